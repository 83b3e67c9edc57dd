"""Bad input and bad configuration raise the right exception, and write nothing."""

from __future__ import annotations

import enum
import threading
import uuid
from datetime import datetime

import pytest

import gendurable
from conftest import wait_until
from gendurable import Await, InvalidConfig, InvalidInput


@pytest.fixture
def engine(make_engine):
    e = make_engine(rate_limits={"openai": {"limit": 10, "period": 1.0}})
    e.migrate()
    return e


@pytest.mark.parametrize(
    ("args", "kwargs", "field"),
    [
        (("W", [1, 2]), {}, "state"),
        (("W", "text"), {}, "state"),
        (("W", {"a": {1, 2}}), {}, "state"),
        (("W", {1: "x"}), {}, "state"),
        (("W", {"a": float("nan")}), {}, "state"),
        (("W", {"a": 2**70}), {}, "state"),
        (("W", {"a": "nul\x00"}), {}, "state"),
        (("W", {"a": "\udcff"}), {}, "state"),
        (("", {}), {}, "workflow"),
        (("x" * 256, {}), {}, "workflow"),
        (("W\x00", {}), {}, "workflow"),
        ((42, {}), {}, "workflow"),
        (("W", {}), {"step": ""}, "step"),
        (("W", {}), {"queue": "q\n"}, "queue"),
        (("W", {}), {"priority": 10}, "priority"),
        (("W", {}), {"priority": -1}, "priority"),
        (("W", {}), {"priority": True}, "priority"),
        (("W", {}), {"priority": "1"}, "priority"),
        (("W", {}), {"max_attempts": 0}, "max_attempts"),
        (("W", {}), {"concurrency_key": ""}, "concurrency_key"),
        (("W", {}), {"concurrency_key": ":7"}, "concurrency_key"),
        (("W", {}), {"concurrency_key": "k\x00"}, "concurrency_key"),
        (("W", {}), {"concurrency_key": "k" * 1025}, "concurrency_key"),
        (("W", {}), {"concurrency_key": ("a", 1, 2)}, "concurrency_key"),
        (("W", {}), {"concurrency_key": 7}, "concurrency_key"),
        (("W", {}), {"concurrency_key": ("acct", None)}, "concurrency_key"),
        (("W", {}), {"concurrency_key": ("acct", True)}, "concurrency_key"),
        (("W", {}), {"concurrency_key": ("acct", 1.5)}, "concurrency_key"),
        (("W", {}), {"concurrency_key": ("acct", [1])}, "concurrency_key"),
        (("W", {}), {"concurrency_key": (None, 1)}, "concurrency_key"),
        (("W", {}), {"rate_limit": "anthropic:t1"}, "rate_limit"),
        (("W", {}), {"schedule_in": -1}, "schedule_in"),
        (("W", {}), {"schedule_in": "soon"}, "schedule_in"),
        (("W", {}), {"scheduled_at": datetime(2030, 1, 1)}, "scheduled_at"),
    ],
)
def test_bad_insert(engine, args, kwargs, field):
    with pytest.raises(InvalidInput) as exc:
        engine.insert(*args, **kwargs)
    assert exc.value.field == field
    assert isinstance(exc.value, gendurable.Error) and isinstance(exc.value, ValueError)
    assert str(exc.value)


def test_rejected_batch_writes_nothing(engine):
    good = gendurable.NewInstance("W", {"i": 1})
    with pytest.raises(InvalidInput) as exc:
        engine.insert_many([good, gendurable.NewInstance("W", {"i": 2}, concurrency_key=":x")])
    assert exc.value.field == "concurrency_key"
    first = engine.insert("W", {})
    assert first == 1 or engine.get(first - 1)  # nothing from the failed batch is visible
    with pytest.raises(gendurable.NotFound):
        engine.get(first + 1)
    with pytest.raises(InvalidInput):
        engine.insert_many(["W"])


def test_huge_state_round_trips(engine):
    state = {"blob": "x" * 5_000_000, "nested": [[[{"a": None, "b": 1.5, "c": True}]]]}
    i = engine.insert("W", state)
    assert engine.get(i).state == state


def test_not_found(engine):
    with pytest.raises(gendurable.NotFound) as exc:
        engine.get(123456789)
    assert exc.value.id == 123456789 and isinstance(exc.value, LookupError)
    with pytest.raises(gendurable.NotFound):
        engine.cancel(123456789)
    with pytest.raises(InvalidInput):
        engine.get("1")


def test_bad_signal(engine):
    with pytest.raises(InvalidInput) as exc:
        engine.signal("", None)
    assert exc.value.field == "signal"
    with pytest.raises(InvalidInput) as exc:
        engine.signal("go", {"a": "\x00"})
    assert exc.value.field == "payload"
    with pytest.raises(InvalidInput) as exc:
        engine.signal("go", object())
    assert exc.value.field == "payload"


def test_an_await_on_nothing_fails_its_attempt(make_engine):
    engine = make_engine()

    @engine.workflow("Forever")
    def forever(step, state, ctx):
        return Await("next", state)  # no signal, timeout or time: the core refuses it

    id_ = engine.insert("Forever", {}, max_attempts=1)
    engine.start()
    inst = wait_until(lambda: (i := engine.get(id_)).finished and i, "the attempt to fail")
    assert inst.status == "discarded"
    assert "invalid await: " in inst.errors[-1]["message"], inst.errors


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"queues": {"default": 0}}, 'queue "default": concurrency must be from 1 to 10000'),
        ({"queues": {"default": "10"}}, "queues.default: expected a positive integer"),
        ({"queues": {"": 1}}, "invalid queue: must not be empty"),
        ({"queues": [("default", 1)]}, "queues: expected a map"),
        ({"concurrency_limits": {"stripe": {"limit": 0}}}, 'stripe": limit must be at least 1'),
        ({"concurrency_limits": {"stripe": {"limit": 5, "shards": 0}}}, 'stripe": shards must'),
        ({"concurrency_limits": {"stripe": {"limt": 5}}}, 'stripe: unknown option "limt"'),
        ({"concurrency_limits": {"stripe": {"shards": 5}}}, "stripe: limit is required"),
        ({"concurrency_limits": {"a:b": 5}}, 'concurrency_limits: "a:b" is not a key name'),
        ({"rate_limits": {"openai": {"limit": 10}}}, "openai: period is required"),
        ({"rate_limits": {"openai": {"limit": 10, "period": 0}}}, 'openai": period must be'),
        ({"rate_limits": {"openai": {"limit": 10, "period": 1, "burst": 0}}}, 'openai": burst'),
        (
            {"rate_limits": {"openai": {"limit": 1, "period": 1, "every": 1}}},
            'unknown option "every"',
        ),
        ({"schema": "Bad-Schema"}, 'schema "Bad-Schema" must be'),
        ({"schema": 7}, "schema: expected a string, got 7"),
        ({"poll_interval": -1}, "poll_interval: expected a positive integer"),
        ({"lease": 1, "heartbeat_interval": 1}, "lease .* heartbeat interval"),
        ({"backoff": 5}, "backoff"),
    ],
)
def test_bad_config(database_url, kwargs, match):
    with pytest.raises(InvalidConfig, match=match):
        gendurable.Engine(database_url, **kwargs)


def test_a_url_that_does_not_parse(schema):
    engine = gendurable.Engine("not a url", schema=schema)
    with pytest.raises(InvalidConfig, match="database url"):
        engine.insert("W", {})


def test_no_url(monkeypatch):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(InvalidConfig, match="DATABASE_URL"):
        gendurable.Engine()


def test_url_from_environment(monkeypatch, database_url, schema):
    monkeypatch.setenv("DATABASE_URL", database_url)
    e = gendurable.Engine(schema=schema)
    assert e.get(e.insert("W", {})).workflow == "W"


def test_bad_workflows(make_engine):
    engine = make_engine()
    with pytest.raises(InvalidInput):
        gendurable.workflow("")
    with pytest.raises(InvalidConfig, match="not a workflow"):
        engine.register(lambda: None)
    with pytest.raises(InvalidConfig, match="no workflows"):
        engine.start()

    @engine.workflow("Dup")
    def dup(step, state, ctx):
        return gendurable.Done(state)

    with pytest.raises(InvalidConfig, match="twice"):
        engine.register(dup)

    with pytest.raises(InvalidConfig, match="no step methods"):

        @engine.workflow("Empty")
        class Empty:
            pass


def test_workflows_are_registered_before_the_first_call(make_engine):
    engine = make_engine()

    @engine.workflow("First")
    def first(step, state, ctx):
        return gendurable.Done(state)

    assert repr(engine).endswith("not yet used>")
    engine.insert("First", {})
    with pytest.raises(InvalidConfig, match="register every workflow before") as exc:

        @engine.workflow("Late")
        def late(step, state, ctx):
            return gendurable.Done(state)

    assert "'Late'" in str(exc.value)
    assert engine.workflows == ["First"]


def test_a_declared_rate_limit_needs_a_configured_rate_limit(make_engine):
    engine = make_engine(rate_limits={"openai": {"limit": 10, "period": 1}})
    with pytest.raises(InvalidConfig, match="no rate limit named") as exc:

        @engine.workflow("Summarise", rate_limits={"start": "anthropic:shared"})
        def summarise(step, state, ctx):
            return gendurable.Done(state)

    assert "rate_limit" in str(exc.value) and "anthropic" in str(exc.value)
    assert engine.workflows == []


def test_a_bad_workflow_default_is_refused_when_the_workflow_is_registered(make_engine):
    engine = make_engine()

    with pytest.raises(InvalidConfig) as exc:

        @engine.workflow("Charge", priority=12)
        def charge(step, state, ctx):
            return gendurable.Done(state)

    assert 'workflow_defaults "Charge"' in str(exc.value) and "priority" in str(exc.value)
    assert "12" in str(exc.value)
    assert engine.workflows == []
    assert repr(engine).endswith("not yet used>")


def test_a_workflow_default_is_declared_once(make_engine):
    engine = make_engine()

    @gendurable.workflow("Charge", step="start", max_attempts=5)
    def start(state, ctx):
        return gendurable.Next("capture", state)

    @gendurable.workflow("Charge", step="capture", max_attempts=3)
    def capture(state, ctx):
        return gendurable.Done(state)

    engine.register(start)
    with pytest.raises(InvalidConfig, match="'Charge': max_attempts is declared twice"):
        engine.register(capture)
    with pytest.raises(InvalidConfig, match=r"'Charge': backoff must be a \(base, max\) pair"):
        gendurable.workflow("Charge", backoff=5)


def test_unreachable_database_is_a_database_error(schema):
    e = gendurable.Engine("postgres://nobody@127.0.0.1:1/none", schema=schema)
    with pytest.raises(gendurable.DatabaseError) as exc:
        e.insert("W", {})
    assert exc.value.transient


def test_too_deep_state(engine):
    deep: dict = {}
    cur = deep
    for _ in range(150):
        cur["d"] = {}
        cur = cur["d"]
    with pytest.raises(InvalidInput) as exc:
        engine.insert("W", deep)
    assert exc.value.field == "state" and "nested" in str(exc.value)


def test_a_key_with_a_none_id_is_refused_everywhere(engine):
    bad = ("acct", None)
    with pytest.raises(InvalidInput, match=r"the id of a \(name, id\) key must be") as exc:
        engine.insert("W", {}, concurrency_key=bad)
    assert exc.value.field == "concurrency_key" and "None" in str(exc.value)
    with pytest.raises(InvalidInput):
        gendurable.NewInstance("W", {}, concurrency_key=bad)
    with pytest.raises(InvalidInput):
        engine.effective_k(bad)


async def test_a_key_with_a_none_id_is_refused_async(engine):
    with pytest.raises(InvalidInput) as exc:
        await engine.insert_async("W", {}, concurrency_key=("acct", None))
    assert exc.value.field == "concurrency_key"


def test_a_step_switching_to_a_none_id_key_fails_its_attempt(make_engine):
    engine = make_engine()
    ran = threading.Event()

    @engine.workflow("Switch")
    def switch(step, state, ctx):
        ran.set()
        return gendurable.Next("after", state, concurrency_key=("acct", None))

    id_ = engine.insert("Switch", {}, max_attempts=1)
    engine.start()
    assert ran.wait(30)
    inst = wait_until(lambda: (i := engine.get(id_)).finished and i, "the attempt to fail")
    assert inst.status == "discarded"
    assert "concurrency_key" in inst.errors[-1]["message"], inst.errors


def test_tuple_keys_as_stored(engine):
    class Tier(enum.IntEnum):
        GOLD = 3

    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    for key, stored in [
        (("acct", 7), "acct:7"),
        (("acct", -7), "acct:-7"),
        (("acct", "x:y"), "acct:x:y"),
        (("acct", u), f"acct:{u}"),
        (("tier", Tier.GOLD), "tier:3"),
    ]:
        assert engine.get(engine.insert("W", {}, concurrency_key=key)).concurrency_key == stored
