"""What a step knows about the instance it runs for."""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["Context", "Wake"]


class Wake:
    """Why an awaiting instance was woken: a signal (``signal`` and
    ``payload``) or its timeout (``timeout`` is true)."""

    __slots__ = ("payload", "signal", "timeout")

    def __init__(self, signal: Optional[str], payload: Any, timeout: bool) -> None:
        self.signal = signal
        self.payload = payload
        self.timeout = timeout

    def __repr__(self) -> str:
        if self.timeout:
            return "Wake(timeout=True)"
        return f"Wake(signal={self.signal!r}, payload={self.payload!r})"


class Context:
    """Passed to every step: the instance's ``id``, ``workflow``, ``queue``,
    this step's ``attempt`` (from 1) of ``max_attempts``, the
    ``concurrency_key`` held while it runs, its ``rate_limit`` key, and
    ``wake`` (a :class:`Wake`, when the step follows an await)."""

    __slots__ = (
        "attempt",
        "concurrency_key",
        "id",
        "max_attempts",
        "queue",
        "rate_limit",
        "wake",
        "workflow",
    )

    def __init__(
        self,
        id: int,
        workflow: str,
        queue: str,
        attempt: int,
        max_attempts: int,
        concurrency_key: Optional[str],
        rate_limit: Optional[str],
        wake: Optional[Wake],
    ) -> None:
        self.id = id
        self.workflow = workflow
        self.queue = queue
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.concurrency_key = concurrency_key
        self.rate_limit = rate_limit
        self.wake = wake

    @classmethod
    def _from_native(cls, t: tuple) -> Context:
        id_, workflow, queue, attempt, max_attempts, ckey, rkey, wake = t
        w = None
        if wake is not None:
            w = Wake(wake[1], wake[2], False) if wake[0] == "signal" else Wake(None, None, True)
        return cls(id_, workflow, queue, attempt, max_attempts, ckey, rkey, w)

    def __repr__(self) -> str:
        return (
            f"Context(id={self.id}, workflow={self.workflow!r}, attempt={self.attempt},"
            f" concurrency_key={self.concurrency_key!r}, wake={self.wake!r})"
        )
