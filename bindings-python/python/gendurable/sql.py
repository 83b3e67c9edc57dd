"""Enqueue an instance in the application's own transaction.

The core's SQL function ``<schema>.enqueue(...)`` inserts one instance in
whatever transaction the caller is in: the row appears, and the pickers of its
queue are woken, when that transaction commits; a rollback leaves nothing.
These helpers build its call with bound parameters (:func:`enqueue_sql`, for
any driver) or run it on a psycopg 3 (:func:`enqueue`) or asyncpg
(:func:`enqueue_async`) connection. Neither driver is a dependency: the
connection is recognised by the methods it has.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import json
import math
import re
from collections.abc import Mapping
from typing import Any, Optional, Union

from .engine import _MARK, _millis, _str, _Workflow, _workflow_name
from .errors import InvalidConfig, InvalidInput
from .transitions import ConcurrencyKey, key_str
from .unique import Inserted, Unique

__all__ = ["enqueue", "enqueue_async", "enqueue_sql"]

# As the core's validate::schema: it is quoted into the statement text.
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,47}")

# The function's parameters, in order, with the type each value is cast to
# (so that no driver has to guess it).
_CASTS = {
    "workflow": "text",
    "state": "jsonb",
    "step": "text",
    "queue": "text",
    "priority": "integer",
    "concurrency_key": "text",
    "rate_limit": "text",
    "max_attempts": "integer",
    "scheduled_at": "timestamptz",
    "unique": "boolean",
    "unique_fields": "text[]",
    "unique_period": "interval",
    "unique_states": "text[]",
    "idempotency_key": "text",
}
# A reserved word, quoted as the function names it.
_ARG = {"unique": '"unique"'}

# The statuses of Unique(states="active") and "all" (gendurable::unique).
_ACTIVE = ["scheduled", "available", "executing", "awaiting"]
_STATES = {"active": _ACTIVE, "all": [*_ACTIVE, "completed", "cancelled", "discarded"]}


def enqueue_sql(
    workflow: Union[str, Any],
    state: Optional[Mapping[str, Any]] = None,
    *,
    step: Optional[str] = None,
    queue: Optional[str] = None,
    priority: Optional[int] = None,
    concurrency_key: Optional[ConcurrencyKey] = None,
    rate_limit: Optional[str] = None,
    max_attempts: Optional[int] = None,
    scheduled_at: Optional[_dt.datetime] = None,
    unique: Optional[Unique] = None,
    idempotency_key: Optional[str] = None,
    schema: str = "gendurable",
    paramstyle: str = "format",
) -> tuple[str, tuple[Any, ...]]:
    """The statement that enqueues one instance, and its parameters.

    Returns ``(sql, params)`` for a driver's ``execute``: ``SELECT id, conflict
    FROM "gendurable".enqueue(workflow => %s::text, state => %s::jsonb, ...)``
    with only the options given (the others are the function's defaults:
    step ``"start"``, queue ``"default"``, priority 0, max_attempts 20, now).
    Its one row is the instance's id and ``conflict``: true when a unique
    insert (``unique=gendurable.Unique(...)``, as in :meth:`Engine.insert`)
    or an ``idempotency_key`` met an instance holding its identity; then
    nothing was inserted and the id is that instance's.
    Every value is a bound parameter; only the schema name, checked like the
    engine's (1 to 48 characters of a-z, 0-9 and _, not starting with a
    digit), is quoted into the text.

    ``paramstyle`` is ``"format"`` (``%s``: psycopg, and SQLAlchemy's
    ``exec_driver_sql`` on it) or ``"numeric"`` (``$1``: asyncpg).
    ``workflow`` is a name or a decorated workflow; ``state`` a dict, sent as
    JSON text; ``concurrency_key`` ``"name:rest"`` or a ``(name, id)`` tuple;
    ``scheduled_at`` a timezone-aware datetime. A :class:`Unique`'s period
    is bound as an interval (a ``timedelta``, to the millisecond), its
    fields and states as text arrays (``"active"`` and ``"all"`` as the
    statuses they name).

    Python checks only the types; the database checks the values, like an
    insert through :meth:`Engine.insert`, and refuses bad ones when the
    statement runs (SQLSTATE 22023, the engine's message).

    A decorated workflow's declarations apply as in an insert through an
    engine: its defaults (``queue``, ``priority``, ``max_attempts`` given to
    :func:`gendurable.workflow`) fill the options not given, and the rate
    limit it declares for the first step (``step``, default ``"start"``)
    applies unless ``rate_limit`` is given (its ``backoff`` is not part of
    an insert). A workflow given by its name gets none of these, nor do the
    engines' options (see docs/operations.md).
    """
    if not (isinstance(schema, str) and _SCHEMA.fullmatch(schema)):
        raise InvalidConfig(
            f"schema {schema!r} must be 1 to 48 characters of a-z, 0-9 and _,"
            " not starting with a digit"
        )
    if paramstyle == "format":
        mark = "%s".format
    elif paramstyle == "numeric":
        mark = "${}".format
    else:
        raise InvalidConfig(f'paramstyle must be "format" or "numeric", got {paramstyle!r}')

    name = _str("workflow", _workflow_name(workflow))
    if not isinstance(workflow, str):
        defaults, rate_limits = _declared(name, workflow)
        if queue is None:
            queue = defaults.get("queue")
        if priority is None:
            priority = defaults.get("priority")
        if max_attempts is None:
            max_attempts = defaults.get("max_attempts")
        first = "start" if step is None else step
        if rate_limit is None and isinstance(first, str):
            rate_limit = rate_limits.get(first)

    values: dict[str, Any] = {"workflow": name}
    if state is not None:
        values["state"] = _json("state", state)
    if step is not None:
        values["step"] = _str("step", step)
    if queue is not None:
        values["queue"] = _str("queue", queue)
    if priority is not None:
        values["priority"] = _int("priority", priority)
    if concurrency_key is not None:
        values["concurrency_key"] = key_str(concurrency_key)
    if rate_limit is not None:
        values["rate_limit"] = _str("rate_limit", rate_limit)
    if max_attempts is not None:
        values["max_attempts"] = _int("max_attempts", max_attempts)
    if scheduled_at is not None:
        values["scheduled_at"] = _aware("scheduled_at", scheduled_at)
    if unique is not None:
        values.update(_unique(unique))
    if idempotency_key is not None:
        values["idempotency_key"] = _str("idempotency_key", idempotency_key)

    args = ", ".join(
        f"{_ARG.get(name, name)} => {mark(n)}::{_CASTS[name]}"
        for n, name in enumerate(values, start=1)
    )
    return f'SELECT id, conflict FROM "{schema}".enqueue({args})', tuple(values.values())


def enqueue(
    conn: Any,
    workflow: Union[str, Any],
    state: Optional[Mapping[str, Any]] = None,
    **options: Any,
) -> Inserted:
    """Enqueue one instance in ``conn``'s current transaction; return its id,
    an :class:`Inserted` (an ``int`` with ``conflict``).

    ``conn`` is a psycopg 3 connection or cursor (anything whose
    ``execute(sql, params)`` takes ``%s`` placeholders and gives a cursor).
    The options are those of :func:`enqueue_sql` (``step``, ``queue``,
    ``priority``, ``concurrency_key``, ``rate_limit``, ``max_attempts``,
    ``scheduled_at``, ``unique``, ``idempotency_key``, ``schema``). The
    instance becomes visible, and the nodes are woken, when the transaction
    commits; a rollback leaves nothing::

        with conn.transaction():
            conn.execute("INSERT INTO orders ...", ...)
            gendurable.enqueue(conn, "Orders.Fulfil", {"order_id": 7},
                               concurrency_key=("account", 3))

    Input the database refuses raises the driver's own exception (with
    psycopg, a ``psycopg.errors.InvalidParameterValue``: ``sqlstate`` is
    ``"22023"`` and the message the engine's, e.g. ``invalid priority: must
    be 0 to 9, got 12``); it aborts the transaction like any failed
    statement. A decorated workflow's defaults (``queue``, ``priority``,
    ``max_attempts`` given to :func:`gendurable.workflow`) and the rate limit
    it declares for the first step fill the options not given, as in
    :func:`enqueue_sql`; a workflow given by its name gets none of these (see
    "Enqueue in the application's own transaction" in docs/operations.md).
    A unique insert or idempotency key that met its holder returns the
    holder's id with ``conflict`` true and inserts nothing; one whose holders
    kept finishing under it raises the driver's serialization failure
    (SQLSTATE 40001), which a retry of the transaction gets past.
    For asyncio use :func:`enqueue_async`.
    """
    if callable(getattr(conn, "fetchval", None)) or inspect.iscoroutinefunction(
        getattr(conn, "execute", None)
    ):
        raise TypeError("an asyncio connection: use await gendurable.enqueue_async(conn, ...)")
    if not callable(getattr(conn, "execute", None)):
        raise TypeError(f"not a psycopg connection or cursor: {conn!r}")
    sql, params = enqueue_sql(workflow, state, paramstyle="format", **options)
    return _inserted(conn.execute(sql, params).fetchone())


async def enqueue_async(
    conn: Any,
    workflow: Union[str, Any],
    state: Optional[Mapping[str, Any]] = None,
    **options: Any,
) -> Inserted:
    """:func:`enqueue` for asyncio: ``conn`` is an asyncpg connection
    (``fetchval``), or a psycopg 3 async connection or cursor.

    Input the database refuses raises the driver's own exception (with
    asyncpg, an ``asyncpg.exceptions.InvalidParameterValueError``:
    ``sqlstate`` is ``"22023"``). A decorated workflow's defaults and
    first step's rate limit apply, a name's do not (see :func:`enqueue`)::

        async with conn.transaction():
            await conn.execute("INSERT INTO orders ...", ...)
            await gendurable.enqueue_async(conn, "Orders.Fulfil", {"order_id": 7})
    """
    if callable(getattr(conn, "fetchval", None)):
        sql, params = enqueue_sql(workflow, state, paramstyle="numeric", **options)
        return _inserted(await conn.fetchrow(sql, *params))
    if inspect.iscoroutinefunction(getattr(conn, "execute", None)):
        sql, params = enqueue_sql(workflow, state, paramstyle="format", **options)
        cur = await conn.execute(sql, params)
        return _inserted(await cur.fetchone())
    raise TypeError(f"not an asyncpg connection or a psycopg async connection: {conn!r}")


def _declared(name: str, workflow: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The defaults and step rate limits a decorated workflow declares,
    gathered from its marks as its registration gathers them."""
    w = _Workflow(name)
    for mark_name, _step, rate_limits, defaults in getattr(workflow, _MARK, ()):
        if mark_name == name:
            w.add_rate_limits(rate_limits)
            w.add_defaults(defaults)
    return w.defaults, w.rate_limits


def _inserted(row: Any) -> Inserted:
    """The id and conflict from a row, whatever the cursor's row factory
    (asyncpg's records take both)."""
    if isinstance(row, Mapping):
        return Inserted(row["id"], row["conflict"])
    return Inserted(row[0], row[1])


def _unique(u: Any) -> dict[str, Any]:
    """A :class:`Unique` as the arguments of ``enqueue``: ``unique`` (so that
    ``Unique()`` is a unique insert with every default) and those it sets."""
    if not isinstance(u, Unique):
        raise InvalidInput(
            f"invalid unique: must be a gendurable.Unique, got {u!r}", field="unique"
        )
    out: dict[str, Any] = {"unique": True}
    if u.fields is not None:
        out["unique_fields"] = _strs("unique.fields", u.fields)
    if u.period is not None:
        out["unique_period"] = _interval("unique.period", u.period)
    if u.states is not None:
        if isinstance(u.states, str):
            if u.states not in _STATES:
                raise InvalidInput(
                    'invalid unique.states: expected "active", "all" or a list of statuses,'
                    f" got {json.dumps(u.states)}",
                    field="unique.states",
                )
            out["unique_states"] = list(_STATES[u.states])
        else:
            out["unique_states"] = _strs("unique.states", u.states)
    return out


def _strs(field: str, v: Any) -> list[str]:
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
        raise InvalidInput(f"invalid {field}: must be a list of str, got {v!r}", field=field)
    return list(v)


def _interval(field: str, v: Any) -> _dt.timedelta:
    """Seconds (a number or a ``timedelta``), to the millisecond as the
    engine's inserts take them."""
    ms = _millis(v)
    if not isinstance(ms, (int, float)) or isinstance(ms, bool):
        raise InvalidInput(
            f"invalid {field}: must be seconds (a number or a timedelta), got {v!r}", field=field
        )
    try:
        if not math.isfinite(ms):
            raise OverflowError
        return _dt.timedelta(milliseconds=ms)
    except OverflowError:
        raise InvalidInput(f"invalid {field}: out of range, got {v!r}", field=field) from None


def _json(field: str, v: Any) -> str:
    try:
        return json.dumps(v, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise InvalidInput(f"invalid {field}: not JSON: {e}", field=field) from None


def _int(field: str, v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise InvalidInput(f"invalid {field}: must be an int, got {v!r}", field=field)
    return v


def _aware(field: str, v: Any) -> _dt.datetime:
    if not isinstance(v, _dt.datetime):
        raise InvalidInput(f"invalid {field}: must be a datetime, got {v!r}", field=field)
    if v.utcoffset() is None:
        raise InvalidInput(
            f"invalid {field}: must be timezone-aware (e.g. datetime.now(timezone.utc))",
            field=field,
        )
    return v
