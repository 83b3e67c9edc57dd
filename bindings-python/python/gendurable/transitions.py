"""What a step returns: the instance's next move.

A step returns one of :class:`Next`, :class:`Done`, :class:`Await`,
:class:`Snooze`, :class:`Cancel`, :class:`gendurable.Error` (any exception
instance, returned or raised, fails the attempt) or :class:`Discard` (returned
or raised, fails the instance for good).
"""

from __future__ import annotations

import datetime as _dt
import uuid
from typing import Any, Final, Optional, Tuple, Union

from .errors import Error, InvalidInput

__all__ = [
    "KEEP",
    "Await",
    "Cancel",
    "ConcurrencyKey",
    "Discard",
    "Done",
    "Next",
    "Snooze",
    "Transition",
]


class _Keep:
    """The default of ``Next(concurrency_key=...)``: keep the current key."""

    _instance: Optional[_Keep] = None

    def __new__(cls) -> _Keep:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "gendurable.KEEP"

    def __reduce__(self) -> str:
        return "KEEP"


KEEP: Final = _Keep()
"""Keep the instance's concurrency key (the default of :class:`Next`)."""

ConcurrencyKey = Union[str, Tuple[str, Union[str, int, uuid.UUID]]]
"""A key: ``"account:7"`` or ``("account", 7)``."""


def key_str(key: ConcurrencyKey, field: str = "concurrency_key") -> str:
    """A key as stored: ``("stripe", 7)`` becomes ``"stripe:7"``.

    The id of a ``(name, id)`` tuple is a ``str``, an ``int`` or a
    ``uuid.UUID``, written as the other languages write it. Anything else
    (``None``, a ``bool``, a ``float``...) is refused rather than turned into
    a key such as ``"stripe:None"`` that every missing id would share.
    """
    if isinstance(key, str):
        return key
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str):
        name, id_ = key
        if isinstance(id_, str):
            return f"{name}:{str.__str__(id_)}"
        if isinstance(id_, int) and not isinstance(id_, bool):
            return f"{name}:{int.__repr__(id_)}"
        if isinstance(id_, uuid.UUID):
            return f"{name}:{id_}"
        raise InvalidInput(
            f"invalid {field}: the id of a (name, id) key must be a str, an int or a UUID,"
            f" got {id_!r} in {key!r}",
            field=field,
        )
    raise InvalidInput(
        f"invalid {field}: must be a str or a (name, id) tuple, got {key!r}", field=field
    )


def _seconds(field: str, value: Any) -> Optional[float]:
    """Seconds as the native side takes them (which refuses a negative or
    infinite duration)."""
    if value is None:
        return None
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(
            f"invalid {field}: must be seconds (a number) or a timedelta, got {value!r}",
            field=field,
        )
    return float(value)


def _timestamp(field: str, value: Any) -> Optional[float]:
    """A time as the native side takes it: seconds since the epoch, which
    say nothing of whether the datetime had a zone, so it is checked here."""
    if value is None:
        return None
    if not isinstance(value, _dt.datetime):
        raise InvalidInput(f"invalid {field}: must be a datetime, got {value!r}", field=field)
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(
            f"invalid {field}: must be timezone-aware (e.g. datetime.now(timezone.utc))",
            field=field,
        )
    return value.timestamp()


def _name(field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"invalid {field}: must be a str, got {value!r}", field=field)
    return value


class Transition:
    """Base class of the transitions a step returns."""

    __slots__ = ()

    def _encode(self) -> tuple:  # pragma: no cover - overridden
        raise NotImplementedError


class Next(Transition):
    """Run ``step`` next with ``state``.

    ``concurrency_key``: omit it to keep the instance's key; ``None`` releases
    it; a key switches to it (admitted at the next claim). ``rate_limit`` sets
    a rate-limit key for the next step; ``delay`` (seconds or a timedelta)
    runs it no sooner than that.
    """

    __slots__ = ("concurrency_key", "delay", "rate_limit", "state", "step")

    def __init__(
        self,
        step: str,
        state: dict[str, Any],
        *,
        concurrency_key: Union[ConcurrencyKey, _Keep, None] = KEEP,
        rate_limit: Optional[str] = None,
        delay: Union[float, _dt.timedelta, None] = None,
    ) -> None:
        self.step = step
        self.state = state
        self.concurrency_key = concurrency_key
        self.rate_limit = rate_limit
        self.delay = delay

    def _encode(self) -> tuple:
        if isinstance(self.concurrency_key, _Keep):
            mode, key = 0, None
        elif self.concurrency_key is None:
            mode, key = 1, None
        else:
            mode, key = 2, key_str(self.concurrency_key)
        return (
            "next",
            _name("step", self.step),
            self.state,
            mode,
            key,
            self.rate_limit,
            _seconds("delay", self.delay),
        )

    def __repr__(self) -> str:
        return f"Next({self.step!r}, {self.state!r})"


class Done(Transition):
    """Finished, with the final ``state``."""

    __slots__ = ("state",)

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def _encode(self) -> tuple:
        return ("done", self.state)

    def __repr__(self) -> str:
        return f"Done({self.state!r})"


class Await(Transition):
    """Park the instance (holding no slot) until a signal, a timeout or a time,
    then run ``step``.

    At least one of ``signal`` (a name sent with ``engine.signal``),
    ``timeout`` (seconds or a timedelta) and ``until`` (an aware datetime) is
    needed: the engine refuses an await on nothing, and the attempt fails.
    The step that runs next sees why in ``ctx.wake``.
    """

    __slots__ = ("signal", "state", "step", "timeout", "until")

    def __init__(
        self,
        step: str,
        state: dict[str, Any],
        *,
        signal: Optional[str] = None,
        timeout: Union[float, _dt.timedelta, None] = None,
        until: Optional[_dt.datetime] = None,
    ) -> None:
        self.step = step
        self.state = state
        self.signal = signal
        self.timeout = timeout
        self.until = until

    def _encode(self) -> tuple:
        return (
            "await",
            _name("step", self.step),
            self.state,
            self.signal,
            _seconds("timeout", self.timeout),
            _timestamp("until", self.until),
        )

    def __repr__(self) -> str:
        return f"Await({self.step!r}, signal={self.signal!r}, timeout={self.timeout!r})"


class Snooze(Transition):
    """Run this step again after ``seconds``; not counted as an attempt."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: Union[float, _dt.timedelta]) -> None:
        self.seconds = seconds

    def _encode(self) -> tuple:
        return ("snooze", _seconds("snooze", self.seconds))

    def __repr__(self) -> str:
        return f"Snooze({self.seconds!r})"


class Discard(Transition, Error):
    """Fail for good: the instance is ``discarded`` now, whatever attempts are
    left, with ``reason`` recorded in its ``errors`` (kind ``"discard"``).

    For a permanent error, such as a request the partner API will never
    accept; a transient one is a :class:`gendurable.Error`, retried. Like
    ``gendurable.Error`` it is an exception that is returned or raised:
    ``raise gendurable.Discard("card declined")`` from code deep in a call
    stack discards the instance the same way (its reason is recorded, not its
    traceback). A ``reason`` that is not a ``str`` is an error outcome.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)

    @property
    def reason(self) -> str:
        """Why, recorded as the message of the ``discard`` error."""
        return self.message

    def _encode(self) -> tuple:
        return ("discard", _name("reason", self.message))

    def __str__(self) -> str:
        return str(self.message)

    def __repr__(self) -> str:
        return f"Discard({self.message!r})"


class Cancel(Transition):
    """Stop the instance for good, recording ``reason``."""

    __slots__ = ("reason",)

    def __init__(self, reason: str = "cancelled") -> None:
        self.reason = reason

    def _encode(self) -> tuple:
        return ("cancel", str(self.reason))

    def __repr__(self) -> str:
        return f"Cancel({self.reason!r})"
