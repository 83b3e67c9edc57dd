"""Shared fixtures: one PostgreSQL per test session, one schema per test."""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, Callable

import pytest

import gendurable
import gendurable.testing

_counter = itertools.count()


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """DATABASE_URL if set, else a throwaway cluster for the whole session."""
    with gendurable.testing.postgres() as url:
        yield url


@pytest.fixture
def schema() -> str:
    """A fresh schema name, so tests never see each other's rows."""
    return f"t_{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}"


@pytest.fixture
def make_engine(database_url: str, schema: str) -> Iterator[Callable[..., gendurable.Engine]]:
    """Build engines on this test's schema with fast timings; all are shut down after."""
    engines: list[gendurable.Engine] = []

    def make(**options: Any) -> gendurable.Engine:
        options.setdefault("schema", schema)
        options.setdefault("poll_interval", 0.1)
        options.setdefault("backoff", (0.01, 0.05))
        e = gendurable.Engine(database_url, **options)
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.shutdown()


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll a condition held in the database (which has no event to wait on)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Intervals:
    """Thread-safe record of (key, start, end) of step executions."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows: list[tuple[str, float, float]] = []

    def add(self, key: str, start: float, end: float) -> None:
        with self._lock:
            self.rows.append((key, start, end))

    def max_concurrency(self, key: str) -> int:
        events = []
        for k, s, e in self.rows:
            if k == key:
                events.append((s, 1))
                events.append((e, -1))
        # At equal times an end comes before a start: touching is not overlapping.
        events.sort(key=lambda t: (t[0], t[1]))
        cur = best = 0
        for _, d in events:
            cur += d
            best = max(best, cur)
        return best
