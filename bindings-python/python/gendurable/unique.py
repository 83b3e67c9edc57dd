"""Unique inserts and idempotency keys: what an insert asks for
(:class:`Unique`) and what it did (:class:`Inserted`).

An insert with ``unique=Unique(...)`` or an ``idempotency_key`` inserts
nothing when an instance with the same identity exists in the chosen
statuses: it reports that instance's id, with ``conflict`` true. The
database decides (a unique index), so racing inserts, from any process or
language, agree on one instance.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

__all__ = ["Inserted", "Unique"]


@dataclass(frozen=True)
class Unique:
    """How an insert is deduplicated; ``Unique()`` takes every default.

    - ``fields``: the state's top-level fields that make the identity, with
      the workflow and the concurrency key (default: the whole state). A
      missing field counts as null.
    - ``period``: seconds (a number or a ``timedelta``, to the millisecond;
      at least 1 s). Duplicates are refused within the same window of this
      length: fixed windows aligned on the Unix epoch, not a sliding one.
      Default: no period.
    - ``states``: the statuses in which an existing instance refuses a
      duplicate: ``"active"`` (scheduled, available, executing, awaiting),
      ``"all"`` (as long as it is kept), or a list that includes the active
      ones. Default: the active ones and ``completed``.

    The core checks the values when the instance is inserted (``InvalidInput``
    with ``field`` ``"unique.fields"``, ``"unique.period"`` or
    ``"unique.states"``). Lists are kept as tuples, so a ``Unique`` is
    hashable.
    """

    fields: Union[Sequence[str], None] = None
    period: Union[float, _dt.timedelta, None] = None
    states: Union[str, Sequence[str], None] = None

    def __post_init__(self) -> None:
        for name in ("fields", "states"):
            v = getattr(self, name)
            if isinstance(v, list):
                object.__setattr__(self, name, tuple(v))


class Inserted(int):
    """What an insert did: the instance's id (this int), and ``conflict``.

    ``conflict`` is true when a unique insert or an idempotency key met an
    existing instance: then nothing was inserted and the id is that
    instance's. An ``Inserted`` is an ``int`` (``==``, hashing, ``str``, JSON
    and SQL parameters are the id's), so code that takes the result of an
    insert as an id keeps working.
    """

    conflict: bool

    def __new__(cls, id: int, conflict: bool = False) -> Inserted:
        self = super().__new__(cls, id)
        self.conflict = bool(conflict)
        return self

    @property
    def id(self) -> int:
        """The id, as a plain ``int``."""
        return int(self)

    def __getnewargs__(self) -> tuple[Any, ...]:  # pickle, copy
        return (int(self), self.conflict)

    def __str__(self) -> str:
        return int.__repr__(self)

    def __repr__(self) -> str:
        return f"Inserted(id={int(self)}, conflict={self.conflict})"
