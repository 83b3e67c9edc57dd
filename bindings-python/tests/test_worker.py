"""The worker: the threads steps run on, graceful shutdown on SIGTERM, and the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import gendurable
from conftest import wait_until

TESTS = Path(__file__).parent


def _worker_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("gendurable")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "gendurable.cli"]


def _write_fifo(path: Path, data: bytes, timeout: float = 30.0) -> None:
    """Write to a FIFO once its reader has it open (never blocks forever)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError("the step never opened the FIFO") from None
            time.sleep(0.01)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def test_a_step_thread_keeps_its_python_thread_state(make_engine):
    """Thread-local data a step sets is still there for the next step on that thread."""
    engine = make_engine(queues={"default": 1})
    local = threading.local()
    seen: list[tuple[int, int]] = []
    n = 30
    finished = threading.Event()

    @engine.workflow("Local.Count")
    def count(step, state, ctx):
        local.steps = getattr(local, "steps", 0) + 1
        seen.append((threading.get_ident(), local.steps))
        if len(seen) == n:
            finished.set()
        return gendurable.Done(state)

    engine.insert_many([gendurable.NewInstance("Local.Count", {}) for _ in range(n)])
    engine.start()
    assert finished.wait(30)
    last: dict[int, int] = {}
    for ident, steps in seen:
        last[ident] = steps
    # Each thread counted every step it ran: none started over from a new state.
    assert sum(last.values()) == n, seen


def test_sigterm_finishes_the_running_step_and_exits_0(database_url, schema, tmp_path):
    started = tmp_path / "started"
    release = tmp_path / "release"
    os.mkfifo(release)
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "GENDURABLE_SCHEMA": schema,
        "PYTHONPATH": str(TESTS),
    }
    client = gendurable.Engine(database_url, schema=schema)
    id_ = client.insert("Term.Slow", {"started": str(started), "release": str(release)})
    proc = subprocess.Popen(
        [*_worker_cmd(), "worker", "apps.sigterm_app:engine"],
        env=env,
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: started.exists() or proc.poll() is not None, "the step to start")
        assert proc.poll() is None, proc.stderr.read()
        assert client.get(id_).status == "executing"
        proc.send_signal(signal.SIGTERM)
        # The step is still running: it finishes only now, after SIGTERM.
        _write_fifo(release, b"after-sigterm")
        rc = proc.wait(timeout=60)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, err
    assert "stopped" in err
    inst = client.get(id_)
    assert inst.status == "completed", inst
    assert inst.state["finished_with"] == "after-sigterm"


def test_cli_rejects_a_bad_target(tmp_path):
    r = subprocess.run(
        [*_worker_cmd(), "worker", "no_colon"], capture_output=True, text=True, cwd=tmp_path
    )
    assert r.returncode != 0 and "module:attribute" in r.stderr


def test_run_returns_on_stop(make_engine):
    import threading

    engine = make_engine()

    @engine.workflow("Idle")
    def idle(step, state, ctx):
        return gendurable.Done(state)

    t = threading.Thread(target=engine.run)
    t.start()
    wait_until(lambda: engine.running, "the worker to start")
    engine.stop()
    t.join(30)
    assert not t.is_alive() and not engine.running


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigint_in_main_thread_stops_run(make_engine):
    engine = make_engine()

    @engine.workflow("Idle")
    def idle(step, state, ctx):
        return gendurable.Done(state)

    import threading

    def interrupt():
        wait_until(lambda: engine.running, "the worker to start")
        os.kill(os.getpid(), signal.SIGINT)

    # What the process had before (default_int_handler, or SIG_IGN when it
    # was started in the background by a shell without job control).
    before = signal.getsignal(signal.SIGINT)
    t = threading.Thread(target=interrupt)
    t.start()
    engine.run()  # returns once SIGINT arrives, after a graceful shutdown
    t.join()
    assert not engine.running
    assert signal.getsignal(signal.SIGINT) is before


async def test_run_async_until_stop(make_engine):
    import asyncio

    engine = make_engine()
    ran = asyncio.Event()
    loop = asyncio.get_running_loop()

    @engine.workflow("InLoop")
    async def in_loop(step, state, ctx):
        loop.call_soon_threadsafe(ran.set)
        return gendurable.Done(state)

    await engine.insert_async("InLoop", {})
    task = asyncio.create_task(engine.run_async())
    await asyncio.wait_for(ran.wait(), 30)
    engine.stop()
    await asyncio.wait_for(task, 30)
    assert not engine.running


def test_shutdown_timeout_cancels_async_steps_and_records_an_error(make_engine):
    import asyncio
    import threading

    engine = make_engine(shutdown_timeout=0.1)
    started, cancelled = threading.Event(), threading.Event()

    @engine.workflow("Stuck")
    async def stuck(step, state, ctx):
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return gendurable.Done(state)

    id_ = engine.insert("Stuck", {})
    engine.start()
    assert started.wait(30)
    engine.shutdown()
    assert cancelled.wait(30)
    inst = engine.get(id_)
    assert inst.status in ("scheduled", "available")
    assert "shutdown timeout" in inst.errors[-1]["message"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_use_after_fork_is_a_clear_error(make_engine):
    engine = make_engine()
    engine.migrate()
    pid = os.fork()
    if pid == 0:  # the child: must refuse, not hang
        code = 1
        try:
            engine.get(1)
        except gendurable.Error as e:
            code = 0 if "fork" in str(e) else 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_gil_is_released_while_rust_waits(make_engine):
    """While the main thread waits in the native shutdown for a running step,
    Python threads run: another thread sees the main thread inside the call
    and releases the step, which then needs the GIL to return."""
    import threading

    engine = make_engine(shutdown_timeout=60)
    started, release = threading.Event(), threading.Event()
    released_by_helper = []

    @engine.workflow("Held")
    def held(step, state, ctx):
        started.set()
        released_by_helper.append(release.wait(30))
        return gendurable.Done(state)

    main = threading.main_thread().ident

    def helper():
        # Wait until the main thread is inside the native shutdown call.
        import inspect

        lines, first = inspect.getsourcelines(gendurable.Engine.shutdown)
        native_call = first + next(i for i, line in enumerate(lines) if "_core.shutdown()" in line)

        def in_shutdown():
            frame = sys._current_frames().get(main)
            return (
                frame is not None
                and frame.f_code is gendurable.Engine.shutdown.__code__
                and frame.f_lineno == native_call
            )

        wait_until(in_shutdown, "the main thread to enter shutdown")
        release.set()

    id_ = engine.insert("Held", {})
    engine.start()
    assert started.wait(30)
    t = threading.Thread(target=helper)
    t.start()
    engine.shutdown()
    t.join()
    assert released_by_helper == [True]
    assert engine.get(id_).status == "completed"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM])
def test_a_second_interrupt_stops_the_running_steps_at_once(database_url, schema, tmp_path, second):
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "GENDURABLE_SCHEMA": schema,
        "PYTHONPATH": str(TESTS),
    }
    client = gendurable.Engine(database_url, schema=schema)
    started = {w: tmp_path / w for w in ("Stuck.Sync", "Stuck.Async")}
    ids = {w: client.insert(w, {"started": str(f)}) for w, f in started.items()}
    proc = subprocess.Popen(
        [*_worker_cmd(), "worker", "apps.stuck_app:engine"],
        env=env,
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: all(f.exists() for f in started.values()) or proc.poll() is not None,
            "both steps to start",
        )
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        # The first interrupt waits for the running steps (shutdown_timeout is 600 s).
        time.sleep(1.0)
        assert proc.poll() is None, proc.stderr.read()
        assert all(client.get(i).status == "executing" for i in ids.values())
        t0 = time.monotonic()
        proc.send_signal(second)
        rc = proc.wait(timeout=30)
        took = time.monotonic() - t0
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 130, err
    assert took < 10, f"took {took:.1f} s"
    assert "stopped at once" in err, err
    for workflow, id_ in ids.items():
        inst = client.get(id_)
        # Recorded as an error, to be retried: not lost, not left executing.
        assert inst.status in ("available", "scheduled"), (workflow, inst)
        assert "interrupted again" in inst.errors[-1]["message"], (workflow, inst.errors)


def test_one_node_id_everywhere(make_engine, database_url, schema):
    engine = make_engine()
    release = threading.Event()

    @engine.workflow("Where")
    def where(step, state, ctx):
        release.wait(30)
        return gendurable.Done(state)

    before = engine.node_id
    id_ = engine.insert("Where", {})
    engine.start()
    try:
        wait_until(lambda: engine.get(id_).status == "executing", "the step to start")
        # The node that claimed the row, the node in `nodes` (which `status`
        # lists) and the engine's node_id are one id.
        assert engine.get(id_).node == before == engine.node_id
        out = subprocess.run(
            [*_worker_cmd(), "status", "--schema", schema],
            env={**os.environ, "DATABASE_URL": database_url},
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        assert f"\n  {before}  host " in out, out
    finally:
        release.set()
    wait_until(lambda: engine.get(id_).finished, "the step to finish")
    engine.shutdown()
    assert engine.node_id == before
    assert repr(engine).endswith(f"node={before!r}>")


def test_a_chosen_node_id_is_kept(make_engine):
    engine = make_engine(node_id="py-node-7")
    release = threading.Event()

    @engine.workflow("Where")
    def where(step, state, ctx):
        release.wait(30)
        return gendurable.Done(state)

    id_ = engine.insert("Where", {})
    engine.start()
    try:
        wait_until(lambda: engine.get(id_).status == "executing", "the step to start")
        assert engine.node_id == "py-node-7" == engine.get(id_).node
    finally:
        release.set()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
async def test_run_async_a_second_interrupt_stops_the_running_steps(make_engine):
    import asyncio

    engine = make_engine(shutdown_timeout=600)
    started = threading.Event()

    @engine.workflow("Stuck")
    async def stuck(step, state, ctx):
        started.set()
        await asyncio.sleep(3600)
        return gendurable.Done(state)

    id_ = await engine.insert_async("Stuck", {})
    task = asyncio.create_task(engine.run_async())
    await asyncio.to_thread(started.wait, 30)
    os.kill(os.getpid(), signal.SIGINT)  # graceful: waits for the step
    await asyncio.sleep(0.5)
    assert not task.done()
    os.kill(os.getpid(), signal.SIGINT)  # at once
    await asyncio.wait_for(task, 30)
    inst = await engine.get_async(id_)
    assert inst.status in ("available", "scheduled")
    assert "interrupted again" in inst.errors[-1]["message"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
