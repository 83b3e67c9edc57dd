"""gendurable: a durable step engine on PostgreSQL.

Instances of workflows are rows; worker nodes claim runnable instances, run
the workflow's code for the current step and write the step's transition back
in one transaction. Concurrency keys (K at a time per key, cluster-wide),
gates and rate limits are enforced by the database; the :class:`Bulkhead`
caps calls to a service from this process.

    import gendurable
    from gendurable import Done, Next

    engine = gendurable.Engine(queues={"default": 10})

    @engine.workflow("Account.Sync")
    class AccountSync:
        def start(self, state, ctx):
            return Next("finish", {**state, "fetched": True})

        async def finish(self, state, ctx):
            return Done(state)

    engine.insert("Account.Sync", {"id": 7}, concurrency_key=("account", 7))
    engine.run()   # until SIGTERM or Ctrl-C
"""

from ._gendurable import __version__
from .bulkhead import Bulkhead, Permit
from .context import Context, Wake
from .cron import Cron
from .engine import Acted, Cancelled, Delivery, Engine, Instance, NewInstance, step, workflow
from .errors import (
    CannotConnect,
    Contended,
    DatabaseError,
    EmbeddedPostgresError,
    Error,
    InvalidConfig,
    InvalidInput,
    MigrationError,
    NotFound,
    Saturated,
    ShutDown,
)
from .sql import enqueue, enqueue_async, enqueue_sql
from .transitions import KEEP, Await, Cancel, Discard, Done, Next, Snooze, Transition
from .unique import Inserted, Unique

__all__ = [
    "KEEP",
    "Acted",
    "Await",
    "Bulkhead",
    "Cancel",
    "Cancelled",
    "CannotConnect",
    "Contended",
    "Context",
    "Cron",
    "DatabaseError",
    "Delivery",
    "Discard",
    "Done",
    "EmbeddedPostgresError",
    "Engine",
    "Error",
    "Inserted",
    "Instance",
    "InvalidConfig",
    "InvalidInput",
    "MigrationError",
    "NewInstance",
    "Next",
    "NotFound",
    "Permit",
    "Saturated",
    "ShutDown",
    "Snooze",
    "Transition",
    "Unique",
    "Wake",
    "__version__",
    "enqueue",
    "enqueue_async",
    "enqueue_sql",
    "step",
    "workflow",
]
