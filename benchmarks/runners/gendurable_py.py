"""gendurable through its Python binding: the same engine as the Rust runner,
with the jobs written as Python `def` steps (run on worker threads). W2 keys
are K = 1 concurrency keys, W3 one key of a gate with limit 10. W5: the gate
is the key `api:1` under the gate `api` (limit 10), the key the K = 1 key
`acct:1`, the rate the rate-limit key `rl:1` (50 a second, burst 5)."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import gendurable
import psycopg
from gendurable import Done, NewInstance

from common import (
    GATE,
    KEYS,
    PAUSE,
    W5_GATE,
    W5_PAUSE,
    W5_RATE,
    W5_RATE_BURST,
    Records,
    Spans,
    emit,
    latencies,
    now_ns,
    paced_inserts,
    parse_args,
    w5,
)

SYSTEM = "gendurable-py"


async def main() -> None:
    args = parse_args(SYSTEM)
    url = os.environ["DATABASE_URL"]
    if args.workload == "w5":
        return await run_w5(args, url)
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

    # The rows not finished are counted over a connection opened before the
    # clock starts (the Rust runner counts through its engine, the Elixir
    # runner through its worker's pool): a connection opened at the end cost
    # a few milliseconds of a W1 run of half a second.
    count = psycopg.connect(url, autocommit=True)

    async def finished() -> None:
        while done[0] < args.jobs:
            await asyncio.sleep(0.002)
        sql = (
            "SELECT count(*) FROM gendurable.instances"
            " WHERE status NOT IN ('completed', 'cancelled', 'discarded')"
        )
        while count.execute(sql).fetchone()[0]:
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
    count.close()
    engine.shutdown()
    records.write(args.record)
    emit(SYSTEM, args.workload, args.jobs, seconds, **extra)


async def run_w5(args, url: str) -> None:
    engine = gendurable.Engine(
        url,
        queues={"default": args.concurrency},
        concurrency_limits={"api": {"limit": W5_GATE}},
        # Up to 5 starts back to back, as in the Rust runner (cli/src/w5.rs).
        rate_limits={"rl": {"limit": W5_RATE, "period": 1, "burst": W5_RATE_BURST}},
    )
    spans = Spans()
    kinds = {"api:1": "gate", "acct:1": "key"}

    @engine.workflow("Job")
    def job(step, state, ctx):
        kind = kinds.get(ctx.concurrency_key) or ("rate" if ctx.rate_limit else "free")
        i = spans.start(kind)
        if kind in ("gate", "key"):
            time.sleep(W5_PAUSE)
        spans.end(i)
        return Done(state)

    options = {
        "gate": {"concurrency_key": "api:1"},
        "key": {"concurrency_key": "acct:1"},
        "rate": {"rate_limit": "rl:1"},
        "free": {},
    }
    free_ids: list[int] = []

    async def insert(kind: str, n: int) -> None:
        ids = engine.insert_many([NewInstance("Job", {}, **options[kind]) for _ in range(n)])
        if kind == "free":
            free_ids[:] = [min(ids + free_ids), max(ids + free_ids)]

    conn = psycopg.connect(url, autocommit=True)

    async def free_left() -> int:
        # Done rows stay (completed). The free rows' ids, both bounds: on a
        # table not analysed since the backlogs went in, `id >= first` alone
        # was planned as a scan of all 2.1 million rows (0.3 s a poll).
        sql = (
            "SELECT count(*) FROM gendurable.instances WHERE id BETWEEN %s AND %s"
            " AND status NOT IN ('completed', 'cancelled', 'discarded')"
        )
        return conn.execute(sql, (free_ids[0], free_ids[1])).fetchone()[0]

    async def start_worker() -> None:
        engine.start()

    async def stop_worker() -> None:
        engine.shutdown()

    await w5(SYSTEM, args, spans, set(options), insert, start_worker, free_left, stop_worker, 50_000)
    conn.close()


if __name__ == "__main__":
    asyncio.run(main())
