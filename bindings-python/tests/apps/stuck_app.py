"""A worker app for the second-interrupt test, run as
`gendurable worker apps.stuck_app:engine`.

Its steps, a `def` and an `async def` one, tell the test they started (a
file each) and never finish on their own; the shutdown timeout is long, so
only a second interrupt stops them.
"""

import asyncio
import os
import time
from pathlib import Path

import gendurable

engine = gendurable.Engine(
    schema=os.environ["GENDURABLE_SCHEMA"],
    queues={"default": 4},
    shutdown_timeout=600,
    poll_interval=0.1,
)


@engine.workflow("Stuck.Sync")
def stuck_sync(step, state, ctx):
    Path(state["started"]).write_text(str(ctx.id))
    while True:
        time.sleep(0.05)


@engine.workflow("Stuck.Async")
async def stuck_async(step, state, ctx):
    Path(state["started"]).write_text(str(ctx.id))
    await asyncio.sleep(3600)
    return gendurable.Done(state)
