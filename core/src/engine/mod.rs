//! The engine: the client calls (insert, signal, cancel, get, status), its
//! builder, and starting or stopping this process's worker node.

mod actions;
mod builder;
mod cron;
mod insert;
mod inspect;
mod metrics;
mod status;
mod testing;

pub use actions::{Acted, Filter};
pub use builder::EngineBuilder;
pub use inspect::{
    capture_warnings, Finished, InstancePage, InstanceRow, KeysView, ListQuery, Minute, Overview,
    QueueLoad, Wait,
};
pub use status::{
    ClusterStatus, GateStatus, KeyLimit, NoNode, NodeStatus, Parked, ParkedKey, QueueCount,
    RateStatus, WaitingRows,
};
pub use testing::{DrainOptions, Drained, InsertedQuery, DRAIN_MAX_STEPS};

use crate::config::EngineConfig;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::instance::{Instance, NewInstance, Status};
use crate::node::{self, maintenance, Node};
use crate::stats::Stats;
use crate::store;
use crate::unique::Inserted;
use crate::validate;
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;
use tokio::sync::Mutex;
use tracing::Instrument;

/// A handle on the engine: cheap to clone, usable from many tasks.
#[derive(Clone)]
pub struct Engine {
    pub(crate) ctx: Arc<Context>,
    /// This process's worker node, once started.
    node: Arc<Mutex<Option<Node>>>,
    /// Its cron service, when schedules are configured.
    cron: Arc<Mutex<Option<cron::Cron>>>,
    /// Its metrics listener, when configured.
    metrics: Arc<Mutex<Option<metrics::MetricsListener>>>,
    /// The running node's state, for inserts that start rows here.
    here: Arc<StdMutex<Weak<node::Shared>>>,
}

impl Engine {
    /// The pool the engine uses, for everything but the claim path's own
    /// connections (see [`EngineBuilder::max_connections`]). A pool the
    /// engine opened itself plans prepared statements generically and
    /// without JIT (see [`EngineBuilder::pool`]).
    pub fn pool(&self) -> &PgPool {
        &self.ctx.store.pool
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.ctx.cfg
    }

    /// Where the metrics listener listens, while the node runs with one.
    pub async fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.lock().await.as_ref().map(|m| m.addr)
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.ctx.cfg.node_id
    }

    /// Counters of what this engine did (picks, claims, outcomes, ...).
    pub fn stats(&self) -> &Stats {
        &self.ctx.stats
    }

    /// Run the migrations (also done by `build` unless disabled).
    pub async fn migrate(&self) -> Result<()> {
        store::migrate(&self.ctx.store.pool, &self.ctx.cfg.schema).await
    }

    /// Start this process's worker node: heartbeat, pickers for every queue,
    /// the reaper, the stager and the gate reconciler. Idempotent.
    pub async fn start(&self) -> Result<()> {
        let mut node = self.node.lock().await;
        if node.is_none() {
            // First the listener: an address in use fails the start early.
            if let Some(addr) = self.ctx.cfg.metrics_listen {
                *self.metrics.lock().await =
                    Some(metrics::MetricsListener::start(self.clone(), addr).await?);
            }
            let started = Node::start(self.ctx.clone()).await?;
            *self.here.lock().unwrap_or_else(|p| p.into_inner()) = Arc::downgrade(started.shared());
            *node = Some(started);
            *self.cron.lock().await = cron::Cron::start(self.ctx.clone())?;
        }
        Ok(())
    }

    /// Stop picking, let running steps finish within the shutdown timeout
    /// (steps still running then are aborted and recorded as errors), write
    /// every outcome and hand back rows that never started.
    pub async fn shutdown(&self) -> Result<()> {
        if let Some(cron) = self.cron.lock().await.take() {
            cron.stop().await;
        }
        if let Some(m) = self.metrics.lock().await.take() {
            m.stop().await;
        }
        let node = self.node.lock().await.take();
        match node {
            Some(node) => node.stop().await,
            None => Ok(()),
        }
    }

    /// One reaper pass now: rows executing on nodes whose heartbeat is older
    /// than the lease become runnable again. Returns how many were rescued.
    /// Running nodes do this on their own every heartbeat interval.
    pub async fn reap_now(&self) -> Result<u64> {
        maintenance::reap(&self.ctx, &mut self.ctx.pass(), None).await
    }

    /// One gate reconciler sweep now: counters are reset from the executing
    /// rows and idle keys' counters deleted. Returns the counters changed.
    /// Running nodes do this on their own every GC interval.
    pub async fn reconcile_gates_now(&self) -> Result<u64> {
        maintenance::reconcile_gates(&self.ctx).await
    }

    /// Delete finished instances older than the retention now. Returns how
    /// many. Running nodes do this on their own once a minute.
    pub async fn prune_now(&self) -> Result<u64> {
        maintenance::prune(&self.ctx).await
    }

    /// Insert one instance; returns its id (for a unique insert that met a
    /// duplicate, the existing instance's: see [`Engine::insert_unique`]).
    pub async fn insert(&self, new: NewInstance) -> Result<i64> {
        Ok(self.insert_unique(new).await?.id)
    }

    /// Insert many instances in one round trip; returns their ids in order.
    /// Either all are inserted or none.
    ///
    /// When this process runs a node serving the queue with running slots
    /// idle and nothing left to pick there, rows due now without a
    /// concurrency key, rate limit or unique identity are claimed by the
    /// insert itself and start here at once, without a wake-up and a pick.
    pub async fn insert_many(&self, news: Vec<NewInstance>) -> Result<Vec<i64>> {
        Ok(ids(self.insert_many_unique(news).await?))
    }

    /// [`Engine::insert`], saying whether a unique insert or idempotency key
    /// met an existing instance (`conflict`: then `id` is that instance's
    /// and nothing was inserted).
    pub async fn insert_unique(&self, new: NewInstance) -> Result<Inserted> {
        let mut all = self.insert_many_unique(vec![new]).await?;
        all.pop()
            .ok_or_else(|| Error::Contended("the insert returned no row".into()))
    }

    /// [`Engine::insert_many`], saying for each instance whether it was a
    /// duplicate. Duplicates within the batch count too: the first is
    /// inserted, the later ones report it.
    pub async fn insert_many_unique(&self, news: Vec<NewInstance>) -> Result<Vec<Inserted>> {
        if news.is_empty() {
            return Ok(Vec::new());
        }
        let span = tracing::info_span!("gendurable.insert", rows = news.len());
        self.insert_news(news).instrument(span).await
    }

    async fn insert_news(&self, news: Vec<NewInstance>) -> Result<Vec<Inserted>> {
        let rows = insert::Rows::new(&self.ctx, news)?;
        if self.ctx.cfg.inline {
            let queues = rows.queues();
            let inserted = self.insert_rows(rows).await?;
            self.run_inline(queues).await?;
            return Ok(inserted);
        }
        self.insert_rows(rows).await
    }

    /// On one connection, given up after `call_timeout` unanswered.
    async fn insert_rows(&self, rows: insert::Rows) -> Result<Vec<Inserted>> {
        let ctx = &*self.ctx;
        if rows.wants_copy() {
            let ids = ctx
                .calls()
                .call(async |c| insert::copy(ctx, c, rows).await)
                .await?;
            return Ok(ids
                .into_iter()
                .map(|id| Inserted {
                    id,
                    conflict: false,
                })
                .collect());
        }
        if rows.any_unique() {
            // A transaction: the lookups and retries after the statement
            // must not leave its rows behind if they fail.
            return ctx
                .calls()
                .call(async |c| {
                    let mut tx = sqlx::Connection::begin(c).await?;
                    let inserted = insert::insert_unique(ctx, &mut tx, rows, None).await?;
                    tx.commit().await?;
                    Ok(inserted)
                })
                .await;
        }
        let here = self
            .here
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .upgrade();
        ctx.calls()
            .call(async |c| insert::insert_unique(ctx, c, rows, here.as_ref()).await)
            .await
    }

    /// Insert inside the caller's own transaction or connection:
    /// `engine.insert_many_in(&mut tx, news)`. The instances become visible,
    /// and wake the pickers, when that transaction commits.
    pub async fn insert_many_in(
        &self,
        conn: &mut PgConnection,
        news: Vec<NewInstance>,
    ) -> Result<Vec<i64>> {
        Ok(ids(self.insert_many_unique_in(conn, news).await?))
    }

    /// [`Engine::insert_many_in`], saying for each instance whether it was a
    /// duplicate (see [`Engine::insert_many_unique`]).
    pub async fn insert_many_unique_in(
        &self,
        conn: &mut PgConnection,
        news: Vec<NewInstance>,
    ) -> Result<Vec<Inserted>> {
        if news.is_empty() {
            return Ok(Vec::new());
        }
        let rows = insert::Rows::new(&self.ctx, news)?;
        insert::insert_unique(&self.ctx, conn, rows, None).await
    }

    /// Read an instance back.
    pub async fn get(&self, id: i64) -> Result<Instance> {
        let row = sqlx::query(&self.ctx.store.sql.get)
            .bind(id)
            .fetch_optional(self.ctx.db())
            .await?;
        match row {
            Some(row) => instance_from_row(&row),
            None => Err(Error::NotFound(id)),
        }
    }

    /// Wake every instance awaiting signal `name`; the woken steps see
    /// `payload`. Returns how many were woken. A signal sent while nothing
    /// awaits it is not kept (see [`Engine::signal_with_ttl`]).
    pub async fn signal(&self, name: &str, payload: Value) -> Result<u64> {
        self.send_signal(name, payload, None).await
    }

    /// [`Engine::signal`]; when it wakes nobody, the signal is kept for `ttl`
    /// and delivered to the first instance that awaits `name` meanwhile
    /// (once). Returns how many were woken now.
    pub async fn signal_with_ttl(&self, name: &str, payload: Value, ttl: Duration) -> Result<u64> {
        if ttl.is_zero() {
            return Err(Error::input("ttl", "must be longer than zero"));
        }
        self.send_signal(name, payload, Some(ttl)).await
    }

    async fn send_signal(&self, name: &str, payload: Value, ttl: Option<Duration>) -> Result<u64> {
        validate::name("signal", name)?;
        validate::payload("payload", &payload)?;
        let row = sqlx::query(&self.ctx.store.sql.signal)
            .bind(name)
            .bind(payload)
            .bind(ttl.map(|t| t.as_secs_f64()))
            .bind(&self.ctx.store.sql.channel)
            .fetch_one(self.ctx.db())
            .await?;
        Ok(row.try_get::<i32, _>("woken")? as u64)
    }

    /// Send signal `name` to one instance: it wakes now if it awaits
    /// (whatever it awaits); otherwise it is kept, in order with the
    /// instance's other kept signals, until the instance awaits `name`,
    /// which then wakes at once with it. Delivered once. A finished
    /// instance gets nothing.
    pub async fn send(&self, id: i64, name: &str, payload: Value) -> Result<Delivery> {
        validate::name("signal", name)?;
        validate::payload("payload", &payload)?;
        let row = sqlx::query(&self.ctx.store.sql.signal_instance)
            .bind(name)
            .bind(payload)
            .bind(id)
            .bind(&self.ctx.store.sql.channel)
            .fetch_optional(self.ctx.db())
            .await?;
        let Some(row) = row else {
            return Err(Error::NotFound(id));
        };
        let status = Status::parse(row.try_get::<&str, _>("status")?);
        Ok(match status {
            Status::Awaiting => Delivery::Woken,
            s if s.is_final() => Delivery::Finished(s),
            _ => Delivery::Kept,
        })
    }

    /// [`Engine::send`], saying only whether the instance was woken now.
    pub async fn signal_instance(&self, id: i64, name: &str, payload: Value) -> Result<bool> {
        match self.send(id, name, payload).await {
            Ok(d) => Ok(d == Delivery::Woken),
            Err(Error::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Cancel an instance. One that is not executing is cancelled at once.
    /// An executing one is cancelled when its step's outcome is written; the
    /// node running it is told and stops the step (an async step at its next
    /// `.await`), so that outcome comes at once. A node that misses the word
    /// (its LISTEN connection down) lets the step finish.
    pub async fn cancel(&self, id: i64) -> Result<Cancelled> {
        self.cancel_with_reason(id, "cancelled").await
    }

    /// [`Engine::cancel`] with a reason recorded in the instance's errors.
    pub async fn cancel_with_reason(&self, id: i64, reason: &str) -> Result<Cancelled> {
        let Some(status) = self.cancel_one(id, reason).await? else {
            return Err(Error::NotFound(id));
        };
        Ok(match status {
            Status::Executing => Cancelled::AtOutcome,
            s if s.is_final() => Cancelled::AlreadyFinished(s),
            _ => Cancelled::Now,
        })
    }
}

fn ids(inserted: Vec<Inserted>) -> Vec<i64> {
    inserted.into_iter().map(|i| i.id).collect()
}

/// What [`Engine::send`] did with a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The instance was awaiting: it is woken with the signal.
    Woken,
    /// Kept until the instance awaits it.
    Kept,
    /// The instance had finished, with this status: nothing was kept.
    Finished(Status),
}

/// What [`Engine::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// It was not executing and is now cancelled.
    Now,
    /// It is executing; its outcome will record it as cancelled.
    AtOutcome,
    /// It had already finished, with this status; nothing changed.
    AlreadyFinished(Status),
}

pub(crate) fn instance_from_row(r: &PgRow) -> Result<Instance> {
    let errors: Value = r.try_get("errors")?;
    Ok(Instance {
        id: r.try_get("id")?,
        workflow: r.try_get("workflow")?,
        step: r.try_get("step")?,
        state: r.try_get("state")?,
        queue: r.try_get("queue")?,
        priority: r.try_get("priority")?,
        status: Status::parse(r.try_get::<&str, _>("status")?),
        concurrency_key: r.try_get("concurrency_key")?,
        rate_limit: r.try_get("rate_key")?,
        attempt: r.try_get("attempt")?,
        max_attempts: r.try_get("max_attempts")?,
        node: r.try_get("node")?,
        cancel_requested: r.try_get("cancel_requested")?,
        await_signal: r.try_get("await_signal")?,
        await_until: r.try_get("await_until")?,
        errors: match errors {
            Value::Array(a) => a,
            _ => Vec::new(),
        },
        inserted_at: r.try_get("inserted_at")?,
        scheduled_at: r.try_get("scheduled_at")?,
        attempted_at: r.try_get("attempted_at")?,
        finished_at: r.try_get("finished_at")?,
    })
}
