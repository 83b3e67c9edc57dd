"""The ``gendurable`` command as pip installs it: the Rust CLI's verbs plus
``worker``; read-only verbs that never create anything; one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gendurable
from conftest import wait_until

REFUSED = "postgres://nobody@127.0.0.1:1/none"


def _cmd() -> list[str]:
    exe = Path(sys.executable).with_name("gendurable")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "gendurable"]


def run(*args: str, url: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "RUST_LOG": "error", **(env or {})}
    e.pop("DATABASE_URL", None)
    if url is not None:
        e["DATABASE_URL"] = url
    return subprocess.run([*_cmd(), *args], capture_output=True, text=True, env=e, timeout=120)


def ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stderr
    return r.stdout


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode != 0, r.stdout
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: "), r.stderr
    assert "backtrace" not in r.stderr.lower()
    return r.stderr


def test_help_lists_the_rust_verbs_and_worker():
    out = ok(run("--help"))
    for verb in ("migrate", "status", "insert", "get", "echo", "demo", "bench", "worker"):
        assert f"\n  {verb} " in out, out
    assert ok(run("--version")).strip() == f"gendurable {gendurable.__version__}"
    # `python -m gendurable` is the same command.
    r = subprocess.run(
        [sys.executable, "-m", "gendurable", "--help"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "worker" in r.stdout
    # A usage error: clap's message and exit status 2.
    r = run("no-such-verb")
    assert r.returncode == 2 and "no-such-verb" in r.stderr


def test_migrate_insert_get_status(database_url, schema):
    s = ("--schema", schema)
    assert "up to date" in ok(run("migrate", *s, url=database_url))
    id_ = int(
        ok(
            run(
                "insert",
                *s,
                "--workflow",
                "Cli.Flow",
                "--state",
                '{"from": "cli ✓"}',
                "--priority",
                "3",
                url=database_url,
            )
        )
    )
    got = json.loads(ok(run("get", *s, str(id_), url=database_url)))
    assert got["state"] == {"from": "cli ✓"} and got["priority"] == 3
    # The Python client reads the same row.
    inst = gendurable.Engine(database_url, schema=schema).get(id_)
    assert inst.workflow == "Cli.Flow" and inst.priority == 3
    out = ok(run("status", *s, url=database_url))
    assert "available" in out and "Cli.Flow" in out


def test_read_only_verbs_never_create_the_schema(database_url, schema):
    for _ in range(2):  # had the first run created it, the second would succeed
        for args in (("status",), ("get", "1"), ("insert", "--workflow", "W")):
            err = one_line_error(
                run(*args, "--schema", schema, url=database_url, env={"RUST_BACKTRACE": "1"})
            )
            assert f'no gendurable schema "{schema}" in this database' in err, err
            assert f"gendurable migrate --schema {schema}" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("insert", "--workflow", "W", "--state", "{"), "--state is not JSON"),
        (("insert", "--workflow", "W", "--state", "[1]"), "invalid state: must be a JSON object"),
        (("insert", "--workflow", "W", "--concurrency-key", ":7"), "invalid concurrency_key"),
        (("status", "--schema", "Bad-Name"), "schema"),
        (("status",), "cannot connect to PostgreSQL at 127.0.0.1:1: connection refused"),
        (("get", "1"), "cannot connect to PostgreSQL at 127.0.0.1:1: connection refused"),
    ],
)
def test_errors_are_one_line(args, message):
    started = time.monotonic()
    err = one_line_error(run(*args, url=REFUSED, env={"RUST_BACKTRACE": "full"}))
    assert message in err, err
    assert time.monotonic() - started < 5  # a refused connection fails at once


def test_no_database_url():
    err = one_line_error(run("status"))
    assert "no database: pass --url or set DATABASE_URL" in err


@pytest.mark.parametrize("priority", ["-3", "10"])
def test_priority_out_of_range(priority):
    r = run("insert", "--workflow", "W", "--priority", priority, url=REFUSED)
    assert r.returncode == 2
    assert "priority must be between 0 and 9" in r.stderr, r.stderr
    assert "unexpected argument" not in r.stderr


def test_status_shows_the_node_and_the_rows_no_live_node_runs(make_engine, database_url, schema):
    engine = make_engine(queues={"default": 2})

    @engine.workflow("Known")
    def known(step, state, ctx):
        return gendurable.Done(state)

    engine.start()
    # Rows no live node will run: a queue no node serves, a workflow no node runs.
    engine.insert("Known", {}, queue="nobody")
    engine.insert("Typo.Flow", {})
    known_id = engine.insert("Known", {})
    wait_until(lambda: engine.get(known_id).finished, "the known row to run")
    out = ok(run("status", "--schema", schema, url=database_url))
    # One node id everywhere: the engine's, the one in `nodes`, the one `status` shows.
    assert f"\n  {engine.node_id}  host " in out, out
    assert 'NO: no live node serves queue "nobody"' in out, out
    typo = next(line for line in out.splitlines() if "Typo.Flow" in line)
    # The nodes record the queues they serve; once they record their workflows
    # too, `status` names the workflow no live node runs.
    if "do not record which workflows they run" in out:
        assert "its queue is served" in typo, out
    else:
        assert 'runs workflow "Typo.Flow"' in typo, out
    engine.shutdown()
    out = ok(run("status", "--schema", schema, url=database_url))
    assert 'NO: no live node serves queue "default"' in out, out


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_echo_runs_python_rows_and_stops_on_ctrl_c(make_engine, database_url, schema):
    """The Rust node of `gendurable echo`, run by the pip-installed command,
    runs a row Python inserted; Ctrl-C stops it gracefully (exit status 0),
    with no KeyboardInterrupt from Python."""
    client = make_engine()
    id_ = client.insert("gendurable.Echo", {"from": "python"})
    env = {**os.environ, "DATABASE_URL": database_url, "RUST_LOG": "error"}
    proc = subprocess.Popen(
        [*_cmd(), "echo", "--schema", schema],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: client.get(id_).finished or proc.poll() is not None, "the echo node")
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read()
    assert rc == 0 and "KeyboardInterrupt" not in err, err
    assert client.get(id_).state == {"from": "python", "ran_by": "rust", "echo_id": id_}


def test_pause_resume_and_status_agree_with_the_engine(make_engine, database_url, schema):
    engine = make_engine()
    s = ("--schema", schema)
    engine.migrate()
    assert ok(run("pause", *s, "billing", url=database_url)).strip() == 'queue "billing" paused'
    assert [q for q, _ in engine.paused_queues()] == ["billing"]
    assert engine.pause_queue("reports") is True
    out = ok(run("status", *s, url=database_url))
    assert "paused queues" in out and "billing" in out and "reports" in out, out
    assert "was not paused" in ok(run("resume", *s, "other", url=database_url))
    assert "resumed" in ok(run("resume", *s, "reports", url=database_url))
    assert engine.resume_queue("billing") is True
    assert engine.paused_queues() == []
    assert "paused queues" not in ok(run("status", *s, url=database_url))
