"""What every Python runner shares: the command line, the workloads' shapes,
the per-job records, the JSON line printed at the end, and W5's course (insert
the backlogs, time the unrelated jobs, hold, count what the blocked kinds ran)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time

DEFAULT_JOBS = {"w1": 20_000, "w2": 10_000, "w3": 2_000, "w4": 500, "w5": 20_000}
KEYS = 100  # W2: jobs spread over this many keys, one at a time per key
GATE = 10  # W3: at most this many jobs of the one key at once
PAUSE = {"w1": 0.0, "w2": 0.005, "w3": 0.020, "w4": 0.0}  # seconds each job sleeps
W4_INTERVAL = 0.020  # W4: one insert every 20 ms (50/s)
# W5: kinds of rows, in the order they are inserted, and their limits.
W5_KINDS = ("gate", "key", "rate", "free")
W5_GATE = 10  # gate: at most 10 running at once
W5_KEY = 1  # key: one key, one at a time
W5_RATE = 50  # rate: at most 50 starts a second
W5_RATE_BURST = 5  # gendurable's runners let up to 5 of them start back to back
W5_PAUSE = 1.0  # seconds each gate and key step sleeps (rate and free are no-ops)

now_ns = time.time_ns  # CLOCK_REALTIME, comparable across processes


def parse_args(system: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=system)
    p.add_argument("workload", choices=sorted(DEFAULT_JOBS))
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--jobs", type=int)
    p.add_argument("--record", help="write key,start_ns,end_ns per job here (W5: kind,start_ns,end_ns)")
    p.add_argument("--backlog", type=int, default=1_000_000, help="W5: rows of each blocked backlog")
    p.add_argument("--hold", type=float, default=10.0, help="W5: seconds the worker runs on after the jobs")
    args = p.parse_args()
    args.jobs = args.jobs or DEFAULT_JOBS[args.workload]
    return args


def key_of(workload: str, i: int) -> str | None:
    if workload == "w2":
        return f"k{i % KEYS}"
    if workload == "w3":
        return "api"
    return None


class Records:
    """Start and end of every job, kept in memory and written once at the end
    so that writing them costs the jobs nothing."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, int]] = []

    def add(self, key: str | None, start: int, end: int) -> None:
        self.rows.append((key or "", start, end))

    def write(self, path: str | None) -> None:
        if path:
            with open(path, "w") as f:
                f.writelines(f"{k},{s},{e}\n" for k, s, e in self.rows)


class Spans:
    """W5's records: a job's start is kept when it starts, so that a job still
    running when the worker stops is recorded too (ending when the records are
    written), and the starts of each kind can be counted at any moment."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, int]] = []
        self.ends: dict[int, int] = {}
        self.done = dict.fromkeys(W5_KINDS, 0)
        self.lock = threading.Lock()  # steps may run on threads

    def start(self, kind: str) -> int:
        with self.lock:
            self.starts.append((kind, now_ns()))
            return len(self.starts) - 1

    def end(self, i: int) -> None:
        with self.lock:
            self.ends[i] = now_ns()
            self.done[self.starts[i][0]] += 1

    def write(self, path: str | None) -> None:
        if path:
            last = now_ns()
            with open(path, "w") as f:
                f.writelines(f"{k},{s},{self.ends.get(i, last)}\n" for i, (k, s) in enumerate(self.starts))

    def per_second(self, kind: str, t0: int, t1: int) -> float:
        """Starts of `kind` from t0 to t1 (wall-clock ns), per second."""
        return sum(1 for k, s in self.starts if k == kind and t0 <= s <= t1) / ((t1 - t0) / 1e9)


def w5_rows(backlog: int, jobs: int) -> list[tuple[str, int]]:
    """How many rows of each kind W5 inserts, in order."""
    return [("gate", backlog), ("key", backlog), ("rate", backlog // 10), ("free", jobs)]


class Progress:
    """Insert progress on stderr, at most about once a second per kind."""

    def __init__(self, kind: str, total: int) -> None:
        self.kind, self.total, self.n, self.t0, self.last = kind, total, 0, time.monotonic(), 0.0

    def add(self, n: int) -> None:
        self.n += n
        now = time.monotonic()
        if self.n >= self.total or now - self.last >= 1:
            self.last = now
            rate = self.n / max(now - self.t0, 1e-9)
            line = f"insert {self.kind:<4} {self.n:>9,}/{self.total:,} ({rate:,.0f}/s)"
            print(line, file=sys.stderr, flush=True)


async def w5(
    system: str,
    args: argparse.Namespace,
    spans: Spans,
    supported: set[str],
    insert,
    start_worker,
    free_left,
    stop_worker,
    chunk: int,
) -> None:
    """W5's course, the same for every runner. `insert(kind, n)` inserts n rows of
    a kind in one batch (only kinds in `supported` are inserted); `start_worker()`
    starts the worker; `free_left()` counts the free rows the system's own tables
    still show as not done; `stop_worker()` stops the worker. Prints the JSON line."""
    for kind, total in w5_rows(args.backlog, args.jobs):
        if kind not in supported:
            continue
        progress = Progress(kind, total)
        for at in range(0, total, chunk):
            n = min(chunk, total - at)
            await insert(kind, n)
            progress.add(n)
    t0, t0_ns = time.perf_counter(), now_ns()
    await start_worker()
    while spans.done["free"] < args.jobs:
        await asyncio.sleep(0.002)
    while await free_left():
        await asyncio.sleep(0.005)
    seconds = time.perf_counter() - t0
    line = f"w5: {args.jobs:,} free jobs in {seconds:.2f} s; holding {args.hold:g} s"
    print(line, file=sys.stderr, flush=True)
    await asyncio.sleep(args.hold)
    t1_ns = now_ns()
    await stop_worker()
    spans.write(args.record)
    rates = {
        f"{kind}_per_s": spans.per_second(kind, t0_ns, t1_ns) if kind in supported else None
        for kind in ("gate", "key", "rate")
    }
    emit(system, "w5", args.jobs, seconds, backlog=args.backlog, **rates)


def emit(system: str, workload: str, jobs: int, seconds: float, **extra: object) -> None:
    line = {
        "system": system,
        "workload": workload,
        "jobs": jobs,
        "seconds": seconds,
        "jobs_per_s": jobs / seconds if seconds else None,
    }
    line.update(extra)
    print(json.dumps(line), flush=True)


def unsupported(system: str, workload: str, reason: str) -> None:
    print(json.dumps({"system": system, "workload": workload, "unsupported": reason}), flush=True)
    sys.exit(0)


def percentiles(latencies_ms: list[float]) -> dict[str, float]:
    """p50 and p99 picked as the Rust runner picks them (nearest rank, floor)."""
    s = sorted(latencies_ms)
    pick = lambda p: s[min(int(len(s) * p), len(s) - 1)]  # noqa: E731
    return {"p50_ms": pick(0.50), "p99_ms": pick(0.99)}


async def paced_inserts(n: int, insert_one) -> list[int]:
    """W4: call `insert_one(i)` every 20 ms; returns the time taken just before each call."""
    before = []
    t0 = time.monotonic()
    for i in range(n):
        delay = t0 + i * W4_INTERVAL - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        before.append(now_ns())
        await insert_one(i)
    return before


def latencies(before: list[int], started: dict[int, int]) -> dict[str, float]:
    return percentiles([(started[i] - t) / 1e6 for i, t in enumerate(before) if i in started])


async def wait_until(predicate, interval: float = 0.002) -> None:
    while not predicate():
        await asyncio.sleep(interval)
