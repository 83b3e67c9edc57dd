"""Periodic workflows from Python: ``Cron`` entries given to the engine are
translated to the core's ``cron`` option, which checks them; a started
engine inserts each tick once, with the entry's state and insert options."""

from __future__ import annotations

import threading

import pytest

import gendurable
from gendurable import Cron, Done, InvalidConfig, Unique
from gendurable.testing import inserted


def test_cron_is_a_frozen_value():
    @gendurable.workflow("Report")
    class Report:
        def start(self, state, ctx):
            return Done(state)

    paris = "Europe/Paris"
    c = Cron("0 6 * * *", Report, {"kind": "daily"}, name="daily", timezone=paris)
    assert (c.workflow, c.state, c.missed) == ("Report", {"kind": "daily"}, "latest")
    assert c == Cron("0 6 * * *", "Report", {"kind": "daily"}, name="daily", timezone=paris)
    assert hash(c) == hash(Cron("0 6 * * *", "Report", name="daily", timezone=paris))
    assert "schedule='0 6 * * *'" in repr(c)
    with pytest.raises(AttributeError):
        c.schedule = "* * * * *"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Cron("0 6 * * *", "Report", {}, "daily")  # type: ignore[misc]  # name is keyword-only


def test_ticks_are_inserted_with_the_entry_options(make_engine):
    ran = threading.Semaphore(0)
    seen = []
    engine = make_engine(
        queues={"default": 2, "periodic": 2},
        cron=[
            Cron(
                "* * * * * *",
                "Tick",
                {"kind": "every second"},
                name="ticker",
                queue="periodic",
                priority=3,
                concurrency_key=("tick", 1),
                unique=Unique(period=1),
            )
        ],
    )

    @engine.workflow("Tick")
    def tick(step, state, ctx):
        seen.append((state, ctx.queue, ctx.concurrency_key))
        ran.release()
        return Done(state)

    with engine:
        assert ran.acquire(timeout=30) and ran.acquire(timeout=30)
    assert seen[0] == ({"kind": "every second"}, "periodic", "tick:1")
    ticks = inserted(engine, "Tick", state={"kind": "every second"}, queue="periodic")
    assert len(ticks) >= 2 and {i.priority for i in ticks} == {3}
    # Each tick once.
    times = [i.scheduled_at for i in ticks]
    assert len(set(times)) == len(times)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (Cron("every minute", "Tick"), "cron"),
        (Cron("* * * * *", "Tick", timezone="Mars/Olympus"), "Mars/Olympus"),
        (Cron("* * * * *", "Tick", missed="sometimes"), "missed"),
        (Cron("* * * * *", "Tick", rate_limit="nope:1"), "nope"),
    ],
)
def test_entries_are_checked_by_the_core(make_engine, entry, message):
    with pytest.raises(InvalidConfig, match=message):
        make_engine(cron=[entry])


def test_two_entries_of_one_workflow_need_names(make_engine):
    with pytest.raises(InvalidConfig, match="configured twice"):
        make_engine(cron=[Cron("* * * * *", "Tick"), Cron("0 * * * *", "Tick")])
    make_engine(cron=[Cron("* * * * *", "Tick"), Cron("0 * * * *", "Tick", name="hourly")])


def test_cron_takes_a_list_of_entries(make_engine):
    with pytest.raises(InvalidConfig, match=r"list of gendurable\.Cron"):
        make_engine(cron=Cron("* * * * *", "Tick"))
    with pytest.raises(InvalidConfig, match=r"gendurable\.Cron entries"):
        make_engine(cron=[{"schedule": "* * * * *"}])
