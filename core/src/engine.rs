//! The engine: configuration, the client calls (insert, signal, cancel, get)
//! and starting or stopping this process's worker node.

use crate::config::{EngineConfig, GateConfig, RateConfig};
use crate::error::{Error, Result};
use crate::insert;
use crate::instance::{Instance, NewInstance, Status};
use crate::node::{self, Node};
use crate::outcome::check_rate_key;
use crate::stats::Stats;
use crate::store::{self, Sql};
use crate::validate;
use crate::workflow::{FnWorkflow, StepContext, StepResult, WithStepRates, Workflow};
use serde_json::Value;
use sqlx::postgres::{PgPoolOptions, PgRow};

/// How long a pooled connection may sit idle before it is pinged on acquire.
const IDLE_CHECK: std::time::Duration = std::time::Duration::from_secs(1);
use sqlx::{PgPool, Postgres, Row};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// A handle on the engine: cheap to clone, usable from many tasks.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub pool: PgPool,
    pub cfg: EngineConfig,
    pub sql: Sql,
    pub workflows: HashMap<String, Arc<dyn Workflow>>,
    pub stats: Stats,
    /// Whether other nodes were alive at the last heartbeat: outcomes that free
    /// keys or slots only notify when someone else may be waiting for them.
    pub others_alive: std::sync::atomic::AtomicBool,
    node: Mutex<Option<Node>>,
    /// The running node's shared state, for inserts that start rows here.
    pub here: std::sync::Mutex<std::sync::Weak<node::Shared>>,
}

enum Connect {
    Url(String),
    Pool(PgPool),
}

/// Builds an [`Engine`]: `Engine::builder().url(..).queue("default", 10).workflow(..).build()`.
pub struct EngineBuilder {
    connect: Option<Connect>,
    cfg: EngineConfig,
    workflows: HashMap<String, Arc<dyn Workflow>>,
    step_rates: HashMap<String, HashMap<String, String>>,
    duplicate: Option<String>,
    migrate: bool,
    max_connections: Option<u32>,
    connect_timeout: Duration,
}

impl Engine {
    /// Start configuring an engine.
    pub fn builder() -> EngineBuilder {
        EngineBuilder {
            connect: None,
            cfg: EngineConfig::default(),
            workflows: HashMap::new(),
            step_rates: HashMap::new(),
            duplicate: None,
            migrate: true,
            max_connections: None,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

impl EngineBuilder {
    /// Connect to this database URL.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.connect = Some(Connect::Url(url.into()));
        self
    }

    /// Use an existing pool. Its connections keep their settings: the
    /// engine's own pool turns JIT off (`options([("jit", "off")])` on the
    /// connect options), which on large tables spares its statements tens of
    /// milliseconds of compiling; consider the same for this one.
    pub fn pool(mut self, pool: PgPool) -> Self {
        self.connect = Some(Connect::Pool(pool));
        self
    }

    /// Connections of the pool the engine opens from a URL (default: 2 per
    /// queue slot, at least 10).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = Some(n);
        self
    }

    /// How long a call waits for a database connection before failing
    /// (default 10 s; a pool passed with [`EngineBuilder::pool`] keeps its own).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// The schema holding the engine's tables (default `gendurable`).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.cfg.schema = schema.into();
        self
    }

    /// This node's id (default: host, pid and a random suffix).
    pub fn node_id(mut self, id: impl Into<String>) -> Self {
        self.cfg.node_id = id.into();
        self
    }

    /// Run steps of `queue`, at most `concurrency` at once on this node.
    pub fn queue(mut self, queue: impl Into<String>, concurrency: u32) -> Self {
        self.cfg.queues.insert(queue.into(), concurrency);
        self
    }

    /// The most rows each queue claims ahead of its free slots (default: 100
    /// times the queue's concurrency). Within that cap a queue claims about
    /// as many rows as it starts in 50 ms, so fast steps are claimed and
    /// recorded in large batches while slow ones claim almost nothing ahead.
    /// A claimed row waits on this node for a slot to run in; it counts as
    /// executing from its claim and holds its concurrency key or gate slot.
    /// `0` claims only for free slots.
    pub fn prefetch(mut self, rows: u32) -> Self {
        self.cfg.prefetch = Some(rows);
        self
    }

    /// Register a workflow under `name`.
    pub fn workflow(mut self, name: impl Into<String>, workflow: impl Workflow) -> Self {
        let name = name.into();
        if self
            .workflows
            .insert(name.clone(), Arc::new(workflow))
            .is_some()
        {
            self.duplicate = Some(name);
        }
        self
    }

    /// Register a workflow written as a closure `|step, state, ctx| async move { .. }`.
    pub fn workflow_fn<F, Fut>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(String, Value, StepContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = StepResult> + Send + 'static,
    {
        self.workflow(name, FnWorkflow::new(f))
    }

    /// Declare a rate-limit key for a step of a registered workflow: used
    /// whenever an instance moves to (or is inserted at) that step without an
    /// explicit one, unless [`Workflow::rate_limit`] answers first.
    pub fn step_rate_limit(
        mut self,
        workflow: impl Into<String>,
        step: impl Into<String>,
        key: impl Into<String>,
    ) -> Self {
        self.step_rates
            .entry(workflow.into())
            .or_default()
            .insert(step.into(), key.into());
        self
    }

    /// Gate every key named `name` (`name:*`) to `limit` executing at once.
    pub fn concurrency_limit(mut self, name: impl Into<String>, gate: GateConfig) -> Self {
        let name = name.into();
        if self.cfg.gates.insert(name.clone(), gate).is_some() {
            self.duplicate = Some(format!("concurrency_limits {name}"));
        }
        self
    }

    /// Rate-limit steps carrying a rate-limit key named `name`.
    pub fn rate_limit(mut self, name: impl Into<String>, rate: RateConfig) -> Self {
        let name = name.into();
        if self.cfg.rates.insert(name.clone(), rate).is_some() {
            self.duplicate = Some(format!("rate_limits {name}"));
        }
        self
    }

    /// How often this node proves it is alive (default 5 s).
    pub fn heartbeat_interval(mut self, d: Duration) -> Self {
        self.cfg.heartbeat_interval = d;
        self
    }

    /// How stale a heartbeat may be before the node's executing rows are
    /// rescued (default 20 s; rescue happens within lease + heartbeat interval).
    pub fn lease(mut self, d: Duration) -> Self {
        self.cfg.lease = d;
        self
    }

    /// Fallback polling interval, also the stager's cadence (default 1 s).
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.cfg.poll_interval = d;
        self
    }

    /// How often gate counters are reconciled (default 10 s).
    pub fn gc_interval(mut self, d: Duration) -> Self {
        self.cfg.gc_interval = d;
        self
    }

    /// How long shutdown waits for running steps (default 15 s).
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.cfg.shutdown_timeout = d;
        self
    }

    /// Delete finished instances older than this (default 7 days; `None` keeps them).
    pub fn retention(mut self, d: Option<Duration>) -> Self {
        self.cfg.retention = d;
        self
    }

    /// Retry backoff: `base × 2^(attempt−1)` up to `max`, with jitter (default 1 s, 1 h).
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.cfg.backoff_base = base;
        self.cfg.backoff_max = max;
        self
    }

    /// Run the migrations when building (default true).
    pub fn migrate(mut self, yes: bool) -> Self {
        self.migrate = yes;
        self
    }

    /// Check the configuration without connecting: what [`EngineBuilder::build`]
    /// checks first.
    pub fn validate(&self) -> Result<()> {
        if let Some(d) = &self.duplicate {
            return Err(Error::config(format!("{d} is configured twice")));
        }
        self.cfg.validate()?;
        for name in self.workflows.keys() {
            validate::name("workflow", name).map_err(|e| Error::config(e.to_string()))?;
        }
        for (name, steps) in &self.step_rates {
            if !self.workflows.contains_key(name) {
                return Err(Error::config(format!(
                    "step_rate_limit: no workflow named {name:?} is registered"
                )));
            }
            for (step, key) in steps {
                check_rate_key(&self.cfg, key).map_err(|e| {
                    Error::config(format!("step_rate_limit {name:?}/{step:?}: {e}"))
                })?;
            }
        }
        if self.connect.is_none() {
            return Err(Error::config(
                "no database: give the builder a url or a pool",
            ));
        }
        Ok(())
    }

    /// Validate, connect and migrate. The node starts with [`Engine::start`].
    pub async fn build(self) -> Result<Engine> {
        self.validate()?;
        let mut workflows = self.workflows;
        for (name, steps) in self.step_rates {
            let inner = workflows.remove(&name).expect("validated");
            workflows.insert(name, Arc::new(WithStepRates { inner, steps }));
        }
        let pool = match self.connect {
            Some(Connect::Pool(pool)) => pool,
            Some(Connect::Url(url)) => {
                let slots: u32 = self.cfg.queues.values().sum();
                PgPoolOptions::new()
                    .max_connections(self.max_connections.unwrap_or((slots * 2).max(10)))
                    .acquire_timeout(self.connect_timeout)
                    // sqlx pings every connection it hands out: a round trip
                    // per statement on the claim path. Only connections idle
                    // for a while are checked; a busy one fails on its own
                    // statement, which the engine retries like any dropped
                    // connection.
                    .test_before_acquire(false)
                    .before_acquire(|conn, meta| {
                        Box::pin(async move {
                            if meta.idle_for >= IDLE_CHECK {
                                sqlx::Connection::ping(conn).await?;
                            }
                            Ok(true)
                        })
                    })
                    .connect_lazy_with(connect_options(&url)?)
            }
            None => unreachable!("validated"),
        };
        if self.migrate {
            store::migrate(&pool, &self.cfg.schema).await?;
        }
        Ok(Engine {
            inner: Arc::new(Inner {
                sql: Sql::new(&self.cfg.schema),
                pool,
                cfg: self.cfg,
                workflows,
                stats: Stats::default(),
                others_alive: std::sync::atomic::AtomicBool::new(true),
                node: Mutex::new(None),
                here: Default::default(),
            }),
        })
    }

    /// Build and start the node in one call.
    pub async fn start(self) -> Result<Engine> {
        let engine = self.build().await?;
        engine.start().await?;
        Ok(engine)
    }
}

impl Engine {
    /// The pool the engine uses. A pool the engine opened itself plans prepared
    /// statements generically (`plan_cache_mode = force_generic_plan`): the
    /// pick's plan does not depend on its parameters, and replanning it on
    /// every call would cost more than running it.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.cfg
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.inner.cfg.node_id
    }

    /// Counters of what this engine did (picks, claims, outcomes, ...).
    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    /// Run the migrations (also done by `build` unless disabled).
    pub async fn migrate(&self) -> Result<()> {
        store::migrate(&self.inner.pool, &self.inner.cfg.schema).await
    }

    /// Start this process's worker node: heartbeat, pickers for every queue,
    /// the reaper, the stager and the gate reconciler. Idempotent.
    pub async fn start(&self) -> Result<()> {
        let mut node = self.inner.node.lock().await;
        if node.is_none() {
            *node = Some(Node::start(self.inner.clone()).await?);
        }
        Ok(())
    }

    /// Stop picking, let running steps finish within the shutdown timeout
    /// (steps still running then are aborted and recorded as errors), write
    /// every outcome and hand back rows that never started.
    pub async fn shutdown(&self) -> Result<()> {
        let node = self.inner.node.lock().await.take();
        match node {
            Some(node) => node.stop(&self.inner).await,
            None => Ok(()),
        }
    }

    /// One reaper pass now: rows executing on nodes whose heartbeat is older
    /// than the lease become runnable again. Returns how many were rescued.
    /// Running nodes do this on their own every heartbeat interval.
    pub async fn reap_now(&self) -> Result<u64> {
        crate::node::reap(&self.inner, None).await
    }

    /// One gate reconciler sweep now: counters are reset from the executing
    /// rows and idle keys' counters deleted. Returns the counters changed.
    /// Running nodes do this on their own every GC interval.
    pub async fn reconcile_gates_now(&self) -> Result<u64> {
        crate::node::reconcile_gates(&self.inner).await
    }

    /// Delete finished instances older than the retention now. Returns how
    /// many. Running nodes do this on their own once a minute.
    pub async fn prune_now(&self) -> Result<u64> {
        crate::node::prune(&self.inner).await
    }

    /// Insert one instance; returns its id.
    pub async fn insert(&self, new: NewInstance) -> Result<i64> {
        let ids = self.insert_many(vec![new]).await?;
        Ok(ids[0])
    }

    /// Insert many instances in one round trip; returns their ids in order.
    /// Either all are inserted or none.
    ///
    /// When this process runs a node serving the queue with running slots
    /// idle and nothing left to pick there, rows due now without a
    /// concurrency key or rate limit are claimed by the insert itself and
    /// start here at once, without a wake-up and a pick.
    pub async fn insert_many(&self, news: Vec<NewInstance>) -> Result<Vec<i64>> {
        if news.is_empty() {
            return Ok(Vec::new());
        }
        let rows = insert::Rows::new(&self.inner, news)?;
        if rows.wants_copy() {
            return insert::copy(&self.inner, &self.inner.pool, rows).await;
        }
        let here = self
            .inner
            .here
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .upgrade();
        insert::insert(&self.inner, &self.inner.pool, rows, here.as_ref()).await
    }

    /// Insert inside the caller's own transaction or connection:
    /// `engine.insert_many_in(&mut *tx, news)`. The instances become visible,
    /// and wake the pickers, when that transaction commits.
    pub async fn insert_many_in<'c, E>(
        &self,
        executor: E,
        news: Vec<NewInstance>,
    ) -> Result<Vec<i64>>
    where
        E: sqlx::Executor<'c, Database = Postgres>,
    {
        if news.is_empty() {
            return Ok(Vec::new());
        }
        let rows = insert::Rows::new(&self.inner, news)?;
        insert::insert(&self.inner, executor, rows, None).await
    }

    /// Read an instance back.
    pub async fn get(&self, id: i64) -> Result<Instance> {
        let row = sqlx::query(&self.inner.sql.get)
            .bind(id)
            .fetch_optional(&self.inner.pool)
            .await?;
        match row {
            Some(row) => instance_from_row(&row),
            None => Err(Error::NotFound(id)),
        }
    }

    /// Wake every instance awaiting signal `name`; the woken steps see
    /// `payload`. Returns how many were woken. A signal sent while nothing
    /// awaits it is not kept.
    pub async fn signal(&self, name: &str, payload: Value) -> Result<u64> {
        self.send_signal(name, payload, None).await
    }

    /// Wake one awaiting instance by id, whatever it awaits. Returns whether it
    /// was awaiting.
    pub async fn signal_instance(&self, id: i64, name: &str, payload: Value) -> Result<bool> {
        Ok(self.send_signal(name, payload, Some(id)).await? == 1)
    }

    async fn send_signal(&self, name: &str, payload: Value, id: Option<i64>) -> Result<u64> {
        validate::name("signal", name)?;
        validate::payload("payload", &payload)?;
        let row = sqlx::query(&self.inner.sql.signal)
            .bind(name)
            .bind(payload)
            .bind(id)
            .bind(&self.inner.sql.channel)
            .fetch_one(&self.inner.pool)
            .await?;
        Ok(row.try_get::<i64, _>(0)? as u64)
    }

    /// Cancel an instance. One that is not executing is cancelled at once;
    /// an executing one when its step's outcome is written.
    pub async fn cancel(&self, id: i64) -> Result<Cancelled> {
        self.cancel_with_reason(id, "cancelled").await
    }

    /// [`Engine::cancel`] with a reason recorded in the instance's errors.
    pub async fn cancel_with_reason(&self, id: i64, reason: &str) -> Result<Cancelled> {
        let row = sqlx::query(&self.inner.sql.cancel)
            .bind(id)
            .bind(reason)
            .fetch_optional(&self.inner.pool)
            .await?;
        let Some(row) = row else {
            return Err(Error::NotFound(id));
        };
        let status = Status::parse(row.try_get::<&str, _>(0)?);
        Ok(match status {
            Status::Executing => Cancelled::AtOutcome,
            s if s.is_final() => Cancelled::AlreadyFinished(s),
            _ => Cancelled::Now,
        })
    }
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

/// The options of the engine's own connections. JIT is off: the engine's
/// statements touch a handful of rows through indexes, but on a large table
/// their estimates pass `jit_above_cost`, and compiling takes tens of
/// milliseconds before a statement that takes one. The engine's functions
/// also say `SET jit = off`; this covers the plain statements. A pool handed
/// in with [`EngineBuilder::pool`] keeps its own settings.
fn connect_options(url: &str) -> Result<sqlx::postgres::PgConnectOptions> {
    let opts: sqlx::postgres::PgConnectOptions = url
        .parse()
        .map_err(|e| Error::config(format!("database url: {e}")))?;
    Ok(opts.options([("jit", "off")]))
}
