"""No-op steps per second: Python workers (sync and async steps) against a
pure-Rust worker, on the same database, in one run.

Each run inserts N instances of a one-step workflow (the step returns
``Done``), starts one worker node with the given queue concurrency, and times
from the start of the node until the N-th step has run. Every step is a real
claim and a real outcome written to PostgreSQL; only the user code is empty.

    # build the extension optimised first
    (cd bindings-python && maturin develop --release)
    python bindings-python/bench/noop.py --n 20000 --concurrency 20

Uses DATABASE_URL, or a throwaway PostgreSQL when it is not set.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid

import gendurable
import gendurable.testing
from gendurable import Done, _gendurable


def _schema(kind: str) -> str:
    return f"bench_{kind}_{uuid.uuid4().hex[:8]}"


def run_python(url: str, n: int, concurrency: int, is_async: bool) -> float:
    engine = gendurable.Engine(
        url,
        schema=_schema("async" if is_async else "sync"),
        queues={"default": concurrency},
        poll_interval=0.1,
    )
    lock = threading.Lock()
    count = 0
    all_done = threading.Event()

    def tick() -> None:
        nonlocal count
        with lock:
            count += 1
            if count == n:
                all_done.set()

    if is_async:

        @engine.workflow("bench.PyNoop")
        async def noop_async(step, state, ctx):
            tick()
            return Done(state)

    else:

        @engine.workflow("bench.PyNoop")
        def noop(step, state, ctx):
            tick()
            return Done(state)

    for chunk in range(0, n, 5000):
        engine.insert_many(
            [
                gendurable.NewInstance("bench.PyNoop", {"i": i})
                for i in range(chunk, min(n, chunk + 5000))
            ]
        )
    t = time.perf_counter()
    engine.start()
    all_done.wait()
    elapsed = time.perf_counter() - t
    engine.shutdown()
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=10_000, help="instances per run (default 10000)")
    p.add_argument("--concurrency", type=int, default=20, help="queue concurrency (default 20)")
    args = p.parse_args()
    with gendurable.testing.postgres() as url:
        rows = [
            (
                "Rust (workflow_fn)",
                _gendurable._bench_rust_noop(url, args.n, args.concurrency, _schema("rust")),
            ),
            ("Python, def step", run_python(url, args.n, args.concurrency, is_async=False)),
            ("Python, async def step", run_python(url, args.n, args.concurrency, is_async=True)),
        ]
    print(f"{args.n} no-op steps, queue concurrency {args.concurrency}, one node")
    print(f"{'worker':<26}{'seconds':>10}{'steps/s':>12}")
    for name, secs in rows:
        print(f"{name:<26}{secs:>10.2f}{args.n / secs:>12.0f}")


if __name__ == "__main__":
    main()
