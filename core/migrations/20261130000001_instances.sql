-- The engine's tables. Names are unqualified: the migrator runs with
-- search_path set to the engine's schema, so every schema gets its own copy.

CREATE TABLE instances (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow         text        NOT NULL,
    step             text        NOT NULL,
    state            jsonb       NOT NULL,
    queue            text        NOT NULL DEFAULT 'default',
    priority         smallint    NOT NULL DEFAULT 0,
    -- scheduled: waits for scheduled_at; available: runnable; executing: claimed
    -- by a node; awaiting: parked on a signal or a timeout; the rest are final.
    status           text        NOT NULL,
    concurrency_key  text,
    -- The gate shard a claim debited; NULL for keyless and K = 1 claims.
    gate_shard       integer,
    rate_key         text,
    -- Attempts of the current step; incremented by each claim.
    attempt          integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL DEFAULT 20,
    node             text,
    cancel_requested boolean     NOT NULL DEFAULT false,
    await_signal     text,
    await_until      timestamptz,
    -- What woke an awaiting step: {"signal": name, "payload": ...} or {"timeout": true}.
    wake             jsonb,
    errors           jsonb       NOT NULL DEFAULT '[]',
    inserted_at      timestamptz NOT NULL DEFAULT now(),
    scheduled_at     timestamptz NOT NULL DEFAULT now(),
    attempted_at     timestamptz,
    finished_at      timestamptz,
    CONSTRAINT instances_status_check CHECK (status IN
        ('scheduled', 'available', 'executing', 'awaiting', 'completed', 'cancelled', 'discarded')),
    CONSTRAINT instances_priority_check CHECK (priority BETWEEN 0 AND 9),
    CONSTRAINT instances_attempts_check CHECK (max_attempts >= 1 AND attempt >= 0),
    CONSTRAINT instances_state_check CHECK (jsonb_typeof(state) = 'object')
);

-- The pick: runnable rows per queue in priority, then schedule, then id order.
CREATE INDEX instances_pick ON instances (queue, priority, scheduled_at, id)
    WHERE status = 'available';

-- The stager: scheduled rows that come due, and awaits that time out.
CREATE INDEX instances_scheduled ON instances (scheduled_at) WHERE status = 'scheduled';
CREATE INDEX instances_await_until ON instances (await_until)
    WHERE status = 'awaiting' AND await_until IS NOT NULL;
CREATE INDEX instances_await_signal ON instances (await_signal)
    WHERE status = 'awaiting' AND await_signal IS NOT NULL;

-- The reaper: executing rows by node.
CREATE INDEX instances_executing ON instances (node) WHERE status = 'executing';

-- K = 1: at most one executing row per ungated key. This index is the lock.
CREATE UNIQUE INDEX instances_k1 ON instances (concurrency_key)
    WHERE status = 'executing' AND concurrency_key IS NOT NULL AND gate_shard IS NULL;

-- Gates: executing rows per (key, shard), the truth the reconciler counts.
CREATE INDEX instances_gated ON instances (concurrency_key, gate_shard)
    WHERE status = 'executing' AND gate_shard IS NOT NULL;

-- Pruning of finished rows.
CREATE INDEX instances_finished ON instances (finished_at)
    WHERE status IN ('completed', 'cancelled', 'discarded');

-- Gate slot counters, one row per (key, shard). Over-admission is uncommittable.
CREATE TABLE gate_slots (
    key        text    NOT NULL,
    shard      integer NOT NULL,
    capacity   integer NOT NULL,
    available  integer NOT NULL,
    PRIMARY KEY (key, shard),
    CONSTRAINT gate_slots_bounds CHECK (capacity >= 1 AND available >= 0 AND available <= capacity)
);

-- Rate limits as GCRA: tat is the theoretical arrival time of the next start.
CREATE TABLE rate_state (
    key  text        PRIMARY KEY,
    tat  timestamptz NOT NULL
);

CREATE TABLE nodes (
    id           text        PRIMARY KEY,
    hostname     text        NOT NULL,
    pid          integer     NOT NULL,
    queues       jsonb       NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- Claims a K = 1 key for the calling pick. The advisory lock serialises pickers of
-- one key; the check runs after it with a fresh snapshot (VOLATILE), so it sees
-- any claim committed by the picker that held the lock before us.
CREATE FUNCTION claim_key(k text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext(current_schema() || ':k1'), hashtext(k)) THEN
        RETURN false;
    END IF;
    RETURN NOT EXISTS (
        SELECT 1 FROM instances
        WHERE status = 'executing' AND concurrency_key = k AND gate_shard IS NULL);
END
$$;

-- Whether the calling pick may mint the counters of a key (gate or rate limit):
-- nobody else is minting it right now and no counter exists yet.
CREATE FUNCTION may_mint_gate(k text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext(current_schema() || ':gate'), hashtext(k)) THEN
        RETURN false;
    END IF;
    RETURN NOT EXISTS (SELECT 1 FROM gate_slots WHERE key = k);
END
$$;

CREATE FUNCTION may_mint_rate(k text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext(current_schema() || ':rate'), hashtext(k)) THEN
        RETURN false;
    END IF;
    RETURN NOT EXISTS (SELECT 1 FROM rate_state WHERE key = k);
END
$$;

-- The gate reconciler. Locks what it can (SKIP LOCKED: a busy shard is repaired
-- next sweep), then counts the executing rows with a fresh snapshot taken after
-- the locks, so a claim or outcome that committed before is always seen and a
-- counter is never set above the truth. Only locked shards are touched. Keys
-- whose every shard is locked here and idle are deleted (a picker mints them
-- again, pre-debited, on next use). Returns the number of counters changed.
CREATE FUNCTION reconcile_gates() RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    lk text[];
    ls integer[];
    n integer;
BEGIN
    WITH l AS (
        SELECT key, shard FROM gate_slots
        ORDER BY key, shard
        FOR UPDATE SKIP LOCKED
    )
    SELECT array_agg(key), array_agg(shard) INTO lk, ls FROM l;
    IF lk IS NULL THEN
        RETURN 0;
    END IF;

    -- A new statement: a fresh snapshot, taken after the locks.
    WITH mine AS (
        SELECT * FROM unnest(lk, ls) AS m(key, shard)
    ), truth AS (
        SELECT g.key, g.shard, g.capacity,
               greatest(g.capacity - (SELECT count(*) FROM instances i
                                      WHERE i.status = 'executing' AND i.concurrency_key = g.key
                                        AND i.gate_shard = g.shard), 0)::integer AS should
        FROM gate_slots g JOIN mine USING (key, shard)
    ), idle AS (
        SELECT g.key FROM gate_slots g LEFT JOIN truth t USING (key, shard)
        WHERE g.key IN (SELECT key FROM mine)
        GROUP BY g.key
        HAVING bool_and(t.should IS NOT NULL AND t.should = t.capacity)
    ), del AS (
        DELETE FROM gate_slots g USING idle WHERE g.key = idle.key RETURNING 1
    ), fix AS (
        UPDATE gate_slots g SET available = t.should
        FROM truth t
        WHERE g.key = t.key AND g.shard = t.shard AND g.available <> t.should
          AND t.key NOT IN (SELECT key FROM idle)
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM del) + (SELECT count(*) FROM fix) INTO n;
    RETURN n;
END
$$;
