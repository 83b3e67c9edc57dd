//! Schema migrations, statement texts and database error classification.

use crate::error::Result;
use sqlx::{Executor, PgPool};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Every statement the engine runs, with the schema written in. Built once per
/// engine; the texts are stable, so sqlx prepares each once per connection.
#[derive(Debug)]
pub(crate) struct Sql {
    /// The LISTEN/NOTIFY channel of this schema.
    pub channel: String,
    pub insert: String,
    pub handoff: String,
    pub stage: String,
    pub reap: String,
    pub get: String,
    pub signal: String,
    pub cancel: String,
    pub heartbeat: String,
    pub forget_node: String,
    pub prune: String,
    pub reconcile: String,
    pub orphans: String,
    pub park_orphans: String,
    pub unpark_workflows: String,
    pub prune_rates: String,
    pub forget_dead_nodes: String,
    pub held_by_node: String,
    pub next_ids: String,
    pub copy_in: String,
    pub key_room: String,
    pub rate_room: String,
    pub unpark_sweep: String,
    pub rate_sweep: String,
}

impl Sql {
    pub fn new(schema: &str) -> Sql {
        // The schema is validated as [a-z0-9_]; quoting keeps it exact.
        let q = |text: &str| text.replace("__S__", &format!("\"{schema}\""));
        Sql {
            // What the database says a node holds: executing, or reserved.
            // One branch per partial index (a status list would match neither).
            held_by_node: q("SELECT id, workflow, step, state, queue, attempt, max_attempts, concurrency_key,
                                    gate_shard, rate_key, wake, token, true AS executing
                             FROM __S__.instances WHERE node = $1 AND status = 'executing'
                             UNION ALL
                             SELECT id, workflow, step, state, queue, attempt, max_attempts, concurrency_key,
                                    gate_shard, rate_key, wake, token, false
                             FROM __S__.instances
                             WHERE node = $1 AND status = 'available' AND node IS NOT NULL"),
            channel: format!("{schema}_wake"),
            // Ids for a COPY, in order (see crate::insert::copy).
            // Materialised: inlined, the sequence's name is looked up per row.
            next_ids: q("WITH q AS MATERIALIZED (SELECT pg_get_serial_sequence('__S__.instances', 'id')::regclass AS s)
                         SELECT nextval(s) FROM q, generate_series(1, $1)"),
            copy_in: q("COPY __S__.instances (id, workflow, step, state, queue, priority, concurrency_key,
                                              rate_key, max_attempts, status, parked) FROM STDIN"),
            // The ($1 queue, $2 workflow) pairs whose rows no live node (within
            // $3 seconds) will run (see the workflow parking migration).
            orphans: q("SELECT q, w FROM unnest($1::text[], $2::text[]) AS p(q, w)
                        WHERE __S__.orphaned(q, w, $3)"),
            // $1 keys, $2/$3 gate names and limits (see the parking migration).
            key_room: q("SELECT key, room FROM __S__.key_room($1, $2, $3)"),
            // $1 rate keys, $2 most rows to count, $3/$4/$5 rate limits.
            rate_room: q("SELECT key, room FROM __S__.rate_room($1, $2, $3, $4, $5)"),
            unpark_sweep: q("SELECT unparked, last_key FROM __S__.unpark_sweep($1, $2, $3, $4, $5, $6, $7, $8, $9)"),
            rate_sweep: q("SELECT unparked, last_key, next_in FROM __S__.rate_sweep($1, $2, $3, $4, $5, $6)"),
            insert: q(include_str!("sql/insert.sql")),
            // Outcomes, handovers and claims (see the migration defining it).
            handoff: q("SELECT (claimed).*, reserved, written, released, handed_over, released_keys, promoted
                        FROM __S__.handoff($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                                           $16, $17, $18)"),
            stage: q(include_str!("sql/stage.sql")),
            reap: q(include_str!("sql/reap.sql")),
            get: q(&format!("SELECT {INSTANCE_COLUMNS} FROM __S__.instances WHERE id = $1")),
            signal: q(include_str!("sql/signal.sql")),
            cancel: q(include_str!("sql/cancel.sql")),
            // Registers the node's queues ($4) and workflows ($6). Also
            // answers how many other nodes are alive (heartbeat within
            // $5 s), and how many seconds ago this node's previous heartbeat
            // was recorded (NULL: none, or its row was deleted as dead).
            heartbeat: q("WITH prev AS (SELECT heartbeat_at FROM __S__.nodes WHERE id = $1),
                          beat AS (INSERT INTO __S__.nodes (id, hostname, pid, queues, workflows)
                                   VALUES ($1, $2, $3, $4, $6)
                                   ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), queues = excluded.queues,
                                                                  workflows = excluded.workflows
                                   RETURNING 1)
                          SELECT (SELECT count(*) FROM __S__.nodes n
                                  WHERE n.id <> $1 AND n.heartbeat_at > now() - make_interval(secs => $5)),
                                 (SELECT extract(epoch FROM now() - heartbeat_at)::float8 FROM prev),
                                 (SELECT count(*) FROM beat)"),
            // Gives back the rows the node reserved, too.
            forget_node: q("WITH gone AS (DELETE FROM __S__.nodes WHERE id = $1 RETURNING 1)
                            SELECT __S__.release_reserved($1, NULL, NULL)"),
            prune: q("DELETE FROM __S__.instances WHERE id IN (
                          SELECT id FROM __S__.instances
                          WHERE status IN ('completed', 'cancelled', 'discarded')
                            AND finished_at < now() - make_interval(secs => $1)
                          LIMIT $2)"),
            // $1 queue, $2 lease in seconds, $3 rows at the head to look at.
            park_orphans: q("SELECT __S__.park_orphans($1, $2, $3)"),
            // $1 queues, $2 workflows (a node's), $3 rows per pair, $4 channel.
            unpark_workflows: q("SELECT __S__.unpark_workflows($1, $2, $3, $4)"),
            // $1 after, $2 keys, $3/$4/$5 gate names, limits and shards, $6 channel.
            reconcile: q("SELECT changed, last_key FROM __S__.reconcile_gates($1, $2, $3, $4, $5, $6)"),
            prune_rates: q("DELETE FROM __S__.rate_state WHERE key IN (
                                SELECT key FROM __S__.rate_state WHERE tat < now() - interval '1 minute'
                                LIMIT 10000 FOR UPDATE SKIP LOCKED)"),
            forget_dead_nodes: q("DELETE FROM __S__.nodes n
                                  WHERE n.heartbeat_at < now() - make_interval(secs => $1)
                                    AND NOT EXISTS (SELECT 1 FROM __S__.instances i
                                                    WHERE i.status = 'executing' AND i.node = n.id)"),
        }
    }
}

/// The columns of [`crate::Instance`], in the order `instance_from_row` reads them.
pub(crate) const INSTANCE_COLUMNS: &str = "id, workflow, step, state, queue, priority, status, \
    concurrency_key, rate_key, attempt, max_attempts, node, cancel_requested, await_signal, \
    await_until, errors, inserted_at, scheduled_at, attempted_at, finished_at";

/// Create the schema and bring it up to date. Safe to run from many nodes at
/// once: a session advisory lock serialises them, and every step is idempotent.
pub(crate) async fn migrate(pool: &PgPool, schema: &str) -> Result<()> {
    let mut conn = pool.acquire().await?;
    let lock = format!("gendurable.migrate.{schema}");
    let create = format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"");
    let search = format!("SET search_path TO \"{schema}\"");
    conn.execute(sqlx::query("SELECT pg_advisory_lock(hashtext($1))").bind(&lock))
        .await?;
    let result = async {
        conn.execute(create.as_str()).await?;
        // The migrations name their tables without a schema: they land in ours,
        // and so does the migrations' own bookkeeping table.
        conn.execute(search.as_str()).await?;
        // run_direct, not run: its future is Send, so `build()` can be spawned.
        MIGRATOR.run_direct(&mut *conn).await?;
        Ok::<_, crate::Error>(())
    }
    .await;
    // Leave the pooled connection as we found it, even after a failure.
    let reset = conn.execute("RESET search_path").await;
    let unlock = conn
        .execute(sqlx::query("SELECT pg_advisory_unlock(hashtext($1))").bind(&lock))
        .await;
    if reset.is_err() || unlock.is_err() {
        conn.close_on_drop();
    }
    result
}

/// Whether a database error is worth retrying: a broken or refused connection,
/// a server shutting down or starting, a deadlock or serialization failure.
pub(crate) fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || code.starts_with("57P")
                || code == "40001"
                || code == "40P01"
                || code == "53300"
        }),
        _ => false,
    }
}
