"""Every transition a step can return, from sync and async steps."""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timedelta, timezone

import pytest

import gendurable
from conftest import wait_until
from gendurable import Await, Cancel, Discard, Done, Next, Snooze


def test_next_and_done_sync_and_async_methods(make_engine):
    engine = make_engine()
    finished = threading.Event()
    seen = {}

    @engine.workflow("Order.Ship")
    class Ship:
        def start(self, state, ctx):
            seen["start"] = (ctx.workflow, ctx.attempt, ctx.concurrency_key)
            return Next("pack", {**state, "started": True})

        async def pack(self, state, ctx):
            await asyncio.sleep(0)
            return Next("finish", {**state, "packed": True})

        def finish(self, state, ctx):
            finished.set()
            return Done({**state, "shipped_by": ctx.id})

    id_ = engine.insert(Ship, {"order": 1}, concurrency_key=("order", 1))
    assert engine.get(id_).status == "available"
    engine.start()
    assert finished.wait(30)
    engine.shutdown()
    inst = engine.get(id_)
    assert inst.status == "completed"
    assert inst.state == {"order": 1, "started": True, "packed": True, "shipped_by": id_}
    assert seen["start"] == ("Order.Ship", 1, "order:1")
    assert inst.finished and inst.finished_at is not None


def test_function_workflows_catch_all_and_per_step(make_engine):
    engine = make_engine()
    done = threading.Event()

    @gendurable.workflow("Fn.All")
    def all_steps(step, state, ctx):
        if step == "start":
            return Next("second", {"n": state["n"] + 1})
        return Done({"n": state["n"] * 10, "last": step})

    @gendurable.workflow("Fn.Steps", step="start")
    async def first(state, ctx):
        return Next("finish", state)

    @gendurable.workflow("Fn.Steps", step="finish")
    def finish(state, ctx):
        done.set()
        return Done({**state, "ok": True})

    engine.register(all_steps, first, finish)
    assert engine.workflows == ["Fn.All", "Fn.Steps"]
    a = engine.insert("Fn.All", {"n": 1})
    engine.start()
    b = engine.insert("Fn.Steps", {"x": 1})
    assert done.wait(30)
    wait_until(lambda: engine.get(a).finished, "Fn.All to finish")
    engine.shutdown()
    assert engine.get(a).state == {"n": 20, "last": "second"}
    assert engine.get(b).state == {"x": 1, "ok": True}


def test_next_key_release_switch_keep_and_delay(make_engine):
    engine = make_engine()
    keys = {}
    done = threading.Event()

    @engine.workflow("Keys")
    class Keys:
        def start(self, state, ctx):
            keys["start"] = ctx.concurrency_key
            return Next("kept", state)  # keeps the key

        def kept(self, state, ctx):
            keys["kept"] = ctx.concurrency_key
            return Next("switched", state, concurrency_key=("tenant", 9))

        def switched(self, state, ctx):
            keys["switched"] = ctx.concurrency_key
            return Next("released", state, concurrency_key=None, delay=timedelta(milliseconds=10))

        def released(self, state, ctx):
            keys["released"] = ctx.concurrency_key
            done.set()
            return Done(state)

    id_ = engine.insert("Keys", {}, concurrency_key="account:1")
    engine.start()
    assert done.wait(30)
    engine.shutdown()
    assert keys == {
        "start": "account:1",
        "kept": "account:1",
        "switched": "tenant:9",
        "released": None,
    }
    assert engine.get(id_).concurrency_key is None


def test_snooze_is_not_an_attempt(make_engine):
    engine = make_engine()
    runs = []
    done = threading.Event()

    @engine.workflow("Snoozer")
    def snoozer(step, state, ctx):
        runs.append(ctx.attempt)
        if len(runs) < 3:
            return Snooze(0.01)
        done.set()
        return Done({"runs": len(runs)})

    id_ = engine.insert("Snoozer", {})
    engine.start()
    assert done.wait(30)
    engine.shutdown()
    assert engine.get(id_).state == {"runs": 3}
    assert runs == [1, 1, 1]


def test_error_returned_retries_then_discards(make_engine):
    engine = make_engine()
    attempts = []
    last = threading.Event()

    @engine.workflow("Flaky")
    def flaky(step, state, ctx):
        attempts.append(ctx.attempt)
        if ctx.attempt == ctx.max_attempts:
            last.set()
        return gendurable.Error("upstream said no", detail="HTTP 503")

    id_ = engine.insert("Flaky", {}, max_attempts=3)
    engine.start()
    assert last.wait(30)
    engine.shutdown()
    inst = engine.get(id_)
    assert attempts == [1, 2, 3]
    assert inst.status == "discarded"
    assert [e["message"] for e in inst.errors] == ["upstream said no"] * 3
    assert inst.errors[0]["detail"] == "HTTP 503"


def test_exception_is_an_error_with_its_traceback(make_engine):
    engine = make_engine()
    ran = threading.Event()

    @engine.workflow("Boom")
    class Boom:
        async def start(self, state, ctx):
            ran.set()
            raise KeyError("missing-thing")

    id_ = engine.insert("Boom", {}, max_attempts=1)
    engine.start()
    assert ran.wait(30)
    engine.shutdown()
    inst = engine.get(id_)
    assert inst.status == "discarded"
    err = inst.errors[0]
    assert err["message"] == "KeyError: 'missing-thing'"
    assert "Traceback (most recent call last)" in err["detail"]
    assert 'raise KeyError("missing-thing")' in err["detail"]


def test_not_a_transition_is_an_error(make_engine):
    engine = make_engine()
    ran = threading.Event()

    @engine.workflow("Lost")
    def lost(step, state, ctx):
        ran.set()
        return {"oops": 1}

    id_ = engine.insert("Lost", {}, max_attempts=1)
    engine.start()
    assert ran.wait(30)
    engine.shutdown()
    assert "expected Next, Done" in engine.get(id_).errors[0]["message"]


def test_non_json_state_returned_is_an_error(make_engine):
    engine = make_engine()
    ran = threading.Event()

    @engine.workflow("BadState")
    def bad(step, state, ctx):
        ran.set()
        return Done({"s": {1, 2}})

    id_ = engine.insert("BadState", {}, max_attempts=1)
    engine.start()
    assert ran.wait(30)
    engine.shutdown()
    inst = engine.get(id_)
    assert inst.status == "discarded"
    assert "state" in inst.errors[0]["message"]


def test_cancel_transition(make_engine):
    engine = make_engine()
    ran = threading.Event()

    @engine.workflow("Quitter")
    def quitter(step, state, ctx):
        ran.set()
        return Cancel("not needed any more")

    id_ = engine.insert("Quitter", {})
    engine.start()
    assert ran.wait(30)
    engine.shutdown()
    inst = engine.get(id_)
    assert inst.status == "cancelled"
    assert inst.errors[-1]["message"] == "not needed any more"


def test_discard_is_final_whatever_attempts_are_left(make_engine):
    engine = make_engine()
    finished = threading.Semaphore(0)

    def charge(card):  # deep in a call stack: raised, not returned
        raise gendurable.Discard(f"card {card} declined")

    @engine.workflow("Charge")
    class Charge:
        def start(self, state, ctx):
            if ctx.attempt == 1:
                raise ConnectionError("gateway unreachable")
            finished.release()
            return Discard("card declined")

        async def deep(self, state, ctx):
            finished.release()
            charge(state["card"])

        def malformed(self, state, ctx):
            finished.release()
            if state["raise"]:
                raise Discard(42)  # type: ignore[arg-type]
            return Discard(None)  # type: ignore[arg-type]

    returned = engine.insert("Charge", {}, max_attempts=5)
    raised = engine.insert("Charge", {"card": 7}, step="deep", max_attempts=5)
    bad = [
        engine.insert("Charge", {"raise": r}, step="malformed", max_attempts=1)
        for r in (False, True)
    ]
    engine.start()
    for _ in range(4):
        assert finished.acquire(timeout=30)
    engine.shutdown()

    inst = engine.get(returned)
    assert (inst.status, inst.attempt, len(inst.errors)) == ("discarded", 2, 2)
    assert inst.errors[0]["kind"] == "error"
    assert inst.errors[0]["message"] == "ConnectionError: gateway unreachable"
    last = inst.errors[-1]
    assert (last["kind"], last["message"], last["attempt"]) == ("discard", "card declined", 2)

    inst = engine.get(raised)
    assert (inst.status, inst.attempt) == ("discarded", 1)
    assert [(e["kind"], e["message"]) for e in inst.errors] == [("discard", "card 7 declined")]

    for id_ in bad:  # an error outcome, like any unusable transition
        inst = engine.get(id_)
        assert inst.status == "discarded"
        [err] = inst.errors
        assert err["kind"] == "error"
        assert err["message"].startswith("invalid reason: must be a str")


def test_discard_is_an_error_and_a_transition():
    d = Discard("card declined")
    assert isinstance(d, gendurable.Error) and isinstance(d, gendurable.Transition)
    assert (d.reason, str(d), repr(d)) == (
        "card declined",
        "card declined",
        "Discard('card declined')",
    )
    assert str(Discard(42)) == "42"  # type: ignore[arg-type]


def test_await_signal_by_name_and_by_id(make_engine):
    engine = make_engine()
    woke = {}
    both = threading.Barrier(3, timeout=30)

    @engine.workflow("Waiter")
    class Waiter:
        def start(self, state, ctx):
            return Await("woken", state, signal="payment.received")

        async def woken(self, state, ctx):
            woke[ctx.id] = ctx.wake
            await asyncio.get_running_loop().run_in_executor(None, both.wait)
            return Done(state)

    a = engine.insert("Waiter", {})
    b = engine.insert("Waiter", {})
    engine.start()
    wait_until(lambda: engine.get(a).status == engine.get(b).status == "awaiting", "both awaiting")
    assert engine.get(a).await_signal == "payment.received"
    assert engine.signal("payment.received", {"amount": 12}, id=a) == 1
    assert engine.signal("payment.received", ["x"]) == 1  # b only: a is no longer awaiting
    both.wait()
    engine.shutdown()
    assert woke[a].signal == "payment.received" and woke[a].payload == {"amount": 12}
    assert woke[b].payload == ["x"] and not woke[b].timeout
    assert engine.get(a).status == engine.get(b).status == "completed"
    assert engine.signal("payment.received", None) == 0


def test_await_timeout_and_until(make_engine):
    engine = make_engine()
    wakes = {}
    done = threading.Barrier(3, timeout=30)

    @engine.workflow("Sleeper")
    class Sleeper:
        def start(self, state, ctx):
            if state["mode"] == "timeout":
                return Await("after", state, signal="never", timeout=0.05)
            return Await("after", state, until=datetime.now(timezone.utc) + timedelta(seconds=0.05))

        def after(self, state, ctx):
            wakes[state["mode"]] = ctx.wake
            done.wait()
            return Done(state)

    engine.insert("Sleeper", {"mode": "timeout"})
    engine.insert("Sleeper", {"mode": "until"})
    engine.start()
    done.wait()
    assert wakes["timeout"].timeout and wakes["until"].timeout
    assert wakes["timeout"].signal is None


def test_cancel_by_id(make_engine):
    engine = make_engine()
    later = engine.insert("Nobody", {}, schedule_in=3600)
    assert engine.get(later).status == "scheduled"
    assert engine.cancel(later) == gendurable.Cancelled.NOW
    assert engine.get(later).status == "cancelled"
    assert engine.cancel(later) == gendurable.Cancelled.ALREADY_FINISHED


def test_cancel_executing_takes_effect_at_outcome(make_engine):
    engine = make_engine()
    started, release = threading.Event(), threading.Event()

    @engine.workflow("Long")
    def long(step, state, ctx):
        started.set()
        release.wait(30)
        return Next("never", state)

    id_ = engine.insert("Long", {})
    engine.start()
    assert started.wait(30)
    assert engine.cancel(id_, "operator") == gendurable.Cancelled.AT_OUTCOME
    release.set()
    engine.shutdown()
    assert engine.get(id_).status == "cancelled"


def test_insert_many_and_scheduling(make_engine):
    engine = make_engine()
    at = datetime.now(timezone.utc) + timedelta(hours=1)
    ids = engine.insert_many(
        [
            gendurable.NewInstance("A", {"i": 1}, priority=3, queue="mail"),
            gendurable.NewInstance("A", {"i": 2}, scheduled_at=at),
            {"workflow": "A", "state": {"i": 3}, "concurrency_key": ("acct", 3)},
        ]
    )
    assert len(ids) == 3 and ids == sorted(ids)
    one, two, three = (engine.get(i) for i in ids)
    assert (one.priority, one.queue, one.status) == (3, "mail", "available")
    assert two.status == "scheduled" and abs((two.scheduled_at - at).total_seconds()) < 0.01
    assert three.concurrency_key == "acct:3"
    assert engine.insert_many([]) == []


def test_an_insert_takes_its_workflows_defaults_unless_it_names_its_own(make_engine):
    engine = make_engine()

    @engine.workflow("Charge", queue="billing", priority=2, max_attempts=5, backoff=(1.0, 60.0))
    def charge(step, state, ctx):
        return Done(state)

    @gendurable.workflow("Refund", step="start", max_attempts=3)
    def refund(state, ctx):
        return Done(state)

    @engine.workflow("Plain")
    def plain(step, state, ctx):
        return Done(state)

    engine.register(refund)

    def stored(id_):
        i = engine.get(id_)
        return (i.queue, i.priority, i.max_attempts)

    assert stored(engine.insert(charge, {})) == ("billing", 2, 5)
    own = engine.insert("Charge", {}, queue="default", priority=0, max_attempts=20)
    assert stored(own) == ("default", 0, 20)
    ids = engine.insert_many(
        [
            gendurable.NewInstance("Charge", priority=7),
            {"workflow": "Charge", "queue": "urgent"},
            gendurable.NewInstance("Refund"),
            gendurable.NewInstance("Plain"),
        ]
    )
    assert [stored(i) for i in ids] == [
        ("billing", 7, 5),
        ("urgent", 2, 5),
        ("default", 0, 3),
        ("default", 0, 20),
    ]


def test_a_workflows_max_attempts_and_backoff_apply_to_its_errors(make_engine):
    # The engine's backoff would hold the retry for minutes; the workflow's
    # retries it at once.
    engine = make_engine(backoff=(600, 3600))
    attempts = []

    @engine.workflow("Flaky", max_attempts=2, backoff=(0.01, 0.05))
    def flaky(step, state, ctx):
        attempts.append((ctx.attempt, ctx.max_attempts))
        raise RuntimeError("upstream said no")

    id_ = engine.insert(flaky, {})
    engine.start()
    inst = wait_until(lambda: engine.get(id_).finished and engine.get(id_), "a discard")
    engine.shutdown()
    assert inst.status == "discarded"
    assert (inst.attempt, inst.max_attempts) == (2, 2)
    assert attempts == [(1, 2), (2, 2)]
    assert [e["message"] for e in inst.errors] == ["RuntimeError: upstream said no"] * 2


async def test_async_client_calls(make_engine):
    engine = make_engine()
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    @engine.workflow("AsyncClient")
    async def wf(step, state, ctx):
        if step == "start":
            return Await("go", state, signal="go")
        loop.call_soon_threadsafe(done.set)
        return Done({**state, "payload": ctx.wake.payload})

    a = await engine.insert_async("AsyncClient", {"v": 1}, concurrency_key="k:1")
    [b] = await engine.insert_many_async([gendurable.NewInstance("AsyncClient", {"v": 2})])
    assert (await engine.get_async(a)).concurrency_key == "k:1"
    assert await engine.cancel_async(b) == gendurable.Cancelled.NOW
    engine.start()
    while (await engine.get_async(a)).status != "awaiting":
        await asyncio.sleep(0.02)
    assert await engine.signal_async("go", {"p": True}) == 1
    await asyncio.wait_for(done.wait(), 30)
    await engine.shutdown_async()
    assert (await engine.get_async(a)).state == {"v": 1, "payload": {"p": True}}
    with pytest.raises(gendurable.NotFound):
        await engine.get_async(10**12)


def test_steps_insert_and_signal_from_inside(make_engine):
    engine = make_engine()
    children = threading.Semaphore(0)

    @engine.workflow("Parent")
    class Parent:
        def start(self, state, ctx):  # a blocking call from a worker thread
            engine.insert("Child", {"parent": ctx.id, "kind": "sync"})
            return Next("more", state)

        async def more(self, state, ctx):  # an asyncio call from the engine's loop
            await engine.insert_async("Child", {"parent": ctx.id, "kind": "async"})
            return Done(state)

    @engine.workflow("Child")
    def child(step, state, ctx):
        children.release()
        return Done(state)

    engine.insert("Parent", {})
    engine.start()
    assert children.acquire(timeout=30) and children.acquire(timeout=30)
