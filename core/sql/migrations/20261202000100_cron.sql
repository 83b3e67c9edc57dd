-- Periodic workflows: the last tick inserted per schedule. A node inserts a
-- tick's instance in the transaction that moves last_tick past it, under
-- this row's lock, so each tick is inserted once however many nodes run the
-- schedule (engine/cron.rs).
CREATE TABLE cron (
    name      text        PRIMARY KEY,
    last_tick timestamptz NOT NULL
);
