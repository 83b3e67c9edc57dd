"""Step errors and discards are warnings on the ``gendurable`` logger, with
the instance in the record."""

from __future__ import annotations

import logging

from gendurable import Discard, Done
from gendurable.testing import drain


def test_step_errors_and_discards_are_logged(make_engine, caplog):
    engine = make_engine(queues={"default": 1})

    @engine.workflow("Charge", max_attempts=2)
    class Charge:
        def start(self, state, ctx):
            if state["card"] == "expired":
                raise Discard("the card expired")
            raise ValueError("the bank is down")

    @engine.workflow("Fine")
    class Fine:
        async def start(self, state, ctx):
            return Done(state)

    down = engine.insert("Charge", {"card": "ok"})
    expired = engine.insert("Charge", {"card": "expired"})
    engine.insert("Fine", {})
    with caplog.at_level(logging.WARNING, logger="gendurable"):
        drain(engine, scheduled=True)
    records = [r for r in caplog.records if r.name == "gendurable"]
    seen = sorted((r.gendurable["id"], r.gendurable["attempt"]) for r in records)
    assert seen == sorted([(down, 1), (down, 2), (expired, 1)]), caplog.text
    first = next(r for r in records if r.gendurable["id"] == down)
    assert first.levelno == logging.WARNING
    assert first.getMessage() == (
        f"Charge step 'start' of instance {down} failed (attempt 1 of 2): "
        "ValueError: the bank is down"
    )
    assert first.gendurable == {
        "id": down,
        "workflow": "Charge",
        "step": "start",
        "attempt": 1,
        "max_attempts": 2,
    }
    gone = next(r for r in records if r.gendurable["id"] == expired)
    assert "discarded its instance" in gone.getMessage()
    assert gone.getMessage().endswith("the card expired")


def test_a_bad_metrics_address_is_refused(make_engine):
    import pytest

    from gendurable import InvalidConfig

    with pytest.raises(InvalidConfig, match="metrics_listen"):
        make_engine(metrics_listen="not an address")


def test_a_running_worker_serves_its_metrics(make_engine):
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = make_engine(queues={"default": 1}, metrics_listen=f"127.0.0.1:{port}")

    @engine.workflow("Fine")
    class Fine:
        def start(self, state, ctx):
            return Done(state)

    engine.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            body = r.read().decode()
    finally:
        engine.shutdown()
    assert "# TYPE gendurable_steps_started_total counter" in body
    assert "gendurable_step_duration_seconds_bucket" in body
