"""Step timeouts and the cancellation of executing instances from Python: an
``async def`` step past its deadline has its task cancelled (it sees
``asyncio.CancelledError``), a ``def`` step is recorded as timed out while
its thread runs on and its late result is ignored; the error, of kind
``timeout``, is retried and discarded after ``max_attempts``; cancelling an
executing instance cancels its step's task."""

from __future__ import annotations

import asyncio
import threading

import pytest

import gendurable
from conftest import wait_until
from gendurable import Done, InvalidConfig, Next
from gendurable.testing import drain


@pytest.fixture
def engine(make_engine):
    return make_engine()


def _kinds(instance):
    return [e.get("kind") for e in instance.errors]


def test_an_async_step_past_its_deadline_is_cancelled_retried_then_discarded(engine):
    cancelled = []
    both = threading.Event()

    @engine.workflow("Slow", timeout=0.2, max_attempts=2)
    class Slow:
        async def start(self, state, ctx):
            try:
                await asyncio.Event().wait()  # forever
            except asyncio.CancelledError:
                cancelled.append(ctx.attempt)
                if len(cancelled) == 2:
                    both.set()
                raise
            return Done(state)

    id = engine.insert("Slow", {"n": 1})
    d = drain(engine, scheduled=True)
    assert (d.steps, d.retried, d.discarded, d.completed) == (2, 1, 1, 0)
    assert both.wait(10), cancelled
    assert cancelled == [1, 2]
    i = engine.get(id)
    assert i.status == "discarded"
    assert _kinds(i) == ["timeout", "timeout"]
    assert i.errors[0]["message"].startswith('step "start" timed out after 200ms'), i.errors


def test_a_step_timeout_wins_over_the_workflow_timeout(engine):
    seen = []

    @engine.workflow("Mixed", timeout=0.1, max_attempts=1)
    class Mixed:
        @gendurable.step(timeout=30)
        async def start(self, state, ctx):
            # Longer than the workflow's timeout, well within its own.
            await asyncio.sleep(0.3)
            seen.append("start")
            return Next("finish", state)

        async def finish(self, state, ctx):
            await asyncio.Event().wait()

    id = engine.insert("Mixed", {})
    d = drain(engine)
    assert (d.steps, d.discarded) == (2, 1)
    i = engine.get(id)
    assert seen == ["start"] and i.step == "finish" and _kinds(i) == ["timeout"]
    assert "timed out after 100ms" in i.errors[0]["message"]


def test_a_sync_step_is_recorded_as_timed_out_and_its_late_result_ignored(engine):
    release = threading.Event()
    returned = threading.Event()

    @engine.workflow("Blocking", step="start", max_attempts=1)
    @gendurable.step(timeout=0.2)
    def start(state, ctx):
        release.wait()
        returned.set()
        return Done({**state, "late": True})

    id = engine.insert("Blocking", {"n": 1})
    d = drain(engine)
    assert (d.steps, d.discarded) == (1, 1)
    i = engine.get(id)
    assert i.status == "discarded" and _kinds(i) == ["timeout"]
    # The thread runs on until its function returns; what it returns is ignored.
    assert gendurable._gendurable.running_sync_steps() == 1
    release.set()
    assert returned.wait(10)
    wait_until(lambda: gendurable._gendurable.running_sync_steps() == 0, "the thread to end")
    i = engine.get(id)
    assert (i.status, i.state, len(i.errors)) == ("discarded", {"n": 1}, 1)


def test_a_timeout_on_a_running_worker(engine):
    cancelled = threading.Event()

    @engine.workflow("Stuck", max_attempts=1)
    class Stuck:
        @gendurable.step(timeout=0.2)
        async def start(self, state, ctx):
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

    id = engine.insert("Stuck", {})
    with engine:
        assert cancelled.wait(10)
        wait_until(lambda: engine.get(id).finished, "the outcome")
    assert _kinds(engine.get(id)) == ["timeout"]


def test_cancelling_an_executing_async_step_cancels_its_task(engine):
    started = threading.Event()
    cancelled = threading.Event()

    @engine.workflow("Long")
    class Long:
        async def start(self, state, ctx):
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

    id = engine.insert("Long", {})
    with engine:
        assert started.wait(10)
        assert engine.cancel(id, "changed my mind") == gendurable.Cancelled.AT_OUTCOME
        assert cancelled.wait(10)
        wait_until(lambda: engine.get(id).finished, "the outcome")
    i = engine.get(id)
    assert i.status == "cancelled", i.errors


def test_timeouts_are_checked_when_registered(engine):
    with pytest.raises(InvalidConfig, match="must be longer than zero"):

        @engine.workflow("Zero")
        class Zero:
            @gendurable.step(timeout=0)
            def start(self, state, ctx):
                return Done(state)

    with pytest.raises(InvalidConfig, match="catch-all"):

        @engine.workflow("All")
        class All:
            @gendurable.step(timeout=1)
            def step(self, step, state, ctx):
                return Done(state)

    with pytest.raises(InvalidConfig, match="timeout"):

        @engine.workflow("Negative", timeout=-1)
        def negative(step, state, ctx):
            return Done(state)

    assert engine.workflows == []
