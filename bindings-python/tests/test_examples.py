"""The Python examples run and finish."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "python"


def test_account_sync_example(database_url, schema):
    env = {**os.environ, "DATABASE_URL": database_url, "EXAMPLE_SCHEMA": schema}
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "account_sync.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("completed: ") == 5
    assert "'approved': True" in out.stdout


def test_idempotent_charges_example(database_url, schema):
    env = {**os.environ, "DATABASE_URL": database_url, "EXAMPLE_SCHEMA": schema}
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "idempotent_charges.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "20 requests for 5 orders" in out.stdout
    assert out.stdout.count("completed, charged 1 time(s)") == 5
    retry = re.search(
        r"a retry after the charge: Inserted\(id=(\d+), conflict=(\w+)\)"
        r" \(the charge of order 1: (\d+)\)",
        out.stdout,
    )
    assert retry and retry[1] == retry[3] and retry[2] == "True", out.stdout


def test_cron_timeouts_signals_example(database_url, schema):
    env = {**os.environ, "DATABASE_URL": database_url, "EXAMPLE_SCHEMA": schema}
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "cron_timeouts_signals.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "approval sent while the refund is prepared: kept" in out.stdout
    assert "capture: completed after ['timeout'] errors" in out.stdout
    assert "refund: completed, approved by ops@example.com" in out.stdout
    assert "heartbeat tick 2" in out.stdout


def test_testing_helpers_example(database_url, schema):
    env = {**os.environ, "DATABASE_URL": database_url, "EXAMPLE_SCHEMA": schema}
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "testing_helpers.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "drained: Drained(steps=2, completed=1," in out.stdout
    assert "as a failing test would say: expected an instance of 'Signup'" in out.stdout
    assert "inline: the insert returned with the instance completed" in out.stdout
