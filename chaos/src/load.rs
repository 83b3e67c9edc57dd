//! The load: instances inserted in waves through the controller's own,
//! direct client (not through the proxy), and signals at random times.

use crate::plan::{Plan, POKE, TICK};
use crate::settings::{RATE, RATE_KEYS, SCHEMA};
use anyhow::Context;
use gendurable::Engine;
use gendurable_testing::TempPostgres;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A wave: when, and what.
pub struct Wave {
    pub at: Duration,
    pub plans: Vec<Plan>,
}

/// `total` plans in waves every 2 to 4 s over the first 70 % of the run,
/// and `poison` poison pills. Each wave has a hot rate-limit key, so that
/// its limit binds.
pub fn waves(rng: &mut StdRng, total: usize, poison: u64, duration: Duration) -> Vec<Wave> {
    let span = duration.as_secs_f64() * 0.7;
    let mut times = vec![0.5];
    let mut t = 0.5;
    loop {
        t += rng.gen_range(2.0..4.0);
        if t > span {
            break;
        }
        times.push(t);
    }
    let mut sizes: Vec<f64> = times.iter().map(|_| rng.gen_range(0.5..1.5)).collect();
    let sum: f64 = sizes.iter().sum();
    sizes.iter_mut().for_each(|s| *s *= total as f64 / sum);
    let mut out = Vec::new();
    let mut made = 0;
    for (w, (&at, size)) in times.iter().zip(sizes).enumerate() {
        let n = if w + 1 == times.len() {
            total - made
        } else {
            (size.round() as usize).min(total - made)
        };
        let hot = format!("{RATE}:{}", w as u32 % RATE_KEYS);
        let plans = (made..made + n)
            .map(|i| Plan::generate(rng, format!("i{i}"), &hot))
            .collect();
        made += n;
        out.push(Wave {
            at: Duration::from_secs_f64(at),
            plans,
        });
    }
    // Poison pills, in the first half.
    let half = out.len().div_ceil(2).max(1);
    for p in 0..poison {
        let w = rng.gen_range(0..half);
        let hot = format!("{RATE}:{}", w as u32 % RATE_KEYS);
        let plan = Plan::poison(rng, format!("p{p}"), &hot);
        out[w].plans.push(plan);
    }
    out
}

/// The controller's client and what it inserted.
pub struct Load {
    pub client: Engine,
    pg: Arc<tokio::sync::Mutex<TempPostgres>>,
    plans: Mutex<BTreeMap<i64, Plan>>,
    pub inserted: AtomicUsize,
}

impl Load {
    pub fn new(client: Engine, pg: Arc<tokio::sync::Mutex<TempPostgres>>) -> Load {
        Load {
            client,
            pg,
            plans: Mutex::new(BTreeMap::new()),
            inserted: AtomicUsize::new(0),
        }
    }

    /// Every instance inserted so far, by id.
    pub fn plans(&self) -> BTreeMap<i64, Plan> {
        self.plans.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn record(&self, id: i64, plan: Plan) {
        self.plans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, plan);
        self.inserted.fetch_add(1, Relaxed);
    }

    /// Insert a wave. Postgres is not crashed meanwhile (the crash takes the
    /// same lock); an insert that fails anyway may have committed, so the
    /// rows already in are looked up by their `uid` before trying again.
    pub async fn insert(&self, mut plans: Vec<Plan>) -> anyhow::Result<()> {
        let _pg = self.pg.lock().await;
        let mut tries = 0;
        while !plans.is_empty() {
            let news = plans.iter().map(Plan::new_instance).collect();
            match self.client.insert_many(news).await {
                Ok(ids) => {
                    for (id, plan) in ids.into_iter().zip(plans.drain(..)) {
                        self.record(id, plan);
                    }
                }
                Err(e) => {
                    tries += 1;
                    if tries > 10 {
                        return Err(e).context("inserting a wave failed ten times");
                    }
                    eprintln!("inserting a wave failed ({e}); checking what went in");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    let uids: Vec<String> = plans.iter().map(|p| p.uid.clone()).collect();
                    let found: Vec<(i64, String)> = match sqlx::query_as(&format!(
                        "SELECT id, state->>'uid' FROM \"{SCHEMA}\".instances WHERE state->>'uid' = ANY($1)"
                    ))
                    .bind(&uids)
                    .fetch_all(self.client.pool())
                    .await
                    {
                        Ok(f) => f,
                        Err(_) => continue,
                    };
                    let found: BTreeMap<String, i64> =
                        found.into_iter().map(|(id, uid)| (uid, id)).collect();
                    let mut left = Vec::new();
                    for plan in plans.drain(..) {
                        match found.get(&plan.uid) {
                            Some(&id) => self.record(id, plan),
                            None => left.push(plan),
                        }
                    }
                    plans = left;
                }
            }
        }
        Ok(())
    }

    /// One random signal: `tick` to everything awaiting it, or `poke` to an
    /// instance that awaits one at some step. Failures (Postgres down) are
    /// of no consequence: signals are sent again.
    pub async fn signal(&self, rng: &mut StdRng) {
        if rng.gen_bool(0.3) {
            let _ = self
                .client
                .signal(TICK, json!({"from": "controller"}))
                .await;
            return;
        }
        let candidates: Vec<i64> = {
            let plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
            plans
                .iter()
                .filter(|(_, p)| p.awaits_poke())
                .map(|(&id, _)| id)
                .collect()
        };
        if let Some(&id) = candidates.choose(rng) {
            let _ = self.client.signal_instance(id, POKE, json!({})).await;
        }
    }

    /// Wake whatever awaits now (for the drain).
    pub async fn wake_all(&self) -> anyhow::Result<()> {
        self.client.signal(TICK, json!({"from": "drain"})).await?;
        let ids: Vec<i64> = sqlx::query_scalar(&format!(
            "SELECT id FROM \"{SCHEMA}\".instances WHERE status = 'awaiting'"
        ))
        .fetch_all(self.client.pool())
        .await?;
        for id in ids {
            self.client.signal_instance(id, POKE, json!({})).await?;
        }
        Ok(())
    }

    /// Instances not final yet.
    pub async fn unfinished(&self) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(&format!(
            "SELECT count(*) FROM \"{SCHEMA}\".instances
             WHERE status NOT IN ('completed', 'cancelled', 'discarded')"
        ))
        .fetch_one(self.client.pool())
        .await?)
    }
}
