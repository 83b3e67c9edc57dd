"""A worker app for the SIGTERM test, run as `gendurable worker apps.sigterm_app:engine`.

Its one step tells the test it started (a file), then blocks reading a FIFO
that the test writes to only after it has sent SIGTERM.
"""

import os
from pathlib import Path

import gendurable
from gendurable import Done

engine = gendurable.Engine(
    schema=os.environ["GENDURABLE_SCHEMA"],
    queues={"default": 2},
    shutdown_timeout=60,
    poll_interval=0.1,
)


@engine.workflow("Term.Slow")
def slow(step, state, ctx):
    Path(state["started"]).write_text(str(ctx.id))
    with open(state["release"]) as fifo:  # blocks until the test writes
        word = fifo.read().strip()
    return Done({**state, "finished_with": word})
