//! The statements of a node's background work: heartbeats, the stager, the
//! reaper, unparking, the gate reconciler and pruning. Each is bounded per
//! call; the loops that run them are in `node/`.

use super::{Limits, Store};
use crate::error::Result;
use chrono::{DateTime, Utc};
use sqlx::Row;

/// A node's heartbeat: who it is and what it serves.
pub(crate) struct Beat<'a> {
    pub node_id: &'a str,
    pub hostname: &'a str,
    pub queues: serde_json::Value,
    pub workflows: serde_json::Value,
    /// Nodes that heartbeated within this many seconds count as alive.
    pub lease: f64,
}

/// What one rate sweep call did (`sql/functions/rate_sweep.sql`). A call
/// that found another node sweeping did nothing and says so as all empty.
#[derive(Debug)]
pub(crate) struct RateSwept {
    pub unparked: u64,
    /// The last key swept (None: the sweep's end).
    pub last_key: Option<String>,
    /// Seconds until a limit swept allows a start beyond the rows waiting
    /// (None: not before a claim).
    pub next_in: Option<f64>,
    /// Queues with rows unparked that the calling node is to pick itself.
    pub own_woken: Vec<String>,
}

impl Store {
    /// Records a heartbeat on `exec`. Returns how many other nodes are alive
    /// and how many seconds ago this node's previous heartbeat was recorded
    /// (None: it had none, or its row was deleted as dead).
    pub async fn heartbeat<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        beat: &Beat<'_>,
    ) -> Result<(i64, Option<f64>)> {
        let row = sqlx::query(&self.sql.heartbeat)
            .bind(beat.node_id)
            .bind(beat.hostname)
            .bind(std::process::id() as i32)
            .bind(&beat.queues)
            .bind(beat.lease)
            .bind(&beat.workflows)
            .fetch_one(exec)
            .await?;
        Ok((row.try_get(0)?, row.try_get(1)?))
    }

    /// A stopping node's row goes, and the rows it reserved go back.
    pub async fn forget_node<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        node_id: &str,
    ) -> Result<()> {
        sqlx::query(&self.sql.forget_node)
            .bind(node_id)
            .execute(exec)
            .await?;
        Ok(())
    }

    /// Up to `batch` due scheduled rows and timed-out awaits made runnable.
    pub async fn stage<'e>(&self, exec: impl sqlx::PgExecutor<'e>, batch: i64) -> Result<u64> {
        let row = sqlx::query(&self.sql.stage)
            .bind(batch)
            .bind(&self.sql.channel)
            .fetch_one(exec)
            .await?;
        Ok(row.try_get::<i64, _>(0)? as u64)
    }

    /// Rescues the rows of nodes silent for `lease` seconds (or, with `own`,
    /// every row that node id holds). Returns how many.
    pub async fn reap<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        lease: f64,
        own: Option<&str>,
    ) -> Result<u64> {
        let row = sqlx::query(&self.sql.reap)
            .bind(lease)
            .bind(&self.sql.channel)
            .bind(own)
            .fetch_one(exec)
            .await?;
        Ok(row.try_get::<i64, _>(0)? as u64)
    }

    /// Forgets nodes silent for `secs` seconds that hold no executing row.
    pub async fn forget_dead_nodes<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        secs: f64,
    ) -> Result<()> {
        sqlx::query(&self.sql.forget_dead_nodes)
            .bind(secs)
            .execute(exec)
            .await?;
        Ok(())
    }

    /// One bounded pass over keys with parked rows
    /// (`sql/functions/unpark_sweep.sql`). Returns the rows unparked and the
    /// last key swept (None: the sweep's end).
    pub async fn unpark_sweep<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        after: Option<&str>,
        batch: i32,
        limits: &Limits,
    ) -> Result<(u64, Option<String>)> {
        let row = sqlx::query(&self.sql.unpark_sweep)
            .bind(after)
            .bind(batch)
            .bind(&self.sql.channel)
            .bind(&limits.gate_names)
            .bind(&limits.gate_limits)
            .fetch_one(exec)
            .await?;
        Ok((row.try_get::<i32, _>(0)? as u64, row.try_get(1)?))
    }

    /// One bounded pass over rate-limited parked rows
    /// (`sql/functions/rate_sweep.sql`), by a node with `own` free claim
    /// slots per queue: queues whose unparked rows fit there are left to
    /// it, others are woken for every node. With another sweep under way,
    /// it waits for its turn (`wait_turn`) or does nothing.
    pub async fn rate_sweep<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        after: Option<&str>,
        batch: i32,
        limits: &Limits,
        own: &[(&str, i32)],
        wait_turn: bool,
    ) -> Result<RateSwept> {
        let (queues, room): (Vec<&str>, Vec<i32>) = own.iter().copied().unzip();
        let row = sqlx::query(&self.sql.rate_sweep)
            .bind(after)
            .bind(batch)
            .bind(&self.sql.channel)
            .bind(&limits.rate_names)
            .bind(&limits.rate_intervals)
            .bind(&limits.rate_tolerances)
            .bind(&queues)
            .bind(&room)
            .bind(wait_turn)
            .fetch_one(exec)
            .await?;
        Ok(RateSwept {
            unparked: row.try_get::<i32, _>(0)? as u64,
            last_key: row.try_get(1)?,
            next_in: row.try_get(2)?,
            own_woken: row.try_get(3)?,
        })
    }

    /// Parks rows of workflows no live node runs among the first `batch`
    /// rows of `queue`. Returns how many.
    pub async fn park_orphans<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        queue: &str,
        lease: f64,
        batch: i32,
    ) -> Result<u64> {
        let n: i32 = sqlx::query_scalar(&self.sql.park_orphans)
            .bind(queue)
            .bind(lease)
            .bind(batch)
            .fetch_one(exec)
            .await?;
        Ok(n as u64)
    }

    /// Unparks up to `batch` rows of each of `workflows` in each of `queues`.
    pub async fn unpark_workflows<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        queues: &[&String],
        workflows: &[String],
        batch: i32,
    ) -> Result<u64> {
        let n: i32 = sqlx::query_scalar(&self.sql.unpark_workflows)
            .bind(queues)
            .bind(workflows)
            .bind(batch)
            .bind(&self.sql.channel)
            .fetch_one(exec)
            .await?;
        Ok(n as u64)
    }

    /// One bounded reconciler pass from the gate key after `after`. Returns
    /// the counters changed and the last key swept (None: the end).
    pub async fn reconcile<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        after: Option<&str>,
        batch: i32,
        limits: &Limits,
    ) -> Result<(u64, Option<String>)> {
        let row = sqlx::query(&self.sql.reconcile)
            .bind(after)
            .bind(batch)
            .bind(&limits.gate_names)
            .bind(&limits.gate_limits)
            .bind(&limits.gate_shards)
            .bind(&self.sql.channel)
            .fetch_one(exec)
            .await?;
        Ok((row.try_get::<i32, _>(0)? as u64, row.try_get(1)?))
    }

    /// Deletes rate-limit state idle for a minute.
    pub async fn prune_rates<'e>(&self, exec: impl sqlx::PgExecutor<'e>) -> Result<()> {
        sqlx::query(&self.sql.prune_rates).execute(exec).await?;
        Ok(())
    }

    /// Deletes up to `batch` rows final for longer than `retention`
    /// seconds, oldest first from `from` on, their kept signals, and expired
    /// signals sent by name; how many, and where the next batch starts.
    pub async fn prune<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        retention: f64,
        batch: i64,
        from: Option<DateTime<Utc>>,
    ) -> Result<(u64, Option<DateTime<Utc>>)> {
        let row = sqlx::query(&self.sql.prune)
            .bind(retention)
            .bind(batch)
            .bind(from)
            .fetch_one(exec)
            .await?;
        let n: i64 = row.try_get(0)?;
        Ok((n as u64, row.try_get(1)?))
    }

    /// Adds a node's step counts to its row of the current minute.
    pub async fn throughput_add<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        node_id: &str,
        started: i64,
        failed: i64,
        completed: i64,
    ) -> Result<()> {
        sqlx::query(&self.sql.throughput_add)
            .bind(node_id)
            .bind(started)
            .bind(failed)
            .bind(completed)
            .execute(exec)
            .await?;
        Ok(())
    }
}
