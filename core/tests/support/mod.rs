//! Shared test support: one throwaway Postgres per test binary (or
//! DATABASE_URL), a fresh schema per test, and an outside observer.
#![allow(dead_code)]

use gendurable::{Engine, EngineBuilder};
use std::time::Duration;

/// The database every test of this binary shares; each test takes its own schema.
pub fn url() -> String {
    gendurable_testing::shared_url()
}

/// `url` with a session setting in its startup options, as a server,
/// database or role setting would give every session.
pub fn with_setting(url: &str, name: &str, value: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options[{name}]={value}")
}

/// A schema name no other test uses.
pub fn schema(prefix: &str) -> String {
    format!("t_{prefix}_{:08x}", rand::random::<u32>())
}

/// A builder with fast test settings: short poll, heartbeat and lease.
pub fn builder(url: &str, schema: &str) -> EngineBuilder {
    Engine::builder()
        .url(url)
        .schema(schema)
        .poll_interval(Duration::from_millis(100))
        .heartbeat_interval(Duration::from_millis(300))
        .lease(Duration::from_secs(2))
        .gc_interval(Duration::from_millis(500))
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .shutdown_timeout(Duration::from_secs(5))
}

/// Waits for `cond` to hold, checking whenever `poll` elapses, for at most
/// `limit` (a failure then, not a timing assertion: the condition never came).
pub async fn eventually<F, Fut>(what: &str, limit: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    loop {
        if cond().await {
            return;
        }
        if start.elapsed() > limit {
            panic!("{what}: not reached within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Count instances per status in a schema.
pub async fn count(pool: &sqlx::PgPool, schema: &str, status: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{schema}\".instances WHERE status = $1"
    ))
    .bind(status)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// An outside observer: steps record their start and end through a pool of
/// its own. Events are ordered by a sequence, which is monotonic in real time
/// across connections, so overlaps are exact (no clock resolution ties).
#[derive(Clone)]
pub struct Observer {
    pub pool: sqlx::PgPool,
    table: String,
}

impl Observer {
    pub async fn new(url: &str, schema: &str) -> Observer {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(40)
            .connect(url)
            .await
            .unwrap();
        let table = format!("\"{schema}\".observed");
        sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (seq bigserial PRIMARY KEY, instance bigint NOT NULL,
             key text NOT NULL, ev text NOT NULL, node text, step text)"
        ))
        .execute(&pool)
        .await
        .unwrap();
        Observer { pool, table }
    }

    pub async fn record(&self, instance: i64, key: &str, ev: &str, step: &str) {
        sqlx::query(&format!(
            "INSERT INTO {} (instance, key, ev, step) VALUES ($1, $2, $3, $4)",
            self.table
        ))
        .bind(instance)
        .bind(key)
        .bind(ev)
        .bind(step)
        .execute(&self.pool)
        .await
        .unwrap();
    }

    /// The largest number of steps ever running at once, per key.
    pub async fn max_per_key(&self) -> std::collections::HashMap<String, i64> {
        sqlx::query_as::<_, (String, i64)>(&format!(
            "SELECT key, max(running)::bigint FROM (
                 SELECT key, sum(CASE WHEN ev = 'start' THEN 1 ELSE -1 END)
                        OVER (PARTITION BY key ORDER BY seq) AS running
                 FROM {}) x GROUP BY key",
            self.table
        ))
        .fetch_all(&self.pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
    }

    /// How many times each instance ran `step` to its end.
    pub async fn ends_of(&self, step: &str) -> std::collections::HashMap<i64, i64> {
        sqlx::query_as::<_, (i64, i64)>(&format!(
            "SELECT instance, count(*) FROM {} WHERE ev = 'end' AND step = $1 GROUP BY instance",
            self.table
        ))
        .bind(step)
        .fetch_all(&self.pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
    }
}

/// Waits until instance `id` has `status` (at most a minute) and returns it.
pub async fn wait_status(
    engine: &Engine,
    id: i64,
    status: gendurable::Status,
) -> gendurable::Instance {
    wait_for(engine, id, &format!("instance {id} {status}"), |i| {
        i.status == status
    })
    .await
}

/// Waits until instance `id` is final (at most a minute) and returns it.
pub async fn wait_final(engine: &Engine, id: i64) -> gendurable::Instance {
    wait_for(engine, id, &format!("instance {id} final"), |i| {
        i.status.is_final()
    })
    .await
}

/// Waits until instance `id` satisfies `pred` (at most a minute).
pub async fn wait_for(
    engine: &Engine,
    id: i64,
    what: &str,
    pred: impl Fn(&gendurable::Instance) -> bool,
) -> gendurable::Instance {
    let start = std::time::Instant::now();
    loop {
        let i = engine.get(id).await.unwrap();
        if pred(&i) {
            return i;
        }
        if start.elapsed() > Duration::from_secs(60) {
            panic!("{what}: not reached within a minute; last seen {i:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `n` instances of the schema have `status` (at most three minutes).
pub async fn wait_count(pool: &sqlx::PgPool, schema: &str, status: &str, n: i64) {
    let start = std::time::Instant::now();
    loop {
        let c = count(pool, schema, status).await;
        if c == n {
            return;
        }
        if start.elapsed() > Duration::from_secs(180) {
            panic!("{n} instances {status}: not reached within three minutes; last count {c}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Scans this transaction made of each index of `schema` named in `indexes`,
/// by name.
pub async fn index_scans(
    tx: &mut sqlx::PgConnection,
    schema: &str,
    indexes: &[&str],
) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT c.relname::text, pg_stat_get_xact_numscans(c.oid)
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relname = ANY ($2)
         ORDER BY 1",
    )
    .bind(schema)
    .bind(indexes)
    .fetch_all(tx)
    .await
    .unwrap()
}
