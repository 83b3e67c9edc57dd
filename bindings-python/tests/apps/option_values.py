"""Seeded random option values through the Python front door.

Run by tests/test_options.py in a child interpreter (so that a crash is a
failed test, not a dead test run):

    python option_values.py URL SCHEMA SEED [SEED ...]

Each seed draws values for the options of an insert and of an engine: at the
limits the core documents (names of 255 bytes, keys of 1024, priorities 0 to
9, attempts up to 2**31 - 1), just past them, and of every wrong type. An
insert must either go in and read back with the values given, or raise
``InvalidInput`` whose ``field`` is the option (or, for ``unique``, one of its
parts: ``unique.fields``...); an engine must either be made or raise
``InvalidConfig`` naming the option. A unique insert (``unique``,
``idempotency_key``) that went in is repeated: the repeat must report the
same instance, with ``conflict`` true. Prints ``ok N`` and exits 0; on
anything else, prints the seed, the value and what happened, and exits 1.
"""

from __future__ import annotations

import datetime as dt
import random
import sys
import uuid
from typing import Any, Callable

import gendurable
from gendurable import InvalidConfig, InvalidInput, Unique

NAME_BYTES = 255  # core/src/validate.rs
KEY_BYTES = 1024
I16 = (-(2**15), 2**15 - 1)
I32 = (-(2**31), 2**31 - 1)
UTC = dt.timezone.utc


def text(r: random.Random, n_bytes: int) -> str:
    """A string of exactly ``n_bytes`` UTF-8 bytes, of 1- to 4-byte characters."""
    out, size = [], 0
    while size < n_bytes:
        c = chr(
            r.choice(
                [
                    r.randint(0x21, 0x7E),
                    r.randint(0xA0, 0x7FF),
                    r.randint(0x4E00, 0x9FFF),
                    r.randint(0x1F300, 0x1F6FF),
                ]
            )
        )
        if size + len(c.encode()) > n_bytes:
            c = "x"
        out.append(c)
        size += len(c.encode())
    return "".join(out)


def wrong_type(r: random.Random) -> Any:
    return r.choice(
        [
            None,
            True,
            1.5,
            float("nan"),
            float("inf"),
            [1],
            {"a": 1},
            {1, 2},
            b"x",
            object(),
            ("t", None),
        ]
    )


def a_name(r: random.Random) -> Any:
    kind = r.randrange(6)
    if kind == 0:
        return text(r, r.choice([1, NAME_BYTES - 1, NAME_BYTES]))
    if kind == 1:
        return text(r, NAME_BYTES + r.randint(1, 3))
    if kind == 2:
        return r.choice(["", "a\x00b", "tab\there", "new\nline"])
    if kind == 3:
        return wrong_type(r)
    return text(r, r.randint(1, 40))


def hashable(v: Any) -> Any:
    """``v``, or its repr when it cannot be a dict key."""
    try:
        hash(v)
    except TypeError:
        return repr(v)
    return v


def a_key(r: random.Random, name: str) -> Any:
    kind = r.randrange(6)
    if kind == 0:
        return f"{name}:" + text(r, KEY_BYTES - len(name) - 1)
    if kind == 1:
        return f"{name}:" + text(r, KEY_BYTES - len(name))
    if kind == 2:
        return r.choice([":7", "", "k\x00", name])
    if kind == 3:
        return (
            name,
            r.choice(
                [
                    r.randint(*I32),
                    str(uuid.UUID(int=r.getrandbits(128))),
                    uuid.uuid4(),
                    None,
                    1.5,
                    True,
                ]
            ),
        )
    if kind == 4:
        return wrong_type(r)
    return f"{name}:{r.randint(0, 10**6)}"


def an_int(r: random.Random, lo: int, hi: int) -> Any:
    return r.choice(
        [
            lo,
            hi,
            lo - 1,
            hi + 1,
            r.randint(lo, hi),
            *I16,
            I16[0] - 1,
            I16[1] + 1,
            *I32,
            I32[1] + 1,
            2**70,
            -(2**70),
            r.randint(-(2**40), 2**40),
            wrong_type(r),
            "3",
        ]
    )


def a_duration(r: random.Random) -> Any:
    return r.choice(
        [
            0,
            0.5,
            1,
            r.uniform(0, 1e6),
            -1,
            -0.001,
            1e300,
            dt.timedelta(seconds=r.randint(0, 10**6)),
            dt.timedelta(seconds=-1),
            wrong_type(r),
            "1",
        ]
    )


def a_time(r: random.Random) -> Any:
    t = dt.datetime(2000, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=r.randint(0, 10**16))
    return r.choice(
        [
            t,
            t.astimezone(dt.timezone(dt.timedelta(hours=r.randint(-12, 12)))),
            t.replace(tzinfo=None),
            wrong_type(r),
            "tomorrow",
        ]
    )


STATUSES = [
    "scheduled",
    "available",
    "executing",
    "awaiting",
    "completed",
    "cancelled",
    "discarded",
]


def some_fields(r: random.Random) -> Any:
    return r.choice(
        [
            None,
            [],
            ["account"],
            [a_name(r) for _ in range(r.randint(1, 3))],
            [f"f{i}" for i in range(r.choice([64, 65]))],
            "account",
            [1],
            wrong_type(r),
        ]
    )


def some_states(r: random.Random) -> Any:
    return r.choice(
        [
            None,
            "active",
            "all",
            "done",
            r.sample(STATUSES, r.randint(0, len(STATUSES))),
            [*STATUSES[:4], r.choice(STATUSES)],
            ["finished"],
            [None],
            wrong_type(r),
        ]
    )


def a_unique(r: random.Random) -> Any:
    kind = r.randrange(8)
    if kind == 0:
        return r.choice([wrong_type(r), {"fields": ["a"]}, "unique"])
    if kind == 1:
        return Unique()
    return Unique(
        fields=some_fields(r) if r.random() < 0.5 else None,
        period=r.choice([None, a_duration(r), 3600, dt.timedelta(hours=1)]),
        states=some_states(r) if r.random() < 0.5 else None,
    )


def an_idempotency_key(r: random.Random) -> Any:
    return r.choice(
        [
            text(r, r.choice([1, KEY_BYTES])),
            text(r, KEY_BYTES + 1),
            "",
            "k\x00",
            f"charge:{r.randint(0, 5)}",
            wrong_type(r),
        ]
    )


INSERT: dict[str, Callable[[random.Random], Any]] = {
    "workflow": a_name,
    "step": a_name,
    "queue": a_name,
    "priority": lambda r: an_int(r, 0, 9),
    "max_attempts": lambda r: an_int(r, 1, I32[1]),
    "concurrency_key": lambda r: a_key(r, "acct"),
    "rate_limit": lambda r: a_key(r, r.choice(["rated", "other"])),
    "schedule_in": a_duration,
    "scheduled_at": a_time,
    "unique": a_unique,
    "idempotency_key": an_idempotency_key,
    "state": lambda r: r.choice(
        [
            {"a": [1, "x", None]},
            {},
            [1],
            "s",
            {"k": {1}},
            {"n": 2**64},
            {"f": float("nan")},
            {"z": "\x00"},
        ]
    ),
}


def check_insert(engine: gendurable.Engine, r: random.Random) -> str | None:
    option = r.choice(list(INSERT))
    value = INSERT[option](r)
    args: dict[str, Any] = {"workflow": "W", "state": {}}
    args[option] = value
    try:
        id_ = engine.insert(**args)
    except InvalidInput as e:
        if e.field != option and not e.field.startswith(f"{option}."):
            return f"{option}={value!r:.120}: InvalidInput names {e.field!r}: {e}"
        return None
    except Exception as e:  # anything else is a failure
        return f"{option}={value!r:.120}: {type(e).__name__}: {e}"
    got = engine.get(id_)
    if value is None:  # left out: the default
        return None
    if option in ("unique", "idempotency_key"):
        return check_repeat(engine, args, id_, r)
    if option == "schedule_in":
        return (
            None
            if got.status in ("scheduled", "available")
            else f"schedule_in={value!r}: {got.status}"
        )
    if option == "scheduled_at":
        if abs(got.scheduled_at - value) > dt.timedelta(milliseconds=1):
            return f"scheduled_at={value!r}: read back {got.scheduled_at!r}"
        return None
    want = f"{value[0]}:{value[1]}" if isinstance(value, tuple) else value
    have = got.state if option == "state" else getattr(got, option)
    return None if have == want else f"{option}={value!r:.120}: read back {have!r:.120}"


def check_repeat(
    engine: gendurable.Engine, args: dict[str, Any], id_: Any, r: random.Random
) -> str | None:
    """A unique insert that went in, repeated (alone or twice in a batch):
    the same instance, told as a conflict; only a period's window may have
    turned in between."""
    what = f"{args!r:.160}"
    if not isinstance(id_, gendurable.Inserted):
        return f"{what}: insert returned {type(id_).__name__}"
    try:
        if r.random() < 0.5:
            again = [engine.insert(**args)]
        else:
            again = engine.insert_many([gendurable.NewInstance(**args)] * 2)
    except Exception as e:
        return f"{what}: repeated: {type(e).__name__}: {e}"
    unique = args.get("unique")
    windowed = isinstance(unique, Unique) and unique.period is not None
    for a in again:
        if (a.id, a.conflict) != (id_.id, True) and not windowed:
            return f"{what}: repeated: {a!r}, first {id_!r}"
    if len(again) == 2 and (again[1].id, again[1].conflict) != (again[0].id, True):
        return f"{what}: a duplicate in the batch: {again!r}"
    return None


ENGINE: dict[str, tuple[str, Callable[[random.Random], Any]]] = {
    # option: (the name the core's message uses, a value)
    "queues": (
        "queue",
        lambda r: r.choice(
            [
                {"default": an_int(r, 1, 2**32 - 1)},
                {hashable(a_name(r)): 1},
                [("default", 1)],
                wrong_type(r),
            ]
        ),
    ),
    "concurrency_limits": (
        "concurrency_limits",
        lambda r: r.choice(
            [
                {"stripe": {"limit": an_int(r, 1, 2**32 - 1), "shards": an_int(r, 1, 99)}},
                {"a:b": 2},
                {"stripe": {"limt": 1}},
                wrong_type(r),
            ]
        ),
    ),
    "rate_limits": (
        "rate_limits",
        lambda r: r.choice(
            [
                {"api": {"limit": an_int(r, 1, 2**32 - 1), "period": a_duration(r)}},
                {"api": {"limit": 1, "period": 1, "burst": an_int(r, 1, 9)}},
                {"api": {"limit": 1}},
                wrong_type(r),
            ]
        ),
    ),
    "poll_interval": ("poll_interval", a_duration),
    "heartbeat_interval": ("heartbeat", a_duration),
    "lease": ("lease", a_duration),
    "shutdown_timeout": ("shutdown_timeout", a_duration),
    "gc_interval": ("gc_interval", a_duration),
    "connect_timeout": ("connect_timeout", a_duration),
    "call_timeout": ("call_timeout", a_duration),
    "retention": ("retention", lambda r: r.choice([None, a_duration(r)])),
    "backoff": ("backoff", lambda r: r.choice([(a_duration(r), a_duration(r)), 5, (1,)])),
    "max_connections": ("pool_size", lambda r: an_int(r, 1, 2**32 - 1)),
    "node_id": ("node_id", a_name),
    "schema": (
        "schema",
        lambda r: r.choice(
            ["s_" + str(r.randint(0, 99)), "Bad-Schema", "x" * 49, "", wrong_type(r)]
        ),
    ),
}


def check_engine(url: str, r: random.Random) -> str | None:
    option = r.choice(list(ENGINE))
    named, draw = ENGINE[option]
    value = draw(r)
    try:
        gendurable.Engine(url, **{option: value})
    except InvalidConfig as e:
        return (
            None
            if named in str(e)
            else f"{option}={value!r:.120}: the message does not name it: {e}"
        )
    except Exception as e:
        return f"{option}={value!r:.120}: {type(e).__name__}: {e}"
    return None


def main() -> int:
    url, schema, *seeds = sys.argv[1:]
    engine = gendurable.Engine(
        url, schema=schema, rate_limits={"rated": {"limit": 1000, "period": 1}}
    )
    engine.migrate()
    for seed in map(int, seeds):
        r = random.Random(seed)
        for _ in range(40):
            problem = check_insert(engine, r) or check_engine(url, r)
            if problem:
                print(f"seed {seed}: {problem}")
                return 1
    print(f"ok {len(seeds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
