"""Unique inserts and idempotency keys through the Python front door: a
duplicate inserts nothing and reports the instance that holds its identity,
within a batch too; the holder's statuses decide how long it holds it; racing
threads agree on one row per identity; the core checks the options; the SQL
function enqueue() does the same in the caller's transaction."""

from __future__ import annotations

import copy
import pickle
import threading
from datetime import timedelta

import asyncpg
import psycopg
import pytest

import gendurable
from conftest import wait_until
from gendurable import Inserted, InvalidInput, NewInstance, Unique


@pytest.fixture
def engine(make_engine):
    e = make_engine()
    e.migrate()
    return e


def _rows(database_url, schema, where="true"):
    with psycopg.connect(database_url) as conn:
        return conn.execute(f'SELECT count(*) FROM "{schema}".instances WHERE {where}').fetchone()[
            0
        ]


def test_inserted_is_an_id():
    i = Inserted(42, True)
    assert isinstance(i, int) and i == 42 and hash(i) == hash(42)
    assert (i.id, i.conflict) == (42, True) and type(i.id) is int
    assert str(i) == f"{i}" == "42"
    assert repr(i) == "Inserted(id=42, conflict=True)"
    for back in (pickle.loads(pickle.dumps(i)), copy.copy(i), copy.deepcopy(i)):
        assert (back, back.conflict) == (42, True)
    assert Inserted(7).conflict is False


def test_unique_is_a_frozen_value():
    u = Unique(fields=["account"], period=60, states=["scheduled"])
    assert u.fields == ("account",) and u.states == ("scheduled",)
    assert u == Unique(fields=("account",), period=60, states=("scheduled",))
    assert hash(u) == hash(Unique(fields=["account"], period=60, states=["scheduled"]))
    with pytest.raises(AttributeError):
        u.period = 1  # type: ignore[misc]
    assert Unique() == Unique(None, None, None)


def test_a_duplicate_reports_the_holder(engine, database_url, schema):
    by_account = Unique(fields=["account"])
    first = engine.insert("Report", {"account": 7, "by": "ops"}, unique=by_account)
    assert (first.conflict, engine.get(first).state) == (False, {"account": 7, "by": "ops"})
    again = engine.insert("Report", {"account": 7, "by": "cron"}, unique=by_account)
    assert (again.id, again.conflict) == (first.id, True)
    other = engine.insert("Report", {"account": 8}, unique=by_account)
    assert not other.conflict and other != first

    # Unique(): the whole state, with the workflow and the concurrency key.
    whole = engine.insert("Report", {"n": 1}, unique=Unique())
    assert engine.insert("Report", {"n": 1}, unique=Unique()) == whole
    assert engine.insert("Report", {"n": 1}, unique=Unique()).conflict
    assert not engine.insert("Report", {"n": 2}, unique=Unique()).conflict
    assert not engine.insert("Other", {"n": 1}, unique=Unique()).conflict
    keyed = engine.insert("Report", {"n": 1}, unique=Unique(), concurrency_key=("account", 1))
    assert not keyed.conflict
    # Without unique= the same state is another instance.
    assert not engine.insert("Report", {"n": 1}).conflict
    assert _rows(database_url, schema) == 7


async def test_insert_async_reports_the_holder(engine):
    first = await engine.insert_async("Report", {}, idempotency_key="charge:1")
    again = await engine.insert_async("Report", {"x": 1}, idempotency_key="charge:1")
    assert isinstance(again, Inserted)
    assert (first.conflict, again.id, again.conflict) == (False, first.id, True)
    many = await engine.insert_many_async(
        [NewInstance("Report", idempotency_key="charge:1"), NewInstance("Report")]
    )
    assert [(i.id, i.conflict) for i in many] == [(first.id, True), (many[1].id, False)]


def test_a_batch_with_a_duplicate_inside(engine, database_url, schema):
    held = engine.insert("Report", {"account": 7}, unique=Unique(fields=["account"]))

    def report(account, by):
        return NewInstance(
            "Report", {"account": account, "by": by}, unique=Unique(fields=["account"])
        )

    out = engine.insert_many(
        [
            report(9, "a"),
            NewInstance("Report", {}),
            report(9, "b"),
            report(7, "c"),
            {"workflow": "Report", "state": {"account": 9}, "unique": Unique(fields=["account"])},
        ]
    )
    assert all(isinstance(i, Inserted) for i in out)
    assert [i.conflict for i in out] == [False, False, True, True, True]
    assert out[2] == out[4] == out[0] and out[3] == held
    assert out[0] < out[1], "ids in input order"
    assert engine.get(out[0]).state == {"account": 9, "by": "a"}, "the first is inserted"
    assert _rows(database_url, schema) == 3


def test_the_period_is_seconds_like_the_other_durations(engine, database_url):
    """3600 and timedelta(hours=1) are the same period (3,600,000 ms to the
    core), hence the same identity within one window; both inserts are
    retried until they fall in the same window of the database's clock."""
    window = "SELECT floor(extract(epoch FROM clock_timestamp()) / 3600)"
    with psycopg.connect(database_url, autocommit=True) as conn:
        while True:
            (w,) = conn.execute(window).fetchone()
            a = engine.insert("Tick", {"a": 1}, unique=Unique(period=3600))
            b = engine.insert("Tick", {"a": 1}, unique=Unique(period=timedelta(hours=1)))
            if conn.execute(window).fetchone() == (w,):
                break
    assert (b.id, b.conflict) == (a.id, True)
    assert not engine.insert("Tick", {"a": 1}, unique=Unique(period=7200)).conflict


def test_the_holders_statuses_decide(make_engine):
    engine = make_engine()

    @engine.workflow("Charge")
    def charge(step, state, ctx):
        return gendurable.Done(state)

    engine.start()

    def completed(id_):
        wait_until(lambda: engine.get(id_).status == "completed", f"{id_} completed")

    # "active": held until it finishes; a completed one lets the next one in.
    active = Unique(states="active")
    one = engine.insert(charge, {}, idempotency_key="charge:42", unique=active)
    completed(one)
    two = engine.insert(charge, {}, idempotency_key="charge:42", unique=active)
    assert not two.conflict and two != one

    # The default: a completed one still holds its key.
    done = engine.insert(charge, {}, idempotency_key="charge:43")
    completed(done)
    again = engine.insert(charge, {}, idempotency_key="charge:43")
    assert (again.id, again.conflict) == (done.id, True)

    # "all": a cancelled one holds it too; by default a cancelled one does not.
    for states, holds in ((None, False), ("all", True)):
        u = Unique(states=states)
        key = f"refund:{states}"
        kept = engine.insert(charge, {}, idempotency_key=key, unique=u, schedule_in=3600)
        assert engine.cancel(kept) is gendurable.Cancelled.NOW
        after = engine.insert(charge, {}, idempotency_key=key, unique=u, schedule_in=3600)
        assert after.conflict is holds and (after == kept) is holds


def test_racing_threads_agree_on_one_row_per_identity(make_engine, database_url, schema):
    """Eight threads (the GIL released while each waits in Rust) insert the
    same 30 identities, with one repeated inside each batch: one row per
    identity, one inserter each, and every caller is told that row's id.

    The batches list the identities in one order: two batches holding the
    same identities in opposite orders can each wait for the other's row,
    and PostgreSQL then aborts one (deadlock detected, a transient
    DatabaseError)."""
    engines = [make_engine(), make_engine()]
    for e in engines:
        e.migrate()
    identities, threads = 30, 8
    start = threading.Barrier(threads)
    results: list[list[tuple[int, Inserted]]] = [[] for _ in range(threads)]
    failures: list[BaseException] = []

    def inserter(t: int) -> None:
        try:
            accounts = [*range(identities), t % identities]
            batch = [
                NewInstance("Report", {"account": a, "by": t}, unique=Unique(fields=["account"]))
                for a in accounts
            ]
            start.wait()
            results[t] = list(zip(accounts, engines[t % 2].insert_many(batch)))
        except BaseException as e:  # reported by the main thread
            failures.append(e)

    workers = [threading.Thread(target=inserter, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not failures, failures

    told: dict[int, set[int]] = {}
    inserted: dict[int, int] = {}
    for got in results:
        assert len(got) == identities + 1
        for account, r in got:
            told.setdefault(account, set()).add(r.id)
            inserted[account] = inserted.get(account, 0) + (not r.conflict)
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            f"SELECT (state->>'account')::int, id FROM \"{schema}\".instances"
        ).fetchall()
    assert len(rows) == identities, "one row per identity"
    for account, id_ in rows:
        assert told[account] == {id_}, f"every caller told row {id_} for {account}"
        assert inserted[account] == 1, f"one caller inserted {account}"


@pytest.mark.parametrize(
    ("unique", "idempotency_key", "field", "says"),
    [
        (Unique(fields=[]), None, "unique.fields", "must name 1 to 64 state fields, got 0"),
        (Unique(fields=["a"] * 65), None, "unique.fields", "got 65"),
        (Unique(fields=[""]), None, "unique.fields", "must not be empty"),
        (Unique(fields="account"), None, "unique.fields", 'expected a list, got "account"'),
        (Unique(period=0.5), None, "unique.period", "must be at least 1 second, got 500ms"),
        (
            Unique(period=-1),
            None,
            "unique.period",
            "expected a positive integer (milliseconds), got -1000",
        ),
        (Unique(period="1h"), None, "unique.period", "(milliseconds)"),
        (
            Unique(states="done"),
            None,
            "unique.states",
            'expected "active", "all" or a list of statuses, got "done"',
        ),
        (Unique(states=["finished"]), None, "unique.states", '"finished" is not a status'),
        (
            Unique(states=["scheduled", "completed"]),
            None,
            "unique.states",
            "must include scheduled, available, executing and awaiting (missing available)",
        ),
        (None, "", "idempotency_key", "must not be empty"),
        (None, "k" * 1025, "idempotency_key", "is 1025 bytes long; the limit is 1024"),
        (None, "k\x00", "idempotency_key", "must not contain NUL bytes"),
        (None, 42, "idempotency_key", "expected a string, got 42"),
        (True, None, "unique", "must be a gendurable.Unique, got True"),
        ({"fields": ["a"]}, None, "unique", "must be a gendurable.Unique"),
    ],
)
def test_bad_unique_options_raise_the_cores_message(
    engine, database_url, schema, unique, idempotency_key, field, says
):
    with pytest.raises(InvalidInput) as exc:
        engine.insert("W", {}, unique=unique, idempotency_key=idempotency_key)
    assert exc.value.field == field
    assert str(exc.value).startswith(f"invalid {field}: ") and says in str(exc.value)
    # In a batch: all or none.
    with pytest.raises(InvalidInput):
        engine.insert_many(
            [NewInstance("W"), NewInstance("W", unique=unique, idempotency_key=idempotency_key)]
        )
    assert _rows(database_url, schema) == 0


def test_contended_is_a_transient_error():
    assert issubclass(gendurable.Contended, gendurable.Error)
    assert not issubclass(gendurable.Contended, gendurable.DatabaseError)
    assert gendurable.Contended("contended: ...").transient is True


# --- enqueue() in the caller's transaction ---------------------------------------------


def test_psycopg_enqueue_with_an_idempotency_key(engine, database_url, schema):
    with psycopg.connect(database_url) as conn:
        with conn.transaction():
            gone = gendurable.enqueue(
                conn, "Charge", {"n": 1}, idempotency_key="c:1", schema=schema
            )
            assert isinstance(gone, Inserted) and not gone.conflict
            raise psycopg.Rollback()
        assert _rows(database_url, schema) == 0, "a rollback leaves nothing"

        with conn.transaction():
            held = gendurable.enqueue(
                conn, "Charge", {"n": 2}, idempotency_key="c:1", schema=schema
            )
            # The same transaction sees its own row.
            same = gendurable.enqueue(
                conn, "Charge", {"n": 3}, idempotency_key="c:1", schema=schema
            )
            assert (same.id, same.conflict) == (held.id, True)
        assert not held.conflict
        with conn.transaction():
            dup = gendurable.enqueue(conn, "Charge", {"n": 4}, idempotency_key="c:1", schema=schema)
    assert (dup.id, dup.conflict) == (held.id, True)
    assert engine.get(held).state == {"n": 2}
    assert _rows(database_url, schema) == 1
    # The engine's insert sees the same identity.
    assert engine.insert("Charge", {}, idempotency_key="c:1") == held


def test_an_insert_waits_for_an_open_enqueue_with_the_gil_released(engine, database_url, schema):
    """An engine insert racing an enqueue of the same key in a transaction not
    yet committed waits on its row lock (in Rust, the GIL released: this
    thread polls meanwhile); told the committed row, or inserts after a
    rollback."""
    for commit in (True, False):
        key = f"k:{commit}"
        with psycopg.connect(database_url) as conn:  # a transaction until commit()
            held = gendurable.enqueue(conn, "Charge", idempotency_key=key, schema=schema)
            got: list[Inserted] = []
            racer = threading.Thread(
                target=lambda: got.append(engine.insert("Charge", idempotency_key=key))  # noqa: B023
            )
            racer.start()
            with psycopg.connect(database_url, autocommit=True) as watch:
                wait_until(
                    lambda: (
                        watch.execute(
                            "SELECT count(*) FROM pg_stat_activity"
                            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                        ).fetchone()[0]
                        > 0
                    ),
                    "the insert to wait on the enqueue's lock",
                )
            if commit:
                conn.commit()
            else:
                conn.rollback()
            racer.join()
        (r,) = got
        if commit:
            assert (r.id, r.conflict) == (held.id, True)
        else:
            assert not r.conflict and r != held


async def test_asyncpg_enqueue_with_an_idempotency_key(engine, database_url, schema):
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            first = await gendurable.enqueue_async(
                conn, "Charge", idempotency_key="a:1", unique=Unique(states="all"), schema=schema
            )
        again = await gendurable.enqueue_async(
            conn, "Charge", {"x": 1}, idempotency_key="a:1", schema=schema
        )
        by_state = await gendurable.enqueue_async(
            conn, "Charge", {"account": 3, "x": 1}, unique=Unique(fields=["account"]), schema=schema
        )
        dup = await gendurable.enqueue_async(
            conn, "Charge", {"account": 3, "x": 2}, unique=Unique(fields=["account"]), schema=schema
        )
        with pytest.raises(asyncpg.exceptions.InvalidParameterValueError) as e:
            await gendurable.enqueue_async(conn, "Charge", unique=Unique(period=0.5), schema=schema)
        assert e.value.args[0].startswith("invalid unique.period: must be at least 1 second")
    finally:
        await conn.close()
    assert isinstance(first, Inserted) and not first.conflict
    assert (again.id, again.conflict) == (first.id, True)
    assert not by_state.conflict and (dup.id, dup.conflict) == (by_state.id, True)


async def test_psycopg_async_enqueue_reports_the_holder(engine, database_url, schema):
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        a = await gendurable.enqueue_async(conn, "Charge", idempotency_key="p:1", schema=schema)
        b = await gendurable.enqueue_async(conn, "Charge", idempotency_key="p:1", schema=schema)
    assert (a.conflict, b.id, b.conflict) == (False, a.id, True)


def test_enqueue_sql_binds_the_unique_options():
    sql, params = gendurable.enqueue_sql(
        "Report",
        {"account": 7},
        unique=Unique(fields=["account"], period=timedelta(hours=1), states="active"),
        idempotency_key="report:7",
    )
    assert sql == (
        'SELECT id, conflict FROM "gendurable".enqueue(workflow => %s::text,'
        ' state => %s::jsonb, "unique" => %s::boolean, unique_fields => %s::text[],'
        " unique_period => %s::interval, unique_states => %s::text[],"
        " idempotency_key => %s::text)"
    )
    assert params == (
        "Report",
        '{"account":7}',
        True,
        ["account"],
        timedelta(hours=1),
        ["scheduled", "available", "executing", "awaiting"],
        "report:7",
    )
    # Unique(): a unique insert with the function's defaults; seconds to the millisecond.
    sql, params = gendurable.enqueue_sql("W", unique=Unique(), paramstyle="numeric")
    assert sql == (
        'SELECT id, conflict FROM "gendurable".enqueue(workflow => $1::text,'
        ' "unique" => $2::boolean)'
    )
    assert params == ("W", True)
    _, params = gendurable.enqueue_sql("W", unique=Unique(period=1.0004, states="all"))
    assert params[2:] == (
        timedelta(seconds=1),
        ["scheduled", "available", "executing", "awaiting", "completed", "cancelled", "discarded"],
    )
    # An idempotency key alone.
    sql, params = gendurable.enqueue_sql("W", idempotency_key="k")
    assert sql.endswith("(workflow => %s::text, idempotency_key => %s::text)")


@gendurable.workflow("Charge.Card", queue="billing", priority=2, max_attempts=5)
class ChargeCard:
    def start(self, state, ctx):
        return gendurable.Done(state)


def test_a_decorated_workflows_defaults_apply_with_a_unique_enqueue(engine, database_url, schema):
    _, params = gendurable.enqueue_sql(ChargeCard, {"n": 1}, idempotency_key="card:1")
    assert params == ("Charge.Card", '{"n":1}', "billing", 2, 5, "card:1")
    with psycopg.connect(database_url) as conn, conn.transaction():
        a = gendurable.enqueue(conn, ChargeCard, idempotency_key="card:1", schema=schema)
        b = gendurable.enqueue(conn, ChargeCard, idempotency_key="card:1", schema=schema)
    assert (b.id, b.conflict) == (a.id, True)
    i = engine.get(a)
    assert (i.queue, i.priority, i.max_attempts) == ("billing", 2, 5)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"unique": True}, "unique"),
        ({"unique": {"fields": ["a"]}}, "unique"),
        ({"unique": Unique(fields="a")}, "unique.fields"),
        ({"unique": Unique(fields=[1])}, "unique.fields"),
        ({"unique": Unique(period="1h")}, "unique.period"),
        ({"unique": Unique(period=float("inf"))}, "unique.period"),
        ({"unique": Unique(period=float("nan"))}, "unique.period"),
        ({"unique": Unique(period=10**20)}, "unique.period"),
        ({"unique": Unique(states="done")}, "unique.states"),
        ({"unique": Unique(states=[None])}, "unique.states"),
        ({"idempotency_key": 42}, "idempotency_key"),
    ],
)
def test_enqueue_sql_refuses_wrong_unique_types(options, field):
    with pytest.raises(InvalidInput) as e:
        gendurable.enqueue_sql("W", {}, **options)
    assert e.value.field == field


@pytest.mark.parametrize(
    ("unique", "says"),
    [
        (Unique(fields=[]), "invalid unique.fields: must name 1 to 64 state fields, got 0"),
        (Unique(states=["finished"]), "invalid unique.states: 'finished' is not a status"),
        (Unique(states=["scheduled"]), "(missing available)"),
        (Unique(period=-1), "invalid unique.period: must be at least 1 second"),
    ],
)
def test_psycopg_bad_unique_values_are_the_drivers_error(
    engine, database_url, schema, unique, says
):
    with psycopg.connect(database_url) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
            gendurable.enqueue(conn, "W", unique=unique, schema=schema)
        assert says in e.value.diag.message_primary
