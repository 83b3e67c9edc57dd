"""gendurable through its Python binding: the same engine as the Rust runner,
with the jobs written as Python `def` steps (run on worker threads). W2 keys
are K = 1 concurrency keys, W3 one key of a gate with limit 10."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import gendurable
import psycopg
from gendurable import Done, NewInstance

from common import GATE, KEYS, PAUSE, Records, emit, latencies, now_ns, paced_inserts, parse_args

SYSTEM = "gendurable-py"


async def main() -> None:
    args = parse_args(SYSTEM)
    url = os.environ["DATABASE_URL"]
    gates = {"api": {"limit": GATE}} if args.workload == "w3" else {}
    engine = gendurable.Engine(url, queues={"default": args.concurrency}, concurrency_limits=gates)
    records, started, done, lock = Records(), {}, [0], threading.Lock()
    pause = PAUSE[args.workload]

    @engine.workflow("Job")
    def job(step, state, ctx):
        start = now_ns()
        if pause:
            time.sleep(pause)
        with lock:
            started[state["i"]] = start
            records.add(ctx.concurrency_key, start, now_ns())
            done[0] += 1
        return Done(state)

    def new(i: int) -> NewInstance:
        # "k:17" is a K = 1 key; "api:1" falls under the gate named "api".
        key = {"w2": f"k:{i % KEYS}", "w3": "api:1"}.get(args.workload)
        return NewInstance("Job", {"i": i}, concurrency_key=key)

    async def finished() -> None:
        while done[0] < args.jobs:
            await asyncio.sleep(0.002)
        sql = (
            "SELECT count(*) FROM gendurable.instances"
            " WHERE status NOT IN ('completed', 'cancelled', 'discarded')"
        )
        with psycopg.connect(url, autocommit=True) as conn:
            while conn.execute(sql).fetchone()[0]:
                await asyncio.sleep(0.005)

    extra = {}
    if args.workload == "w4":
        engine.start()
        await asyncio.sleep(1)  # idle and listening
        t = time.perf_counter()
        before = await paced_inserts(args.jobs, lambda i: engine.insert_async("Job", {"i": i}))
        await finished()
        extra = latencies(before, started)
    else:
        t = time.perf_counter()
        engine.insert_many([new(i) for i in range(args.jobs)])
        if args.workload == "w1":
            extra = {"insert_per_s": args.jobs / (time.perf_counter() - t)}
        t = time.perf_counter()
        engine.start()
        await finished()
    seconds = time.perf_counter() - t
    engine.shutdown()
    records.write(args.record)
    emit(SYSTEM, args.workload, args.jobs, seconds, **extra)


if __name__ == "__main__":
    asyncio.run(main())
