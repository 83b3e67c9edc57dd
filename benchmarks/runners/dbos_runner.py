"""DBOS runner: a job is a DBOS workflow (no steps) on a DBOS queue with
worker_concurrency=20. W2 uses a partitioned queue (partition_concurrency=1,
the partition key is the job's key), W3 a queue with global_concurrency=10;
both limits are enforced in the database."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy as sa
from dbos import DBOS, DBOSClient

from common import GATE, PAUSE, Records, emit, key_of, latencies, now_ns, paced_inserts, parse_args

SYSTEM = "dbos"
APP = "bench"
POLL = 0.01  # seconds between dequeues; DBOS's default is 1 s


async def main() -> None:
    args = parse_args(SYSTEM)
    url = os.environ["DATABASE_URL"]
    records, started, done = Records(), {}, [0]
    pause = PAUSE[args.workload]

    # The system tables, then the queue and (W1-W3) the jobs, all before this
    # process becomes a worker: DBOS dequeues as soon as it is launched.
    dbos_cli = Path(sys.executable).parent / "dbos"
    subprocess.run([dbos_cli, "migrate", "-s", url], check=True, stdout=subprocess.DEVNULL)
    client = DBOSClient(system_database_url=url)
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
        t = time.perf_counter()
        DBOS.launch()
        await finished()
    seconds = time.perf_counter() - t
    DBOS.destroy()
    records.write(args.record)
    emit(SYSTEM, args.workload, args.jobs, seconds, **extra)


if __name__ == "__main__":
    asyncio.run(main())
