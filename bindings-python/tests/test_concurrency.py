"""Concurrency keys (K = 1) and gates, observed from Python steps."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import gendurable
from conftest import Intervals
from gendurable import Done, Next


def test_k1_keys_run_one_at_a_time_and_keys_in_parallel(make_engine):
    engine = make_engine(queues={"default": 8})
    record = Intervals()
    per_key = 6
    keys = ["account:1", "account:2", "account:3"]
    # The first step of every key waits here until one step of each key runs:
    # different keys do run at the same time.
    all_keys = threading.Barrier(len(keys), timeout=30)
    left = threading.Semaphore(0)
    firsts: set[str] = set()
    lock = threading.Lock()

    @engine.workflow("Account.Sync")
    def sync(step, state, ctx):
        start = time.monotonic()
        with lock:
            first = ctx.concurrency_key not in firsts
            firsts.add(ctx.concurrency_key)
        if first:
            all_keys.wait()
        time.sleep(0.005)  # some work, so that overlaps would show
        record.add(ctx.concurrency_key, start, time.monotonic())
        left.release()
        return Done(state)

    engine.insert_many(
        [
            gendurable.NewInstance(sync, {"i": i}, concurrency_key=k)
            for k in keys
            for i in range(per_key)
        ]
    )
    engine.start()
    for _ in range(per_key * len(keys)):
        assert left.acquire(timeout=30)
    engine.shutdown()
    for k in keys:
        assert record.max_concurrency(k) == 1, k
    assert engine.effective_k("account:1") == 1


def test_gate_admits_up_to_its_limit(make_engine):
    limit = 3
    engine = make_engine(
        queues={"default": 10},
        concurrency_limits={"stripe": {"limit": limit, "shards": 2}},
    )
    record = Intervals()
    n = 12
    # Every group of `limit` steps meets here before finishing: the gate lets
    # `limit` run at once (more than one), and the record shows it never lets more.
    group = threading.Barrier(limit, timeout=30)
    left = threading.Semaphore(0)

    @engine.workflow("Charge")
    async def charge(step, state, ctx):
        start = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, group.wait)
        await asyncio.sleep(0.005)
        record.add("stripe", start, time.monotonic())
        left.release()
        return Done(state)

    engine.insert_many(
        [gendurable.NewInstance(charge, {"i": i}, concurrency_key=("stripe", 42)) for i in range(n)]
    )
    engine.start()
    for _ in range(n):
        assert left.acquire(timeout=30)
    engine.shutdown()
    m = record.max_concurrency("stripe")
    assert 1 < m <= limit
    assert engine.effective_k(("stripe", 42)) == limit
    assert all(engine.get(i).status == "completed" for i in range(1, n + 1))


def test_rate_limit_keys_reach_the_steps(make_engine):
    engine = make_engine(
        rate_limits={"openai": {"limit": 1000, "period": 1, "burst": 10}},
    )
    seen = {}
    done = threading.Event()

    @engine.workflow("Rated")
    class Rated:
        def start(self, state, ctx):
            seen["start"] = ctx.rate_limit
            return Next("call", state, rate_limit="openai:tenant7")

        def call(self, state, ctx):
            seen["call"] = ctx.rate_limit
            return Next("after", state)

        def after(self, state, ctx):
            seen["after"] = ctx.rate_limit
            done.set()
            return Done(state)

    engine.insert("Rated", {}, rate_limit="openai:tenant1")
    engine.start()
    assert done.wait(30)
    # A rate-limit key applies to one step: the one it was given for.
    assert seen == {"start": "openai:tenant1", "call": "openai:tenant7", "after": None}


def test_declared_rate_limits_per_step(make_engine):
    engine = make_engine(rate_limits={"openai": {"limit": 1000, "period": 1}})
    seen = {}
    done = threading.Event()

    @engine.workflow("Summarise", rate_limits={"start": "openai:in", "model": "openai:shared"})
    class Summarise:
        def start(self, state, ctx):
            seen["start"] = ctx.rate_limit
            return Next("model", state)

        async def model(self, state, ctx):
            seen["model"] = ctx.rate_limit
            return Next("store", state)

        def store(self, state, ctx):
            seen["store"] = ctx.rate_limit
            done.set()
            return Done(state)

    id_ = engine.insert(Summarise, {})
    assert engine.get(id_).rate_limit == "openai:in"
    engine.start()
    assert done.wait(30)
    assert seen == {"start": "openai:in", "model": "openai:shared", "store": None}


def test_declared_rate_limits_are_checked(make_engine):
    engine = make_engine()
    with pytest.raises(gendurable.InvalidInput):
        gendurable.workflow("X", rate_limits={"start": ":bad"})
    with pytest.raises(gendurable.InvalidConfig):
        engine.workflow("X", rate_limits=["start"])
