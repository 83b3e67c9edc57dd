-- Steps per minute per node, for the dashboard's chart: each node adds what
-- its counters moved by since its last flush (node/maintenance/throughput.rs)
-- every few seconds, so reading the last hour reads at most 60 rows a node,
-- however many instances the table holds. Rows older than a day go.
CREATE TABLE throughput (
    minute    timestamptz NOT NULL,
    node      text        NOT NULL,
    -- Steps started, steps that recorded an error, instances completed.
    started   bigint      NOT NULL DEFAULT 0,
    failed    bigint      NOT NULL DEFAULT 0,
    completed bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, node)
);
