-- Every instance is inserted, updated two or three times and deleted, so
-- `instances` makes dead rows as fast as the cluster runs steps. PostgreSQL's
-- defaults (a vacuum once a fifth of the table is dead, throttled by a cost
-- delay) fall behind at thousands of steps a second: dead rows pile up, the
-- table and its indexes grow, and claims slow down with them. Vacuum this
-- table early and unthrottled instead (benchmarks/README.md, Soak). Changing
-- storage parameters takes a lock that neither reads nor writes wait for.
ALTER TABLE instances SET (
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);

-- The gates' slot counters and the rate limits' state are a few rows
-- updated on every claim and every release: keep their dead versions few.
ALTER TABLE gate_slots SET (autovacuum_vacuum_cost_delay = 0);
ALTER TABLE rate_state SET (autovacuum_vacuum_cost_delay = 0);
