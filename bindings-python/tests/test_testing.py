"""gendurable.testing as an application's tests use it: insert through the
application's code, assert on what was inserted, drain the queues, assert on
the outcome; or an inline engine that runs each insert to its end."""

from __future__ import annotations

import pytest

import gendurable
from apps import shop
from gendurable import Done, InvalidInput
from gendurable.testing import (
    Drained,
    assert_inserted,
    drain,
    drain_async,
    inserted,
    inserted_async,
    refute_inserted,
)


@pytest.fixture
def engine(database_url, schema):
    e = shop.engine(database_url, schema)
    yield e
    e.shutdown()


def test_insert_assert_drain(engine):
    id = shop.place_order(engine, 1, 500, "ada@example.com")
    shop.place_order(engine, 2, 0, "bob@example.com")

    order = assert_inserted(engine, shop.Order, state={"order": 1}, status="available")
    assert order.id == id and order.queue == "orders"
    assert_inserted(engine, "Shop.Mail", state={"to": "ada@example.com", "order": 1})
    refute_inserted(engine, shop.Order, state={"order": 3})
    refute_inserted(engine, shop.Order, status="completed")

    # The mails are in the default queue; the orders in theirs.
    assert drain(engine) == Drained(steps=2, completed=2)
    assert drain(engine, "orders") == Drained(steps=3, completed=1, discarded=1)
    assert drain(engine, "orders") == Drained()

    done = assert_inserted(engine, shop.Order, state={"order": 1}, status="completed")
    assert done.state == {"order": 1, "cents": 500, "charged": 500, "receipt": "R-1"}
    discarded = assert_inserted(engine, shop.Order, status="discarded")
    assert discarded.errors[0]["kind"] == "discard"
    assert [i.state["to"] for i in inserted(engine, shop.mail, status="completed")] == [
        "ada@example.com",
        "bob@example.com",
    ]


def test_the_assertions_say_what_was_found(engine):
    shop.place_order(engine, 1, 500, "ada@example.com")
    with pytest.raises(AssertionError) as e:
        assert_inserted(engine, shop.Order, state={"order": 2})
    message = str(e.value)
    assert "expected an instance of 'Shop.Order', state containing {'order': 2}" in message
    assert "found: 1:" in message and "'order': 1" in message and "status='available'" in message

    with pytest.raises(AssertionError) as e:
        assert_inserted(engine, "Shop.Refund")
    assert "instances of 'Shop.Refund' found: none" in str(e.value)

    with pytest.raises(AssertionError) as e:
        refute_inserted(engine, shop.mail, state={"to": "ada@example.com"}, queue="default")
    message = str(e.value)
    assert message.startswith(
        "expected no instance of 'Shop.Mail', state containing {'to': 'ada@example.com'},"
        " queue 'default'; found 1:"
    )


def test_inserted_filters(engine):
    for n in range(3):
        shop.place_order(engine, n, 100 * n, f"{n}@example.com")
    assert [i.state["order"] for i in inserted(engine, shop.Order)] == [0, 1, 2]
    assert len(inserted(engine, shop.Order, limit=2)) == 2
    assert inserted(engine, shop.Order, queue="default") == []
    assert len(inserted(engine, shop.Order, state={})) == 3
    with pytest.raises(InvalidInput, match="status") as e:
        inserted(engine, shop.Order, status="done")
    assert e.value.field == "status"


async def test_async_variants(engine):
    await engine.insert_async(shop.Order, {"order": 9, "cents": 900})
    assert len(await inserted_async(engine, shop.Order, state={"order": 9})) == 1
    assert await drain_async(engine, "orders") == Drained(steps=2, completed=1)
    (done,) = await inserted_async(engine, shop.Order, status="completed")
    assert done.state["receipt"] == "R-9"


def test_an_inline_engine_runs_each_insert_to_its_end(database_url, schema):
    engine = shop.engine(database_url, schema, inline=True)
    try:
        id = shop.place_order(engine, 1, 500, "ada@example.com")
        assert engine.get(id).status == "completed"
        assert engine.get(id).state["receipt"] == "R-1"
        assert_inserted(engine, shop.mail, state={"sent": True}, status="completed")
    finally:
        engine.shutdown()


def test_max_steps_stops_a_workflow_that_never_ends(make_engine):
    engine = make_engine()

    @engine.workflow("Loop")
    def loop(step, state, ctx):
        return gendurable.Next("again", {"n": state.get("n", 0) + 1})

    id = engine.insert("Loop", {})
    assert drain(engine, max_steps=5) == Drained(steps=5)
    assert engine.get(id).state == {"n": 5}


def test_a_drain_with_scheduled_retries_errors_to_their_last_attempt(make_engine):
    engine = make_engine()

    @engine.workflow("Flaky", max_attempts=3)
    def flaky(step, state, ctx):
        if ctx.attempt < 3:
            raise RuntimeError("not yet")
        return Done(state)

    engine.insert("Flaky", {})
    assert drain(engine, scheduled=True) == Drained(steps=3, retried=2, completed=1)
