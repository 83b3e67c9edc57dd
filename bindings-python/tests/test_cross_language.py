"""Python and Rust share instances: inserted by one, run by the other.

The Rust side is the `gendurable` binary of the workspace's `cli/` crate
(its `echo` node runs the built-in `gendurable.Echo` workflow). The tests
look for it in $GENDURABLE_CLI, then in the workspace's target directories;
`scripts/test-python` builds it. Without it they are skipped, saying so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

import gendurable
from conftest import wait_until
from gendurable import Done, Next

ROOT = Path(__file__).resolve().parents[2]


def _find_cli() -> str | None:
    candidates = [os.environ.get("GENDURABLE_CLI")]
    for target in ("target-py", "target"):
        for profile in ("debug", "release"):
            candidates.append(str(ROOT / target / profile / "gendurable"))
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            try:
                help_text = subprocess.run(
                    [c, "--help"], capture_output=True, text=True, timeout=30
                ).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            if "echo" in help_text and "insert" in help_text:
                return c
    return None


CLI = _find_cli()
pytestmark = pytest.mark.skipif(
    CLI is None,
    reason="the Rust `gendurable` CLI (cli/ crate, with `insert` and `echo`) is not built:"
    " run `cargo build -p gendurable-cli` or set GENDURABLE_CLI",
)

STATE = {
    "name": "Zoë ✓ \u2603",
    "nested": {"list": [1, 2.5, None, True, {"deep": ["x"]}]},
    "big": 2**62,
    "neg": -7,
}


def test_inserted_from_python_run_by_rust(database_url, schema):
    engine = gendurable.Engine(database_url, schema=schema)
    id_ = engine.insert("gendurable.Echo", STATE, concurrency_key=("account", 7), priority=2)
    node = subprocess.Popen(
        [CLI, "echo", "--url", database_url, "--schema", schema, "--concurrency", "2"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: engine.get(id_).finished or node.poll() is not None, "the Rust node")
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=60) == 0, node.stderr.read()
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
    inst = engine.get(id_)
    assert inst.status == "completed"
    assert inst.state == {**STATE, "ran_by": "rust", "echo_id": id_}
    assert inst.concurrency_key == "account:7"


def test_inserted_by_rust_run_by_python(database_url, schema):
    engine = gendurable.Engine(database_url, schema=schema, poll_interval=0.1)
    done = threading.Event()

    @engine.workflow("Py.Echo")
    class PyEcho:
        def start(self, state, ctx):
            return Next("finish", {**state, "key_seen": ctx.concurrency_key})

        async def finish(self, state, ctx):
            done.set()
            return Done({**state, "ran_by": "python"})

    engine.migrate()
    out = subprocess.run(
        [
            CLI, "insert", "--url", database_url, "--schema", schema,
            "--workflow", "Py.Echo", "--state", json.dumps(STATE),
            "--concurrency-key", "tenant:3",
        ],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    id_ = int(out.stdout.strip())
    with engine:
        assert done.wait(30)
    inst = engine.get(id_)
    assert inst.status == "completed"
    assert inst.state == {**STATE, "key_seen": "tenant:3", "ran_by": "python"}
    # And the Rust side reads back what Python wrote.
    got = subprocess.run(
        [CLI, "get", "--url", database_url, "--schema", schema, str(id_)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    row = json.loads(got.stdout)
    assert row["state"] == inst.state and row["status"] == "completed"
