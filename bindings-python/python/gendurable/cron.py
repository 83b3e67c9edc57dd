"""Periodic workflows: :class:`Cron` entries, given to ``Engine(cron=[...])``.

Every started engine (node) runs the entries; each tick is inserted once
cluster-wide, whatever the number of nodes: the database decides (see
docs/cron.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

from .transitions import ConcurrencyKey
from .unique import Unique

__all__ = ["Cron"]


@dataclass(frozen=True, init=False)
class Cron:
    """Insert an instance of ``workflow`` at every tick of ``schedule``.

    ``schedule``: five cron fields (minute, hour, day of month, month, day of
    week), or six with seconds first (``"*/10 * * * * *"``), or ``@hourly``,
    ``@daily``, ``@weekly``, ``@monthly``, ``@yearly``. ``workflow``: a name or
    a decorated workflow. The instance gets ``state`` and the insert options
    given (``step``, ``queue``, ``priority``, ``concurrency_key``,
    ``rate_limit``, ``max_attempts``, ``unique``, ``idempotency_key``, as
    :meth:`Engine.insert` takes them), scheduled at the tick's time; the
    workflow's declared defaults apply as to any insert.

    - ``name``: identifies the entry across nodes (default: the workflow's
      name); two entries of one workflow need names of their own.
    - ``timezone``: an IANA name (``"Europe/Paris"``) the schedule is read in
      (default UTC).
    - ``missed``: ticks that passed while no node ran the entry: ``"latest"``
      (default: the latest one, once), ``"all"`` (each, oldest first) or
      ``"skip"`` (none older than a minute).

    The core checks the entry when the engine is made
    (:class:`gendurable.InvalidConfig` naming the entry).
    """

    schedule: str
    workflow: str
    state: Optional[Mapping[str, Any]] = None
    name: Optional[str] = None
    timezone: Optional[str] = None
    missed: str = "latest"
    step: Optional[str] = None
    queue: Optional[str] = None
    priority: Optional[int] = None
    concurrency_key: Optional[ConcurrencyKey] = None
    rate_limit: Optional[str] = None
    max_attempts: Optional[int] = None
    unique: Optional[Unique] = None
    idempotency_key: Optional[str] = None

    def __init__(
        self,
        schedule: str,
        workflow: Union[str, Any],
        state: Optional[Mapping[str, Any]] = None,
        *,
        name: Optional[str] = None,
        timezone: Optional[str] = None,
        missed: str = "latest",
        step: Optional[str] = None,
        queue: Optional[str] = None,
        priority: Optional[int] = None,
        concurrency_key: Optional[ConcurrencyKey] = None,
        rate_limit: Optional[str] = None,
        max_attempts: Optional[int] = None,
        unique: Optional[Unique] = None,
        idempotency_key: Optional[str] = None,
    ) -> None:
        from .engine import _workflow_name

        values = {
            "schedule": schedule,
            "workflow": _workflow_name(workflow),
            "state": state,
            "name": name,
            "timezone": timezone,
            "missed": missed,
            "step": step,
            "queue": queue,
            "priority": priority,
            "concurrency_key": concurrency_key,
            "rate_limit": rate_limit,
            "max_attempts": max_attempts,
            "unique": unique,
            "idempotency_key": idempotency_key,
        }
        for k, v in values.items():
            object.__setattr__(self, k, v)

    def __hash__(self) -> int:
        # Not the state's: a dict.
        return hash((self.schedule, self.workflow, self.name, self.timezone, self.missed))
