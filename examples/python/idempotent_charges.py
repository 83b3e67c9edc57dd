"""Idempotent charges and unique reports with gendurable, from Python.

- a client retries its "charge order N" request (a timeout, a double click):
  every attempt inserts with the idempotency key ``charge:N``, from several
  threads at once, and each order is charged once; every attempt is told the
  id of the one charge;
- a retry after the charge completed still gets that charge back (by default
  a completed instance keeps its key);
- a report is unique per account and hour: a second request for the same
  account within the hour, whoever asks, gets the first report.

Run it with a PostgreSQL in DATABASE_URL, or with none (a throwaway cluster is
started from the installed server binaries):

    python examples/python/idempotent_charges.py
"""

from __future__ import annotations

import os
import threading
from collections import Counter

import gendurable
import gendurable.testing
from gendurable import Done, Unique

charged: Counter[int] = Counter()  # order -> how many times its charge step ran
lock = threading.Lock()
finished = threading.Semaphore(0)


@gendurable.workflow("Order.Charge")
def charge(step, state, ctx):
    with lock:
        charged[state["order"]] += 1
    finished.release()
    return Done({**state, "charged": True})


@gendurable.workflow("Account.Report")
def report(step, state, ctx):
    return Done(state)


def main() -> None:
    with gendurable.testing.postgres() as url:
        engine = gendurable.Engine(
            url,
            schema=os.environ.get("EXAMPLE_SCHEMA", "example_charges"),
            queues={"default": 4},
            workflows=[charge, report],
            poll_interval=0.1,
        )
        orders, attempts = range(1, 6), 4
        told: dict[int, set[int]] = {o: set() for o in orders}
        inserted = Counter()

        def client(order: int, attempt: int) -> None:
            r = engine.insert(
                charge, {"order": order, "attempt": attempt}, idempotency_key=f"charge:{order}"
            )
            with lock:
                told[order].add(r.id)
                inserted[order] += not r.conflict

        with engine:  # starts the worker; shuts it down gracefully on exit
            clients = [
                threading.Thread(target=client, args=(o, a))
                for o in orders
                for a in range(attempts)
            ]
            for c in clients:
                c.start()
            for c in clients:
                c.join()
            for _ in orders:
                if not finished.acquire(timeout=60):
                    raise SystemExit("a charge did not run within 60 s")
            ids = {o: told[o].pop() for o in orders if len(told[o]) == 1}
            if len(ids) != len(orders) or set(inserted.values()) != {1}:
                raise SystemExit(f"not one charge per order: {told}, {inserted}")
            print(f"{len(orders) * attempts} requests for {len(orders)} orders: charges {ids}")

            retry = engine.insert(charge, {"order": 1}, idempotency_key="charge:1")
            print(f"a retry after the charge: {retry!r} (the charge of order 1: {ids[1]})")

            hourly = Unique(fields=["account"], period=3600)
            first = engine.insert(report, {"account": 7, "asked_by": "ops"}, unique=hourly)
            second = engine.insert(report, {"account": 7, "asked_by": "cron"}, unique=hourly)
            print(f"report for account 7: {first!r}; asked again: {second!r}")

        for o in orders:
            inst = engine.get(ids[o])
            print(f"  order {o}: #{inst.id} {inst.status}, charged {charged[o]} time(s)")
        if set(charged.values()) != {1}:
            raise SystemExit(f"an order was charged more than once: {charged}")


if __name__ == "__main__":
    main()
