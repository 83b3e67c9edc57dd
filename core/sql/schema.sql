CREATE SCHEMA gendurable;

CREATE TYPE gendurable.claim AS (
	id bigint,
	workflow text,
	step text,
	state jsonb,
	queue text,
	priority smallint,
	attempt integer,
	max_attempts integer,
	concurrency_key text,
	gate_shard integer,
	rate_key text,
	wake jsonb,
	token bigint
);

CREATE FUNCTION gendurable.claim_key(k text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    AS -- sql/functions/claim_key.sql, source md5 3c0e88fbc37509c7f715e02a5171d876
;

CREATE FUNCTION gendurable.enqueue(workflow text, state jsonb DEFAULT '{}'::jsonb, step text DEFAULT 'start'::text, queue text DEFAULT 'default'::text, priority integer DEFAULT 0, concurrency_key text DEFAULT NULL::text, rate_limit text DEFAULT NULL::text, max_attempts integer DEFAULT 20, scheduled_at timestamp with time zone DEFAULT NULL::timestamp with time zone, "unique" boolean DEFAULT false, unique_fields text[] DEFAULT NULL::text[], unique_period interval DEFAULT NULL::interval, unique_states text[] DEFAULT NULL::text[], idempotency_key text DEFAULT NULL::text, OUT id bigint, OUT conflict boolean) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    AS -- sql/functions/enqueue.sql, source md5 94704d4008f26401cf027212596436b9
;

CREATE FUNCTION gendurable.handoff(plain_ids bigint[], plain_tokens bigint[], plain_steps text[], plain_states jsonb[], outcomes jsonb, node_id text, channel text, notify boolean, queues text[], demands integer[], skip_pick boolean[], reserve boolean[], unreserve bigint[], unreserve_tokens bigint[], win_factor double precision, workflows text[], gate_names text[], gate_limits integer[], gate_shards integer[], rate_names text[], rate_intervals double precision[], rate_tolerances double precision[]) RETURNS TABLE(claimed gendurable.claim, reserved boolean, written integer, released integer, handed_over integer, released_keys text[], promoted bigint[])
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    SET plan_cache_mode TO 'force_generic_plan'
    SET jit TO 'off'
    AS -- sql/functions/handoff.sql, source md5 85a5448ece70305a58960ad6bb9e995f
;

CREATE FUNCTION gendurable.insert_room(keys text[], gate_names text[], gate_limits integer[]) RETURNS TABLE(key text, room integer)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS -- sql/functions/insert_room.sql, source md5 9713971158452fa85f16bca3d2a9e9e7
;

CREATE FUNCTION gendurable.key_room(keys text[], gate_names text[], gate_limits integer[]) RETURNS TABLE(key text, room integer)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS -- sql/functions/key_room.sql, source md5 ec5bc164082fc54f6e4e53208bc4b25a
;

CREATE FUNCTION gendurable.matching(ids bigint[], workflow text, queue text, statuses text[], concurrency_key text, error text, after bigint, lim integer) RETURNS SETOF bigint
    LANGUAGE sql STABLE
    SET search_path TO 'gendurable'
    AS -- sql/functions/matching.sql, source md5 ab06d495704d679930bf3d14f7a94092
;

CREATE FUNCTION gendurable.may_mint_gate(k text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    AS -- sql/functions/may_mint_gate.sql, source md5 a8383947dd184d337034c2d5abdc469e
;

CREATE FUNCTION gendurable.may_mint_rate(k text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    AS -- sql/functions/may_mint_rate.sql, source md5 6d6330390f4943764dca392b2b8e5431
;

CREATE FUNCTION gendurable.name_problem(v text) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS -- sql/functions/name_problem.sql, source md5 b27702aa923ee787d29e9a8680b3d20d
;

CREATE FUNCTION gendurable.node_key_room(q text, node_id text, free text[]) RETURNS integer
    LANGUAGE plpgsql STABLE
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS -- sql/functions/node_key_room.sql, source md5 3f8df634698e753ca48a183a6f914489
;

CREATE FUNCTION gendurable.orphaned(q text, wf text, lease double precision) RETURNS boolean
    LANGUAGE plpgsql STABLE
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS -- sql/functions/orphaned.sql, source md5 7902f08b02271529bcab4a89cdc48c44
;

CREATE FUNCTION gendurable.park_orphans(q text, lease double precision, lim integer) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS -- sql/functions/park_orphans.sql, source md5 1337fa8ebd8153f4c13f54a05b7d8803
;

CREATE FUNCTION gendurable.pick(q text, demand integer, win_size integer, wfs text[], node_id text, gate_names text[], gate_limits integer[], gate_shards integer[], rate_names text[], rate_intervals double precision[], rate_tolerances double precision[]) RETURNS SETOF gendurable.claim
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    SET plan_cache_mode TO 'force_generic_plan'
    SET jit TO 'off'
    AS -- sql/functions/pick.sql, source md5 3cd26b4dedc8f5046a618aedc434723e
;

CREATE FUNCTION gendurable.rate_room(keys text[], lim integer, rate_names text[], rate_intervals double precision[], rate_tolerances double precision[]) RETURNS TABLE(key text, room integer)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS -- sql/functions/rate_room.sql, source md5 1b43d7829f03e69157c7da816220f1a3
;

CREATE FUNCTION gendurable.rate_sweep(after text, lim integer, channel text, rate_names text[], rate_intervals double precision[], rate_tolerances double precision[], own_queues text[], own_room integer[], wait_turn boolean, OUT unparked integer, OUT last_key text, OUT next_in double precision, OUT own_woken text[]) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS -- sql/functions/rate_sweep.sql, source md5 92988f72f28ab6c246c15e4aff94070a
;

CREATE FUNCTION gendurable.reconcile_gates(after text, lim integer, gate_names text[], gate_limits integer[], gate_shards integer[], channel text, OUT changed integer, OUT last_key text) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS -- sql/functions/reconcile_gates.sql, source md5 103e31ad3b3a8f8b5a6e6c72c101a820
;

CREATE FUNCTION gendurable.release_reserved(node_id text, ids bigint[], tokens bigint[]) RETURNS integer
    LANGUAGE sql
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS -- sql/functions/release_reserved.sql, source md5 c825955c914b31e439a320c9b8f46b92
;

CREATE FUNCTION gendurable.send_signal(signal text, payload jsonb, ttl double precision, channel text, OUT woken integer, OUT kept boolean) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    AS -- sql/functions/send_signal.sql, source md5 9fe6112215656d5fffde2cf27426d707
;

CREATE FUNCTION gendurable.unique_key(workflow text, state jsonb, concurrency_key text, spec jsonb) RETURNS bytea
    LANGUAGE sql STABLE
    AS -- sql/functions/unique_key.sql, source md5 c144943ae0e428e68fd2a8da5765da5d
;

CREATE FUNCTION gendurable.unpark_keys(keys text[], gate_names text[], gate_limits integer[], channel text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS -- sql/functions/unpark_keys.sql, source md5 1fa47ed447a68b21f4d3067d203a3776
;

CREATE FUNCTION gendurable.unpark_sweep(after text, lim integer, channel text, gate_names text[], gate_limits integer[], OUT unparked integer, OUT last_key text) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS -- sql/functions/unpark_sweep.sql, source md5 f9508c5b485111386a1ccb108cbb8f04
;

CREATE FUNCTION gendurable.unpark_workflows(queues text[], workflows text[], lim integer, channel text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS -- sql/functions/unpark_workflows.sql, source md5 2103c50c98eeba4efd96a8dd2ffcb9f3
;

CREATE TABLE gendurable.cron (
    name text NOT NULL,
    last_tick timestamp with time zone NOT NULL
);

CREATE TABLE gendurable.functions (
    name text NOT NULL,
    source text NOT NULL
);

CREATE TABLE gendurable.gate_slots (
    key text NOT NULL,
    shard integer NOT NULL,
    capacity integer NOT NULL,
    available integer NOT NULL,
    CONSTRAINT gate_slots_bounds CHECK (((capacity >= 1) AND (available >= 0) AND (available <= capacity)))
)
WITH (autovacuum_vacuum_cost_delay='0');

CREATE TABLE gendurable.instances (
    id bigint NOT NULL,
    workflow text NOT NULL,
    step text NOT NULL,
    state jsonb NOT NULL,
    queue text DEFAULT 'default'::text NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    status text NOT NULL,
    concurrency_key text,
    gate_shard integer,
    rate_key text,
    attempt integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 20 NOT NULL,
    node text,
    cancel_requested boolean DEFAULT false NOT NULL,
    await_signal text,
    await_until timestamp with time zone,
    wake jsonb,
    errors jsonb DEFAULT '[]'::jsonb NOT NULL,
    inserted_at timestamp with time zone DEFAULT now() NOT NULL,
    scheduled_at timestamp with time zone DEFAULT now() NOT NULL,
    attempted_at timestamp with time zone,
    finished_at timestamp with time zone,
    token bigint DEFAULT 0 NOT NULL,
    parked text,
    unique_key bytea,
    unique_states text[],
    cautious boolean DEFAULT false NOT NULL,
    CONSTRAINT instances_attempts_check CHECK (((max_attempts >= 1) AND (attempt >= 0))),
    CONSTRAINT instances_parked_check CHECK ((parked = ANY (ARRAY['key'::text, 'rate'::text, 'workflow'::text]))),
    CONSTRAINT instances_priority_check CHECK (((priority >= 0) AND (priority <= 9))),
    CONSTRAINT instances_state_check CHECK ((jsonb_typeof(state) = 'object'::text)),
    CONSTRAINT instances_status_check CHECK ((status = ANY (ARRAY['scheduled'::text, 'available'::text, 'executing'::text, 'awaiting'::text, 'completed'::text, 'cancelled'::text, 'discarded'::text]))),
    CONSTRAINT instances_unique_check CHECK ((((unique_key IS NULL) = (unique_states IS NULL)) AND (unique_states <@ ARRAY['scheduled'::text, 'available'::text, 'executing'::text, 'awaiting'::text, 'completed'::text, 'cancelled'::text, 'discarded'::text]) AND (unique_states @> ARRAY['scheduled'::text, 'available'::text, 'executing'::text, 'awaiting'::text])))
)
WITH (autovacuum_vacuum_cost_delay='0', autovacuum_vacuum_scale_factor='0.02', autovacuum_vacuum_insert_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02');

ALTER TABLE gendurable.instances ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME gendurable.instances_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE gendurable.mailbox (
    id bigint NOT NULL,
    instance bigint,
    name text NOT NULL,
    payload jsonb NOT NULL,
    sent_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone,
    CONSTRAINT mailbox_named_expires CHECK (((instance IS NOT NULL) OR (expires_at IS NOT NULL)))
);

ALTER TABLE gendurable.mailbox ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME gendurable.mailbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE gendurable.nodes (
    id text NOT NULL,
    hostname text NOT NULL,
    pid integer NOT NULL,
    queues jsonb NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    workflows jsonb,
    lease_s double precision
);

CREATE TABLE gendurable.queue_pauses (
    queue text NOT NULL,
    paused_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE gendurable.rate_state (
    key text NOT NULL,
    tat timestamp with time zone NOT NULL
)
WITH (autovacuum_vacuum_cost_delay='0');

CREATE TABLE gendurable.throughput (
    minute timestamp with time zone NOT NULL,
    node text NOT NULL,
    started bigint DEFAULT 0 NOT NULL,
    failed bigint DEFAULT 0 NOT NULL,
    completed bigint DEFAULT 0 NOT NULL
);

ALTER TABLE ONLY gendurable.cron
    ADD CONSTRAINT cron_pkey PRIMARY KEY (name);

ALTER TABLE ONLY gendurable.functions
    ADD CONSTRAINT functions_pkey PRIMARY KEY (name);

ALTER TABLE ONLY gendurable.gate_slots
    ADD CONSTRAINT gate_slots_pkey PRIMARY KEY (key, shard);

ALTER TABLE ONLY gendurable.instances
    ADD CONSTRAINT instances_pkey PRIMARY KEY (id);

ALTER TABLE ONLY gendurable.mailbox
    ADD CONSTRAINT mailbox_pkey PRIMARY KEY (id);

ALTER TABLE ONLY gendurable.nodes
    ADD CONSTRAINT nodes_pkey PRIMARY KEY (id);

ALTER TABLE ONLY gendurable.queue_pauses
    ADD CONSTRAINT queue_pauses_pkey PRIMARY KEY (queue);

ALTER TABLE ONLY gendurable.rate_state
    ADD CONSTRAINT rate_state_pkey PRIMARY KEY (key);

ALTER TABLE ONLY gendurable.throughput
    ADD CONSTRAINT throughput_pkey PRIMARY KEY (minute, node);

CREATE INDEX instances_await_signal ON gendurable.instances USING btree (await_signal) WHERE ((status = 'awaiting'::text) AND (await_signal IS NOT NULL));

CREATE INDEX instances_await_until ON gendurable.instances USING btree (await_until) WHERE ((status = 'awaiting'::text) AND (await_until IS NOT NULL));

CREATE INDEX instances_executing ON gendurable.instances USING btree (node) WHERE (status = 'executing'::text);

CREATE INDEX instances_finished ON gendurable.instances USING btree (finished_at) WHERE (status = ANY (ARRAY['completed'::text, 'cancelled'::text, 'discarded'::text]));

CREATE INDEX instances_gated ON gendurable.instances USING btree (concurrency_key, gate_shard) WHERE ((status = 'executing'::text) AND (gate_shard IS NOT NULL));

CREATE UNIQUE INDEX instances_k1 ON gendurable.instances USING btree (concurrency_key) WHERE ((status = 'executing'::text) AND (concurrency_key IS NOT NULL) AND (gate_shard IS NULL));

CREATE INDEX instances_key_heads ON gendurable.instances USING btree (concurrency_key) WHERE ((COALESCE(parked, status) = 'available'::text) AND (concurrency_key IS NOT NULL));

CREATE INDEX instances_key_next ON gendurable.instances USING btree (concurrency_key, ((queue || ''::text)), priority, scheduled_at, id) WHERE ((status = 'available'::text) AND (concurrency_key IS NOT NULL));

CREATE INDEX instances_parked_key ON gendurable.instances USING btree (concurrency_key, priority, scheduled_at, id) WHERE ((status = 'available'::text) AND (parked = 'key'::text));

CREATE INDEX instances_parked_rate ON gendurable.instances USING btree (rate_key, priority, scheduled_at, id) WHERE ((status = 'available'::text) AND (parked = 'rate'::text));

CREATE INDEX instances_parked_workflow ON gendurable.instances USING btree (workflow, queue, priority, scheduled_at, id) WHERE ((status = 'available'::text) AND (parked = 'workflow'::text));

CREATE INDEX instances_pick ON gendurable.instances USING btree (queue, priority, scheduled_at, id) WHERE ((status = 'available'::text) AND (parked IS NULL));

CREATE INDEX instances_rate_key_heads ON gendurable.instances USING btree (rate_key) WHERE ((COALESCE(parked, status) = 'available'::text) AND (rate_key IS NOT NULL));

CREATE INDEX instances_reserved ON gendurable.instances USING btree (node) WHERE ((status = 'available'::text) AND (node IS NOT NULL));

CREATE INDEX instances_scheduled ON gendurable.instances USING btree (scheduled_at) WHERE (status = 'scheduled'::text);

CREATE UNIQUE INDEX instances_unique ON gendurable.instances USING btree (unique_key) WHERE ((unique_key IS NOT NULL) AND (status = ANY (unique_states)));

CREATE INDEX mailbox_instance ON gendurable.mailbox USING btree (instance, name, id) WHERE (instance IS NOT NULL);

CREATE INDEX mailbox_named ON gendurable.mailbox USING btree (name, id) WHERE (instance IS NULL);

