"""Helpers for tests: a throwaway PostgreSQL."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from . import _gendurable

__all__ = ["postgres"]


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
