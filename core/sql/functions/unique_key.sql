-- The identity of a unique insert, as the digest the unique index
-- instances_unique holds: the idempotency key, or the workflow, concurrency
-- key and state (the fields named, a missing one as null, or all of it);
-- with a period, also the window of that many seconds the database's clock
-- is in. `spec` is what Unique::spec writes: {"key", "fields", "period",
-- "states"}. jsonb's text is canonical (keys sorted, one spelling per
-- number), so equal values give equal digests.
CREATE OR REPLACE FUNCTION unique_key(workflow text, state jsonb, concurrency_key text, spec jsonb)
RETURNS bytea
LANGUAGE sql STABLE
AS $$
    SELECT sha256(convert_to(jsonb_build_array(
        CASE WHEN spec ->> 'key' IS NOT NULL THEN jsonb_build_array('key', spec ->> 'key')
             ELSE jsonb_build_array('state', workflow, concurrency_key,
                      CASE WHEN jsonb_typeof(spec -> 'fields') = 'array'
                           THEN (SELECT coalesce(jsonb_object_agg(f, state -> f), '{}')
                                 FROM jsonb_array_elements_text(spec -> 'fields') f)
                           ELSE state END)
        END,
        floor(extract(epoch FROM now())::float8 / (spec ->> 'period')::float8)
    )::text, 'UTF8'))
$$;
