"""Helpers for tests: a throwaway PostgreSQL, draining queues, and
assertions on inserted instances.

    from gendurable.testing import assert_inserted, drain

    def test_signup_sends_a_welcome(engine):
        signup(engine, "ada@example.com")           # inserts Mail.Welcome
        assert_inserted(engine, "Mail.Welcome", state={"to": "ada@example.com"})
        assert drain(engine).completed == 1

``Engine(..., inline=True)`` runs every insert's queues to the end before the
insert returns, for tests that assert on the outcome at once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

from . import _gendurable
from .engine import Engine, Instance, _str, _workflow_name

__all__ = [
    "Drained",
    "assert_inserted",
    "drain",
    "drain_async",
    "inserted",
    "inserted_async",
    "postgres",
    "refute_inserted",
]


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """Yield the URL of a PostgreSQL to test against.

    With ``DATABASE_URL`` set (and not empty), yields it. Otherwise starts a
    throwaway cluster from the PostgreSQL server binaries installed on the
    machine (``initdb`` and ``pg_ctl`` on ``PATH`` or in the usual places), in a
    temporary directory on its own port, and stops and removes it on exit
    (a watchdog removes it even if this process dies).
    """
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    pg = _gendurable._TempPostgres.start()
    try:
        yield pg.url
    finally:
        pg.stop()


@dataclass(frozen=True)
class Drained:
    """What :func:`drain` ran: ``steps``, and how they ended."""

    steps: int = 0
    """Steps run."""
    completed: int = 0
    """Steps that completed their instance."""
    discarded: int = 0
    """Steps that discarded it (a discard, or an error on its last attempt)."""
    cancelled: int = 0
    """Steps that cancelled it."""
    retried: int = 0
    """Errors with attempts left (scheduled for a retry)."""
    snoozed: int = 0
    """Steps that snoozed."""
    awaiting: int = 0
    """Steps that ended in an await."""


def _max_steps(v: Optional[int]) -> Optional[int]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"max_steps must be an int, zero or more, got {v!r}")
    return v


def drain(
    engine: Engine,
    queue: str = "default",
    *,
    scheduled: bool = False,
    max_steps: Optional[int] = None,
) -> Drained:
    """Run every runnable instance of ``queue`` to its end in this call, one
    step at a time in pick order (priority, schedule, id), each next step
    included, and return what ran.

    ``scheduled=True`` runs the queue's scheduled instances too (delays,
    retries waiting out their backoff, snoozes) at once, again after every
    step: errors are retried to their last attempt within the drain.
    Instances that await stay awaiting (send them their signal and drain
    again). A workflow that never ends stops the drain after ``max_steps``
    (default 10,000).

    The worker need not run: the drain claims rows as a node of its own, so
    keys, gates, rate limits and timeouts apply as on any node. A running
    worker serving the same queue competes for its rows: drain with an
    engine that is not started."""
    core = engine._steps_loop()
    counts = core.drain(_str("queue", queue), bool(scheduled), _max_steps(max_steps))
    return Drained(*counts)


async def drain_async(
    engine: Engine,
    queue: str = "default",
    *,
    scheduled: bool = False,
    max_steps: Optional[int] = None,
) -> Drained:
    """:func:`drain` for asyncio."""
    core = engine._steps_loop()
    counts = await core.drain_async(_str("queue", queue), bool(scheduled), _max_steps(max_steps))
    return Drained(*counts)


def _query(
    workflow: Any,
    state: Optional[Mapping[str, Any]],
    queue: Optional[str],
    status: Optional[str],
    limit: Optional[int],
) -> tuple:
    return (
        _workflow_name(workflow),
        state,
        None if queue is None else _str("queue", queue),
        None if status is None else _str("status", status),
        limit,
    )


def inserted(
    engine: Engine,
    workflow: Union[str, Any],
    *,
    state: Optional[Mapping[str, Any]] = None,
    queue: Optional[str] = None,
    status: Optional[str] = None,
    limit: Optional[int] = None,
) -> list[Instance]:
    """The instances of ``workflow`` (a name or a decorated workflow), oldest
    first: those whose state contains ``state`` (the fields given, with those
    values: JSON containment, so nested objects match by their fields too),
    in ``queue``, with ``status`` (``"available"``, ``"completed"``...), at
    most ``limit`` (default 1,000)."""
    q = _query(workflow, state, queue, status, limit)
    return [Instance(d) for d in engine._native().inserted(*q)]


async def inserted_async(
    engine: Engine,
    workflow: Union[str, Any],
    *,
    state: Optional[Mapping[str, Any]] = None,
    queue: Optional[str] = None,
    status: Optional[str] = None,
    limit: Optional[int] = None,
) -> list[Instance]:
    """:func:`inserted` for asyncio."""
    q = _query(workflow, state, queue, status, limit)
    return [Instance(d) for d in await engine._native().inserted_async(*q)]


def _describe(
    workflow: Any,
    state: Optional[Mapping[str, Any]],
    queue: Optional[str],
    status: Optional[str],
) -> str:
    parts = [repr(_workflow_name(workflow))]
    if state is not None:
        parts.append(f"state containing {dict(state)!r}")
    if queue is not None:
        parts.append(f"queue {queue!r}")
    if status is not None:
        parts.append(f"status {status!r}")
    return ", ".join(parts)


def _listing(found: list[Instance]) -> str:
    if not found:
        return "none"
    shown = "\n".join(
        f"  id={i.id} step={i.step!r} queue={i.queue!r} status={i.status!r} state={i.state!r}"
        for i in found[:20]
    )
    more = f"\n  ... and {len(found) - 20} more" if len(found) > 20 else ""
    return f"{len(found)}:\n{shown}{more}"


def assert_inserted(
    engine: Engine,
    workflow: Union[str, Any],
    *,
    state: Optional[Mapping[str, Any]] = None,
    queue: Optional[str] = None,
    status: Optional[str] = None,
) -> Instance:
    """Assert that an instance of ``workflow`` matching ``state`` (containment),
    ``queue`` and ``status`` was inserted, and return the oldest match. Raises
    ``AssertionError`` listing the instances of that workflow found instead."""
    found = inserted(engine, workflow, state=state, queue=queue, status=status)
    if found:
        return found[0]
    every = inserted(engine, workflow, limit=21)
    raise AssertionError(
        f"expected an instance of {_describe(workflow, state, queue, status)};"
        f" instances of {_workflow_name(workflow)!r} found: {_listing(every)}"
    )


def refute_inserted(
    engine: Engine,
    workflow: Union[str, Any],
    *,
    state: Optional[Mapping[str, Any]] = None,
    queue: Optional[str] = None,
    status: Optional[str] = None,
) -> None:
    """Assert that no instance of ``workflow`` matching ``state`` (containment),
    ``queue`` and ``status`` was inserted. Raises ``AssertionError`` listing
    the matches."""
    found = inserted(engine, workflow, state=state, queue=queue, status=status, limit=21)
    if found:
        raise AssertionError(
            f"expected no instance of {_describe(workflow, state, queue, status)};"
            f" found {_listing(found)}"
        )
