"""DBOS runner: a job is a DBOS workflow (no steps) on a DBOS queue with
worker_concurrency=20. W2 uses a partitioned queue (partition_concurrency=1,
the partition key is the job's key), W3 a queue with global_concurrency=10;
both limits are enforced in the database. W5: a queue per kind, as DBOS's
limits are a queue's: the gate's with global_concurrency=10, the key's
partitioned with partition_concurrency=1, the rate's with a limiter of 50 per
second, the free jobs' with none."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy as sa
from dbos import DBOS, DBOSClient

from common import (
    GATE,
    PAUSE,
    W5_GATE,
    W5_KEY,
    W5_PAUSE,
    W5_RATE,
    Records,
    Spans,
    emit,
    key_of,
    latencies,
    now_ns,
    paced_inserts,
    parse_args,
    w5,
)

SYSTEM = "dbos"
APP = "bench"
POLL = 0.01  # seconds between dequeues; DBOS's default is 1 s


async def main() -> None:
    args = parse_args(SYSTEM)
    url = os.environ["DATABASE_URL"]

    # The system tables, then the queue and (W1-W3, W5) the jobs, all before this
    # process becomes a worker: DBOS dequeues as soon as it is launched.
    dbos_cli = Path(sys.executable).parent / "dbos"
    subprocess.run([dbos_cli, "migrate", "-s", url], check=True, stdout=subprocess.DEVNULL)
    client = DBOSClient(system_database_url=url)
    if args.workload == "w5":
        return await run_w5(args, url, client)
    records, started, done = Records(), {}, [0]
    pause = PAUSE[args.workload]
    limits = {"w2": {"partition_concurrency": 1}, "w3": {"global_concurrency": GATE}}
    # DBOS refuses a worker limit above the queue's global one, hence 10 for W3.
    worker = min(args.concurrency, GATE) if args.workload == "w3" else args.concurrency
    client.register_queue(
        "jobs",
        worker_concurrency=worker,
        polling_interval_sec=POLL,
        application_name=APP,
        **limits.get(args.workload, {}),
    )

    def options(i: int) -> dict:
        opts = {"queue_name": "jobs", "workflow_name": "job", "application_name": APP}
        if args.workload == "w2":
            opts["queue_partition_key"] = key_of("w2", i)
        return opts

    @DBOS.workflow(name="job")
    def job(i: int, key: str | None) -> None:
        start = now_ns()
        if pause:
            time.sleep(pause)
        started[i] = start
        records.add(key, start, now_ns())
        done[0] += 1

    pending = sa.text("SELECT count(*) FROM dbos.workflow_status WHERE status IN ('ENQUEUED', 'PENDING')")
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))

    async def finished() -> None:
        while done[0] < args.jobs:
            await asyncio.sleep(0.002)
        with engine.connect() as conn:
            while conn.execute(pending).scalar():
                conn.rollback()
                await asyncio.sleep(0.005)

    DBOS(config={"name": APP, "system_database_url": url})
    extra = {}
    if args.workload == "w4":
        DBOS.launch()
        await asyncio.sleep(2)  # the queue's worker thread is started and idle

        async def insert(i: int) -> None:
            client.enqueue(options(i), i, None)

        t = time.perf_counter()
        before = await paced_inserts(args.jobs, insert)
        await finished()
        extra = latencies(before, started)
    else:
        # One transaction for all the jobs: DBOS's batch insert.
        t = time.perf_counter()
        with engine.begin() as conn:
            for i in range(args.jobs):
                client.enqueue_in_transaction(conn, options(i), i, key_of(args.workload, i))
        if args.workload == "w1":
            extra = {"insert_per_s": args.jobs / (time.perf_counter() - t)}
        # Fresh statistics after the bulk insert, before the clock, as PostgreSQL
        # advises after a bulk load (every runner does: benchmarks/README.md, Results).
        with engine.begin() as conn:
            conn.execute(sa.text("ANALYZE dbos.workflow_status"))
        t = time.perf_counter()
        DBOS.launch()
        await finished()
    seconds = time.perf_counter() - t
    DBOS.destroy()
    records.write(args.record)
    emit(SYSTEM, args.workload, args.jobs, seconds, **extra)


async def run_w5(args, url: str, client: DBOSClient) -> None:
    # Each queue has its own worker limit: the 20 slots are split as one shared
    # queue of 20 splits them while the gate and the key are saturated (10 + 1,
    # and 9 for the rest); the rate queue's limiter admits 50 no-op starts a second.
    queues = {
        "gate": {"global_concurrency": W5_GATE, "worker_concurrency": W5_GATE},
        "key": {"partition_concurrency": W5_KEY, "worker_concurrency": W5_KEY},
        "rate": {"limiter": {"limit": W5_RATE, "period": 1}},
        "free": {"worker_concurrency": args.concurrency - W5_GATE - W5_KEY},
    }
    for name, limits in queues.items():
        client.register_queue(name, polling_interval_sec=POLL, application_name=APP, **limits)
    spans = Spans()

    @DBOS.workflow(name="job")
    def job(kind: str) -> None:
        i = spans.start(kind)
        if kind in ("gate", "key"):
            time.sleep(W5_PAUSE)
        spans.end(i)

    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))

    async def insert(kind: str, n: int) -> None:
        opts = {"queue_name": kind, "workflow_name": "job", "application_name": APP}
        if kind == "key":
            opts["queue_partition_key"] = "acct:1"
        with engine.begin() as conn:  # DBOS's batch insert: many enqueues in one transaction
            for _ in range(n):
                client.enqueue_in_transaction(conn, opts, kind)

    left = sa.text(
        "SELECT count(*) FROM dbos.workflow_status"
        " WHERE queue_name = 'free' AND status IN ('ENQUEUED', 'PENDING')"
    )

    async def free_left() -> int:
        with engine.connect() as conn:
            return conn.execute(left).scalar()

    async def start_worker() -> None:
        DBOS.launch()

    async def stop_worker() -> None:
        DBOS.destroy(workflow_completion_timeout_sec=2)

    DBOS(config={"name": APP, "system_database_url": url})
    await w5(SYSTEM, args, spans, set(queues), insert, start_worker, free_left, stop_worker, 10_000)


if __name__ == "__main__":
    asyncio.run(main())
