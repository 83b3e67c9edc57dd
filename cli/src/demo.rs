//! `gendurable demo`: a sample workload on a throwaway Postgres (or
//! DATABASE_URL) with a progress bar and a summary.
//!
//! Account syncs, one at a time per account (K = 1 keys), each pushing to a
//! partner API through a gate of 5 slots and a rate limit, watched from the
//! outside: the summary reports the most ever seen running at once.

use anyhow::Result;
use gendurable::{
    ConcurrencyKey, Engine, GateConfig, KeyChange, NewInstance, NextOptions, RateConfig, Transition,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Account syncs to run.
    #[arg(long, default_value_t = 2000)]
    instances: usize,
    /// Distinct accounts (each one runs one step at a time).
    #[arg(long, default_value_t = 50)]
    accounts: usize,
    /// Worker nodes (separate pools) to run.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Schema to use (a fresh one per run by default).
    #[arg(long)]
    schema: Option<String>,
}

/// Running-at-once per key, and the most ever seen.
#[derive(Default)]
struct Watch(Mutex<HashMap<String, (i64, i64)>>);

impl Watch {
    fn enter(&self, key: &str) {
        let mut m = self.0.lock().unwrap();
        let e = m.entry(key.to_owned()).or_default();
        e.0 += 1;
        e.1 = e.1.max(e.0);
    }

    fn leave(&self, key: &str) {
        self.0.lock().unwrap().get_mut(key).unwrap().0 -= 1;
    }

    fn max_where(&self, f: impl Fn(&str) -> bool) -> i64 {
        let m = self.0.lock().unwrap();
        m.iter()
            .filter(|(k, _)| f(k))
            .map(|(_, v)| v.1)
            .max()
            .unwrap_or(0)
    }
}

const GATE: u32 = 5;

async fn node(url: &str, schema: &str, watch: Arc<Watch>) -> Result<Engine> {
    Ok(Engine::builder()
        .url(url)
        .schema(schema)
        .queue("default", 20)
        .concurrency_limit("partner", GateConfig::new(GATE))
        .rate_limit(
            "partner_api",
            RateConfig::new(2000, Duration::from_secs(1)).burst(50),
        )
        .poll_interval(Duration::from_millis(200))
        .workflow_fn("Account.Sync", move |step, mut state, ctx| {
            let watch = watch.clone();
            async move {
                let key = ctx.concurrency_key.clone().unwrap_or_default();
                watch.enter(&key);
                let pause = match step.as_str() {
                    "fetch" => 2,
                    "push" => 5,
                    _ => 1,
                };
                tokio::time::sleep(Duration::from_millis(pause)).await;
                watch.leave(&key);
                let account = state["account"].as_u64().unwrap_or(0);
                Ok(match step.as_str() {
                    "fetch" => Transition::next_with(
                        "push",
                        state,
                        NextOptions {
                            concurrency_key: KeyChange::Set(ConcurrencyKey::from((
                                "partner", "acme",
                            ))),
                            rate_limit: Some("partner_api:acme".into()),
                            ..Default::default()
                        },
                    ),
                    "push" => Transition::next_with(
                        "save",
                        state,
                        NextOptions {
                            concurrency_key: KeyChange::Set(ConcurrencyKey::from((
                                "account", account,
                            ))),
                            ..Default::default()
                        },
                    ),
                    _ => {
                        state["synced"] = json!(true);
                        Transition::done(state)
                    }
                })
            }
        })
        .start()
        .await?)
}

pub async fn run(args: Args) -> Result<()> {
    let (url, _pg) = crate::database(false).await?;
    let schema = args
        .schema
        .unwrap_or_else(|| format!("demo_{}", std::process::id()));
    let watch = Arc::new(Watch::default());
    let mut nodes = Vec::new();
    for _ in 0..args.nodes.max(1) {
        nodes.push(node(&url, &schema, watch.clone()).await?);
    }
    let news = (0..args.instances)
        .map(|i| {
            let account = i % args.accounts.max(1);
            NewInstance::new("Account.Sync", json!({ "account": account, "n": i }))
                .step("fetch")
                .concurrency_key(("account", account))
        })
        .collect();
    let started = Instant::now();
    nodes[0].insert_many(news).await?;
    println!(
        "inserted {} account syncs over {} accounts in one call; {} nodes, schema {schema:?}",
        args.instances,
        args.accounts,
        nodes.len()
    );

    let bar = ProgressBar::new(args.instances as u64);
    bar.set_style(ProgressStyle::with_template(
        "{bar:40} {pos}/{len} done  {per_sec}  eta {eta}  {msg}",
    )?);
    let total = args.instances as i64;
    loop {
        let st = nodes[0].status().await?;
        let finished: i64 = st
            .counts
            .iter()
            .filter(|c| matches!(c.status.as_str(), "completed" | "cancelled" | "discarded"))
            .map(|c| c.count)
            .sum();
        let in_gate: i64 = st.gates.iter().map(|g| g.in_flight).sum();
        bar.set_position(finished as u64);
        bar.set_message(format!("partner gate {in_gate}/{GATE} in flight"));
        if finished >= total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bar.finish();
    let elapsed = started.elapsed();
    let st = nodes[0].status().await?;
    for n in nodes {
        n.shutdown().await?;
        // Close before the throwaway server goes away with `_pg`.
        n.pool().close().await;
    }
    let max_account = watch.max_where(|k| k.starts_with("account:"));
    let max_partner = watch.max_where(|k| k.starts_with("partner:"));
    println!("\nsummary");
    println!(
        "  {} instances, {} steps in {:.2?}: {:.0} steps/s",
        total,
        total * 3,
        elapsed,
        (total * 3) as f64 / elapsed.as_secs_f64()
    );
    for c in &st.counts {
        println!("  {:<10} {:>8}", c.status, c.count);
    }
    println!("  most steps of one account running at once: {max_account} (K = 1)");
    println!("  most steps in the partner gate at once:   {max_partner} (limit {GATE})");
    if max_account > 1 || max_partner > GATE as i64 {
        anyhow::bail!("a concurrency limit was exceeded");
    }
    Ok(())
}
