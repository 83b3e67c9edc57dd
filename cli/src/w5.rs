//! W5: unrelated no-op jobs behind blocked backlogs. `backlog` rows of a gate
//! of 10 and as many of one K = 1 key (each step 1 s), a tenth as many under
//! a rate limit of 50 a second (burst 5), all inserted first; then `jobs` no-op jobs
//! with no key at the same priority. The unrelated jobs' rate is the result
//! (to compare with W1's); the nodes then go on for `hold` seconds, and what
//! the blocked kinds started per second over the whole run shows them at
//! their limits. With `nodes` > 1 the first process starts the others and drives
//! them (see `cluster`).
//!
//! The blocked kinds' admitted steps hold up to 11 slots of a node for a
//! second each (the gate's 10, the key's 1). `benchmarks/w5.sh` and the
//! harness give every system's nodes 11 slots more than W1's 20, so that the
//! unrelated jobs have as many free slots as in W1: W5 measures what the
//! backlog costs them, not the work the blocked kinds are admitted to do
//! (docs/performance.md).

use crate::cluster::{self, p99s, Extra};
use crate::workload::{bar, now_ns, result, schema, write_records, Node, Records};
use anyhow::Result;
use gendurable::{Engine, GateConfig, NewInstance, RateConfig, Transition};
use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) struct Shape {
    pub jobs: usize,
    pub backlog: usize,
    pub hold: Duration,
    pub nodes: u32,
}

/// Steps started per kind: free (unrelated), gate, key, rate.
#[derive(Default)]
struct Counts([AtomicU64; 4]);

impl Counts {
    fn get(&self) -> [u64; 4] {
        self.0.each_ref().map(|c| c.load(Relaxed))
    }
}

const KINDS: [&str; 4] = ["free", "gate", "key", "rate"];

/// A node of the workload: the gate, the rate limit and the one workflow,
/// counting and recording what it runs.
async fn engine(node: &Node, schema: &str, counts: &Arc<Counts>, rec: &Records) -> Result<Engine> {
    let (counts, rec) = (counts.clone(), rec.clone());
    Ok(node
        .builder_in(schema)
        .concurrency_limit("api", GateConfig::new(10))
        // Up to 5 back to back: evenly spaced starts (burst 1) could not
        // make up for the round trip each start waits for.
        .rate_limit("rl", RateConfig::new(50, Duration::from_secs(1)).burst(5))
        .workflow_fn("Job", move |_step, state, ctx| {
            let (counts, rec) = (counts.clone(), rec.clone());
            async move {
                let start = now_ns();
                let kind = match (ctx.concurrency_key.as_deref(), ctx.rate_limit.as_deref()) {
                    (Some("api:1"), _) => 1,
                    (Some(_), _) => 2,
                    (None, Some(_)) => 3,
                    (None, None) => 0,
                };
                if kind == 1 || kind == 2 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                counts.0[kind].fetch_add(1, Relaxed);
                if let Ok(mut r) = rec.lock() {
                    r.push((KINDS[kind].to_owned(), start, now_ns()));
                }
                Ok(Transition::done(state))
            }
        })
        .build()
        .await?)
}

async fn insert(engine: &Engine, shape: &Shape) -> Result<()> {
    let rated = shape.backlog / 10;
    let progress = bar("insert", 2 * shape.backlog + rated + shape.jobs)?;
    let job = || NewInstance::new("Job", json!({}));
    let kinds: [(usize, &dyn Fn() -> NewInstance); 4] = [
        (shape.backlog, &|| job().concurrency_key("api:1")),
        (shape.backlog, &|| job().concurrency_key("acct:1")),
        (rated, &|| job().rate_limit("rl:1")),
        (shape.jobs, &job),
    ];
    for (count, make) in kinds {
        let mut left = count;
        while left > 0 {
            let k = left.min(50_000);
            engine.insert_many((0..k).map(|_| make()).collect()).await?;
            left -= k;
            progress.inc(k as u64);
        }
    }
    progress.finish_and_clear();
    // Two million rows inserted at once leave a checkpoint due, which would
    // run during the timed phase; a backlog that grew over minutes has had
    // its checkpoints. (Needs superuser or pg_checkpoint; without, it runs
    // as it comes.)
    if let Err(e) = sqlx::query("CHECKPOINT").execute(engine.pool()).await {
        eprintln!("w5: no CHECKPOINT after the insert ({e})");
    }
    Ok(())
}

/// One of the other node processes: the same engine, driven by the first
/// (see `cluster`).
pub(crate) async fn extra_node(node: &Node, schema: &str, record: &Option<PathBuf>) -> Result<()> {
    let (counts, rec) = (Arc::new(Counts::default()), Records::default());
    let engine = engine(node, schema, &counts, &rec).await?;
    cluster::serve(engine, || counts.get().to_vec(), &rec, record).await
}

pub(crate) async fn run(
    node: &Node,
    shape: &Shape,
    record: &Option<PathBuf>,
) -> Result<serde_json::Value> {
    let schema = schema();
    let (counts, rec) = (Arc::new(Counts::default()), Records::default());
    let engine = engine(node, &schema, &counts, &rec).await?;
    insert(&engine, shape).await?;
    let mut extras = Vec::new();
    for i in 1..shape.nodes {
        extras.push(Extra::spawn("w5", &schema, node, record.as_deref(), i).await?);
    }
    let total = |extra: &[[u64; 4]]| {
        extra
            .iter()
            .fold(counts.get(), |a, b| std::array::from_fn(|k| a[k] + b[k]))
    };
    let progress = bar("w5", shape.jobs)?;
    let t = Instant::now();
    for e in &mut extras {
        e.send("go").await?;
    }
    engine.start().await?;
    let mut seen = vec![[0u64; 4]; extras.len()];
    loop {
        for (e, s) in extras.iter_mut().zip(seen.iter_mut()) {
            let c = e.count().await?;
            *s = std::array::from_fn(|k| c.get(k).copied().unwrap_or(0));
        }
        let free = total(&seen)[0];
        progress.set_position(free);
        if free >= shape.jobs as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = t.elapsed().as_secs_f64();
    progress.finish_and_clear();
    let mark = engine.stats().pick_latencies();
    let s = engine.stats().snapshot();
    eprintln!(
        "w5: unrelated phase on the first node: {}, {} picks, {} rows unparked, {} parked for a rate limit",
        crate::workload::amortised(&s),
        s.picks,
        s.unparked,
        s.rate_limited
    );
    for e in &mut extras {
        e.send("mark").await?;
    }
    eprintln!("w5: unrelated jobs done; holding {:?}", shape.hold);
    tokio::time::sleep(shape.hold).await;
    for (e, s) in extras.iter_mut().zip(seen.iter_mut()) {
        let c = e.count().await?;
        *s = std::array::from_fn(|k| c.get(k).copied().unwrap_or(0));
    }
    let ran = total(&seen);
    let span = t.elapsed().as_secs_f64();
    let now = engine.stats().pick_latencies();
    let (mut p99, mut p99_hold) = p99s(&now, Some(&mark));
    let mut held = now.since(&mark);
    engine.shutdown().await?;
    write_records(record, &rec)?;
    for e in extras {
        let ended = e.end(record.as_deref()).await?;
        p99 = p99.max(ended.p99.0);
        p99_hold = p99_hold.max(ended.p99.1);
        held = held.plus(&ended.held);
    }
    // Every node's claiming calls while holding, read as one.
    let p99_hold_all = held.quantile(0.99).as_secs_f64() * 1e3;
    let per_s = |k: usize| ran[k] as f64 / span;
    eprintln!(
        "w5: {} node(s); over {span:.1} s the gate ran {:.1}/s (limit 10), the K = 1 key {:.2}/s (1), \
         the rate limit {:.1}/s (50); claiming calls p99 {p99:.1} ms; while holding {p99_hold:.1} ms \
         (the highest node's), {p99_hold_all:.1} ms (every node's calls as one)",
        shape.nodes,
        per_s(1),
        per_s(2),
        per_s(3)
    );
    Ok(result(
        "w5",
        shape.jobs,
        secs,
        json!({
            "nodes": shape.nodes,
            "backlog": shape.backlog,
            "hold_s": shape.hold.as_secs_f64(),
            "pick_p99_ms": p99,
            "pick_p99_hold_ms": p99_hold,
            "pick_p99_hold_all_ms": p99_hold_all,
            "gate_per_s": per_s(1),
            "key_per_s": per_s(2),
            "rate_per_s": per_s(3),
        }),
    ))
}
