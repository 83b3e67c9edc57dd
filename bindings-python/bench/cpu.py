"""CPU time per no-op step: the Python worker (``def`` and ``async def``
steps) against the Rust node, on the same database, W1's shape (N rows
inserted before the worker starts, one node, queue concurrency C).

For each run only the worker's part is measured, from the node's start to the
N-th step: the seconds, this process's CPU time (user + system, every thread)
and PostgreSQL's (the postmaster's and all its backends', live or exited),
each per 1,000 steps. CPU time is what to compare on a shared machine; the
wall-clock rate moves with whatever else runs.

    (cd bindings-python && maturin develop --release)
    python bindings-python/bench/cpu.py --n 20000 --concurrency 20 --repeat 3

Uses DATABASE_URL (a server of its own: every backend of it is counted), or a
throwaway PostgreSQL when it is not set.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import threading
import time
import uuid

import psycopg

import gendurable
import gendurable.testing
from gendurable import Done, _gendurable

TICK = os.sysconf("SC_CLK_TCK")


def _schema(kind: str) -> str:
    return f"bench_{kind}_{uuid.uuid4().hex[:8]}"


class PgCpu:
    """The CPU seconds of a local PostgreSQL server: its postmaster's own and
    reaped children's, and every live child's."""

    def __init__(self, url: str) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            self.postmaster = _stat(backend)["ppid"]

    def seconds(self) -> float:
        pm = _stat(self.postmaster)
        ticks = pm["utime"] + pm["stime"] + pm["cutime"] + pm["cstime"]
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    s = _stat(int(pid))
                except (FileNotFoundError, ProcessLookupError):
                    continue
                if s["ppid"] == self.postmaster:
                    ticks += s["utime"] + s["stime"]
        return ticks / TICK


def _stat(pid: int) -> dict:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return {
        "ppid": int(fields[1]),
        "utime": int(fields[11]),
        "stime": int(fields[12]),
        "cutime": int(fields[13]),
        "cstime": int(fields[14]),
    }


def _insert(url: str, schema: str, workflow: str, n: int) -> None:
    engine = gendurable.Engine(url, schema=schema, queues={"default": 1})
    for chunk in range(0, n, 20_000):
        engine.insert_many(
            [
                gendurable.NewInstance(workflow, {"i": i})
                for i in range(chunk, min(n, chunk + 20_000))
            ]
        )


def _switches() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_nvcsw + r.ru_nivcsw


def run(kind: str, url: str, n: int, concurrency: int, pg: PgCpu) -> tuple:
    """(seconds, this process's CPU seconds, PostgreSQL's, this process's
    context switches) for the worker part."""
    schema = _schema(kind)
    workflow = "bench.RustNoop" if kind == "rust" else "bench.PyNoop"
    _insert(url, schema, workflow, n)
    if kind == "rust":
        c0, p0, s0 = time.process_time(), pg.seconds(), _switches()
        secs = _gendurable._bench_rust_noop(url, n, concurrency, schema, insert=False)
        return secs, time.process_time() - c0, pg.seconds() - p0, _switches() - s0
    engine = gendurable.Engine(
        url, schema=schema, queues={"default": concurrency}, poll_interval=0.1
    )
    lock = threading.Lock()
    count = [0]
    all_done = threading.Event()

    # As benchmarks/runners/gendurable_py.py's W1 step: a lock, a count, Done.
    if kind == "async":

        @engine.workflow(workflow)
        async def noop_async(step, state, ctx):
            with lock:
                count[0] += 1
                if count[0] == n:
                    all_done.set()
            return Done(state)

    else:

        @engine.workflow(workflow)
        def noop(step, state, ctx):
            with lock:
                count[0] += 1
                if count[0] == n:
                    all_done.set()
            return Done(state)

    engine._native()  # connect and migrate before the clock starts
    c0, p0, s0, t = time.process_time(), pg.seconds(), _switches(), time.perf_counter()
    engine.start()
    all_done.wait()
    secs = time.perf_counter() - t
    c1, p1, s1 = time.process_time(), pg.seconds(), _switches()
    engine.shutdown()
    return secs, c1 - c0, p1 - p0, s1 - s0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=20_000, help="instances per run (default 20000)")
    p.add_argument("--concurrency", type=int, default=20, help="queue concurrency (default 20)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each kind, alternating")
    p.add_argument("--kinds", default="rust,def,async", help="rust, def, async (default all)")
    args = p.parse_args()
    kinds = args.kinds.split(",")
    with gendurable.testing.postgres() as url:
        pg = PgCpu(url)
        results: dict[str, list] = {k: [] for k in kinds}
        for _ in range(args.repeat):
            for kind in kinds:
                results[kind].append(run(kind, url, args.n, args.concurrency, pg))
    k = 1000 / args.n
    print(
        f"{args.n} no-op steps, queue concurrency {args.concurrency}, one node;"
        f" medians of {args.repeat}"
    )
    print(
        f"{'worker':<8}{'steps/s':>10}{'worker ms CPU/1k':>18}{'pg ms CPU/1k':>14}"
        f"{'total':>8}{'switches/step':>15}"
    )
    for kind, rows in results.items():
        secs = statistics.median(r[0] for r in rows)
        cpu = statistics.median(r[1] for r in rows) * k * 1000
        pgc = statistics.median(r[2] for r in rows) * k * 1000
        sw = statistics.median(r[3] for r in rows) / args.n
        print(
            f"{kind:<8}{args.n / secs:>10.0f}{cpu:>18.1f}{pgc:>14.1f}{cpu + pgc:>8.1f}{sw:>15.2f}"
        )
        for r in rows:
            print(
                f"  run: {args.n / r[0]:.0f}/s, worker {r[1] * k * 1000:.1f},"
                f" pg {r[2] * k * 1000:.1f}, switches {r[3] / args.n:.2f}"
            )


if __name__ == "__main__":
    main()
