"""procrastinate runner: W2 keys are procrastinate `lock`s (jobs sharing a lock
run one at a time, enforced in the database). It has no limit above one per
key, so W3 is reported unsupported. W5: the key is a lock; procrastinate has
no limit above one per key and no rate limit, so no gate or rate rows."""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict

import procrastinate

from common import (
    PAUSE,
    W5_PAUSE,
    Records,
    Spans,
    emit,
    key_of,
    latencies,
    now_ns,
    paced_inserts,
    parse_args,
    unsupported,
    w5,
)

SYSTEM = "procrastinate"


async def main() -> None:
    args = parse_args(SYSTEM)
    if args.workload == "w3":
        unsupported(SYSTEM, "w3", "no concurrency limit above 1 per key (lock = one at a time)")
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ["DATABASE_URL"]))
    if args.workload == "w5":
        return await run_w5(args, app)
    records, started, done = Records(), {}, [0]
    pause = PAUSE[args.workload]

    @app.task(name="job", pass_context=True)
    async def job(context, i: int) -> None:
        start = now_ns()
        if pause:
            await asyncio.sleep(pause)
        started[i] = start
        records.add(context.job.lock, start, now_ns())
        done[0] += 1

    async with app.open_async():
        await app.schema_manager.apply_schema_async()

        async def finished() -> None:
            while done[0] < args.jobs:
                await asyncio.sleep(0.002)
            sql = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
            while (await app.connector.execute_query_one_async(sql))["count"]:
                await asyncio.sleep(0.005)

        def start_worker() -> asyncio.Task:
            return worker_task(app, args.concurrency)

        extra = {}
        if args.workload == "w4":
            worker = start_worker()
            await asyncio.sleep(1)  # idle and listening
            t = time.perf_counter()
            before = await paced_inserts(args.jobs, lambda i: job.defer_async(i=i))
            await finished()
            extra = latencies(before, started)
        else:
            by_lock = defaultdict(list)  # a deferrer carries one lock: one batch per key
            for i in range(args.jobs):
                by_lock[key_of(args.workload, i)].append({"i": i})
            t = time.perf_counter()
            for lock, batch in by_lock.items():
                await job.configure(lock=lock).batch_defer_async(*batch)
            if args.workload == "w1":
                extra = {"insert_per_s": args.jobs / (time.perf_counter() - t)}
            # Fresh statistics after the bulk insert, before the clock, as PostgreSQL
            # advises after a bulk load (every runner does: benchmarks/README.md, Results).
            await app.connector.execute_query_async("ANALYZE procrastinate_jobs")
            t = time.perf_counter()
            worker = start_worker()
            await finished()
        seconds = time.perf_counter() - t
        worker.cancel()  # a graceful stop in procrastinate
        await asyncio.gather(worker, return_exceptions=True)
    records.write(args.record)
    emit(SYSTEM, args.workload, args.jobs, seconds, **extra)


def worker_task(app: procrastinate.App, concurrency: int) -> asyncio.Task:
    # listen_notify wakes the worker on inserts; the short polling interval
    # bounds the wait after a fetch found every remaining key locked.
    return asyncio.create_task(
        app.run_worker_async(
            concurrency=concurrency,
            listen_notify=True,
            fetch_job_polling_interval=0.1,
            install_signal_handlers=False,
        )
    )


async def run_w5(args, app: procrastinate.App) -> None:
    spans = Spans()

    @app.task(name="key")
    async def key() -> None:
        i = spans.start("key")
        await asyncio.sleep(W5_PAUSE)
        spans.end(i)

    @app.task(name="free")
    async def free() -> None:
        spans.end(spans.start("free"))

    deferrers = {"key": key.configure(lock="acct:1"), "free": free.configure()}
    first_free, worker = [], []

    async def insert(kind: str, n: int) -> None:
        ids = await deferrers[kind].batch_defer_async(*([{}] * n))
        if kind == "free" and not first_free:
            first_free.append(min(ids))

    async def free_left() -> int:
        # Done rows stay (status 'succeeded'); the free rows are the last ids.
        sql = "SELECT count(*) FROM procrastinate_jobs WHERE id >= %(id)s AND status IN ('todo', 'doing')"
        return (await app.connector.execute_query_one_async(sql, id=first_free[0]))["count"]

    async def start_worker() -> None:
        worker.append(worker_task(app, args.concurrency))

    async def stop_worker() -> None:
        worker[0].cancel()  # a graceful stop in procrastinate
        await asyncio.gather(worker[0], return_exceptions=True)

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        await w5(SYSTEM, args, spans, {"key", "free"}, insert, start_worker, free_left, stop_worker, 10_000)


if __name__ == "__main__":
    asyncio.run(main())
