"""A worker process for `gendurable worker`, with an async workflow.

In one terminal, run the worker (until Ctrl-C or SIGTERM), from this directory:
``DATABASE_URL=postgres://... gendurable worker worker_app:engine``

In another, insert some work: ``DATABASE_URL=postgres://... python worker_app.py 5``
"""

from __future__ import annotations

import asyncio
import sys

import gendurable
from gendurable import Done, Next, Snooze

engine = gendurable.Engine(
    queues={"default": 20, "mail": 5},
    concurrency_limits={"mailer": {"limit": 3}},
)

smtp = gendurable.Bulkhead(limit=5, reclaim_after=60, wait=1.0)


@engine.workflow("Newsletter.Send")
class Send:
    async def start(self, state, ctx):
        # Render, then send under the mailer gate: 3 sends at once, cluster-wide.
        body = f"Hello {state['to']}!"
        return Next("send", {**state, "body": body}, concurrency_key=("mailer", "smtp"))

    async def send(self, state, ctx):
        try:
            async with smtp:  # and at most 5 SMTP calls from this process
                await asyncio.sleep(0.1)  # the SMTP conversation
        except gendurable.Saturated:
            return Snooze(1.0)  # busy: try again soon, not an error
        return Done({**state, "sent": True})


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    ids = engine.insert_many(
        [gendurable.NewInstance(Send, {"to": f"reader{i}@example.com"}) for i in range(n)]
    )
    print("inserted", ids)
