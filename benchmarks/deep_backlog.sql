-- The pick on a deep backlog, for EXPLAIN (via auto_explain) and timing.
--
--   gendurable migrate --schema pickprof
--   psql "$DATABASE_URL" -f benchmarks/deep_backlog.sql
--
-- Builds 1M available rows in queue 'default' (600k keyless, 300k over 1,500
-- K = 1 keys of which 1,000 are busy on another node, 100k of one key under a
-- saturated gate of 10), and queue 'gq' with 100k rows of that saturated key
-- ahead of 1,000 keyless ones. Then times two picks of 160 rows from each
-- queue, each rolled back, with every nested plan logged.
\set ON_ERROR_STOP on
SET search_path = pickprof;
TRUNCATE instances, gate_slots;
INSERT INTO instances (workflow, step, state, queue, status, concurrency_key, scheduled_at)
SELECT 'Job', 'start', '{}', 'default', 'available',
       CASE WHEN g % 10 < 6 THEN NULL
            WHEN g % 10 < 9 THEN 'acct:' || (g % 5000)
            ELSE 'api:1' END,
       now() - interval '1 hour' + g * interval '1 ms'
FROM generate_series(1, 1000000) g;
UPDATE instances SET status = 'executing', node = 'other', attempt = 1
WHERE id IN (SELECT min(id) FROM instances WHERE concurrency_key LIKE 'acct:%'
             AND (substr(concurrency_key, 6))::int % 2 = 0 GROUP BY concurrency_key);
UPDATE instances SET status = 'executing', node = 'other', attempt = 1, gate_shard = 0
WHERE id IN (SELECT id FROM instances WHERE concurrency_key = 'api:1' ORDER BY id LIMIT 10);
INSERT INTO gate_slots (key, shard, available, capacity) VALUES ('api:1', 0, 0, 10);
INSERT INTO instances (workflow, step, state, queue, status, concurrency_key, scheduled_at)
SELECT 'Job', 'start', '{}', 'gq', 'available', CASE WHEN g <= 100000 THEN 'api:1' END,
       now() - interval '2 hour' + g * interval '1 ms'
FROM generate_series(1, 101000) g;
VACUUM ANALYZE instances;

LOAD 'auto_explain';
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_analyze = on;
SET auto_explain.log_nested_statements = on;
SET auto_explain.log_level = notice;
SET client_min_messages = notice;
\timing on
\echo queue default, twice
BEGIN;
SELECT count(*) FROM pick('default', 160, 168, '{Job}', 'me', '{api}', '{10}', '{1}', '{}', '{}', '{}');
ROLLBACK;
BEGIN;
SELECT count(*) FROM pick('default', 160, 168, '{Job}', 'me', '{api}', '{10}', '{1}', '{}', '{}', '{}');
ROLLBACK;
\echo queue gq, a saturated gate backlog first, twice
BEGIN;
SELECT count(*) FROM pick('gq', 160, 168, '{Job}', 'me', '{api}', '{10}', '{1}', '{}', '{}', '{}');
ROLLBACK;
BEGIN;
SELECT count(*) FROM pick('gq', 160, 168, '{Job}', 'me', '{api}', '{10}', '{1}', '{}', '{}', '{}');
ROLLBACK;
