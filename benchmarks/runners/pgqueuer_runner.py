"""pgqueuer runner: W2 keys are entrypoints with concurrency_limit=1, W3 one
entrypoint with concurrency_limit=10 (both enforced in the database). W5: the
gate and the key are entrypoints with concurrency_limit 10 and 1; pgqueuer has
no rate limit since 1.0 (requests_per_second was removed), so no rate rows."""

from __future__ import annotations

import asyncio
import os
import time

import asyncpg
from pgqueuer import PgQueuer, Queries
from pgqueuer.db import AsyncpgDriver

from common import (
    GATE,
    KEYS,
    PAUSE,
    W5_GATE,
    W5_KEY,
    W5_PAUSE,
    Records,
    Spans,
    emit,
    key_of,
    latencies,
    now_ns,
    paced_inserts,
    parse_args,
    w5,
    wait_until,
)

SYSTEM = "pgqueuer"
BATCH = 10  # dequeue batch; pgqueuer wants max_concurrent_tasks >= 2 * batch


async def main() -> None:
    args = parse_args(SYSTEM)
    url = os.environ["DATABASE_URL"]
    client = Queries(AsyncpgDriver(await asyncpg.connect(url)))
    await client.install()

    pgq = PgQueuer(AsyncpgDriver(await asyncpg.connect(url)))
    if args.workload == "w5":
        return await run_w5(args, client, pgq)
    records, started, done = Records(), {}, [0]
    pause = PAUSE[args.workload]

    async def job(job) -> None:
        start = now_ns()
        if pause:
            await asyncio.sleep(pause)
        if args.workload == "w4":
            started[int(job.payload)] = start
        records.add(job.entrypoint, start, now_ns())
        done[0] += 1

    if args.workload == "w2":
        for k in range(KEYS):
            pgq.entrypoint(f"k{k}", concurrency_limit=1)(job)
    elif args.workload == "w3":
        pgq.entrypoint("api", concurrency_limit=GATE)(job)
    else:
        pgq.entrypoint("job")(job)

    def entrypoint(i: int) -> str:
        return key_of(args.workload, i) or "job"

    async def remaining() -> int:
        return (await client.driver.fetch("SELECT count(*) AS n FROM pgqueuer"))[0]["n"]

    async def finished() -> None:
        await wait_until(lambda: done[0] >= args.jobs)
        while await remaining():
            await asyncio.sleep(0.005)

    def start_worker() -> asyncio.Task:
        return asyncio.create_task(pgq.run(batch_size=BATCH, max_concurrent_tasks=args.concurrency))

    extra = {}
    if args.workload == "w4":
        worker = start_worker()
        await asyncio.sleep(1)  # idle and listening
        t = time.perf_counter()
        before = await paced_inserts(args.jobs, lambda i: client.enqueue("job", str(i).encode(), 0))
        await finished()
        extra = latencies(before, started)
    else:
        n = args.jobs
        t = time.perf_counter()
        await client.enqueue([entrypoint(i) for i in range(n)], [None] * n, [0] * n)
        extra = {"insert_per_s": n / (time.perf_counter() - t)} if args.workload == "w1" else {}
        # Fresh statistics after the bulk insert, before the clock, as PostgreSQL
        # advises after a bulk load (every runner does: benchmarks/README.md, Results).
        await client.driver.execute("ANALYZE pgqueuer")
        t = time.perf_counter()
        worker = start_worker()
        await finished()
    seconds = time.perf_counter() - t
    pgq.shutdown.set()
    await asyncio.wait_for(worker, 30)
    records.write(args.record)
    emit(SYSTEM, args.workload, args.jobs, seconds, **extra)


async def run_w5(args, client: Queries, pgq: PgQueuer) -> None:
    spans = Spans()

    async def job(job) -> None:
        i = spans.start(job.entrypoint)
        if job.entrypoint != "free":
            await asyncio.sleep(W5_PAUSE)
        spans.end(i)

    pgq.entrypoint("gate", concurrency_limit=W5_GATE)(job)
    pgq.entrypoint("key", concurrency_limit=W5_KEY)(job)
    pgq.entrypoint("free")(job)
    first_free = []

    async def insert(kind: str, n: int) -> None:
        ids = await client.enqueue([kind] * n, [None] * n, [0] * n)
        if kind == "free" and not first_free:
            first_free.append(min(ids))

    async def free_left() -> int:
        # Done rows leave the table; the free rows are the last ids.
        sql = "SELECT count(*) AS n FROM pgqueuer WHERE id >= $1"
        return (await client.driver.fetch(sql, first_free[0]))[0]["n"]

    worker = []

    async def start_worker() -> None:
        worker.append(asyncio.create_task(pgq.run(batch_size=BATCH, max_concurrent_tasks=args.concurrency)))

    async def stop_worker() -> None:
        pgq.shutdown.set()
        await asyncio.wait_for(worker[0], 30)

    kinds = {"gate", "key", "free"}
    await w5(SYSTEM, args, spans, kinds, insert, start_worker, free_left, stop_worker, 50_000)


if __name__ == "__main__":
    asyncio.run(main())
