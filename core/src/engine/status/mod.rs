//! Introspection: what the cluster is doing right now, for `gendurable status`
//! and monitoring.

use super::Engine;
use crate::error::{Error, Result};
use chrono::{DateTime, Utc};
use sqlx::Row;

mod report;

/// A snapshot of the cluster as seen from the database.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ClusterStatus {
    /// Instances per (queue, status).
    pub counts: Vec<QueueCount>,
    /// Nodes that heartbeated within the lease.
    pub nodes: Vec<NodeStatus>,
    /// Gate counters per key.
    pub gates: Vec<GateStatus>,
    /// K = 1 keys executing right now (at most 100, oldest claim first).
    pub executing_keys: Vec<String>,
    /// Rate-limit keys with state.
    pub rates: Vec<RateStatus>,
    /// Keys with parked rows, the most parked first (at most 100): rows
    /// waiting out of the pick's sight until their key has room or their
    /// rate limit allows a start (see docs/concurrency.md, parking).
    pub parked: Vec<ParkedKey>,
    /// Rows waiting to run (`available` or `scheduled`) per workflow and
    /// queue, the ones no live node will run first (at most 1000 groups).
    pub waiting: Vec<WaitingRows>,
    /// Paused queues (see [`Engine::pause_queue`]), and since when.
    pub paused: Vec<(String, DateTime<Utc>)>,
}

/// Rows of one workflow waiting in one queue.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WaitingRows {
    pub workflow: String,
    pub queue: String,
    /// `available` and `scheduled` rows.
    pub count: i64,
    /// The earliest `scheduled_at` among them (in the past: due since then).
    pub oldest: DateTime<Utc>,
    /// Why no live node will run them, if none will.
    pub no_node: Option<NoNode>,
}

/// Why no live node will run a waiting row. Such rows wait until a node that
/// serves their queue and runs their workflow starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum NoNode {
    /// No live node serves the row's queue.
    Queue,
    /// Live nodes serve the queue, but none of them runs the workflow (known
    /// only when nodes record their workflows).
    Workflow,
}

/// How many instances of a queue are in a status.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueueCount {
    pub queue: String,
    pub status: String,
    pub count: i64,
}

/// A live node.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodeStatus {
    pub id: String,
    pub hostname: String,
    pub pid: i32,
    pub queues: serde_json::Value,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    /// Rows it is executing.
    pub executing: i64,
    /// The workflows it runs (`None`: it recorded none, and may run any).
    pub workflows: Option<Vec<String>>,
}

/// One gated key: its counters summed over shards.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GateStatus {
    pub key: String,
    /// Steps executing under the gate (from the rows, the truth).
    pub in_flight: i64,
    /// The gate's limit (sum of the shards' capacities).
    pub limit: i64,
    /// Slots the counters say are free (lower than limit − in_flight right
    /// after a crash, until the reconciler repairs them).
    pub available: i64,
    /// Counter rows.
    pub shards: i64,
}

/// Rows parked behind one key.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ParkedKey {
    /// A concurrency key (K = 1 or gated) or a rate-limit key.
    pub key: String,
    /// What they wait for: [`Parked::Key`] (room under the key's K) or
    /// [`Parked::Rate`] (the rate limit's next start).
    pub waits_for: Parked,
    /// Parked rows.
    pub rows: i64,
    /// Rows of the key waiting unparked, where a pick sees them (at most its
    /// K for a concurrency key).
    pub heads: i64,
}

/// What a parked row waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Parked {
    /// Room under its concurrency key's K.
    Key,
    /// Its rate limit's next allowed start.
    Rate,
}

/// One rate-limit key.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RateStatus {
    pub key: String,
    /// The GCRA theoretical arrival time: starts are spaced from here on.
    pub tat: DateTime<Utc>,
}

/// The effective K of a concurrency key on this node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeyLimit {
    /// At most this many steps of the key execute at once.
    pub k: u32,
    /// The `concurrency_limits` name that captured the key, if any (K = 1 otherwise).
    pub gate: Option<String>,
    /// Counter rows the gate is split over (1 for K = 1).
    pub shards: u32,
}

impl Engine {
    /// The effective K of `key` under this engine's configuration, and which
    /// configured name captured it. Config names capture every key with that
    /// name before the first `:` (`order` gates `order:42`).
    pub fn key_limit(&self, key: &str) -> KeyLimit {
        match self.ctx.cfg.gate_for(key) {
            Some((name, g)) => KeyLimit {
                k: g.limit,
                gate: Some(name.to_owned()),
                shards: g.effective_shards(),
            },
            None => KeyLimit {
                k: 1,
                gate: None,
                shards: 1,
            },
        }
    }

    /// Whether this engine's schema exists and holds the engine's tables
    /// (read-only: nothing is created).
    pub async fn schema_exists(&self) -> Result<bool> {
        Ok(sqlx::query_scalar(&self.ctx.store.sql.schema_exists)
            .fetch_one(self.ctx.db())
            .await?)
    }

    /// Read the cluster's state: counts, live nodes, gates, executing K = 1
    /// keys, rate-limit state and the rows no live node will run. Read-only:
    /// a schema that does not exist is an error, not created.
    pub async fn status(&self) -> Result<ClusterStatus> {
        if !self.schema_exists().await? {
            let schema = &self.ctx.cfg.schema;
            return Err(Error::InvalidConfig(format!(
                "schema {schema:?} does not exist in this database (or has no gendurable tables); \
                 `gendurable migrate --schema {schema}` creates it"
            )));
        }
        let (sql, pool) = (&self.ctx.store.sql, self.ctx.db());
        let lease = self.ctx.cfg.lease.as_secs_f64();
        let counts = sqlx::query(&sql.status_counts)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|r| {
                Ok(QueueCount {
                    queue: r.try_get(0)?,
                    status: r.try_get(1)?,
                    count: r.try_get(2)?,
                })
            })
            .collect::<Result<_>>()?;
        let nodes = self.live_nodes().await?;
        let waiting = sqlx::query(&sql.status_waiting)
            .bind(lease)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|r| {
                Ok(WaitingRows {
                    workflow: r.try_get(0)?,
                    queue: r.try_get(1)?,
                    count: r.try_get(2)?,
                    oldest: r.try_get(3)?,
                    no_node: match r.try_get::<Option<&str>, _>(4)? {
                        Some("queue") => Some(NoNode::Queue),
                        Some(_) => Some(NoNode::Workflow),
                        None => None,
                    },
                })
            })
            .collect::<Result<_>>()?;
        let gates = self.gate_statuses().await?;
        let executing_keys = self.executing_keys().await?;
        let rates = self.rate_statuses().await?;
        let parked = self.parked().await?;
        Ok(ClusterStatus {
            counts,
            nodes,
            gates,
            executing_keys,
            rates,
            parked,
            waiting,
            paused: self.paused_queues().await?,
        })
    }
}

impl Engine {
    /// Live nodes: heartbeating within the lease.
    pub(crate) async fn live_nodes(&self) -> Result<Vec<NodeStatus>> {
        let (sql, pool) = (&self.ctx.store.sql, self.ctx.db());
        sqlx::query(&sql.status_nodes)
            .bind(self.ctx.cfg.lease.as_secs_f64())
            .fetch_all(pool)
            .await?
            .iter()
            .map(|r| {
                Ok(NodeStatus {
                    id: r.try_get(0)?,
                    hostname: r.try_get(1)?,
                    pid: r.try_get(2)?,
                    queues: r.try_get(3)?,
                    started_at: r.try_get(4)?,
                    heartbeat_at: r.try_get(5)?,
                    executing: r.try_get(6)?,
                    workflows: r
                        .try_get::<Option<serde_json::Value>, _>(7)?
                        .map(workflow_names),
                })
            })
            .collect()
    }

    /// Every gate key with its counters.
    pub(crate) async fn gate_statuses(&self) -> Result<Vec<GateStatus>> {
        sqlx::query(&self.ctx.store.sql.status_gates)
            .fetch_all(self.ctx.db())
            .await?
            .iter()
            .map(|r| {
                Ok(GateStatus {
                    key: r.try_get(0)?,
                    in_flight: r.try_get(1)?,
                    limit: r.try_get(2)?,
                    available: r.try_get(3)?,
                    shards: r.try_get(4)?,
                })
            })
            .collect()
    }

    /// K = 1 keys executing now (at most 100, oldest claim first).
    pub(crate) async fn executing_keys(&self) -> Result<Vec<String>> {
        Ok(
            sqlx::query_scalar(&self.ctx.store.sql.status_executing_keys)
                .fetch_all(self.ctx.db())
                .await?,
        )
    }

    /// Rate-limit keys and their schedules.
    pub(crate) async fn rate_statuses(&self) -> Result<Vec<RateStatus>> {
        sqlx::query(&self.ctx.store.sql.status_rates)
            .fetch_all(self.ctx.db())
            .await?
            .iter()
            .map(|r| {
                Ok(RateStatus {
                    key: r.try_get(0)?,
                    tat: r.try_get(1)?,
                })
            })
            .collect()
    }

    /// Keys with parked rows (see `sql/queries/status_parked.sql`).
    pub(crate) async fn parked(&self) -> Result<Vec<ParkedKey>> {
        sqlx::query(&self.ctx.store.sql.status_parked)
            .fetch_all(self.ctx.db())
            .await?
            .iter()
            .map(|r| {
                Ok(ParkedKey {
                    key: r.try_get(0)?,
                    waits_for: match r.try_get::<&str, _>(1)? {
                        "key" => Parked::Key,
                        _ => Parked::Rate,
                    },
                    rows: r.try_get(2)?,
                    heads: r.try_get(3)?,
                })
            })
            .collect()
    }
}

/// Workflow names from a recorded `workflows` value: an array of names or an
/// object keyed by them.
fn workflow_names(v: serde_json::Value) -> Vec<String> {
    match v {
        serde_json::Value::Array(a) => a
            .into_iter()
            .filter_map(|w| w.as_str().map(str::to_owned))
            .collect(),
        serde_json::Value::Object(o) => o.into_iter().map(|(k, _)| k).collect(),
        _ => Vec::new(),
    }
}
