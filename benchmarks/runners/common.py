"""What every Python runner shares: the command line, the workloads' shapes,
the per-job records and the JSON line printed at the end."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

DEFAULT_JOBS = {"w1": 20_000, "w2": 10_000, "w3": 2_000, "w4": 500}
KEYS = 100  # W2: jobs spread over this many keys, one at a time per key
GATE = 10  # W3: at most this many jobs of the one key at once
PAUSE = {"w1": 0.0, "w2": 0.005, "w3": 0.020, "w4": 0.0}  # seconds each job sleeps
W4_INTERVAL = 0.020  # W4: one insert every 20 ms (50/s)

now_ns = time.time_ns  # CLOCK_REALTIME, comparable across processes


def parse_args(system: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=system)
    p.add_argument("workload", choices=sorted(DEFAULT_JOBS))
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--jobs", type=int)
    p.add_argument("--record", help="W2/W3: write key,start_ns,end_ns per job here")
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
