"""A database that cannot be reached: the error names the cause, at once for a
refused connection, within ``connect_timeout`` for a server that never answers."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit, urlunsplit

import pytest

import gendurable
from gendurable import CannotConnect, DatabaseError


def _with(url: str, *, user: str | None = None, database: str | None = None) -> str:
    u = urlsplit(url)
    netloc = u.netloc
    if user is not None:
        host = netloc.rpartition("@")[2]
        netloc = f"{user}@{host}"
    path = u.path if database is None else f"/{database}"
    return urlunsplit((u.scheme, netloc, path, u.query, u.fragment))


def _raises(url: str, schema: str, **options) -> tuple[CannotConnect, float]:
    engine = gendurable.Engine(url, schema=schema, **options)
    started = time.monotonic()
    with pytest.raises(CannotConnect) as exc:
        engine.insert("W", {})
    return exc.value, time.monotonic() - started


def test_refused_is_named_at_once(schema):
    err, took = _raises("postgres://nobody@127.0.0.1:1/none", schema)
    assert err.cause == "refused" and err.transient
    assert "cannot connect to PostgreSQL at 127.0.0.1:1: connection refused" in str(err)
    assert isinstance(err, DatabaseError) and isinstance(err, gendurable.Error)
    assert took < 2, f"took {took:.1f} s"


def test_every_call_names_the_cause(schema):
    engine = gendurable.Engine("postgres://nobody@127.0.0.1:1/none", schema=schema)

    @engine.workflow("W")
    def w(step, state, ctx):
        return gendurable.Done(state)

    for call in (
        engine.migrate,
        lambda: engine.get(1),
        lambda: engine.signal("go"),
        lambda: engine.cancel(1),
        lambda: engine.insert_many([gendurable.NewInstance("W", {})]),
    ):
        with pytest.raises(CannotConnect, match="connection refused"):
            call()

    with pytest.raises(CannotConnect, match="connection refused"):
        engine.start()
    assert not engine.running


async def test_async_calls_name_the_cause(schema):
    engine = gendurable.Engine("postgres://nobody@127.0.0.1:1/none", schema=schema)
    started = time.monotonic()
    with pytest.raises(CannotConnect) as exc:
        await engine.insert_async("W", {})
    assert exc.value.cause == "refused"
    with pytest.raises(CannotConnect):
        await engine.get_async(1)
    assert time.monotonic() - started < 4


def test_unknown_host(schema):
    err, _ = _raises("postgres://nobody@no-such-host.invalid/none", schema)
    assert err.cause == "unknown_host"
    assert 'unknown host "no-such-host.invalid"' in str(err)


def test_unknown_role_is_an_auth_failure(database_url, schema):
    err, _ = _raises(_with(database_url, user="no_such_role"), schema)
    assert err.cause == "auth" and not err.transient
    assert 'authentication failed for user "no_such_role"' in str(err), err


def test_unknown_database(database_url, schema):
    err, _ = _raises(_with(database_url, database="no_such_database"), schema)
    assert err.cause == "no_database"
    assert 'database "no_such_database" does not exist' in str(err), err


def test_connect_timeout_is_honoured(schema):
    # Accepts connections (the kernel's backlog) and never answers.
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        err, took = _raises(f"postgres://nobody@127.0.0.1:{port}/none", schema, connect_timeout=0.5)
    assert err.cause == "timeout" and err.transient
    assert f"127.0.0.1:{port}: no answer within 0.5 s" in str(err)
    assert took < 3, f"took {took:.1f} s"


def test_bad_connect_timeout(database_url):
    with pytest.raises(gendurable.InvalidConfig, match="connect_timeout"):
        gendurable.Engine(database_url, connect_timeout=-1)


def test_a_reachable_database_still_works_after_a_failure(database_url, schema):
    engine = gendurable.Engine(database_url, schema=schema)
    assert engine.get(engine.insert("W", {"a": 1})).state == {"a": 1}
