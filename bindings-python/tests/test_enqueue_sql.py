"""gendurable.enqueue / enqueue_async / enqueue_sql: an instance enqueued in
the application's own transaction through psycopg 3 or asyncpg is there only
once it commits, and a running engine completes it; the database refuses bad
input with the engine's message (SQLSTATE 22023), through the driver's own
exception; values are always bound parameters."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import asyncpg
import psycopg
import pytest
from psycopg.rows import dict_row

import gendurable
from conftest import wait_until

NASTY = {"note": "it's '; DROP TABLE instances; --", "q": "\"'\\", "n": [1, 2.5, None, True]}


def _engine(make_engine):
    engine = make_engine(queues={"default": 2, "bulk": 1})

    @engine.workflow("Orders.Fulfil")
    class Fulfil:
        def start(self, state, ctx):
            return gendurable.Done({**state, "done": True})

    engine.migrate()
    return engine, Fulfil


def _missing(engine, id_):
    with pytest.raises(gendurable.NotFound):
        engine.get(id_)


def _completed(engine, id_):
    return wait_until(
        lambda: (i := engine.get(id_)).status == "completed" and i, f"instance {id_} completed"
    )


def test_psycopg_rollback_leaves_nothing_and_commit_runs(make_engine, database_url, schema):
    engine, fulfil = _engine(make_engine)
    engine.start()
    with psycopg.connect(database_url) as conn:
        with conn.transaction():
            gone = gendurable.enqueue(conn, fulfil, {"order_id": 1}, schema=schema)
            raise psycopg.Rollback()
        _missing(engine, gone)

        with conn.transaction():
            conn.execute("CREATE TEMP TABLE orders (id int)")
            conn.execute("INSERT INTO orders VALUES (2)")
            id_ = gendurable.enqueue(
                conn,
                fulfil,
                {"order_id": 2},
                concurrency_key=("account", 3),
                priority=4,
                max_attempts=5,
                schema=schema,
            )
            _missing(engine, id_)  # not before the commit
    i = _completed(engine, id_)
    assert i.workflow == "Orders.Fulfil"
    assert i.state == {"order_id": 2, "done": True}
    assert (i.priority, i.max_attempts, i.queue, i.step) == (4, 5, "default", "start")
    assert i.concurrency_key == "account:3"


def test_psycopg_cursor_with_a_dict_row_factory(make_engine, database_url, schema):
    engine, _ = _engine(make_engine)
    engine.start()
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=dict_row)
        id_ = gendurable.enqueue(cur, "Orders.Fulfil", queue="bulk", schema=schema)
        later = gendurable.enqueue(
            cur,
            "Orders.Fulfil",
            scheduled_at=datetime.now(timezone.utc) + timedelta(hours=1),
            rate_limit="api:x",
            schema=schema,
        )
    assert _completed(engine, id_).state == {"done": True}
    i = engine.get(later)
    assert (i.status, i.rate_limit) == ("scheduled", "api:x")


async def test_asyncpg_rollback_leaves_nothing_and_commit_runs(make_engine, database_url, schema):
    engine, fulfil = _engine(make_engine)
    engine.start()
    conn = await asyncpg.connect(database_url)
    try:
        tx = conn.transaction()
        await tx.start()
        gone = await gendurable.enqueue_async(conn, fulfil, {"order_id": 1}, schema=schema)
        await tx.rollback()
        _missing(engine, gone)

        async with conn.transaction():
            id_ = await gendurable.enqueue_async(
                conn,
                "Orders.Fulfil",
                NASTY,
                step="start",
                concurrency_key="account:9",
                schema=schema,
            )
            _missing(engine, id_)
    finally:
        await conn.close()
    i = _completed(engine, id_)
    assert i.state == {**NASTY, "done": True}
    assert i.concurrency_key == "account:9"


async def test_psycopg_async_connection(make_engine, database_url, schema):
    engine, fulfil = _engine(make_engine)
    engine.start()
    async with await psycopg.AsyncConnection.connect(database_url) as conn, conn.transaction():
        id_ = await gendurable.enqueue_async(conn, fulfil, {"a": 1}, schema=schema)
    assert _completed(engine, id_).state == {"a": 1, "done": True}


def test_psycopg_bad_priority_is_the_drivers_error(make_engine, database_url, schema):
    _engine(make_engine)
    with psycopg.connect(database_url) as conn:
        with pytest.raises(psycopg.Error) as e:
            gendurable.enqueue(conn, "Orders.Fulfil", priority=12, schema=schema)
        assert e.value.sqlstate == "22023"
        assert isinstance(e.value, psycopg.errors.InvalidParameterValue)
        assert e.value.diag.message_primary == "invalid priority: must be 0 to 9, got 12"
        conn.rollback()
        assert conn.execute(f'SELECT count(*) FROM "{schema}".instances').fetchone() == (0,)


async def test_asyncpg_bad_priority_is_the_drivers_error(make_engine, database_url, schema):
    _engine(make_engine)
    conn = await asyncpg.connect(database_url)
    try:
        with pytest.raises(asyncpg.PostgresError) as e:
            await gendurable.enqueue_async(conn, "Orders.Fulfil", priority=12, schema=schema)
        assert e.value.sqlstate == "22023"
        assert isinstance(e.value, asyncpg.exceptions.InvalidParameterValueError)
        assert e.value.args[0] == "invalid priority: must be 0 to 9, got 12"
    finally:
        await conn.close()


def test_enqueue_sql_binds_every_value(make_engine, database_url, schema):
    sql, params = gendurable.enqueue_sql(
        "Orders.Fulfil", NASTY, concurrency_key=("account", 7), priority=2, schema=schema
    )
    assert sql == (
        f'SELECT id, conflict FROM "{schema}".enqueue(workflow => %s::text, state => %s::jsonb,'
        " priority => %s::integer, concurrency_key => %s::text)"
    )
    assert params == ("Orders.Fulfil", json.dumps(NASTY, separators=(",", ":")), 2, "account:7")
    assert "DROP" not in sql

    sql, params = gendurable.enqueue_sql("W", paramstyle="numeric", queue="q", max_attempts=3)
    assert sql == (
        'SELECT id, conflict FROM "gendurable".enqueue(workflow => $1::text, queue => $2::text,'
        " max_attempts => $3::integer)"
    )
    assert params == ("W", "q", 3)

    engine, _ = _engine(make_engine)
    sql, params = gendurable.enqueue_sql("Orders.Fulfil", NASTY, schema=schema)
    with psycopg.connect(database_url) as conn:
        id_, conflict = conn.execute(sql, params).fetchone()
    assert conflict is False
    assert engine.get(id_).state == NASTY


@pytest.mark.parametrize(
    ("options", "error", "field"),
    [
        ({"schema": "Public"}, gendurable.InvalidConfig, None),
        ({"schema": 'x"; DROP'}, gendurable.InvalidConfig, None),
        ({"schema": "a" * 49}, gendurable.InvalidConfig, None),
        ({"paramstyle": "qmark"}, gendurable.InvalidConfig, None),
        ({"priority": "1"}, gendurable.InvalidInput, "priority"),
        ({"priority": True}, gendurable.InvalidInput, "priority"),
        ({"max_attempts": 1.5}, gendurable.InvalidInput, "max_attempts"),
        ({"queue": 7}, gendurable.InvalidInput, "queue"),
        ({"concurrency_key": ("account", None)}, gendurable.InvalidInput, "concurrency_key"),
        ({"scheduled_at": datetime(2030, 1, 1)}, gendurable.InvalidInput, "scheduled_at"),
        ({"scheduled_at": "2030-01-01"}, gendurable.InvalidInput, "scheduled_at"),
    ],
)
def test_enqueue_sql_refuses_wrong_types(options, error, field):
    with pytest.raises(error) as e:
        gendurable.enqueue_sql("W", {}, **options)
    if field is not None:
        assert e.value.field == field


def test_enqueue_sql_refuses_state_that_is_not_json():
    with pytest.raises(gendurable.InvalidInput) as e:
        gendurable.enqueue_sql("W", {"x": float("nan")})
    assert e.value.field == "state"
    with pytest.raises(gendurable.InvalidInput):
        gendurable.enqueue_sql("W", {"x": object()})


def test_the_wrong_kind_of_connection_is_a_type_error():
    class AsyncpgLike:
        async def fetchval(self, *a):
            raise AssertionError

    with pytest.raises(TypeError, match="enqueue_async"):
        gendurable.enqueue(AsyncpgLike(), "W")
    with pytest.raises(TypeError):
        gendurable.enqueue(object(), "W")


@gendurable.workflow(
    "Orders.Ship",
    queue="bulk",
    priority=3,
    max_attempts=4,
    backoff=(1, 60),
    rate_limits={"start": "carrier:ups", "label": "printer:a"},
)
class Ship:
    def start(self, state, ctx):
        return gendurable.Done(state)

    def label(self, state, ctx):
        return gendurable.Done(state)


def test_enqueue_sql_applies_a_decorated_workflows_declarations():
    sql, params = gendurable.enqueue_sql(Ship, {"a": 1})
    assert sql == (
        'SELECT id, conflict FROM "gendurable".enqueue(workflow => %s::text,'
        " state => %s::jsonb, queue => %s::text, priority => %s::integer,"
        " rate_limit => %s::text, max_attempts => %s::integer)"
    )
    assert params == ("Orders.Ship", '{"a":1}', "bulk", 3, "carrier:ups", 4)
    assert "backoff" not in sql

    # An option given wins; the rate limit is the one declared for the step given.
    sql, params = gendurable.enqueue_sql(
        Ship, step="label", queue="q", priority=0, max_attempts=9, paramstyle="numeric"
    )
    assert params == ("Orders.Ship", "label", "q", 0, "printer:a", 9)
    _, params = gendurable.enqueue_sql(Ship, rate_limit="api:x")
    assert params == ("Orders.Ship", "bulk", 3, "api:x", 4)

    # By name: none of the workflow's declarations.
    sql, params = gendurable.enqueue_sql("Orders.Ship", {"a": 1})
    assert sql == (
        'SELECT id, conflict FROM "gendurable".enqueue(workflow => %s::text, state => %s::jsonb)'
    )
    assert params == ("Orders.Ship", '{"a":1}')


def test_psycopg_stores_a_decorated_workflows_declarations(make_engine, database_url, schema):
    engine = make_engine()
    engine.migrate()
    with psycopg.connect(database_url) as conn, conn.transaction():
        declared = gendurable.enqueue(conn, Ship, {"a": 1}, schema=schema)
        given = gendurable.enqueue(
            conn, Ship, queue="q", priority=7, max_attempts=2, rate_limit="api:x", schema=schema
        )
        named = gendurable.enqueue(conn, "Orders.Ship", schema=schema)

    def row(id_):
        i = engine.get(id_)
        return (i.queue, i.priority, i.max_attempts, i.rate_limit)

    assert row(declared) == ("bulk", 3, 4, "carrier:ups")
    assert row(given) == ("q", 7, 2, "api:x")
    assert row(named) == ("default", 0, 20, None)
