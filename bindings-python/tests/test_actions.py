"""An operator's actions from Python: pausing and resuming a queue, and
retrying, cancelling, deleting and counting one instance or every one that
keyword conditions name."""

from __future__ import annotations

import datetime as dt
import queue
import threading

import pytest

from conftest import wait_until
from gendurable import Acted, Discard, Done, InvalidInput, NewInstance, Next, NotFound
from gendurable.testing import Drained, drain, inserted


def test_a_paused_queue_claims_nothing_until_resumed(make_engine):
    engine = make_engine(queues={"default": 4})
    started: queue.Queue[int] = queue.Queue()
    hold = threading.Event()

    # The first step of "hold" instances waits for the test's word.
    @engine.workflow("Job")
    def job(step, state, ctx):
        started.put(ctx.id)
        if state.get("hold"):
            assert hold.wait(30)
        return Done(state)

    engine.start()
    # A K = 1 key: the first runs, the second waits for the key.
    first = engine.insert("Job", {"hold": True}, concurrency_key="account:1")
    second = engine.insert("Job", {}, concurrency_key="account:1")
    assert started.get(timeout=30) == first

    before = dt.datetime.now(dt.timezone.utc)
    assert engine.pause_queue("default") is True
    assert engine.pause_queue("default") is False, "already paused"
    [(name, since)] = engine.paused_queues()
    assert name == "default"
    assert since.tzinfo is not None
    assert abs(since - before) < dt.timedelta(minutes=1)

    # The running step finishes and is recorded; its key is not handed over.
    hold.set()
    wait_until(lambda: engine.get(first).status == "completed", "the first to complete")
    assert engine.get(second).status == "available"
    # An insert on this idle node does not start its row here, and a drain
    # by another node (not started; the pause is cluster-wide) claims nothing.
    third = engine.insert("Job", {})
    assert engine.get(third).status == "available"
    other = make_engine()
    other.register(job)
    assert other.paused_queues() == [("default", since)]
    assert drain(other) == Drained()
    assert started.empty()

    # Resumed: the pickers are woken and both run.
    assert engine.resume_queue("default") is True
    assert engine.resume_queue("default") is False, "not paused"
    assert {started.get(timeout=30), started.get(timeout=30)} == {second, third}
    for id in (second, third):
        wait_until(lambda id=id: engine.get(id).status == "completed", f"{id} to complete")
    assert engine.paused_queues() == []


def test_a_queue_name_is_checked(make_engine):
    engine = make_engine()
    with pytest.raises(InvalidInput) as e:
        engine.pause_queue("")
    assert e.value.field == "queue"
    with pytest.raises(InvalidInput):
        engine.resume_queue(7)  # type: ignore[arg-type]


def charges(engine, broken):
    """``Charge``: discarded while ``broken`` holds a true value, else done."""

    @engine.workflow("Charge")
    class Charge:
        def start(self, state, ctx):
            if broken[0]:
                return Discard("the card was refused")
            return Done(state)

    return Charge


def test_a_discarded_instance_retried_runs_again(make_engine):
    engine = make_engine()
    broken = [True]
    charges(engine, broken)
    id = engine.insert("Charge", {})
    assert drain(engine).discarded == 1
    assert engine.get(id).status == "discarded"

    broken[0] = False
    assert engine.retry(id) is True
    assert drain(engine).completed == 1
    i = engine.get(id)
    assert i.status == "completed"
    assert [e["kind"] for e in i.errors] == ["discard", "retry"]
    # A completed instance is not retried; an unknown one is an error.
    assert engine.retry(id) is False
    with pytest.raises(NotFound):
        engine.retry(id + 10_000)

    # A scheduled one runs now, its attempts kept.
    s = engine.insert("Charge", {}, schedule_in=3600)
    assert engine.retry(s) is True
    assert engine.get(s).status == "available"


def test_a_retry_does_not_take_an_identity_another_instance_holds(make_engine):
    engine = make_engine()
    charges(engine, [True])
    first = engine.insert("Charge", {}, idempotency_key="charge:1")
    drain(engine)
    # Discarded: the identity is free again, and taken by a second charge.
    second = engine.insert("Charge", {}, idempotency_key="charge:1")
    assert second != first and not second.conflict
    assert engine.retry(first) is False, "the second holds it"
    assert engine.get(first).status == "discarded"


def test_bulk_actions_apply_to_what_conditions_name(make_engine):
    engine = make_engine()
    Charge = charges(engine, [False])
    # More than one statement's batch (1,000).
    engine.insert_many(NewInstance(Charge, {"n": n}, schedule_in=3600) for n in range(1100))
    engine.insert_many(
        [
            NewInstance("Charge", {}, queue="other", schedule_in=3600, concurrency_key=key)
            for key in (("account", 7), "account:7", "account:8")
        ]
    )
    assert engine.count(status="scheduled", queue="default") == 1100
    assert engine.count(workflow=Charge) == 1103
    assert engine.count(key=("account", 7)) == 2
    assert engine.count(queue="other", key="account:8", status=["scheduled", "available"]) == 1
    assert engine.count(ids=[]) == 0

    acted = engine.cancel_where(status="scheduled", queue="default", reason="not needed")
    assert acted == Acted(matched=1100, changed=1100)
    assert engine.count(status="scheduled", queue="default") == 0
    assert engine.count(status="cancelled") == 1100
    # By the text of the last error, in any case.
    assert engine.count(error="NOT NEEDED") == 1100
    # Cancelled already: named, not changed.
    assert engine.cancel_where(status="cancelled") == Acted(1100, 0)

    # Retry 10 of them by id, then delete the rest.
    ten = [i.id for i in inserted(engine, Charge, status="cancelled", limit=10)]
    assert engine.retry_where(ids=ten, reason="by hand") == Acted(10, 10)
    assert engine.get(ten[0]).errors[-1]["message"] == "by hand"
    assert engine.count(ids=ten, status="available") == 10
    assert engine.delete_where(status="cancelled") == Acted(1090, 1090)
    assert engine.count(queue="default", status=["available", "cancelled", "scheduled"]) == 10
    assert engine.count(queue="other") == 3
    assert drain(engine).completed == 10


def test_executing_instances_are_cancelled_not_deleted(make_engine):
    engine = make_engine()
    entered, hold = threading.Event(), threading.Event()

    # Its step moves on (a completed outcome would stand: cancelling stops
    # what has not finished).
    @engine.workflow("Forever")
    def forever(step, state, ctx):
        entered.set()
        assert hold.wait(30)
        return Next("again", state)

    with engine:
        id = engine.insert("Forever", {})
        assert entered.wait(30)
        assert engine.delete(id) is False
        assert engine.delete_where(workflow=forever) == Acted(1, 0), "executing: not deleted"
        assert engine.get(id).status == "executing"
        assert engine.cancel_where(workflow="Forever", reason="stop") == Acted(1, 1)
        hold.set()
        wait_until(lambda: engine.get(id).finished, "the instance to finish")
    assert engine.get(id).status == "cancelled"
    assert engine.delete(id) is True
    with pytest.raises(NotFound):
        engine.get(id)
    with pytest.raises(NotFound):
        engine.delete(id)


@pytest.mark.parametrize(
    ("conditions", "field"),
    [
        ({}, "filter"),
        ({"status": "done"}, "status"),
        ({"status": ["discarded", 3]}, "status"),
        ({"ids": "5"}, "ids"),
        ({"ids": [5, "6"]}, "id"),
        ({"workflow": lambda step, state, ctx: None}, "workflow"),
        ({"key": ("account", None)}, "key"),
        ({"queue": 1}, "queue"),
        ({"error": b"timeout"}, "error"),
    ],
)
def test_conditions_are_checked_before_anything_is_done(make_engine, conditions, field):
    engine = make_engine()
    charges(engine, [False])
    id = engine.insert("Charge", {}, schedule_in=3600)
    for call in (engine.count, engine.cancel_where, engine.retry_where, engine.delete_where):
        with pytest.raises(InvalidInput) as e:
            call(**conditions)
        assert e.value.field == field, e.value
    if not conditions:
        assert "at least one condition" in str(e.value)
    assert engine.get(id).status == "scheduled"


async def test_the_async_forms(make_engine):
    engine = make_engine()
    charges(engine, [False])
    id = await engine.insert_async("Charge", {}, schedule_in=3600)
    assert await engine.count_async(workflow="Charge") == 1
    assert await engine.cancel_where_async(ids=[id]) == Acted(1, 1)
    assert (await engine.get_async(id)).errors[-1]["message"] == "cancelled"
    assert await engine.retry_where_async(status="cancelled") == Acted(1, 1)
    assert (await engine.get_async(id)).errors[-1]["message"] == "retried"
    assert await engine.retry_async(id) is False, "available: nothing to retry"
    await engine.cancel_async(id)
    assert await engine.retry_async(id) is True
    await engine.cancel_async(id)
    assert await engine.delete_async(id) is True
    assert await engine.delete_where_async(workflow="Charge") == Acted(0, 0)

    assert await engine.pause_queue_async("billing") is True
    [(name, since)] = await engine.paused_queues_async()
    assert name == "billing" and isinstance(since, dt.datetime)
    assert await engine.resume_queue_async("billing") is True
    assert await engine.paused_queues_async() == []
