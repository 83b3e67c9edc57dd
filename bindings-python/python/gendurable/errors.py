"""The exceptions gendurable raises.

Every error is a :class:`gendurable.Error`. Input and configuration errors are
raised before anything is written, so a call that raised them changed nothing.
"""

from __future__ import annotations

from typing import Optional

__all__ = [
    "CannotConnect",
    "Contended",
    "DatabaseError",
    "EmbeddedPostgresError",
    "Error",
    "InvalidConfig",
    "InvalidInput",
    "MigrationError",
    "NotFound",
    "Saturated",
    "ShutDown",
]


class Error(Exception):
    """The base class of gendurable's errors.

    It doubles as the ``error`` transition: a step that returns
    ``gendurable.Error("reason")`` (or any exception instance) fails this
    attempt; it is retried with backoff until ``max_attempts``, then
    discarded. ``detail`` is recorded with the reason (a traceback, say).
    Its subclass :class:`gendurable.Discard`, returned or raised, is a
    permanent error: the instance is discarded at once.
    """

    def __init__(self, message: str = "", *, detail: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail

    def __str__(self) -> str:
        return self.message


class InvalidInput(Error, ValueError):
    """An argument is not acceptable; ``field`` names it (``"state"``, ``"concurrency_key"``...)."""

    def __init__(self, message: str = "", *, field: str = "value") -> None:
        super().__init__(message)
        self.field = field


class InvalidConfig(Error, ValueError):
    """The engine's or a bulkhead's configuration is not acceptable."""


class NotFound(Error, LookupError):
    """No instance has this id (``id``)."""

    def __init__(self, message: str = "", *, id: Optional[int] = None) -> None:
        super().__init__(message)
        self.id = id


class ShutDown(Error):
    """The engine has been shut down."""


class DatabaseError(Error):
    """The database refused or failed a statement, or the connection broke.

    ``transient`` is true when retrying later may succeed (a broken
    connection, a server restarting or taking no writes, a deadlock, a
    lock or statement timeout).
    """

    def __init__(self, message: str = "", *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class CannotConnect(DatabaseError):
    """The database could not be reached; the message says where and why.

    ``cause`` is one of ``"refused"`` (nothing listens there),
    ``"unknown_host"``, ``"auth"`` (the user or its password was refused),
    ``"no_database"``, ``"not_ready"`` (the server is starting or stopping),
    ``"timeout"`` (no answer within ``connect_timeout``) and ``"other"``.
    """

    def __init__(self, message: str = "", *, cause: str = "other", transient: bool = False) -> None:
        super().__init__(message, transient=transient)
        self.cause = cause


class MigrationError(DatabaseError):
    """Creating or upgrading the engine's schema failed."""


class EmbeddedPostgresError(Error):
    """A throwaway PostgreSQL (``gendurable.testing.postgres``) could not be started."""


class Saturated(Error):
    """A bulkhead had no permit to give within the caller's wait budget.

    This is backpressure, not a failure of the service: shed the call, retry
    later or degrade.
    """


class Contended(Error):
    """Concurrent writers kept a unique insert from finishing.

    A unique insert (or an idempotency key) met a holder of its identity
    that finished, and so stopped holding it, before the insert could read
    it back, five times in a row: those rows were not inserted (the other
    rows of an ``insert_many`` were). It is transient: retrying succeeds
    (``transient`` is always true); a retried batch reports its unique rows
    already in as conflicts.
    """

    transient = True
