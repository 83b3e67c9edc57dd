"""The engine: configuration, workflows, client calls and the worker."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import datetime as _dt
import enum
import inspect
import math
import os
import signal as _signal
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar, Union

from . import _gendurable
from .cron import Cron
from .errors import Error, InvalidConfig, InvalidInput
from .transitions import ConcurrencyKey, key_str
from .unique import Inserted, Unique

__all__ = [
    "Acted",
    "Cancelled",
    "Delivery",
    "Engine",
    "Instance",
    "NewInstance",
    "step",
    "workflow",
]

T = TypeVar("T")
_MARK = "__gendurable_workflow__"
_STEP_MARK = "__gendurable_step__"
_UNSET: Any = object()


def workflow(
    name: str,
    *,
    step: Optional[str] = None,
    rate_limits: Optional[Mapping[str, str]] = None,
    queue: Optional[str] = None,
    priority: Optional[int] = None,
    max_attempts: Optional[int] = None,
    backoff: Optional[tuple[float, float]] = None,
    timeout: Union[float, _dt.timedelta, None] = None,
) -> Callable[[T], T]:
    """Mark a class or a function as the workflow ``name``, to be registered
    with ``Engine(workflows=[...])`` or ``engine.register(...)``.

    - A class: each public method ``def fetch(self, state, ctx)`` runs the step
      of that name; a method ``step(self, step, state, ctx)`` runs any other
      step. The class is instantiated once, with no arguments.
    - A function ``f(step, state, ctx)`` runs every step of the workflow.
    - With ``step="fetch"``, a function ``f(state, ctx)`` runs that one step;
      several functions may make up one workflow this way.

    Methods and functions may be ``def`` (run on a worker thread) or
    ``async def`` (run on the engine's event loop).

    ``rate_limits`` declares a rate-limit key per step (``{"call_model":
    "openai:shared"}``): applied whenever an instance moves to that step, or is
    inserted at it, without an explicit ``rate_limit``.

    ``queue``, ``priority`` and ``max_attempts`` are what an insert of this
    workflow gets when it does not name them (else the engine's: ``"default"``,
    0, 20); ``backoff=(base, max)``, in seconds, is how its errors are retried
    (else the engine's ``backoff``). ``timeout``, in seconds, is how long each
    of its steps may run (a step's own :func:`gendurable.step` timeout wins):
    at the deadline an ``async def`` step's task is cancelled
    (``asyncio.CancelledError`` at its next ``await``), a ``def`` step is
    recorded as timed out (its thread runs on, its result ignored), and the
    error, of kind ``timeout``, is retried like any other. The core checks
    them when the workflow is registered.
    """
    _gendurable.check_name("workflow", _str("workflow", name))
    if step is not None:
        _gendurable.check_name("step", _str("step", step))
    declared = _declared_rate_limits(rate_limits)
    defaults = _defaults(name, queue, priority, max_attempts, backoff, timeout)

    def mark(target: T) -> T:
        marks = list(getattr(target, _MARK, ()))
        marks.append((name, step, declared, defaults))
        try:
            setattr(target, _MARK, tuple(marks))
        except (AttributeError, TypeError) as exc:
            raise InvalidInput(
                f"invalid workflow: cannot mark {target!r} as a workflow", field="workflow"
            ) from exc
        return target

    return mark


def step(*, timeout: Union[float, _dt.timedelta]) -> Callable[[T], T]:
    """Declare how long a step may run, in seconds (or a ``timedelta``): on a
    step method of a workflow class, or on a function registered with
    ``step=``. Wins over the workflow's ``timeout``::

        @engine.workflow("Charge", timeout=30)
        class Charge:
            @gendurable.step(timeout=10)
            async def capture(self, state, ctx): ...

    At the deadline an ``async def`` step's task is cancelled
    (``asyncio.CancelledError`` at its next ``await``); a ``def`` step is
    recorded as timed out, its thread running on and its result ignored. The
    error, of kind ``timeout``, is retried like any other. The core checks the
    value when the workflow is registered."""
    ms = _millis(timeout)

    def mark(fn: T) -> T:
        target = fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn
        try:
            setattr(target, _STEP_MARK, {"timeout": ms})
        except (AttributeError, TypeError) as exc:
            raise InvalidInput(
                f"invalid step: cannot declare a timeout on {fn!r}", field="step"
            ) from exc
        return fn

    return mark


def _step_timeout(fn: Any) -> Optional[Any]:
    """The timeout :func:`step` declared on ``fn`` (milliseconds), if any."""
    declared = getattr(fn, _STEP_MARK, None)
    return declared.get("timeout") if isinstance(declared, dict) else None


def _declared_rate_limits(rate_limits: Optional[Mapping[str, str]]) -> dict[str, str]:
    if rate_limits is None:
        return {}
    if not isinstance(rate_limits, Mapping):
        raise InvalidConfig(f"rate_limits must be a dict of step -> key, got {rate_limits!r}")
    out = {}
    for step, key in rate_limits.items():
        _gendurable.check_name("step", _str("step", step))
        _gendurable.check_key("rate_limit", _str("rate_limit", key))
        out[step] = key
    return out


def _defaults(
    name: str,
    queue: Optional[str],
    priority: Optional[int],
    max_attempts: Optional[int],
    backoff: Optional[tuple[float, float]],
    timeout: Union[float, _dt.timedelta, None] = None,
) -> dict[str, Any]:
    """A workflow's defaults as the core's ``workflow_defaults`` entry
    (gendurable::options::WorkflowDefaultsOptions): those given, backoff and
    timeout in milliseconds. The core checks the values."""
    return _given(
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        backoff=None if backoff is None else _backoff(backoff, f"workflow {name!r}: backoff"),
        timeout=None if timeout is None else _millis(timeout),
    )


def _given(**options: Any) -> dict[str, Any]:
    """The options that are set: the core takes its defaults for the rest."""
    return {k: v for k, v in options.items() if v is not None}


def _str(field: str, v: Any) -> str:
    if not isinstance(v, str):
        raise InvalidInput(f"invalid {field}: must be a str, got {v!r}", field=field)
    return v


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    )


class _Workflow:
    def __init__(self, name: str) -> None:
        self.name = name
        self.steps: dict[str, tuple[Callable[..., Any], bool, bool]] = {}
        self.fallback: Optional[tuple[Callable[..., Any], bool, bool]] = None
        self.rate_limits: dict[str, str] = {}
        # The core's workflow_defaults entry: queue, priority, max_attempts,
        # backoff, timeout.
        self.defaults: dict[str, Any] = {}
        # The core's step_timeouts entry: step -> milliseconds.
        self.timeouts: dict[str, Any] = {}

    def copy(self) -> _Workflow:
        w = _Workflow(self.name)
        w.steps = dict(self.steps)
        w.fallback = self.fallback
        w.rate_limits = dict(self.rate_limits)
        w.defaults = dict(self.defaults)
        w.timeouts = dict(self.timeouts)
        return w

    def table(self) -> tuple:
        """As the native engine takes it."""
        return (self.name, self.steps, self.fallback, self.rate_limits)

    def add_rate_limits(self, declared: Mapping[str, str]) -> None:
        for step, key in declared.items():
            if self.rate_limits.get(step, key) != key:
                raise InvalidConfig(
                    f"workflow {self.name!r}: step {step!r} declares two rate limits"
                )
            self.rate_limits[step] = key

    def add_defaults(self, declared: Mapping[str, Any]) -> None:
        for option, value in declared.items():
            if self.defaults.get(option, value) != value:
                raise InvalidConfig(f"workflow {self.name!r}: {option} is declared twice")
            self.defaults[option] = value

    def add_step(self, step: str, fn: Callable[..., Any], takes_step: bool = False) -> None:
        if step in self.steps:
            raise InvalidConfig(f"workflow {self.name!r}: step {step!r} is defined twice")
        self.steps[step] = (fn, _is_async(fn), takes_step)
        timeout = _step_timeout(fn)
        if timeout is not None:
            self.timeouts[step] = timeout

    def set_fallback(self, fn: Callable[..., Any]) -> None:
        if self.fallback is not None:
            raise InvalidConfig(
                f"workflow {self.name!r}: a catch-all step function is defined twice"
            )
        if _step_timeout(fn) is not None:
            raise InvalidConfig(
                f"workflow {self.name!r}: a catch-all step function runs many steps; give"
                " the workflow a timeout (timeout=...) rather than the function"
            )
        self.fallback = (fn, _is_async(fn), True)

    def add_class(self, cls: type) -> None:
        instance = cls()
        seen = set()
        for klass in cls.__mro__[:-1]:
            for attr, raw in vars(klass).items():
                if attr.startswith("_") or attr in seen:
                    continue
                seen.add(attr)
                if not (inspect.isfunction(raw) or isinstance(raw, (staticmethod, classmethod))):
                    continue
                fn = getattr(instance, attr)
                if attr == "step":
                    self.set_fallback(fn)
                else:
                    self.add_step(attr, fn)
        if not self.steps and self.fallback is None:
            raise InvalidConfig(f"workflow {self.name!r}: class {cls.__name__} has no step methods")


class Delivery(str, enum.Enum):
    """What :meth:`Engine.send` did with a signal."""

    WOKEN = "woken"
    """The instance was awaiting: it is woken with the signal."""
    KEPT = "kept"
    """It was not awaiting: the signal is kept until it awaits that name,
    then delivered at once (in the order sent, once)."""
    FINISHED = "finished"
    """It had finished: nothing was kept."""


class Cancelled(str, enum.Enum):
    """What :meth:`Engine.cancel` did."""

    NOW = "now"
    """It was not executing and is now cancelled."""
    AT_OUTCOME = "at_outcome"
    """It is executing; it is cancelled when its step's outcome is written."""
    ALREADY_FINISHED = "already_finished"
    """It had already finished (completed, cancelled or discarded)."""


@dataclass(frozen=True)
class Acted:
    """What :meth:`Engine.cancel_where`, :meth:`Engine.retry_where` or
    :meth:`Engine.delete_where` did."""

    matched: int
    """Instances the filter named."""
    changed: int
    """Those the action changed (the others were in a status it does not apply
    to: finished for a cancel, running for a retry, executing for a delete...)."""


def _time(v: Optional[float]) -> Optional[_dt.datetime]:
    return None if v is None else _dt.datetime.fromtimestamp(v, _dt.timezone.utc)


class Instance:
    """An instance as stored, read back with :meth:`Engine.get`.

    ``status`` is one of ``scheduled``, ``available``, ``executing``,
    ``awaiting``, ``completed``, ``cancelled``, ``discarded``. ``errors``
    lists every error, rescue and cancellation recorded, oldest first.
    """

    __slots__ = (
        "attempt",
        "attempted_at",
        "await_signal",
        "await_until",
        "cancel_requested",
        "concurrency_key",
        "errors",
        "finished_at",
        "id",
        "inserted_at",
        "max_attempts",
        "node",
        "priority",
        "queue",
        "rate_limit",
        "scheduled_at",
        "state",
        "status",
        "step",
        "workflow",
    )

    id: int
    workflow: str
    step: str
    state: dict[str, Any]
    queue: str
    priority: int
    status: str
    concurrency_key: Optional[str]
    rate_limit: Optional[str]
    attempt: int
    max_attempts: int
    node: Optional[str]
    cancel_requested: bool
    await_signal: Optional[str]
    await_until: Optional[_dt.datetime]
    errors: list[Any]
    inserted_at: _dt.datetime
    scheduled_at: _dt.datetime
    attempted_at: Optional[_dt.datetime]
    finished_at: Optional[_dt.datetime]

    def __init__(self, d: dict[str, Any]) -> None:
        for k in self.__slots__:
            v = d[k]
            if k.endswith(("_at", "_until")):
                v = _time(v)
            setattr(self, k, v)

    @property
    def finished(self) -> bool:
        """Whether it is finished for good."""
        return self.status in ("completed", "cancelled", "discarded")

    def __repr__(self) -> str:
        return (
            f"Instance(id={self.id}, workflow={self.workflow!r}, step={self.step!r},"
            f" status={self.status!r}, state={self.state!r})"
        )


class NewInstance:
    """An instance to insert with :meth:`Engine.insert_many`; the arguments
    are those of :meth:`Engine.insert`. They are checked when inserted."""

    __slots__ = ("_d",)

    def __init__(
        self,
        workflow: Union[str, Any],
        state: Optional[Mapping[str, Any]] = None,
        *,
        step: str = "start",
        queue: Optional[str] = None,
        priority: Optional[int] = None,
        concurrency_key: Optional[ConcurrencyKey] = None,
        rate_limit: Optional[str] = None,
        schedule_in: Union[float, _dt.timedelta, None] = None,
        scheduled_at: Optional[_dt.datetime] = None,
        max_attempts: Optional[int] = None,
        unique: Optional[Unique] = None,
        idempotency_key: Optional[str] = None,
    ) -> None:
        # The core's insert options (gendurable::options::InsertOptions);
        # those left out (None) are not passed.
        self._d = _given(
            workflow=_workflow_name(workflow),
            state={} if state is None else state,
            step=step,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            concurrency_key=None if concurrency_key is None else key_str(concurrency_key),
            rate_limit=rate_limit,
            schedule_in=None if schedule_in is None else _millis(schedule_in),
            scheduled_at=None if scheduled_at is None else _rfc3339(scheduled_at),
            unique=None if unique is None else _unique(unique),
            idempotency_key=idempotency_key,
        )

    def __repr__(self) -> str:
        return f"NewInstance({self._d['workflow']!r}, {self._d['state']!r})"


def _workflow_name(w: Any) -> Any:
    """The name of a decorated workflow; a name (or anything else but code)
    as it is, for the core to judge."""
    if isinstance(w, str):
        return w
    marks = getattr(w, _MARK, None)
    if marks:
        names = {m[0] for m in marks}
        if len(names) == 1:
            return next(iter(names))
    if marks or callable(w):
        raise InvalidInput(
            f"invalid workflow: give a workflow name or a decorated workflow, got {w!r}",
            field="workflow",
        )
    return w


# --- values as the core's options take them ------------------------------------------


def _millis(v: Any) -> Any:
    """Seconds (a number or a ``timedelta``) as the core's milliseconds;
    anything else as it is, for the core to judge."""
    if isinstance(v, _dt.timedelta):
        v = v.total_seconds()
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        ms = v * 1000
        return round(ms) if math.isfinite(ms) else ms
    return v


def _unique(v: Any) -> dict[str, Any]:
    """A :class:`Unique` as the core's unique options (``{}``: its defaults),
    the period in milliseconds; the values are the core's to judge."""
    if not isinstance(v, Unique):
        raise InvalidInput(
            f"invalid unique: must be a gendurable.Unique, got {v!r}", field="unique"
        )
    return _given(
        fields=list(v.fields) if isinstance(v.fields, tuple) else v.fields,
        period=None if v.period is None else _millis(v.period),
        states=list(v.states) if isinstance(v.states, tuple) else v.states,
    )


def _rfc3339(v: Any) -> Any:
    """A ``datetime`` as the core's RFC 3339 time; a naive one has no offset,
    which the core refuses."""
    return v.isoformat() if isinstance(v, _dt.datetime) else v


def _gates(v: Any) -> Any:
    """``{"stripe": 100}`` is ``{"stripe": {"limit": 100}}``."""
    if not isinstance(v, Mapping):
        return v
    return {
        name: {"limit": g} if isinstance(g, int) and not isinstance(g, bool) else g
        for name, g in v.items()
    }


def _rates(v: Any) -> Any:
    """Periods in seconds, as the core's milliseconds."""
    if not isinstance(v, Mapping):
        return v
    return {
        name: {**r, "period": _millis(r["period"])}
        if isinstance(r, Mapping) and "period" in r
        else r
        for name, r in v.items()
    }


def _backoff(v: Any, what: str = "backoff") -> Any:
    if v is None:
        return None
    if not (isinstance(v, (tuple, list)) and len(v) == 2):
        raise InvalidConfig(f"{what} must be a (base, max) pair of seconds, got {v!r}")
    return {"base": _millis(v[0]), "max": _millis(v[1])}


# Running engines: kept alive while they run, shut down at interpreter exit.
_live: set[Engine] = set()


@atexit.register
def _stop_all() -> None:
    for e in list(_live):
        with contextlib.suppress(Exception):  # best effort at exit
            e.shutdown()


_used = False  # whether this process has started the native runtime
_forked = False  # whether this process was forked after that


def _after_fork_in_child() -> None:
    global _forked
    if _used:
        _forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _check_fork() -> None:
    if _forked:
        raise Error(
            "gendurable was used in this process's parent before it forked, and its"
            " native threads do not survive a fork: use gendurable only after forking"
        )


class _LoopThread:
    """The engine's event loop for async steps, on a thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="gendurable-asyncio", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        pending = asyncio.all_tasks(self.loop)
        for t in pending:
            t.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


class _Stop(BaseException):
    pass


class Engine:
    """A gendurable engine: a client of the database and, once started, a
    worker node running the registered workflows.

    ``url`` defaults to the ``DATABASE_URL`` environment variable. Tables live
    in ``schema`` (created or upgraded on first use). ``queues`` maps each queue
    this node runs to how many of its steps run at once. ``concurrency_limits``
    turns key names into gates (``{"stripe": {"limit": 100, "shards": 10}}``
    lets 100 steps holding any ``stripe:*`` key run at once; keys with other
    names are K = 1). ``rate_limits`` caps how many steps start per period per
    rate-limit key (``{"openai": {"limit": 100, "period": 60, "burst": 10}}``).
    Durations are seconds (or ``timedelta``). ``retention`` is how long
    finished instances are kept (``None``: forever; default 7 days).
    ``connect_timeout`` (default 10 s) bounds how long a call waits for a
    database connection; a database that cannot be reached raises
    :class:`gendurable.CannotConnect` naming the cause (a refused connection,
    an unknown host, a refused password) at once. ``call_timeout`` (default
    60 s) bounds how long a call waits for the database's answer to one
    statement: a connection whose server went away without closing it would
    otherwise keep it waiting forever (a transient
    :class:`gendurable.DatabaseError` then; the statement may have committed).

    A bad configuration raises :class:`gendurable.InvalidConfig` here (a url
    that does not parse: at the first call); nothing connects to the database
    until the first call that needs it. The options are the core's
    (``gendurable::options``), durations in seconds given to it in
    milliseconds.

    ``cron`` lists periodic workflows (:class:`gendurable.Cron`), inserted
    at each tick while this engine's worker runs, once cluster-wide.

    ``inline=True`` is for unit tests: every insert runs the queues it
    inserted into to the end before it returns (see
    :func:`gendurable.testing.drain`), so a test can insert and assert on the
    outcome at once. Instances that await stay awaiting; a retry waits for
    its backoff (drain with ``scheduled=True`` to run it).

    ``metrics_listen="127.0.0.1:9090"``: while the worker runs, it serves
    ``GET /metrics`` in the Prometheus text format there (the core's
    ``metrics_listen``).

    Register every workflow before the first call (an insert, :meth:`get`,
    :meth:`start`...): it builds the one engine that its calls and its worker
    go through, with the workflows registered by then.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        *,
        schema: str = "gendurable",
        queues: Optional[Mapping[str, int]] = None,
        concurrency_limits: Optional[Mapping[str, Any]] = None,
        rate_limits: Optional[Mapping[str, Any]] = None,
        workflows: Iterable[Any] = (),
        node_id: Optional[str] = None,
        poll_interval: Union[float, _dt.timedelta, None] = None,
        heartbeat_interval: Union[float, _dt.timedelta, None] = None,
        lease: Union[float, _dt.timedelta, None] = None,
        shutdown_timeout: Union[float, _dt.timedelta, None] = None,
        gc_interval: Union[float, _dt.timedelta, None] = None,
        retention: Union[float, _dt.timedelta, None] = _UNSET,
        backoff: Optional[tuple[float, float]] = None,
        max_connections: Optional[int] = None,
        connect_timeout: Union[float, _dt.timedelta, None] = None,
        call_timeout: Union[float, _dt.timedelta, None] = None,
        cron: Iterable[Cron] = (),
        inline: bool = False,
        metrics_listen: Optional[str] = None,
    ) -> None:
        if url is None:
            url = os.environ.get("DATABASE_URL") or None
        if url is None:
            raise InvalidConfig(
                "no database: pass url=... or set DATABASE_URL"
                " (in tests, gendurable.testing.postgres() gives a throwaway one)"
            )
        # The core's engine options (gendurable::options::EngineOptions).
        options = {
            "url": url,
            "schema": schema,
            "node_id": node_id,
            "queues": {"default": 10} if queues is None else queues,
            "concurrency_limits": _gates(concurrency_limits),
            "rate_limits": _rates(rate_limits),
            "poll_interval": _millis(poll_interval),
            "heartbeat_interval": _millis(heartbeat_interval),
            "lease": _millis(lease),
            "shutdown_timeout": _millis(shutdown_timeout),
            "gc_interval": _millis(gc_interval),
            "connect_timeout": _millis(connect_timeout),
            "call_timeout": _millis(call_timeout),
            "backoff": _backoff(backoff),
            "pool_size": max_connections,
            "cron": _cron(cron),
            "metrics_listen": metrics_listen,
        }
        if retention is not _UNSET:
            options["retention"] = "infinity" if retention is None else _millis(retention)
        _check_fork()
        global _used
        _used = True
        self._core = _gendurable.Core(options, inline=bool(inline))
        self._options = options
        self.schema = schema
        self._workflows: dict[str, _Workflow] = {}
        # Held while workflows are registered, the engine is built, and the
        # worker starts or stops.
        self._lock = threading.RLock()
        self._loop: Optional[_LoopThread] = None
        self._inline = bool(inline)
        self._stop = threading.Event()
        for w in workflows:
            self.register(w)

    # --- workflows ----------------------------------------------------------------------

    def workflow(
        self,
        name: str,
        *,
        step: Optional[str] = None,
        rate_limits: Optional[Mapping[str, str]] = None,
        queue: Optional[str] = None,
        priority: Optional[int] = None,
        max_attempts: Optional[int] = None,
        backoff: Optional[tuple[float, float]] = None,
        timeout: Union[float, _dt.timedelta, None] = None,
    ) -> Callable[[T], T]:
        """Like :func:`gendurable.workflow`, and registers the target with this engine."""
        mark = workflow(
            name,
            step=step,
            rate_limits=rate_limits,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            backoff=backoff,
            timeout=timeout,
        )
        declared = _declared_rate_limits(rate_limits)
        defaults = _defaults(name, queue, priority, max_attempts, backoff, timeout)

        def decorate(target: T) -> T:
            self._add(name, step, target, declared, defaults)
            return mark(target)

        return decorate

    def register(self, *targets: Any) -> None:
        """Register classes or functions marked with :func:`gendurable.workflow`."""
        for target in targets:
            marks = getattr(target, _MARK, None)
            if not marks:
                raise InvalidConfig(
                    f"{target!r} is not a workflow: decorate it with @gendurable.workflow(name)"
                )
            for name, step, declared, defaults in marks:
                self._add(name, step, target, declared, defaults)

    def _add(
        self,
        name: str,
        step: Optional[str],
        target: Any,
        declared: Mapping[str, str],
        defaults: Mapping[str, Any],
    ) -> None:
        with self._lock:
            if self._core.built:
                raise InvalidConfig(
                    f"workflow {name!r}: register every workflow before the engine's first"
                    " call (insert, get, signal, cancel, migrate, effective_k, node_id or start),"
                    " which builds the engine with the workflows registered by then"
                )
            existing = self._workflows.get(name)
            w = existing.copy() if existing is not None else _Workflow(name)
            if inspect.isclass(target):
                if step is not None:
                    raise InvalidConfig(
                        f"workflow {name!r}: step= applies to functions, not classes"
                    )
                w.add_class(target)
            elif callable(target):
                if step is None:
                    w.set_fallback(target)
                else:
                    w.add_step(step, target)
            else:
                raise InvalidConfig(f"workflow {name!r}: {target!r} is not a class or a function")
            w.add_rate_limits(declared)
            w.add_defaults(defaults)
            workflows = {**self._workflows, name: w}
            self._core.check(
                [x.table() for x in workflows.values()], self._build_options(workflows.values())
            )
            self._workflows = workflows

    def _build_options(self, workflows: Iterable[_Workflow]) -> dict[str, Any]:
        """The engine's options with what the workflows declare: their
        defaults and step timeouts."""
        workflows = list(workflows)
        return {
            **self._options,
            "workflow_defaults": {w.name: w.defaults for w in workflows if w.defaults},
            "step_timeouts": {w.name: w.timeouts for w in workflows if w.timeouts},
        }

    def _native(self) -> Any:
        """The native engine, built at the first call with the workflows
        registered by then, and the defaults they declare."""
        core = self._core
        if not core.built:
            _check_fork()
            with self._lock:
                if not core.built:
                    workflows = self._workflows.values()
                    core.build([w.table() for w in workflows], self._build_options(workflows))
        return core

    def _steps_loop(self) -> Any:
        """The native engine, with an event loop for the async steps that a
        drain (or an inline insert) runs while the worker does not run."""
        core = self._native()
        if self._loop is None:
            with self._lock:
                if self._loop is None and not core.running:
                    loop = _LoopThread()
                    core.use_loop(loop.loop)
                    self._loop = loop
        return core

    def _inserting(self) -> Any:
        """The native engine for an insert: an inline engine runs steps then."""
        return self._steps_loop() if self._inline else self._native()

    @property
    def workflows(self) -> list[str]:
        """Names of the registered workflows."""
        return sorted(self._workflows)

    # --- client calls -------------------------------------------------------------------

    def migrate(self) -> None:
        """Create or upgrade the schema (the first call that needs it does it too)."""
        _check_fork()
        self._native().migrate()

    async def migrate_async(self) -> None:
        """:meth:`migrate` for asyncio."""
        await self._native().migrate_async()

    def insert(
        self,
        workflow: Union[str, Any],
        state: Optional[Mapping[str, Any]] = None,
        *,
        step: str = "start",
        queue: Optional[str] = None,
        priority: Optional[int] = None,
        concurrency_key: Optional[ConcurrencyKey] = None,
        rate_limit: Optional[str] = None,
        schedule_in: Union[float, _dt.timedelta, None] = None,
        scheduled_at: Optional[_dt.datetime] = None,
        max_attempts: Optional[int] = None,
        unique: Optional[Unique] = None,
        idempotency_key: Optional[str] = None,
    ) -> Inserted:
        """Insert one instance of ``workflow`` (a name or a decorated workflow)
        and return its id, an :class:`Inserted` (an ``int``).

        ``state`` is a JSON object (a dict). ``concurrency_key`` is
        ``"name:rest"`` or a ``(name, id)`` tuple; ``schedule_in`` seconds or
        ``scheduled_at`` an aware datetime.

        ``unique=Unique(fields=..., period=..., states=...)`` or an
        ``idempotency_key`` (1 to 1024 bytes, across workflows) make it a
        unique insert: if an instance holds the same identity, nothing is
        inserted and the result is that instance's id with ``conflict`` true
        (see :class:`gendurable.Unique`).

        Left out, ``queue``, ``priority`` and ``max_attempts`` are the
        workflow's defaults (see :func:`gendurable.workflow`), else the
        engine's:

        - ``queue`` (default: the workflow's, else ``"default"``)
        - ``priority`` 0 (first) to 9 (default: the workflow's, else 0)
        - ``max_attempts`` per step (default: the workflow's, else 20)
        """
        new = NewInstance(
            workflow,
            state,
            step=step,
            queue=queue,
            priority=priority,
            concurrency_key=concurrency_key,
            rate_limit=rate_limit,
            schedule_in=schedule_in,
            scheduled_at=scheduled_at,
            max_attempts=max_attempts,
            unique=unique,
            idempotency_key=idempotency_key,
        )
        _check_fork()
        return _inserted(self._inserting().insert_many([new._d]))[0]

    async def insert_async(
        self,
        workflow: Union[str, Any],
        state: Optional[Mapping[str, Any]] = None,
        *,
        step: str = "start",
        queue: Optional[str] = None,
        priority: Optional[int] = None,
        concurrency_key: Optional[ConcurrencyKey] = None,
        rate_limit: Optional[str] = None,
        schedule_in: Union[float, _dt.timedelta, None] = None,
        scheduled_at: Optional[_dt.datetime] = None,
        max_attempts: Optional[int] = None,
        unique: Optional[Unique] = None,
        idempotency_key: Optional[str] = None,
    ) -> Inserted:
        """:meth:`insert` for asyncio."""
        new = NewInstance(
            workflow,
            state,
            step=step,
            queue=queue,
            priority=priority,
            concurrency_key=concurrency_key,
            rate_limit=rate_limit,
            schedule_in=schedule_in,
            scheduled_at=scheduled_at,
            max_attempts=max_attempts,
            unique=unique,
            idempotency_key=idempotency_key,
        )
        return _inserted(await self._inserting().insert_many_async([new._d]))[0]

    def insert_many(self, instances: Iterable[NewInstance]) -> list[Inserted]:
        """Insert many instances in one round trip; all or none. Returns an
        :class:`Inserted` (an id) per instance, in order.

        Unique inserts and idempotency keys count within the batch too: the
        first of an identity is inserted, the later ones report it with
        ``conflict`` true."""
        _check_fork()
        return _inserted(self._inserting().insert_many(_news(instances)))

    async def insert_many_async(self, instances: Iterable[NewInstance]) -> list[Inserted]:
        """:meth:`insert_many` for asyncio."""
        return _inserted(await self._inserting().insert_many_async(_news(instances)))

    def get(self, id: int) -> Instance:
        """Read an instance back; raises :class:`gendurable.NotFound`."""
        _check_fork()
        return Instance(self._native().get(_id(id)))

    async def get_async(self, id: int) -> Instance:
        """:meth:`get` for asyncio."""
        return Instance(await self._native().get_async(_id(id)))

    def signal(
        self,
        name: str,
        payload: Any = None,
        *,
        id: Optional[int] = None,
        ttl: Union[float, _dt.timedelta, None] = None,
    ) -> int:
        """Wake every instance awaiting signal ``name`` (or, with ``id``, that one
        instance whatever it awaits); the woken step sees ``payload`` in
        ``ctx.wake``. Returns how many were woken.

        A signal nobody awaits is not kept, unless ``ttl`` (seconds, or a
        ``timedelta``) is given: then one that woke nobody is kept that long
        and delivered to the first instance that awaits ``name`` meanwhile
        (once). To keep a signal for one instance until it awaits it, use
        :meth:`send`."""
        _check_fork()
        return self._native().signal(
            _str("signal", name), payload, None if id is None else _id(id), _ttl(ttl)
        )

    async def signal_async(
        self,
        name: str,
        payload: Any = None,
        *,
        id: Optional[int] = None,
        ttl: Union[float, _dt.timedelta, None] = None,
    ) -> int:
        """:meth:`signal` for asyncio."""
        return await self._native().signal_async(
            _str("signal", name), payload, None if id is None else _id(id), _ttl(ttl)
        )

    def send(self, id: int, name: str, payload: Any = None) -> Delivery:
        """Send signal ``name`` to one instance. If it is awaiting (whatever it
        awaits) it wakes now with the signal: :attr:`Delivery.WOKEN`. If it has
        not reached its await yet, the signal is kept and delivered the moment
        it awaits ``name`` (in the order sent, each once):
        :attr:`Delivery.KEPT`. A finished instance gets nothing:
        :attr:`Delivery.FINISHED`. Raises :class:`gendurable.NotFound`."""
        _check_fork()
        what, _status = self._native().send(_id(id), _str("signal", name), payload)
        return Delivery(what)

    async def send_async(self, id: int, name: str, payload: Any = None) -> Delivery:
        """:meth:`send` for asyncio."""
        what, _status = await self._native().send_async(_id(id), _str("signal", name), payload)
        return Delivery(what)

    def cancel(self, id: int, reason: Optional[str] = None) -> Cancelled:
        """Cancel an instance: at once if it is not executing, else when its
        step's outcome is written. Raises :class:`gendurable.NotFound`."""
        _check_fork()
        what, _status = self._native().cancel(_id(id), reason)
        return Cancelled(what)

    async def cancel_async(self, id: int, reason: Optional[str] = None) -> Cancelled:
        """:meth:`cancel` for asyncio."""
        what, _status = await self._native().cancel_async(_id(id), reason)
        return Cancelled(what)

    def retry(self, id: int) -> bool:
        """Run an instance again now: a scheduled one (waiting out a delay, a
        backoff or a snooze) keeps its attempts; a discarded or cancelled one
        gets its step's attempts afresh, a ``retry`` entry recorded in its
        errors. Returns whether it was made runnable: not if it is in another
        status, nor if another instance holds its unique identity meanwhile.
        Raises :class:`gendurable.NotFound`."""
        _check_fork()
        return self._native().act_one("retry", _id(id))

    async def retry_async(self, id: int) -> bool:
        """:meth:`retry` for asyncio."""
        return await self._native().act_one_async("retry", _id(id))

    def delete(self, id: int) -> bool:
        """Delete an instance, with the signals kept for it. Returns whether
        it was deleted: an executing instance (or one a node has reserved) is
        not; cancel it first. Raises :class:`gendurable.NotFound`."""
        _check_fork()
        return self._native().act_one("delete", _id(id))

    async def delete_async(self, id: int) -> bool:
        """:meth:`delete` for asyncio."""
        return await self._native().act_one_async("delete", _id(id))

    def count(
        self,
        *,
        ids: Optional[Iterable[int]] = None,
        workflow: Union[str, Any, None] = None,
        queue: Optional[str] = None,
        status: Union[str, Iterable[str], None] = None,
        key: Optional[ConcurrencyKey] = None,
        error: Optional[str] = None,
    ) -> int:
        """How many instances the conditions name (every one given must hold):
        what :meth:`cancel_where`, :meth:`retry_where` or :meth:`delete_where`
        would look at, a dry run.

        - ``ids``: instance ids
        - ``workflow``: a name or a decorated workflow
        - ``queue``
        - ``status``: one (``"discarded"``) or several (``["discarded", "cancelled"]``)
        - ``key``: a concurrency key, ``"name:rest"`` or a ``(name, id)`` tuple
        - ``error``: text in the message of the last error recorded (any case)

        At least one is needed (:class:`gendurable.InvalidInput`, field
        ``filter``): to name every instance, list the statuses."""
        _check_fork()
        return self._native().count(_filter(ids, workflow, queue, status, key, error))

    async def count_async(
        self,
        *,
        ids: Optional[Iterable[int]] = None,
        workflow: Union[str, Any, None] = None,
        queue: Optional[str] = None,
        status: Union[str, Iterable[str], None] = None,
        key: Optional[ConcurrencyKey] = None,
        error: Optional[str] = None,
    ) -> int:
        """:meth:`count` for asyncio."""
        f = _filter(ids, workflow, queue, status, key, error)
        return await self._native().count_async(f)

    def cancel_where(
        self,
        *,
        ids: Optional[Iterable[int]] = None,
        workflow: Union[str, Any, None] = None,
        queue: Optional[str] = None,
        status: Union[str, Iterable[str], None] = None,
        key: Optional[ConcurrencyKey] = None,
        error: Optional[str] = None,
        reason: Optional[str] = None,
    ) -> Acted:
        """Cancel every instance the conditions name (those of :meth:`count`),
        as :meth:`cancel` does one: at once if not executing, else when its
        step's outcome is written; ``reason`` is recorded in its errors.
        ``changed`` counts those not finished already."""
        _check_fork()
        f = _filter(ids, workflow, queue, status, key, error)
        return Acted(*self._native().act("cancel", f, _reason(reason)))

    async def cancel_where_async(
        self,
        *,
        ids: Optional[Iterable[int]] = None,
        workflow: Union[str, Any, None] = None,
        queue: Optional[str] = None,
        status: Union[str, Iterable[str], None] = None,
        key: Optional[ConcurrencyKey] = None,
        error: Optional[str] = None,
        reason: Optional[str] = None,
    ) -> Acted:
        """:meth:`cancel_where` for asyncio."""
        f = _filter(ids, workflow, queue, status, key, error)
        return Acted(*await self._native().act_async("cancel", f, _reason(reason)))

    def retry_where(
        self,
        *,
        ids: Optional[Iterable[int]] = None,
        workflow: Union[str, Any, None] = None,
        queue: Optional[str] = None,
        status: Union[str, Iterable[str], None] = None,
        key: Optional[ConcurrencyKey] = None,
        error: Optional[str] = None,
        reason: Optional[str] = None,
    ) -> Acted:
        """:meth:`retry` every instance the conditions name (those of
        :meth:`count`); ``reason`` is recorded in each one's errors.
        ``changed`` counts those made runnable."""
        _check_fork()
        f = _filter(ids, workflow, queue, status, key, error)
        return Acted(*self._native().act("retry", f, _reason(reason)))

    async def retry_where_async(
        self,
        *,
        ids: Optional[Iterable[int]] = None,
        workflow: Union[str, Any, None] = None,
        queue: Optional[str] = None,
        status: Union[str, Iterable[str], None] = None,
        key: Optional[ConcurrencyKey] = None,
        error: Optional[str] = None,
        reason: Optional[str] = None,
    ) -> Acted:
        """:meth:`retry_where` for asyncio."""
        f = _filter(ids, workflow, queue, status, key, error)
        return Acted(*await self._native().act_async("retry", f, _reason(reason)))

    def delete_where(
        self,
        *,
        ids: Optional[Iterable[int]] = None,
        workflow: Union[str, Any, None] = None,
        queue: Optional[str] = None,
        status: Union[str, Iterable[str], None] = None,
        key: Optional[ConcurrencyKey] = None,
        error: Optional[str] = None,
    ) -> Acted:
        """:meth:`delete` every instance the conditions name (those of
        :meth:`count`), executing and reserved ones excepted. ``changed``
        counts those deleted."""
        _check_fork()
        f = _filter(ids, workflow, queue, status, key, error)
        return Acted(*self._native().act("delete", f))

    async def delete_where_async(
        self,
        *,
        ids: Optional[Iterable[int]] = None,
        workflow: Union[str, Any, None] = None,
        queue: Optional[str] = None,
        status: Union[str, Iterable[str], None] = None,
        key: Optional[ConcurrencyKey] = None,
        error: Optional[str] = None,
    ) -> Acted:
        """:meth:`delete_where` for asyncio."""
        f = _filter(ids, workflow, queue, status, key, error)
        return Acted(*await self._native().act_async("delete", f))

    def pause_queue(self, queue: str) -> bool:
        """Pause ``queue`` cluster-wide: no node claims from it (nor starts an
        instance inserted into it at once) until :meth:`resume_queue`. Steps
        already running finish and record their outcomes (a key's next
        instance that a node started as the one before it ended is stopped
        instead, and runs again once resumed); inserts go on. The
        pause is stored, so it holds across restarts. Returns whether the
        queue was running (``False``: it was paused already)."""
        _check_fork()
        return self._native().pause_queue(_str("queue", queue), True)

    async def pause_queue_async(self, queue: str) -> bool:
        """:meth:`pause_queue` for asyncio."""
        return await self._native().pause_queue_async(_str("queue", queue), True)

    def resume_queue(self, queue: str) -> bool:
        """Resume a paused queue; its pickers on every node are woken. Returns
        whether it was paused."""
        _check_fork()
        return self._native().pause_queue(_str("queue", queue), False)

    async def resume_queue_async(self, queue: str) -> bool:
        """:meth:`resume_queue` for asyncio."""
        return await self._native().pause_queue_async(_str("queue", queue), False)

    def paused_queues(self) -> list[tuple[str, _dt.datetime]]:
        """The paused queues and since when (aware datetimes, UTC)."""
        _check_fork()
        return [(q, _since(t)) for q, t in self._native().paused_queues()]

    async def paused_queues_async(self) -> list[tuple[str, _dt.datetime]]:
        """:meth:`paused_queues` for asyncio."""
        return [(q, _since(t)) for q, t in await self._native().paused_queues_async()]

    def effective_k(self, key: ConcurrencyKey) -> int:
        """How many steps holding ``key`` may run at once under this configuration."""
        return self._native().effective_k(key_str(key))

    @property
    def node_id(self) -> str:
        """This node's id."""
        return self._native().node_id

    # --- the worker ---------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether this engine's worker node runs."""
        return self._core.running

    def start(self) -> None:
        """Start the worker node in the background: it claims runnable instances
        of the registered workflows and runs their steps (sync steps on worker
        threads, async steps on the engine's event loop thread)."""
        _check_fork()
        with self._lock:
            if self._core.running:
                return
            if not self._workflows:
                raise InvalidConfig(
                    "no workflows registered: register one before starting the worker"
                )
            core = self._native()
            self._stop.clear()
            if self._loop is None:
                self._loop = _LoopThread()
            try:
                core.start(self._loop.loop)
            except BaseException:
                self._loop.stop()
                self._loop = None
                raise
            _live.add(self)

    def shutdown(self) -> None:
        """Stop the worker gracefully: stop claiming, let running steps finish
        within ``shutdown_timeout`` (steps still running then are recorded as
        errors and retried), write every outcome and hand back claimed rows
        that never started. Idempotent.

        A Ctrl-C (or any signal handler raising) while it waits in the main
        thread stops the running steps at once, recorded as errors; the
        exception propagates once their outcomes are written."""
        with self._lock:
            try:
                self._core.shutdown()
            finally:
                if self._loop is not None:
                    self._loop.stop()
                    self._loop = None
                _live.discard(self)
                self._stop.set()

    def stop(self) -> None:
        """Ask :meth:`run` to return (from any thread or a signal handler)."""
        self._stop.set()

    def run(self, *, handle_signals: bool = True) -> None:
        """Run the worker until SIGINT (Ctrl-C) or SIGTERM, or until
        :meth:`stop` is called; then shut down gracefully and return.

        A second SIGINT or SIGTERM during the graceful shutdown stops the
        running steps at once (each is recorded as an error and retried
        later) and raises :class:`KeyboardInterrupt` once their outcomes are
        written.

        Signal handlers are installed only when called from the main thread
        (and ``handle_signals`` is true); the previous ones are restored on return.
        """
        previous: dict[Any, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():
            signalled = []

            def on_signal(signum: int, frame: Any) -> None:
                if signalled:
                    # A second signal: stop the running steps now (each is
                    # recorded as an error) and leave with KeyboardInterrupt.
                    self._core.force_stop()
                    raise KeyboardInterrupt
                signalled.append(signum)
                raise _Stop

            for s in (_signal.SIGINT, _signal.SIGTERM):
                previous[s] = _signal.signal(s, on_signal)
        try:
            try:
                self.start()
                self._stop.wait()
            except _Stop:
                pass
            finally:
                self.shutdown()
        finally:
            for s, h in previous.items():
                _signal.signal(s, h)

    async def run_async(self, *, handle_signals: bool = True) -> None:
        """:meth:`run` inside a running event loop: start the worker, wait for
        SIGINT or SIGTERM (handled on this loop when it runs in the main thread),
        :meth:`stop` or the cancellation of this task, then shut down gracefully.
        A second signal during the shutdown stops the running steps at once
        (recorded as errors)."""
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        installed = []

        def on_signal() -> None:
            if stopped.is_set():  # a second signal: stop the running steps now
                self._core.force_stop()
            stopped.set()

        if handle_signals and threading.current_thread() is threading.main_thread():
            for s in (_signal.SIGINT, _signal.SIGTERM):
                try:
                    loop.add_signal_handler(s, on_signal)
                    installed.append(s)
                except (NotImplementedError, RuntimeError):  # pragma: no cover - not POSIX
                    pass
        watcher = threading.Thread(
            target=lambda: (self._stop.wait(), loop.call_soon_threadsafe(stopped.set)),
            name="gendurable-run-async",
            daemon=True,
        )
        try:
            await asyncio.to_thread(self.start)
            watcher.start()
            await stopped.wait()
        finally:
            try:
                await self.shutdown_async()
            finally:
                for s in installed:
                    loop.remove_signal_handler(s)

    async def shutdown_async(self) -> None:
        """:meth:`shutdown` for asyncio (the event loop is not blocked)."""
        await self._core.shutdown_async()
        self.shutdown()

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        if not self._core.built:
            return f"<gendurable.Engine schema={self.schema!r}, not yet used>"
        return f"<gendurable.Engine schema={self.schema!r} node={self.node_id!r}>"


def _id(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidInput(f"invalid id: must be an int, got {v!r}", field="id")
    if not -(2**63) <= v < 2**63:
        raise InvalidInput(f"invalid id: out of range: {v}", field="id")
    return v


def _since(t: float) -> _dt.datetime:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc)


def _reason(v: Any) -> Optional[str]:
    return None if v is None else _str("reason", v)


def _filter(
    ids: Any, workflow: Any, queue: Any, status: Any, key: Any, error: Any
) -> tuple[Any, ...]:
    """The conditions of :meth:`Engine.count` and the actions, as the native
    side takes them: ``(ids, workflow, queue, statuses, key, error)``; the
    statuses and the need for one condition are checked there."""
    if ids is not None:
        if isinstance(ids, (str, bytes, Mapping)) or not isinstance(ids, Iterable):
            raise InvalidInput(f"invalid ids: must be a list of ids, got {ids!r}", field="ids")
        ids = [_id(i) for i in ids]
    if status is not None:
        statuses = [status] if isinstance(status, str) else status
        if not isinstance(statuses, Iterable) or isinstance(statuses, (bytes, Mapping)):
            raise InvalidInput(
                f"invalid status: must be a status or a list of them, got {status!r}",
                field="status",
            )
        status = [_str("status", s) for s in statuses]
    return (
        ids,
        None if workflow is None else _str("workflow", _workflow_name(workflow)),
        None if queue is None else _str("queue", queue),
        status,
        None if key is None else key_str(key, "key"),
        None if error is None else _str("error", error),
    )


def _ttl(v: Any) -> Optional[float]:
    """A signal's time to live in seconds, as the native side takes it."""
    if v is None:
        return None
    if isinstance(v, _dt.timedelta):
        return v.total_seconds()
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidInput(f"invalid ttl: must be a number of seconds, got {v!r}", field="ttl")
    return float(v)


def _cron(entries: Iterable[Any]) -> list[dict[str, Any]]:
    """:class:`Cron` entries as the core's ``cron`` option
    (gendurable::options::CronOptions); the core checks the values."""
    if isinstance(entries, Cron) or not isinstance(entries, Iterable):
        raise InvalidConfig(f"cron must be a list of gendurable.Cron entries, got {entries!r}")
    out = []
    for c in entries:
        if not isinstance(c, Cron):
            raise InvalidConfig(f"cron: expected gendurable.Cron entries, got {c!r}")
        instance = _given(
            workflow=c.workflow,
            state={} if c.state is None else c.state,
            step=c.step,
            queue=c.queue,
            priority=c.priority,
            max_attempts=c.max_attempts,
            concurrency_key=None if c.concurrency_key is None else key_str(c.concurrency_key),
            rate_limit=c.rate_limit,
            unique=None if c.unique is None else _unique(c.unique),
            idempotency_key=c.idempotency_key,
        )
        out.append(
            _given(
                schedule=c.schedule,
                instance=instance,
                name=c.name,
                timezone=c.timezone,
                missed=c.missed,
            )
        )
    return out


def _inserted(pairs: list[tuple[int, bool]]) -> list[Inserted]:
    return [Inserted(id, conflict) for id, conflict in pairs]


def _news(instances: Iterable[Any]) -> list[dict[str, Any]]:
    out = []
    for n in instances:
        if isinstance(n, NewInstance):
            out.append(n._d)
        elif isinstance(n, Mapping):
            out.append(NewInstance(**n)._d)
        else:
            raise InvalidInput(
                f"invalid instances: expected NewInstance objects, got {n!r}", field="instances"
            )
    return out
