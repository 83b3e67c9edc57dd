"""Insert and engine options through the Python front door: at the limits
the core documents, just past them, and random values of every type (see
apps/option_values.py). The core decides; its message names the option."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gendurable import InvalidInput

APP = Path(__file__).parent / "apps" / "option_values.py"
SEEDS = int(os.environ.get("GENDURABLE_OPTION_SEEDS", "20"))


def test_random_option_values(database_url, schema):
    r = subprocess.run(
        [sys.executable, str(APP), database_url, schema, *map(str, range(SEEDS))],
        capture_output=True,
        text=True,
        timeout=600,
    )
    # A crash of the interpreter (a signal, an abort) is a failure too.
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stdout}\n{r.stderr[-5000:]}"
    assert r.stdout.strip() == f"ok {SEEDS}", r.stdout


NAME = "é" * 127 + "x"  # 255 bytes
KEY = "acct:" + "🧪" * 254 + "xxx"  # 1024 bytes


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("workflow", NAME),
        ("step", NAME),
        ("queue", NAME),
        ("priority", 0),
        ("priority", 9),
        ("max_attempts", 1),
        ("max_attempts", 2**31 - 1),
        ("concurrency_key", KEY),
        ("concurrency_key", ("acct", 2**63 - 1)),
        ("schedule_in", 0),
        ("schedule_in", timedelta(days=3650)),
        ("scheduled_at", datetime(9999, 12, 31, tzinfo=timezone.utc)),
    ],
)
def test_at_the_limits(make_engine, option, value):
    engine = make_engine()
    got = engine.get(engine.insert(**{"workflow": "W", option: value}))
    if option == "concurrency_key" and isinstance(value, tuple):
        assert got.concurrency_key == f"acct:{2**63 - 1}"
    elif option == "schedule_in":
        assert got.status == ("available" if value == 0 else "scheduled")
    elif option == "scheduled_at":
        assert got.scheduled_at.year == 9999
    else:
        assert getattr(got, option) == value


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("workflow", NAME + "x", "the limit is 255"),
        ("step", "", "must not be empty"),
        ("queue", NAME + "é", "the limit is 255"),
        ("priority", -1, "must be 0 to 9, got -1"),
        ("priority", 10, "must be 0 to 9, got 10"),
        ("priority", 2**15, "expected an integer, got 32768"),
        ("max_attempts", 0, "must be at least 1, got 0"),
        ("max_attempts", 2**31, "got 2147483648"),
        ("concurrency_key", KEY + "x", "the limit is 1024"),
        ("schedule_in", -0.001, "expected a non-negative integer (milliseconds), got -1"),
        ("scheduled_at", datetime(2030, 1, 1), "expected an RFC 3339 timestamp"),
    ],
)
def test_past_the_limits(make_engine, option, value, says):
    engine = make_engine()
    with pytest.raises(InvalidInput) as exc:
        engine.insert(**{"workflow": "W", option: value})
    assert exc.value.field == option
    assert says in str(exc.value) and str(exc.value).startswith(f"invalid {option}: ")
