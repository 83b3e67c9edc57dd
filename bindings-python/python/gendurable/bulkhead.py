"""An in-process bulkhead: a cap on how many calls to one service run at once."""

from __future__ import annotations

import contextvars
import datetime as _dt
import functools
import inspect
from typing import Any, Awaitable, Callable, Optional, TypeVar, Union, cast

from . import _gendurable
from .errors import InvalidConfig

__all__ = ["Bulkhead", "Permit"]

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")

Permit = _gendurable.Permit


def _secs(what: str, v: Any) -> float:
    if isinstance(v, _dt.timedelta):
        return v.total_seconds()
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidConfig(f"bulkhead {what} must be a number of seconds, got {v!r}")
    return float(v)


class Bulkhead:
    """At most ``limit`` calls at once; over it, :class:`gendurable.Saturated`.

    ``reclaim_after`` (seconds, required): a permit not released by then
    (a thread stuck forever, a leaked permit) counts as free again. Choose it
    above the slowest call you expect to finish: a call still running past it
    may see one more call than ``limit`` start beside it.

    ``wait``: ``None`` (default) refuses at once when full; a number of seconds
    waits at most that long for a permit (waiting callers hold no slot).
    An unbounded wait (``float("inf")``) is refused: a bulkhead that queues
    without limit hides the overload it is there to expose.

    Use it as a context manager (``with`` or ``async with``), as a decorator
    of ``def`` or ``async def`` functions, or take permits explicitly with
    :meth:`acquire`. The permit is released on every way out: return,
    exception, task cancellation. With ``name``, the bulkhead is also
    registered under that name in the process's registry (shared with the
    native core).
    """

    def __init__(
        self,
        limit: int,
        reclaim_after: Union[float, _dt.timedelta],
        wait: Union[float, _dt.timedelta, None] = None,
        *,
        name: Optional[str] = None,
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise InvalidConfig(f"bulkhead limit must be an int, got {limit!r}")
        if name is not None and not isinstance(name, str):
            raise InvalidConfig(f"bulkhead name must be a str, got {name!r}")
        self._b = _gendurable._Bulkhead(
            limit,
            _secs("reclaim_after", reclaim_after),
            None if wait is None else _secs("wait", wait),
            name,
        )
        self.name = name
        self._held: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
            f"gendurable.Bulkhead@{id(self):x}", default=()
        )

    # --- permits --------------------------------------------------------------------

    def try_acquire(self) -> Optional[Permit]:
        """A permit if one is free right now, else ``None``; never waits."""
        return self._b.try_acquire()

    def acquire(self) -> Permit:
        """A permit, waiting up to ``wait`` (the GIL is released meanwhile);
        raises :class:`gendurable.Saturated`. Use it in ``with``."""
        return self._b.acquire()

    async def acquire_async(self) -> Permit:
        """A permit, waiting up to ``wait`` without blocking the event loop;
        raises :class:`gendurable.Saturated`."""
        p = self._b.try_acquire()
        if p is not None:
            return p
        if self._b.wait is None:
            return self._b.acquire()  # raises Saturated at once
        return await self._b.acquire_async()

    # --- context manager and decorator ---------------------------------------------------

    def __enter__(self) -> Bulkhead:
        p = self.acquire()
        self._held.set((*self._held.get(), p))
        return self

    def __exit__(self, *exc: Any) -> None:
        held = self._held.get()
        self._held.set(held[:-1])
        held[-1].release()

    async def __aenter__(self) -> Bulkhead:
        p = await self.acquire_async()
        self._held.set((*self._held.get(), p))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.__exit__()

    def __call__(self, fn: F) -> F:
        """Decorate a function (``def`` or ``async def``) to run under a permit."""
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with await self.acquire_async():
                    return await fn(*args, **kwargs)

            return cast(F, run_async)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with self.acquire():
                return fn(*args, **kwargs)

        return cast(F, run)

    def call(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """Run ``fn(*args, **kwargs)`` under a permit."""
        with self.acquire():
            return fn(*args, **kwargs)

    async def call_async(self, fn: Callable[..., Awaitable[R]], *args: Any, **kwargs: Any) -> R:
        """Await ``fn(*args, **kwargs)`` under a permit."""
        with await self.acquire_async():
            return await fn(*args, **kwargs)

    # --- inspection ----------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Permits held right now."""
        return self._b.in_flight

    @property
    def limit(self) -> int:
        """How many permits may be held at once."""
        return self._b.limit

    @property
    def waiting(self) -> int:
        """Callers waiting for a permit right now."""
        return self._b.waiting

    @property
    def wait(self) -> Optional[float]:
        """The wait budget in seconds (``None``: refuse at once)."""
        return self._b.wait

    @property
    def reclaim_after(self) -> float:
        """Seconds after which an unreleased permit counts as free."""
        return self._b.reclaim_after

    def reset(self) -> None:
        """Free every slot, as if all holders had released (their later releases
        do nothing). For operators and tests, after an incident left the count
        wrong: the service may briefly see up to twice ``limit`` calls."""
        self._b.reset()

    def __repr__(self) -> str:
        return (
            f"<gendurable.Bulkhead limit={self.limit} in_flight={self.in_flight} wait={self.wait}>"
        )
