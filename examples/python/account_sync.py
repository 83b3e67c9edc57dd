"""Account syncs with gendurable, from Python.

- each account syncs one step at a time (a K = 1 concurrency key per account),
  accounts in parallel;
- while it calls the partner API a sync switches to the partner's key, a gate
  letting 2 calls run at once cluster-wide, and switches back afterwards;
- in this process a bulkhead keeps the mail client to 4 calls at once;
- a sync then waits for a signal (an operator's approval) before finishing.

Run it with a PostgreSQL in DATABASE_URL, or with none (a throwaway cluster is
started from the installed server binaries):

    python examples/python/account_sync.py
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import gendurable
import gendurable.testing
from gendurable import Await, Done, Next

mailer = gendurable.Bulkhead(limit=4, reclaim_after=30, wait=5)


@gendurable.workflow("Account.Sync")
class AccountSync:
    """start -> fetch (gated partner API) -> notify -> await approval -> finish."""

    def start(self, state, ctx):
        # Runs under the account's key; the next step runs under the partner gate.
        return Next("fetch", state, concurrency_key=("partner", "api"))

    async def fetch(self, state, ctx):
        await asyncio.sleep(0.05)  # the partner API call
        records = 10 * state["account"]
        return Next(
            "notify",
            {**state, "records": records},
            concurrency_key=("account", state["account"]),
        )

    def notify(self, state, ctx):
        with mailer:  # at most 4 mails in flight from this process
            time.sleep(0.01)
        return Await("finish", state, signal="approve", timeout=60)

    def finish(self, state, ctx):
        approved = ctx.wake is not None and not ctx.wake.timeout
        finished.release()
        return Done({**state, "approved": approved, "by": ctx.wake.payload if approved else None})


finished = threading.Semaphore(0)


def main() -> None:
    with gendurable.testing.postgres() as url:
        engine = gendurable.Engine(
            url,
            schema=os.environ.get("EXAMPLE_SCHEMA", "example_accounts"),
            queues={"default": 8},
            concurrency_limits={"partner": {"limit": 2}},
            workflows=[AccountSync],
            poll_interval=0.1,
        )
        accounts = range(1, 6)
        ids = engine.insert_many(
            [
                gendurable.NewInstance(AccountSync, {"account": a}, concurrency_key=("account", a))
                for a in accounts
            ]
        )
        print(f"inserted {len(ids)} syncs: {ids}")
        with engine:  # starts the worker; shuts it down gracefully on exit
            deadline = time.monotonic() + 60
            while sum(engine.get(i).status == "awaiting" for i in ids) < len(ids):
                if time.monotonic() > deadline:
                    raise SystemExit("the syncs did not all reach their approval within 60 s")
                time.sleep(0.05)
            print(f"all awaiting approval; woke {engine.signal('approve', 'ops@example.com')}")
            for _ in ids:
                if not finished.acquire(timeout=60):
                    raise SystemExit("a sync did not finish within 60 s of its approval")
        for i in ids:
            inst = engine.get(i)
            print(f"  #{inst.id} {inst.status}: {inst.state}")


if __name__ == "__main__":
    main()
