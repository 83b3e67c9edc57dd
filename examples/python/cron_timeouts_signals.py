"""Periodic workflows, step timeouts and durable signals with gendurable, from
Python.

- a cron entry inserts ``Ops.Heartbeat`` every two seconds (a six-field
  schedule, seconds first); each tick is inserted once however many workers
  run it: the example waits for two ticks;
- ``Payment.Capture`` gives its ``capture`` step 0.5 s: the gateway hangs on
  the first attempt, whose task is cancelled at the deadline
  (``asyncio.CancelledError``) and recorded as an error of kind ``timeout``;
  the retry goes through;
- ``Refund.Approve`` awaits an ``approved`` signal, which the approver sends
  while the refund is still being prepared: ``send`` keeps it, and the
  refund takes it the moment it awaits.

Run it with a PostgreSQL in DATABASE_URL, or with none (a throwaway cluster is
started from the installed server binaries):

    python examples/python/cron_timeouts_signals.py
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import gendurable
import gendurable.testing
from gendurable import Await, Cron, Delivery, Done, Next

ticks = threading.Semaphore(0)
gateway_cancelled = threading.Event()
preparing = threading.Event()
prepared = threading.Event()


@gendurable.workflow("Ops.Heartbeat")
def heartbeat(step, state, ctx):
    ticks.release()
    return Done(state)


@gendurable.workflow("Payment.Capture", max_attempts=3, backoff=(0.1, 0.2))
class Capture:
    @gendurable.step(timeout=0.5)
    async def start(self, state, ctx):
        if ctx.attempt == 1:
            try:
                await asyncio.Event().wait()  # the gateway never answers
            except asyncio.CancelledError:
                gateway_cancelled.set()
                raise
        return Next("receipt", {**state, "captured": True})

    def receipt(self, state, ctx):
        return Done({**state, "receipt": f"R-{state['order']}"})


@gendurable.workflow("Refund.Approve")
class Approve:
    def start(self, state, ctx):
        preparing.set()
        prepared.wait(30)  # preparing the refund takes a while
        return Await("refund", state, signal="approved", timeout=3600)

    def refund(self, state, ctx):
        return Done({**state, "approved_by": ctx.wake.payload["by"]})


def wait_final(engine: gendurable.Engine, id: int) -> gendurable.Instance:
    """The database holds the outcome: look until the instance has finished."""
    deadline = time.monotonic() + 30
    while not (i := engine.get(id)).finished:
        if time.monotonic() > deadline:
            raise SystemExit(f"instance {id} did not finish: {i!r}")
        time.sleep(0.05)
    return i


def main() -> None:
    with gendurable.testing.postgres() as url:
        engine = gendurable.Engine(
            url,
            schema=os.environ.get("EXAMPLE_SCHEMA", "example_cron"),
            queues={"default": 4},
            workflows=[heartbeat, Capture, Approve],
            cron=[Cron("*/2 * * * * *", heartbeat, {"from": "cron"}, name="heartbeat")],
            poll_interval=0.1,
        )
        with engine:
            capture = engine.insert(Capture, {"order": 7})
            refund = engine.insert(Approve, {"order": 7, "cents": 500})

            # The approver answers before the refund awaits: the signal is kept.
            assert preparing.wait(30)
            delivery = engine.send(refund, "approved", {"by": "ops@example.com"})
            print(f"approval sent while the refund is prepared: {delivery.value}")
            assert delivery is Delivery.KEPT
            prepared.set()

            assert gateway_cancelled.wait(30)
            print("the hanging gateway call was cancelled at its deadline")
            c = wait_final(engine, capture)
            kinds = [e["kind"] for e in c.errors]
            print(f"capture: {c.status} after {kinds} errors, state {c.state}")

            r = wait_final(engine, refund)
            print(f"refund: {r.status}, approved by {r.state['approved_by']}")

            for n in (1, 2):
                if not ticks.acquire(timeout=30):
                    raise SystemExit("no cron tick")
                print(f"heartbeat tick {n}")


if __name__ == "__main__":
    main()
