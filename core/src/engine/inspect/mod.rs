//! What the dashboard reads: the backlog per queue, the last hour's steps,
//! a page of instances, why one waits, the keys and gates. Every read goes
//! through an index and is bounded by the backlog or by a window of ids,
//! never by the finished history (docs/dashboard.md has their plans and
//! times on 10M rows).

use super::status::{GateStatus, NodeStatus, ParkedKey, RateStatus};
use super::Engine;
use crate::error::Result;
use chrono::{DateTime, Utc};
use sqlx::Row;

mod list;
mod why;

pub use list::{InstancePage, InstanceRow, ListQuery};
pub use why::Wait;

/// Finished instances are counted exactly up to this many; past it, the
/// figure is PostgreSQL's estimate.
const FINISHED_EXACT: i64 = 100_000;

/// The cluster at a glance: the overview page.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Overview {
    /// Instances waiting or running per queue, in queue order; a queue with
    /// live nodes or a pause but nothing waiting is listed too.
    pub queues: Vec<QueueLoad>,
    /// Finished instances (completed, cancelled, discarded).
    pub finished: Finished,
    /// Steps per minute over the last hour, oldest first (minutes without
    /// steps are absent).
    pub throughput: Vec<Minute>,
    /// Live nodes.
    pub nodes: Vec<NodeStatus>,
    /// The database's clock when this was read.
    pub now: DateTime<Utc>,
}

/// One queue's backlog.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct QueueLoad {
    pub queue: String,
    pub scheduled: i64,
    pub available: i64,
    pub executing: i64,
    pub awaiting: i64,
    /// Paused since then (see [`Engine::pause_queue`]).
    pub paused_since: Option<DateTime<Utc>>,
}

/// How many instances are finished.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Finished {
    pub count: i64,
    /// `count` is PostgreSQL's estimate (too many to count on every read).
    pub estimated: bool,
}

/// One minute of steps, summed over nodes.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Minute {
    pub minute: DateTime<Utc>,
    /// Steps started.
    pub started: i64,
    /// Steps that recorded an error (retried or discarded).
    pub failed: i64,
    /// Instances completed.
    pub completed: i64,
}

/// Keys, gates and rate limits: the keys page.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KeysView {
    /// K = 1 keys executing now (at most 100, oldest claim first).
    pub executing_keys: Vec<String>,
    /// Every gate key with its counters.
    pub gates: Vec<GateStatus>,
    /// Keys with parked rows, the most first (at most 100).
    pub parked: Vec<ParkedKey>,
    /// Rate-limit keys and their schedules.
    pub rates: Vec<RateStatus>,
    /// Gate names whose keys look like identities (see [`capture_warnings`]).
    pub warnings: Vec<String>,
    pub now: DateTime<Utc>,
}

impl Engine {
    /// The overview: backlog per queue, finished count, the last hour's
    /// steps per minute, live nodes. Reads partial indexes and small tables
    /// only.
    pub async fn overview(&self) -> Result<Overview> {
        let (sql, pool) = (&self.ctx.store.sql, self.ctx.db());
        let mut queues: std::collections::BTreeMap<String, QueueLoad> = Default::default();
        for r in sqlx::query(&sql.active_counts).fetch_all(pool).await? {
            let (queue, status, n): (String, String, i64) =
                (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
            let q = queues.entry(queue.clone()).or_insert_with(|| QueueLoad {
                queue,
                ..Default::default()
            });
            match status.as_str() {
                "scheduled" => q.scheduled = n,
                "available" => q.available = n,
                "executing" => q.executing = n,
                _ => q.awaiting = n,
            }
        }
        for (queue, since) in self.paused_queues().await? {
            queues
                .entry(queue.clone())
                .or_insert_with(|| QueueLoad {
                    queue,
                    ..Default::default()
                })
                .paused_since = Some(since);
        }
        let nodes = self.live_nodes().await?;
        for n in &nodes {
            if let Some(served) = n.queues.as_object() {
                for queue in served.keys() {
                    queues.entry(queue.clone()).or_insert_with(|| QueueLoad {
                        queue: queue.clone(),
                        ..Default::default()
                    });
                }
            }
        }
        let f = sqlx::query(&sql.finished_count)
            .bind(FINISHED_EXACT)
            .fetch_one(pool)
            .await?;
        let (exact, estimate): (i64, Option<i64>) = (f.try_get(0)?, f.try_get(1)?);
        let finished = if exact < FINISHED_EXACT {
            Finished {
                count: exact,
                estimated: false,
            }
        } else {
            Finished {
                count: estimate.unwrap_or(0).max(exact),
                estimated: true,
            }
        };
        let throughput = sqlx::query(&sql.throughput_recent)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|r| {
                Ok(Minute {
                    minute: r.try_get(0)?,
                    started: r.try_get(1)?,
                    failed: r.try_get(2)?,
                    completed: r.try_get(3)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Overview {
            queues: queues.into_values().collect(),
            finished,
            throughput,
            nodes,
            now: self.db_now().await?,
        })
    }

    /// Keys, gates and rate limits, with the capture warnings.
    pub async fn keys(&self) -> Result<KeysView> {
        let gates = self.gate_statuses().await?;
        let warnings = capture_warnings(gates.iter().map(|g| g.key.as_str()));
        Ok(KeysView {
            executing_keys: self.executing_keys().await?,
            gates,
            parked: self.parked().await?,
            rates: self.rate_statuses().await?,
            warnings,
            now: self.db_now().await?,
        })
    }

    /// The database's clock.
    pub(crate) async fn db_now(&self) -> Result<DateTime<Utc>> {
        Ok(sqlx::query_scalar("SELECT now()")
            .fetch_one(self.ctx.db())
            .await?)
    }
}

/// Gate names whose keys look like identities: a gate `order` with keys
/// such as `order:42` (a suffix of digits or a UUID). A configured name
/// captures every key with that name before its first `:`; if `order:42`
/// was meant as "never two steps of order 42 at once", the gate now lets K
/// of them run (docs/concurrency.md). One warning per name, naming a key.
pub fn capture_warnings<'a>(gate_keys: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut seen = std::collections::BTreeMap::new();
    for key in gate_keys {
        if let Some((name, id)) = key.split_once(':') {
            if looks_like_identity(id) {
                seen.entry(name.to_owned())
                    .or_insert_with(|| key.to_owned());
            }
        }
    }
    seen.into_iter()
        .map(|(name, key)| {
            format!(
                "gate {name:?} captures keys like {key:?} that look like identities: if steps \
                 of {key} must never overlap, they now run up to the gate's limit at once \
                 (keep gate names apart from entity names)"
            )
        })
        .collect()
}

/// A run of digits, or a UUID.
fn looks_like_identity(s: &str) -> bool {
    let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let uuid = s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        });
    digits || uuid
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_like_gate_keys_are_warned_about_once_per_name() {
        let w = capture_warnings([
            "stripe",
            "stripe:acme",
            "order:42",
            "order:43",
            "user:0b6c1b1e-58a4-4f7e-9d8a-2f4d3c2b1a00",
            "openai:gpt-4",
        ]);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].contains("\"order\"") && w[0].contains("order:42"),
            "{w:?}"
        );
        assert!(w[1].contains("\"user\""), "{w:?}");
    }
}
