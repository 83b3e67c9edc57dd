//! Introspection: what the cluster is doing right now, for `gendurable status`
//! and monitoring.

use crate::engine::Engine;
use crate::error::Result;
use chrono::{DateTime, Utc};
use sqlx::Row;

/// A snapshot of the cluster as seen from the database.
#[derive(Debug, Clone, Default)]
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
}

/// How many instances of a queue are in a status.
#[derive(Debug, Clone)]
pub struct QueueCount {
    pub queue: String,
    pub status: String,
    pub count: i64,
}

/// A live node.
#[derive(Debug, Clone)]
pub struct NodeStatus {
    pub id: String,
    pub hostname: String,
    pub pid: i32,
    pub queues: serde_json::Value,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    /// Rows it is executing.
    pub executing: i64,
}

/// One gated key: its counters summed over shards.
#[derive(Debug, Clone)]
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

/// One rate-limit key.
#[derive(Debug, Clone)]
pub struct RateStatus {
    pub key: String,
    /// The GCRA theoretical arrival time: starts are spaced from here on.
    pub tat: DateTime<Utc>,
}

/// The effective K of a concurrency key on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
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
        match self.inner.cfg.gate_for(key) {
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

    /// Read the cluster's state: counts, live nodes, gates, executing K = 1
    /// keys and rate-limit state.
    pub async fn status(&self) -> Result<ClusterStatus> {
        let s = format!("\"{}\"", self.inner.cfg.schema);
        let pool = &self.inner.pool;
        let lease = self.inner.cfg.lease.as_secs_f64();
        let counts = sqlx::query(&format!(
            "SELECT queue, status, count(*) FROM {s}.instances GROUP BY 1, 2 ORDER BY 1, 2"
        ))
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
        let nodes = sqlx::query(&format!(
            "SELECT n.id, n.hostname, n.pid, n.queues, n.started_at, n.heartbeat_at,
                    (SELECT count(*) FROM {s}.instances i WHERE i.status = 'executing' AND i.node = n.id)
             FROM {s}.nodes n WHERE n.heartbeat_at > now() - make_interval(secs => $1)
             ORDER BY n.id"
        ))
        .bind(lease)
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
            })
        })
        .collect::<Result<_>>()?;
        let gates = sqlx::query(&format!(
            "SELECT g.key,
                    (SELECT count(*) FROM {s}.instances i
                     WHERE i.status = 'executing' AND i.concurrency_key = g.key AND i.gate_shard IS NOT NULL),
                    sum(g.capacity)::bigint, sum(g.available)::bigint, count(*)
             FROM {s}.gate_slots g GROUP BY g.key ORDER BY g.key"
        ))
        .fetch_all(pool)
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
        .collect::<Result<_>>()?;
        let executing_keys = sqlx::query_scalar(&format!(
            "SELECT concurrency_key FROM {s}.instances
             WHERE status = 'executing' AND concurrency_key IS NOT NULL AND gate_shard IS NULL
             ORDER BY attempted_at LIMIT 100"
        ))
        .fetch_all(pool)
        .await?;
        let rates = sqlx::query(&format!(
            "SELECT key, tat FROM {s}.rate_state ORDER BY key LIMIT 1000"
        ))
        .fetch_all(pool)
        .await?
        .iter()
        .map(|r| {
            Ok(RateStatus {
                key: r.try_get(0)?,
                tat: r.try_get(1)?,
            })
        })
        .collect::<Result<_>>()?;
        Ok(ClusterStatus {
            counts,
            nodes,
            gates,
            executing_keys,
            rates,
        })
    }
}
