"""Seeded random JSON states through insert, get, two steps and their outcome.

Run by tests/test_roundtrip.py in a child interpreter (so that a crash is a
failed test, not a dead test run):

    python json_roundtrip.py URL SCHEMA SEED [SEED ...]

Each seed draws a state of one shape, at the limits of core/src/validate.rs
and beyond what a hand-written test would try: a map of 100,000 keys, nesting
at the depth limit, long strings, a big array, or a random tree; all of them
made of unicode from every plane, edge numbers (the 64-bit bounds, -0.0, the
largest and smallest floats) and empty containers. The state must come back
equal from `get`, arrive equal in each step (a `def` or an `async def` one),
and be the final state of the completed instance (equal as JSON: a float
with an integral value may come back as an int of the same value, see
`same_number`). Prints `ok N` and exits 0;
on a difference, prints the seed and where the values part, and exits 1.
"""

from __future__ import annotations

import random
import sys
import threading
from typing import Any

import gendurable
from gendurable import Done, Next

MAX_DEPTH = 100  # core/src/validate.rs: the top-level object is level 1
I64 = (-(2**63), 2**63 - 1)
U64_MAX = 2**64 - 1
FLOATS = [0.0, -0.0, 0.1, -1.5, 1e308, -1e308, 5e-324, 2.2250738585072014e-308, 1e16, 3.0]

# Code points by kind, surrogates and NUL left out (refused by design).
RANGES = [
    (0x20, 0x7E),  # ASCII
    (0x01, 0x1F),  # control characters, escaped in JSON
    (0xA0, 0x24F),  # Latin
    (0x370, 0x4FF),  # Greek, Cyrillic
    (0x590, 0x6FF),  # Hebrew, Arabic (right to left)
    (0x300, 0x36F),  # combining marks
    (0x4E00, 0x9FFF),  # CJK
    (0x2028, 0x2029),  # line and paragraph separators
    (0xFEFF, 0xFEFF),  # byte order mark
    (0xFFF9, 0xFFFF),  # specials and non-characters
    (0x1F300, 0x1F6FF),  # emoji
    (0x10000, 0x10FFFF),  # every supplementary plane
]
SPECIAL_STRINGS = ["", " ", '"', "\\", "\\u0000", "null", "{}", "\n\r\t", "é", "e\u0301", "🧪"]


def rand_char(r: random.Random) -> str:
    lo, hi = r.choice(RANGES)
    return chr(r.randint(lo, hi))


def rand_str(r: random.Random, max_len: int = 24) -> str:
    if r.random() < 0.15:
        return r.choice(SPECIAL_STRINGS)
    return "".join(rand_char(r) for _ in range(r.randint(0, max_len)))


def rand_scalar(r: random.Random) -> Any:
    kind = r.randrange(8)
    if kind == 0:
        return None
    if kind == 1:
        return r.random() < 0.5
    if kind == 2:
        return r.choice([0, 1, -1, *I64, U64_MAX, r.randint(*I64), r.randint(0, U64_MAX)])
    if kind == 3:
        return r.choice([*FLOATS, r.uniform(-1e6, 1e6), r.random() * 10 ** r.randint(-300, 300)])
    return rand_str(r)


def rand_tree(r: random.Random, depth: int, budget: list[int]) -> Any:
    """A value at nesting level `depth` (the top-level object is level 1)."""
    if depth >= MAX_DEPTH or budget[0] <= 0 or r.random() < 0.35:
        return rand_scalar(r)
    budget[0] -= 1
    n = r.choice([0, 1, 2, 3, 5, 8])
    if r.random() < 0.5:
        return {rand_str(r, 12): rand_tree(r, depth + 1, budget) for _ in range(n)}
    items = [rand_tree(r, depth + 1, budget) for _ in range(n)]
    return tuple(items) if r.random() < 0.2 else items  # a tuple comes back a list


def deep(r: random.Random) -> dict:
    """Nesting exactly at the limit: MAX_DEPTH levels of objects and arrays."""
    inner: Any = rand_scalar(r)
    for level in range(MAX_DEPTH - 1, 0, -1):  # levels MAX_DEPTH .. 2
        if r.random() < 0.5:
            inner = {rand_str(r, 6): inner, "level": level + 1, "s": rand_str(r)}
        else:
            inner = [rand_scalar(r), inner, rand_str(r)]
    return {"deep": inner, "tree": rand_tree(r, 2, [30])}


def state_for(seed: int) -> dict:
    r = random.Random(seed)
    shape = seed % 5
    if shape == 0:  # a map of 100,000 keys
        keys = {f"k{i}-{rand_str(r, 3)}" for i in range(100_000)}
        return {k: rand_scalar(r) for k in keys}
    if shape == 1:
        return deep(r)
    if shape == 2:  # long strings, a few MB in all
        return {
            "ascii": "x" * r.randint(1_000_000, 3_000_000),
            "unicode": "".join(rand_char(r) for _ in range(r.randint(200_000, 400_000))),
            rand_str(r, 100): rand_str(r, 5_000),
        }
    if shape == 3:  # a big array
        return {"items": [rand_scalar(r) for _ in range(100_000)], "empty": [], "obj": {}}
    return {rand_str(r, 12): rand_tree(r, 2, [400]) for _ in range(r.randint(1, 30))}


def normal(v: Any) -> Any:
    """What JSON gives back: tuples become lists."""
    if isinstance(v, dict):
        return {k: normal(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [normal(x) for x in v]
    return v


def first_difference(a: Any, b: Any, path: str = "$") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{path}: keys {sorted(a.keys() ^ b.keys())[:5]!r}"
        for k in a:
            d = first_difference(a[k], b[k], f"{path}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: lengths {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    if same_number(a, b):
        return None
    if type(a) is not type(b) and not (isinstance(a, float) and isinstance(b, float)):
        return f"{path}: {type(a).__name__} {a!r:.80} came back as {type(b).__name__} {b!r:.80}"
    return None if a == b else f"{path}: {a!r:.80} != {b!r:.80}"


def same_number(want: Any, got: Any) -> bool:
    """jsonb keeps numbers as decimals and prints an integral one without a
    fraction: a float such as 1e20 comes back as the int of the decimal it
    was written as (100000000000000000000), which converts back to the very
    same float. Below 2**53 Python compares them equal anyway."""
    return isinstance(want, float) and type(got) is int and want.is_integer() and float(got) == want


def main() -> int:
    url, schema, *seeds = sys.argv[1:]
    engine = gendurable.Engine(url, schema=schema, queues={"default": 4}, poll_interval=0.1)
    expected: dict[int, Any] = {}
    problems: list[str] = []
    finished = threading.Semaphore(0)

    def check(where: str, state: Any, ctx: gendurable.Context) -> None:
        d = first_difference(expected[ctx.id], state)
        if d:
            problems.append(f"{where} of instance {ctx.id}: {d}")

    @engine.workflow("RoundTrip.Sync")
    class SyncSteps:
        def start(self, state, ctx):
            check("the first def step", state, ctx)
            return Next("finish", state)

        def finish(self, state, ctx):
            check("the second def step", state, ctx)
            finished.release()
            return Done(state)

    @engine.workflow("RoundTrip.Async")
    class AsyncSteps:
        async def start(self, state, ctx):
            check("the first async step", state, ctx)
            return Next("finish", state)

        async def finish(self, state, ctx):
            check("the second async step", state, ctx)
            finished.release()
            return Done(state)

    ids: dict[int, int] = {}
    for seed in map(int, seeds):
        state = state_for(seed)
        workflow = "RoundTrip.Sync" if seed % 2 == 0 else "RoundTrip.Async"
        id_ = engine.insert(workflow, state)
        want = normal(state)
        expected[id_] = want
        ids[seed] = id_
        d = first_difference(want, engine.get(id_).state)
        if d:
            problems.append(f"seed {seed}, get after insert: {d}")
    with engine:
        for _ in ids:
            if not finished.acquire(timeout=300):
                problems.append("timed out waiting for the steps")
                break
    for seed, id_ in ids.items():
        inst = engine.get(id_)
        if inst.status != "completed":
            problems.append(f"seed {seed}: {inst.status}, errors {inst.errors!r:.300}")
        d = first_difference(expected[id_], inst.state)
        if d:
            problems.append(f"seed {seed}, the final state: {d}")
    for p in problems:
        print(p, file=sys.stderr)
    print(f"ok {len(ids)}" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
