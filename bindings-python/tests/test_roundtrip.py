"""Property-based round trip of states (seeded random JSON at the limits)
through insert, get, a step and its outcome: see apps/json_roundtrip.py."""

from __future__ import annotations

import math
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import gendurable
from gendurable import InvalidInput

APP = Path(__file__).parent / "apps" / "json_roundtrip.py"
# Every shape twice (once through def steps, once through async def ones);
# more with GENDURABLE_ROUNDTRIP_SEEDS=N.
SEEDS = int(os.environ.get("GENDURABLE_ROUNDTRIP_SEEDS", "10"))


def test_random_states_round_trip(database_url, schema):
    r = subprocess.run(
        [sys.executable, str(APP), database_url, schema, *map(str, range(SEEDS))],
        capture_output=True,
        text=True,
        timeout=900,
    )
    # A crash of the interpreter (a signal, an abort) is a failure too.
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stdout}\n{r.stderr[-5000:]}"
    assert r.stdout.strip() == f"ok {SEEDS}", r.stdout


def _nested(levels: int) -> dict:
    inner: object = 1
    for i in range(levels - 1):
        inner = [inner] if i % 2 else {"d": inner}
    return {"d": inner}


def test_the_limits_themselves(make_engine):
    engine = make_engine()
    at_limit = _nested(100)
    assert engine.get(engine.insert("W", at_limit)).state == at_limit
    with pytest.raises(InvalidInput) as exc:
        engine.insert("W", _nested(101))
    assert exc.value.field == "state" and "nested" in str(exc.value)
    with pytest.raises(InvalidInput) as exc:
        engine.insert("W", _nested(100_000))  # far too deep: refused, no stack overflow
    assert exc.value.field == "state"
    with pytest.raises(InvalidInput) as exc:
        engine.insert("W", {"big": "x" * (64 * 1024 * 1024)})
    assert exc.value.field == "state" and "the limit is 67108864" in str(exc.value)
    wide = {f"k{i}": i for i in range(100_000)}
    assert engine.get(engine.insert("W", wide)).state == wide
    with pytest.raises(InvalidInput):
        engine.signal("go", _nested(101))
    assert isinstance(gendurable.Engine, type)  # still here


def test_floats_come_back_exactly(make_engine):
    """Every float, read back and written again by each step, stays the same
    double (serde_json's default parser may be one unit in the last place
    off, and the error grew with every step before `float_roundtrip`)."""
    rng = random.Random(7)
    floats = [rng.uniform(-1e6, 1e6) for _ in range(2000)]
    floats += [rng.random() * 10 ** rng.randint(-300, 300) for _ in range(2000)]
    floats += [
        struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0] for _ in range(2000)
    ]
    floats = [f for f in floats if math.isfinite(f) and not (f.is_integer() and abs(f) >= 2**53)]
    engine = make_engine()
    got = engine.get(engine.insert("W", {"f": floats})).state["f"]
    assert [x.hex() for x in got] == [x.hex() for x in floats]
