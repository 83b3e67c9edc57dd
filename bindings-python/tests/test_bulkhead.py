"""The bulkhead's rules, sync and async."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import gendurable
from gendurable import Bulkhead, Saturated


def test_sheds_at_once_over_the_limit():
    b = Bulkhead(limit=2, reclaim_after=30)
    assert (b.limit, b.in_flight, b.wait) == (2, 0, None)
    with b:
        with b:
            assert b.in_flight == 2
            with pytest.raises(Saturated) as exc, b:
                pass
            assert isinstance(exc.value, gendurable.Error)
            assert b.try_acquire() is None
        assert b.in_flight == 1
    assert b.in_flight == 0


def test_released_on_exception_and_by_decorator():
    b = Bulkhead(limit=1, reclaim_after=30)

    @b
    def work(x):
        assert b.in_flight == 1
        if x:
            raise ValueError("boom")
        return "ok"

    assert work(0) == "ok"
    with pytest.raises(ValueError):
        work(1)
    assert b.in_flight == 0
    assert b.call(lambda: b.in_flight) == 1
    with pytest.raises(RuntimeError), b:
        raise RuntimeError
    assert b.in_flight == 0


def test_explicit_permits():
    b = Bulkhead(limit=1, reclaim_after=30)
    p = b.acquire()
    assert p.is_current and b.in_flight == 1
    with pytest.raises(Saturated):
        b.acquire()
    p.release()
    p.release()  # idempotent
    assert not p.is_current and b.in_flight == 0
    with b.acquire():
        assert b.in_flight == 1
    assert b.in_flight == 0


def test_bounded_wait_gets_a_released_permit():
    b = Bulkhead(limit=1, reclaim_after=30, wait=30)
    holder = b.acquire()

    def release_when_someone_waits():
        while b.waiting == 0:
            time.sleep(0.001)
        holder.release()

    t = threading.Thread(target=release_when_someone_waits)
    t.start()
    with b:  # waits (GIL released) until the other thread releases
        assert b.in_flight == 1
    t.join()
    assert b.in_flight == 0 and b.waiting == 0


def test_bounded_wait_then_saturated():
    b = Bulkhead(limit=1, reclaim_after=30, wait=0.01)
    with b:
        with pytest.raises(Saturated):
            b.acquire()
        assert b.waiting == 0


def test_reclaim_after_frees_a_leaked_permit():
    b = Bulkhead(limit=1, reclaim_after=0.05, wait=30)
    leaked = b.acquire()
    # Nobody releases `leaked`; the waiter wakes when its deadline passes.
    with b.acquire() as fresh:
        assert fresh.is_current
        assert not leaked.is_current
        leaked.release()  # late release of a reclaimed permit frees nothing
        assert b.in_flight == 1
    assert b.in_flight == 0


def test_reset():
    b = Bulkhead(limit=2, reclaim_after=30)
    p1, p2 = b.acquire(), b.acquire()
    b.reset()
    assert b.in_flight == 0 and not p1.is_current
    with b:
        p1.release()
        p2.release()
        assert b.in_flight == 1


def test_named_bulkheads_share_the_registry():
    a = Bulkhead(limit=3, reclaim_after=30, name="payments-test")
    assert a.name == "payments-test" and a.limit == 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"limit": 0, "reclaim_after": 1}, "limit"),
        ({"limit": -1, "reclaim_after": 1}, "limit"),
        ({"limit": True, "reclaim_after": 1}, "limit"),
        ({"limit": 1, "reclaim_after": 0}, "reclaim_after"),
        ({"limit": 1, "reclaim_after": float("nan")}, "reclaim_after"),
        ({"limit": 1, "reclaim_after": "1"}, "reclaim_after"),
        ({"limit": 1, "reclaim_after": 1, "wait": float("inf")}, "wait"),
        ({"limit": 1, "reclaim_after": 1, "wait": -1}, "wait"),
    ],
)
def test_bad_configuration(kwargs, match):
    with pytest.raises(gendurable.InvalidConfig, match=match):
        Bulkhead(**kwargs)


async def test_async_with_and_decorator():
    b = Bulkhead(limit=2, reclaim_after=30)

    @b
    async def call(x):
        await asyncio.sleep(0)
        return x * 2

    assert await call(2) == 4
    async with b, b:
        assert b.in_flight == 2
        with pytest.raises(Saturated):
            async with b:
                pass
        with pytest.raises(Saturated):
            await call(1)
    assert b.in_flight == 0
    assert await b.call_async(call, 5) == 10


async def test_async_tasks_each_hold_their_own_permit():
    b = Bulkhead(limit=3, reclaim_after=30)
    inside = asyncio.Event()
    go = asyncio.Event()
    entered = 0

    async def worker():
        nonlocal entered
        async with b:
            entered += 1
            if entered == 3:
                inside.set()
            await go.wait()

    tasks = [asyncio.create_task(worker()) for _ in range(3)]
    await inside.wait()
    assert b.in_flight == 3
    go.set()
    await asyncio.gather(*tasks)
    assert b.in_flight == 0


async def test_async_cancellation_releases():
    b = Bulkhead(limit=1, reclaim_after=30)
    holding = asyncio.Event()

    async def holder():
        async with b:
            holding.set()
            await asyncio.Event().wait()

    t = asyncio.create_task(holder())
    await holding.wait()
    assert b.in_flight == 1
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert b.in_flight == 0


async def test_async_bounded_wait():
    b = Bulkhead(limit=1, reclaim_after=30, wait=30)
    holder = b.acquire()

    async def release_when_waited():
        while b.waiting == 0:
            await asyncio.sleep(0.001)
        holder.release()

    r = asyncio.create_task(release_when_waited())
    async with b:  # waits without blocking the loop, so `r` runs
        assert b.in_flight == 1
    await r
    short = Bulkhead(limit=1, reclaim_after=30, wait=0.01)
    async with short:
        with pytest.raises(Saturated):
            await short.acquire_async()
