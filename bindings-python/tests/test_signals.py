"""Durable signals from Python: ``send`` keeps a signal for an instance that
has not reached its await and delivers it once, in order, when it awaits
that name; ``signal(..., ttl=...)`` keeps a signal that woke nobody for the
first awaiter."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from conftest import wait_until
from gendurable import Await, Delivery, Done, InvalidInput, NotFound
from gendurable.testing import drain


@pytest.fixture
def engine(make_engine):
    return make_engine()


def awaiter(engine, hold=None, entered=None):
    """``Await``: awaits the signal ``state["on"]`` ``state["left"]`` times,
    recording each signal in ``state["got"]``; with ``hold``, its first step
    waits for that event."""

    @engine.workflow("Await")
    def run(step, state, ctx):
        if step == "start" and hold is not None:
            entered.set()
            assert hold.wait(30)
        if ctx.wake is not None and ctx.wake.signal is not None:
            state = {**state, "got": [*state["got"], [ctx.wake.signal, ctx.wake.payload]]}
        if state["left"] == 0:
            return Done(state)
        return Await("again", {**state, "left": state["left"] - 1}, signal=state["on"])


def new_state(left, on="go"):
    return {"left": left, "on": on, "got": []}


def test_signals_sent_before_the_await_are_kept_and_delivered_once_in_order(engine):
    hold, entered = threading.Event(), threading.Event()
    awaiter(engine, hold, entered)
    id = engine.insert("Await", new_state(2))
    with engine:
        assert entered.wait(30)
        # While its first step runs: two for it, one it never awaits.
        for name, n in [("go", 1), ("other", 0), ("go", 2)]:
            assert engine.send(id, name, {"n": n}) is Delivery.KEPT
        hold.set()
        i = wait_until(lambda: (i := engine.get(id)).finished and i, "the instance to finish")
    assert i.status == "completed"
    assert i.state["got"] == [["go", {"n": 1}], ["go", {"n": 2}]]
    assert engine.send(id, "go", {"n": 3}) is Delivery.FINISHED
    assert engine.send(id, "go") == "finished"  # a str enum
    with pytest.raises(NotFound):
        engine.send(id + 1000, "go")


def test_send_wakes_an_awaiting_instance(engine):
    awaiter(engine)
    id = engine.insert("Await", new_state(1))
    assert drain(engine).awaiting == 1
    assert engine.get(id).status == "awaiting"
    assert engine.send(id, "go", [1, 2]) is Delivery.WOKEN
    assert drain(engine).completed == 1
    assert engine.get(id).state["got"] == [["go", [1, 2]]]


async def test_send_async(engine):
    awaiter(engine)
    id = await engine.insert_async("Await", new_state(1))
    assert await engine.send_async(id, "go", {"early": True}) is Delivery.KEPT
    # The await finds the kept signal: woken at once, in the same drain.
    d = drain(engine)
    assert (d.awaiting, d.completed) == (1, 1)
    assert (await engine.get_async(id)).state["got"] == [["go", {"early": True}]]


def test_a_signal_with_a_ttl_waits_for_the_first_awaiter(engine):
    awaiter(engine)
    assert engine.signal("late", {"v": 1}) == 0  # not kept
    assert engine.signal("late", {"v": 2}, ttl=60) == 0  # kept for a minute
    first = engine.insert("Await", new_state(1, on="late"))
    second = engine.insert("Await", new_state(1, on="late"))
    drain(engine)
    assert engine.get(first).state["got"] == [["late", {"v": 2}]]
    # Delivered once: the second awaits on.
    assert engine.get(second).status == "awaiting"
    assert engine.signal("late", {"v": 3}, ttl=timedelta(minutes=1)) == 1
    drain(engine)
    assert engine.get(second).state["got"] == [["late", {"v": 3}]]


async def test_signal_async_with_a_ttl(engine):
    awaiter(engine)
    assert await engine.signal_async("soon", "payload", ttl=60) == 0
    id = await engine.insert_async("Await", new_state(1, on="soon"))
    assert drain(engine).completed == 1
    assert (await engine.get_async(id)).state["got"] == [["soon", "payload"]]


def test_the_ttl_is_checked(engine):
    with pytest.raises(InvalidInput, match="ttl") as e:
        engine.signal("x", ttl=0)
    assert e.value.field == "ttl"
    for bad in (-1, float("nan"), "60"):
        with pytest.raises(InvalidInput, match="ttl"):
            engine.signal("x", ttl=bad)
    with pytest.raises(InvalidInput, match="send"):
        engine.signal("x", id=1, ttl=60)
