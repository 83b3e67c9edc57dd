-- Enqueue one instance inside the caller's own transaction, from any
-- language or ORM:
--
--   SELECT id, conflict FROM gendurable.enqueue('Charge', '{"id": 7}',
--                                               concurrency_key => 'account:7');
--
-- The checks of an insert through a client, with the same messages
-- ("invalid priority: must be 0 to 9, got 12"; SQLSTATE 22023). The row is
-- visible, and the pickers of its queue are woken, when the transaction
-- commits (NOTIFY is transactional); a rollback leaves nothing. Returns the
-- new instance's id and conflict = false; a unique insert (`unique => true`,
-- any `unique_*` argument, or an idempotency key; see unique_key.sql and
-- docs/unique.md) that meets an instance holding its identity inserts nothing
-- and returns that instance's id with conflict = true. What lives in the nodes' configuration does not apply
-- here: per-workflow defaults and declared step rate limits, and a rate
-- limit's name is not checked against the configured ones (one no node
-- configures does not limit). A row that cannot run now is parked by the
-- first pick or maintenance pass that meets it.
CREATE OR REPLACE FUNCTION enqueue(workflow text, state jsonb DEFAULT '{}', step text DEFAULT 'start',
                                   queue text DEFAULT 'default', priority integer DEFAULT 0,
                                   concurrency_key text DEFAULT NULL, rate_limit text DEFAULT NULL,
                                   max_attempts integer DEFAULT 20,
                                   scheduled_at timestamptz DEFAULT NULL,
                                   "unique" boolean DEFAULT false,
                                   unique_fields text[] DEFAULT NULL,
                                   unique_period interval DEFAULT NULL,
                                   unique_states text[] DEFAULT NULL,
                                   idempotency_key text DEFAULT NULL,
                                   OUT id bigint, OUT conflict boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
-- Parameters are named as columns are; columns win, parameters are qualified.
#variable_conflict use_column
DECLARE
    field text;
    v text;
    reason text;
    due timestamptz := coalesce(enqueue.scheduled_at, now());
    states text[] := coalesce(enqueue.unique_states,
                              ARRAY['scheduled', 'available', 'executing', 'awaiting', 'completed']);
    spec jsonb;
    ukey bytea;
    rounds integer := 0;
BEGIN
    FOR field, v IN VALUES ('workflow', enqueue.workflow), ('step', enqueue.step), ('queue', enqueue.queue)
    LOOP
        reason := name_problem(v);
        IF reason IS NOT NULL THEN
            RAISE EXCEPTION 'invalid %: %', field, reason USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    -- The state: an object, at most 100 levels deep, at most 64 MiB
    -- (validate::state); jsonb holds no NUL.
    reason := CASE WHEN enqueue.state IS NULL THEN 'must be a JSON object, got null'
                   WHEN jsonb_typeof(enqueue.state) <> 'object'
                   THEN 'must be a JSON object, got ' || CASE jsonb_typeof(enqueue.state)
                            WHEN 'array' THEN 'an array' WHEN 'string' THEN 'a string'
                            WHEN 'number' THEN 'a number' WHEN 'boolean' THEN 'a boolean'
                            ELSE 'null' END
              END;
    IF reason IS NULL AND EXISTS (
        WITH RECURSIVE c(v, depth) AS (
            SELECT enqueue.state, 1
            UNION ALL
            SELECT e.v, c.depth + 1
            FROM c CROSS JOIN LATERAL (
                SELECT value FROM jsonb_each(CASE WHEN jsonb_typeof(c.v) = 'object' THEN c.v ELSE '{}' END)
                UNION ALL
                SELECT value FROM jsonb_array_elements(CASE WHEN jsonb_typeof(c.v) = 'array' THEN c.v ELSE '[]' END)
            ) e(v)
            WHERE c.depth <= 100 AND jsonb_typeof(e.v) IN ('object', 'array')
        )
        SELECT 1 FROM c WHERE depth > 100)
    THEN
        reason := 'is nested more than 100 levels deep';
    END IF;
    IF reason IS NULL AND octet_length(enqueue.state::text) > 64 * 1024 * 1024 THEN
        reason := format('is %s bytes; the limit is %s', octet_length(enqueue.state::text), 64 * 1024 * 1024);
    END IF;
    IF reason IS NOT NULL THEN
        RAISE EXCEPTION 'invalid state: %', reason USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.priority IS NULL OR enqueue.priority NOT BETWEEN 0 AND 9 THEN
        RAISE EXCEPTION 'invalid priority: must be 0 to 9, got %', coalesce(enqueue.priority::text, 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.max_attempts IS NULL OR enqueue.max_attempts < 1 THEN
        RAISE EXCEPTION 'invalid max_attempts: must be at least 1, got %', coalesce(enqueue.max_attempts::text, 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Keys: "name:rest", at most 1024 bytes (validate::key).
    FOR field, v IN VALUES ('concurrency_key', enqueue.concurrency_key), ('rate_limit', enqueue.rate_limit)
    LOOP
        reason := CASE WHEN v IS NULL THEN NULL
                       WHEN v = '' THEN 'must not be empty'
                       WHEN octet_length(v) > 1024
                       THEN format('is %s bytes long; the limit is 1024', octet_length(v))
                       WHEN split_part(v, ':', 1) = ''
                       THEN format('"%s" has an empty name: keys look like "name:rest"', v)
                  END;
        IF reason IS NOT NULL THEN
            RAISE EXCEPTION 'invalid %: %', field, reason USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;

    -- Unique inserts (unique::Unique::validate, unique::validate_key).
    IF enqueue.idempotency_key IS NOT NULL THEN
        reason := CASE WHEN enqueue.idempotency_key = '' THEN 'must not be empty'
                       WHEN octet_length(enqueue.idempotency_key) > 1024
                       THEN format('is %s bytes long; the limit is 1024', octet_length(enqueue.idempotency_key))
                  END;
        IF reason IS NOT NULL THEN
            RAISE EXCEPTION 'invalid idempotency_key: %', reason USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    IF enqueue.unique_fields IS NOT NULL THEN
        IF cardinality(enqueue.unique_fields) NOT BETWEEN 1 AND 64 THEN
            RAISE EXCEPTION 'invalid unique.fields: must name 1 to 64 state fields, got %',
                cardinality(enqueue.unique_fields) USING ERRCODE = 'invalid_parameter_value';
        END IF;
        FOREACH v IN ARRAY enqueue.unique_fields LOOP
            reason := name_problem(v);
            IF reason IS NOT NULL THEN
                RAISE EXCEPTION 'invalid unique.fields: %', reason USING ERRCODE = 'invalid_parameter_value';
            END IF;
        END LOOP;
    END IF;
    IF enqueue.unique_period IS NOT NULL AND enqueue.unique_period < interval '1 second' THEN
        RAISE EXCEPTION 'invalid unique.period: must be at least 1 second, got %', enqueue.unique_period
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH v IN ARRAY states LOOP
        IF v IS NULL OR v NOT IN ('scheduled', 'available', 'executing', 'awaiting',
                                  'completed', 'cancelled', 'discarded') THEN
            RAISE EXCEPTION 'invalid unique.states: % is not a status', coalesce(quote_literal(v), 'null')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    FOREACH v IN ARRAY ARRAY['scheduled', 'available', 'executing', 'awaiting'] LOOP
        IF NOT v = ANY (states) THEN
            RAISE EXCEPTION 'invalid unique.states: must include scheduled, available, executing and awaiting (missing %): an instance moves between them while it runs; add completed, cancelled or discarded to refuse duplicates after it finished', v
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    IF enqueue."unique" OR enqueue.unique_fields IS NOT NULL OR enqueue.unique_period IS NOT NULL
       OR enqueue.unique_states IS NOT NULL OR enqueue.idempotency_key IS NOT NULL THEN
        spec := jsonb_build_object('key', enqueue.idempotency_key, 'fields', to_jsonb(enqueue.unique_fields),
                                   'period', extract(epoch FROM enqueue.unique_period),
                                   'states', to_jsonb(states));
        ukey := unique_key(enqueue.workflow, enqueue.state, enqueue.concurrency_key, spec);
    END IF;

    -- A unique insert meets a holder or inserts; a holder that left the
    -- index between the two statements (each sees what committed before
    -- it) lets the insert try again.
    LOOP
        INSERT INTO instances (workflow, step, state, queue, priority, concurrency_key, rate_key,
                               max_attempts, status, scheduled_at, unique_key, unique_states)
        VALUES (enqueue.workflow, enqueue.step, enqueue.state, enqueue.queue, enqueue.priority,
                enqueue.concurrency_key, enqueue.rate_limit, enqueue.max_attempts,
                CASE WHEN due > now() THEN 'scheduled' ELSE 'available' END, due,
                ukey, CASE WHEN ukey IS NOT NULL THEN states END)
        ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status = ANY (unique_states) DO NOTHING
        RETURNING instances.id INTO enqueue.id;
        IF FOUND THEN
            conflict := false;
            IF due <= now() THEN
                PERFORM pg_notify(current_schema() || '_wake', enqueue.queue);
            END IF;
            RETURN;
        END IF;
        SELECT i.id INTO enqueue.id FROM instances i
        WHERE i.unique_key = ukey AND i.status = ANY (i.unique_states);
        IF FOUND THEN
            conflict := true;
            RETURN;
        END IF;
        rounds := rounds + 1;
        IF rounds = 5 THEN
            RAISE EXCEPTION 'contended: a unique insert kept meeting an instance that finished before it could be read back'
                USING ERRCODE = 'serialization_failure';
        END IF;
    END LOOP;
END
$$;
