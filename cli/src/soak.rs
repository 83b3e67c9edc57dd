//! The soak: a node under a steady load for a long time, on a table that
//! already holds a long history being pruned. `history` finished rows are
//! written first, spread over the retention window before the start, as if
//! the cluster had run at this rate before; then jobs are inserted at `rate`
//! per second for `minutes` (70 % plain no-ops, 20 % on 1,000 K = 1 keys, 5 %
//! through a gate of 50, 5 % failing their first attempt and retried) while
//! the node runs them and prunes what passes the retention. Every 10 s a
//! sample: jobs completed, claim p99, backlog, the table's and its indexes'
//! size, dead rows, autovacuum runs, and this process's resident memory. The
//! result compares the first five minutes with the last five.

use crate::workload::{schema, Node};
use anyhow::{bail, Context, Result};
use gendurable::{GateConfig, Latencies, NewInstance, Transition};
use serde_json::json;
use sqlx::Row;
use std::time::{Duration, Instant};

pub(crate) struct Shape {
    pub minutes: f64,
    /// Jobs inserted per second.
    pub rate: f64,
    /// Finished rows in the table at the start.
    pub history: u64,
}

/// What one 10 s sample saw.
#[derive(Clone, serde::Serialize)]
struct Sample {
    /// Seconds since the start.
    t: f64,
    inserted_per_s: f64,
    completed_per_s: f64,
    claim_p99_ms: f64,
    backlog: i64,
    table_mb: f64,
    indexes_mb: f64,
    dead_rows: i64,
    live_rows: i64,
    autovacuums: i64,
    rss_mb: f64,
    heap_mb: f64,
}

const SAMPLE: Duration = Duration::from_secs(10);

pub(crate) async fn run(node: &Node, shape: &Shape) -> Result<serde_json::Value> {
    if shape.rate <= 0.0 || shape.minutes <= 0.0 {
        bail!("the soak needs --rate and --minutes above zero");
    }
    let schema = schema();
    // The steady state: the history is what `rate` leaves within the retention.
    let retention = Duration::from_secs_f64((shape.history as f64 / shape.rate).max(60.0));
    let engine = node
        .builder_in(&schema)
        .concurrency_limit("api", GateConfig::new(50))
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .retention(Some(retention))
        .workflow_fn("Job", |_step, state, ctx| async move {
            Ok(if state["fail"] == json!(true) && ctx.attempt == 1 {
                Transition::error("the first attempt fails")
            } else {
                Transition::done(state)
            })
        })
        .build()
        .await?;
    seed(engine.pool(), &schema, shape.history, retention).await?;

    let before = inserted_rows(engine.pool(), &schema).await?;
    let indexes_at_start = index_sizes(engine.pool(), &schema).await?;
    engine.start().await?;
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(shape.minutes * 60.0);
    let inserter = {
        let engine = engine.clone();
        let rate = shape.rate;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let (mut sent, mut i) = (0u64, 0u64);
            let start = Instant::now();
            while Instant::now() < end {
                tick.tick().await;
                let due = rate * start.elapsed().as_secs_f64();
                let n = (due as u64).saturating_sub(sent);
                let batch: Vec<NewInstance> = (0..n)
                    .map(|_| {
                        i += 1;
                        job(i)
                    })
                    .collect();
                if !batch.is_empty() {
                    engine.insert_many(batch).await?;
                    sent += n;
                }
            }
            Ok::<u64, gendurable::Error>(sent)
        })
    };

    let mut samples: Vec<Sample> = Vec::new();
    let (mut last_done, mut last_inserted) = (0u64, before);
    let mut mark = engine.stats().pick_latencies();
    let mut next = t0 + SAMPLE;
    while next <= end {
        tokio::time::sleep_until(next.into()).await;
        next += SAMPLE;
        let stats = engine.stats().snapshot();
        let lat = engine.stats().pick_latencies();
        let inserted = inserted_rows(engine.pool(), &schema).await?;
        let s = sample(
            engine.pool(),
            &schema,
            t0.elapsed().as_secs_f64(),
            (stats.steps_completed - last_done) as f64 / SAMPLE.as_secs_f64(),
            (inserted.saturating_sub(last_inserted)) as f64 / SAMPLE.as_secs_f64(),
            &lat.since(&mark),
        )
        .await?;
        (last_done, last_inserted, mark) = (stats.steps_completed, inserted, lat);
        eprintln!("soak {}", serde_json::to_string(&s)?);
        samples.push(s);
    }
    let sent = inserter.await.context("the inserter")??;
    engine.shutdown().await?;
    // Which indexes grew.
    let indexes_at_end = index_sizes(engine.pool(), &schema).await?;

    let window = |from: f64, to: f64| -> Vec<&Sample> {
        samples.iter().filter(|s| s.t > from && s.t <= to).collect()
    };
    let total = shape.minutes * 60.0;
    let (first, last) = (window(0.0, 300.0), window(total - 300.0, total));
    let mean = |ss: &[&Sample], f: fn(&Sample) -> f64| {
        ss.iter().map(|s| f(s)).sum::<f64>() / ss.len().max(1) as f64
    };
    let max = |f: fn(&Sample) -> f64| samples.iter().map(f).fold(0.0, f64::max);
    Ok(json!({
        "system": "gendurable",
        "workload": "soak",
        "minutes": shape.minutes,
        "rate": shape.rate,
        "history": shape.history,
        "retention_s": retention.as_secs_f64(),
        "inserted": sent,
        "first5_completed_per_s": mean(&first, |s| s.completed_per_s),
        "last5_completed_per_s": mean(&last, |s| s.completed_per_s),
        "first5_claim_p99_ms": mean(&first, |s| s.claim_p99_ms),
        "last5_claim_p99_ms": mean(&last, |s| s.claim_p99_ms),
        "table_mb_first": samples.first().map(|s| s.table_mb),
        "table_mb_max": max(|s| s.table_mb),
        "table_mb_last": samples.last().map(|s| s.table_mb),
        "indexes_mb_first": samples.first().map(|s| s.indexes_mb),
        "indexes_mb_max": max(|s| s.indexes_mb),
        "indexes_mb_last": samples.last().map(|s| s.indexes_mb),
        "rss_mb_first5": mean(&first, |s| s.rss_mb),
        "rss_mb_last5": mean(&last, |s| s.rss_mb),
        "heap_mb_first5": mean(&first, |s| s.heap_mb),
        "heap_mb_last5": mean(&last, |s| s.heap_mb),
        "backlog_last": samples.last().map(|s| s.backlog),
        "index_mb_at_start": indexes_at_start,
        "index_mb_at_end": indexes_at_end,
        "samples": samples,
    }))
}

/// Job `i` of the mix.
fn job(i: u64) -> NewInstance {
    let new = NewInstance::new("Job", json!({}));
    match i % 20 {
        0..=3 => new.concurrency_key(format!("account:{}", i % 1000)),
        4 => new.concurrency_key("api:1"),
        5 => NewInstance::new("Job", json!({ "fail": true })),
        _ => new,
    }
}

/// Write `n` completed rows spread over the `retention` before now, in
/// batches of a million, with progress.
async fn seed(pool: &sqlx::PgPool, schema: &str, n: u64, retention: Duration) -> Result<()> {
    const CHUNK: u64 = 1_000_000;
    let bar = crate::workload::bar("history", n as usize)?;
    let mut done = 0;
    while done < n {
        let k = CHUNK.min(n - done);
        sqlx::query(&format!(
            "INSERT INTO \"{schema}\".instances
                 (workflow, step, state, queue, status, attempt, inserted_at, scheduled_at, attempted_at, finished_at)
             SELECT 'Job', 'start', '{{}}', 'default', 'completed', 1, t, t, t, t
             FROM (SELECT now() - make_interval(secs => $3 * (1 - (g::float8 / $4))) AS t
                   FROM generate_series($1::bigint, $2::bigint) g) s"
        ))
        .bind(done as i64 + 1)
        .bind((done + k) as i64)
        .bind(retention.as_secs_f64())
        .bind(n as f64)
        .execute(pool)
        .await?;
        done += k;
        bar.set_position(done);
    }
    bar.finish_and_clear();
    sqlx::query(&format!("VACUUM ANALYZE \"{schema}\".instances"))
        .execute(pool)
        .await?;
    Ok(())
}

/// Each index of `instances` and its size in MB, the largest first.
async fn index_sizes(
    pool: &sqlx::PgPool,
    schema: &str,
) -> Result<serde_json::Map<String, serde_json::Value>> {
    let sizes: Vec<(String, i64)> = sqlx::query_as(
        "SELECT indexrelname::text, pg_relation_size(indexrelid) FROM pg_stat_user_indexes \
         WHERE schemaname = $1 AND relname = 'instances' ORDER BY 2 DESC",
    )
    .bind(schema)
    .fetch_all(pool)
    .await?;
    Ok(sizes
        .into_iter()
        .map(|(name, bytes)| (name, json!(bytes as f64 / 1048576.0)))
        .collect())
}

/// Rows inserted so far (the identity's last value).
async fn inserted_rows(pool: &sqlx::PgPool, schema: &str) -> Result<u64> {
    let v: Option<i64> = sqlx::query_scalar(
        "SELECT last_value FROM pg_sequences \
         WHERE schemaname = $1 AND sequencename = 'instances_id_seq'",
    )
    .bind(schema)
    .fetch_one(pool)
    .await?;
    Ok(v.unwrap_or(0).max(0) as u64)
}

async fn sample(
    pool: &sqlx::PgPool,
    schema: &str,
    t: f64,
    completed_per_s: f64,
    inserted_per_s: f64,
    claims: &Latencies,
) -> Result<Sample> {
    let r = sqlx::query(&format!(
        "SELECT pg_table_size('\"{schema}\".instances'), pg_indexes_size('\"{schema}\".instances'),
                coalesce(n_dead_tup, 0), coalesce(n_live_tup, 0), coalesce(autovacuum_count, 0),
                (SELECT count(*) FROM \"{schema}\".instances WHERE status = 'available' AND parked IS NULL)
         FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'instances'"
    ))
    .bind(schema)
    .fetch_one(pool)
    .await?;
    let mb = |b: i64| b as f64 / 1048576.0;
    Ok(Sample {
        t,
        inserted_per_s,
        completed_per_s,
        claim_p99_ms: claims.quantile(0.99).as_secs_f64() * 1e3,
        backlog: r.try_get(5)?,
        table_mb: mb(r.try_get(0)?),
        indexes_mb: mb(r.try_get(1)?),
        dead_rows: r.try_get(2)?,
        live_rows: r.try_get(3)?,
        autovacuums: r.try_get(4)?,
        rss_mb: rss_mb(),
        heap_mb: heap_mb(),
    })
}

/// This process's resident memory, from /proc (0 where there is none).
fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// What the allocator has handed out and not had back (glibc; 0 elsewhere).
/// RSS above it is memory freed but kept by the allocator for reuse.
fn heap_mb() -> f64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 takes no arguments and only reads the allocator's counters.
        let m = unsafe { libc::mallinfo2() };
        (m.uordblks + m.hblkhd) as f64 / 1048576.0
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    0.0
}
