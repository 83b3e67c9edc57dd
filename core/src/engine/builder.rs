//! [`EngineBuilder`]: an engine's configuration, checked before anything
//! connects, and its connection pool.

use super::Engine;
use crate::config::{EngineConfig, GateConfig, RateConfig};
use crate::context::Context;
use crate::cron::CronEntry;
use crate::error::{Error, Result};
use crate::outcome::check_rate_key;
use crate::store::{self, Store, IDLE_CHECK};
use crate::validate;
use crate::workflow::{
    FnWorkflow, StepContext, StepResult, WithStepRates, Workflow, WorkflowDefaults,
};
use serde_json::Value;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

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
    /// Workflows whose defaults came from [`Workflow::defaults`] (a
    /// `workflow_defaults` call replaces them).
    trait_defaults: HashSet<String>,
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
            trait_defaults: HashSet::new(),
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
    /// engine's own pool turns JIT off, plans prepared statements
    /// generically, starts no parallel workers and runs read committed
    /// transactions (`options([("jit", "off"), ("plan_cache_mode",
    /// "force_generic_plan"), ("max_parallel_workers_per_gather", "0"),
    /// ("default_transaction_isolation", "read\\ committed")])` on the
    /// connect options), which spares its statements tens of milliseconds of
    /// compiling on large tables, a plan per insert and a worker's start-up
    /// per short scan; consider the same for this one. Its commits must be
    /// durable: the engine's own connections raise `synchronous_commit = off`
    /// to `on`, and the engine warns when this pool's is `off`
    /// (docs/operations.md, "Durable commits"). The claim path shares this
    /// pool with everything else (an engine opened from a URL keeps
    /// connections of its own for it: [`EngineBuilder::max_connections`]).
    pub fn pool(mut self, pool: PgPool) -> Self {
        self.connect = Some(Connect::Pool(pool));
        self
    }

    /// Connections the engine opens from a URL (default: 2 per queue slot, at
    /// least 10). Of these, one per queue and two more are the claim path's
    /// own (its pickers' and outcome writer's calls), kept apart so that
    /// other work cannot take them and each has planned the claim path's
    /// statements once; when that would leave fewer than two for the rest,
    /// all are shared.
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

    /// How long a call the application makes (an insert, a read, a signal,
    /// an operator's action, the dashboard's) may wait for the database's
    /// answer to one statement (an insert: to its whole transaction) before
    /// it fails with a timeout, a transient
    /// database error (default 60 s). Its connection is closed: one whose
    /// server went away without closing it (a failover, a dropped NAT
    /// mapping) would otherwise keep the call waiting forever. The statement
    /// may have committed, as after any lost connection. A single insert of
    /// millions of rows may need more. The node's own calls give up after a
    /// lease; migrations and inserts on the caller's connection have no limit.
    pub fn call_timeout(mut self, d: Duration) -> Self {
        self.cfg.call_timeout = d;
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

    /// The most rows each queue claims ahead of its free slots (default: 250
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
        let defaults = workflow.defaults();
        if defaults != WorkflowDefaults::default()
            && !self.cfg.workflow_defaults.contains_key(&name)
        {
            self.cfg.workflow_defaults.insert(name.clone(), defaults);
            self.trait_defaults.insert(name.clone());
        }
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

    /// How long a step of a registered workflow may run before it is
    /// stopped (an async step is cancelled at its next `.await`) and recorded
    /// as an error of kind `timeout`, retried like any error. Wins over the
    /// workflow's [`WorkflowDefaults::timeout`].
    pub fn step_timeout(
        mut self,
        workflow: impl Into<String>,
        step: impl Into<String>,
        timeout: Duration,
    ) -> Self {
        self.cfg
            .step_timeouts
            .entry(workflow.into())
            .or_default()
            .insert(step.into(), timeout);
        self
    }

    /// Serve this engine's metrics (Prometheus text format) on `GET
    /// /metrics` at `addr` while its node runs (`127.0.0.1:9090`; port 0:
    /// any free port, see [`Engine::metrics_addr`]).
    pub fn metrics_listen(mut self, addr: std::net::SocketAddr) -> Self {
        self.cfg.metrics_listen = Some(addr);
        self
    }

    /// Show this bulkhead in the engine's metrics ([`Engine::metrics`]) as
    /// `gendurable_bulkhead_in_flight{name="..."}`, `_limit`, `_waiting`,
    /// `_saturated_total` and `_reclaimed_total`. The application keeps
    /// using it as before; this turns on its count of refusals
    /// ([`Bulkhead::count_saturated`](crate::bulkhead::Bulkhead::count_saturated)).
    pub fn bulkhead(
        mut self,
        name: impl Into<String>,
        bulkhead: Arc<crate::bulkhead::Bulkhead>,
    ) -> Self {
        let name = name.into();
        bulkhead.count_saturated();
        if self.cfg.bulkheads.insert(name.clone(), bulkhead).is_some() {
            self.duplicate = Some(format!("bulkheads {name}"));
        }
        self
    }

    /// For unit tests: every insert through this engine runs the queues it
    /// inserted into to the end, in the calling task, before it returns
    /// ([`Engine::drain`] after each insert). Instances that await stay
    /// awaiting; a step's errors are retried as on a node (their backoff is
    /// waited for only by a later drain with `scheduled`).
    pub fn inline(mut self, inline: bool) -> Self {
        self.cfg.inline = inline;
        self
    }

    /// A periodic workflow: each tick of the entry's schedule inserts its
    /// instance once, cluster-wide (see [`CronEntry`] and docs/cron.md).
    /// Every node that runs the engine with it tries; the database decides.
    pub fn cron(mut self, entry: CronEntry) -> Self {
        self.cfg.cron.push(entry);
        self
    }

    /// Defaults for a registered workflow's instances: their queue, priority
    /// and attempts when an insert does not name them, and the backoff of
    /// its errors (see [`WorkflowDefaults`]).
    pub fn workflow_defaults(
        mut self,
        workflow: impl Into<String>,
        defaults: WorkflowDefaults,
    ) -> Self {
        let workflow = workflow.into();
        if self.cfg.workflow_defaults.contains_key(&workflow)
            && !self.trait_defaults.remove(&workflow)
        {
            self.duplicate = Some(format!("workflow_defaults {workflow}"));
        }
        self.cfg.workflow_defaults.insert(workflow, defaults);
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
        if let Some(name) =
            (self.cfg.workflow_defaults.keys()).find(|n| !self.workflows.contains_key(*n))
        {
            return Err(Error::config(format!(
                "workflow_defaults: no workflow named {name:?} is registered"
            )));
        }
        for (name, steps) in &self.cfg.step_timeouts {
            if !self.workflows.contains_key(name) {
                return Err(Error::config(format!(
                    "step_timeout: no workflow named {name:?} is registered"
                )));
            }
            if let Some((step, _)) = steps.iter().find(|(_, t)| t.is_zero()) {
                return Err(Error::config(format!(
                    "step_timeout {name:?}/{step:?}: must be longer than zero"
                )));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for entry in &self.cfg.cron {
            entry.parse()?;
            if let Some(key) = &entry.instance.rate_limit {
                check_rate_key(&self.cfg, key).map_err(|e| {
                    Error::config(format!("cron {:?}: instance: {e}", entry.entry_name()))
                })?;
            }
            if !names.insert(entry.entry_name()) {
                return Err(Error::config(format!(
                    "cron {:?} is configured twice: give each entry its own name",
                    entry.entry_name()
                )));
            }
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
        let handed = matches!(self.connect, Some(Connect::Pool(_)));
        let (pool, claims, own_claims) = match self.connect {
            Some(Connect::Pool(pool)) => (pool.clone(), pool, false),
            Some(Connect::Url(url)) => {
                let slots: u64 = self.cfg.queues.values().map(|&n| u64::from(n)).sum();
                let default = (slots * 2).clamp(10, u64::from(u32::MAX)) as u32;
                let max = self.max_connections.unwrap_or(default);
                let opts = connect_options(&url)?;
                let pool = |n: u32| engine_pool(n, self.connect_timeout, opts.clone());
                // The claim path's calls get connections of their own (see
                // `Store::claims`), out of the same number, when it leaves
                // the rest at least two.
                let own = crate::node::claim_connections(self.cfg.queues.len());
                if self.cfg.queues.is_empty() || max < own + 2 {
                    let shared = pool(max);
                    (shared.clone(), shared, false)
                } else {
                    (pool(max - own), pool(own), true)
                }
            }
            None => unreachable!("validated"),
        };
        if handed {
            // In the background: a pool that cannot connect yet does not hold
            // `build` up for this.
            tokio::spawn(store::warn_if_commits_may_be_lost(pool.clone()));
        }
        if self.migrate {
            store::migrate(&pool, &self.cfg.schema).await?;
        }
        let store = Store::new(pool, claims, own_claims, &self.cfg.schema);
        Ok(Engine {
            ctx: Arc::new(Context::new(store, self.cfg, workflows)),
            node: Default::default(),
            cron: Default::default(),
            metrics: Default::default(),
            here: Default::default(),
        })
    }

    /// Build and start the node in one call.
    pub async fn start(self) -> Result<Engine> {
        let engine = self.build().await?;
        engine.start().await?;
        Ok(engine)
    }
}

/// A pool the engine opens: connected on first use, its commits durable
/// (`store::raise_synchronous_commit`), a connection idle for a while pinged
/// before it is handed out.
fn engine_pool(max: u32, timeout: Duration, opts: sqlx::postgres::PgConnectOptions) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(timeout)
        // sqlx pings every connection it hands out: a round trip per
        // statement on the claim path. Only connections idle for a while are
        // checked; a busy one fails on its own statement, which the engine
        // retries like any dropped connection.
        .test_before_acquire(false)
        .after_connect(|conn, _| Box::pin(store::raise_synchronous_commit(conn)))
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= IDLE_CHECK {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .connect_lazy_with(opts)
}

/// The options of the engine's own connections. JIT is off: the engine's
/// statements touch a handful of rows through indexes, but on a large table
/// their estimates pass `jit_above_cost`, and compiling takes tens of
/// milliseconds before a statement that takes one. Prepared statements are
/// planned once, generically (`plan_cache_mode = force_generic_plan`): under
/// the default, PostgreSQL plans the insert statement afresh on every call
/// (0.4 to 0.7 ms of planning for 0.2 ms of work), whose plan does not depend
/// on its arrays' contents. No parallel workers: a generic plan that
/// expects one match starts a worker for a scan its LIMIT ends at once (the
/// dashboard's list window: 5 ms of start-up for 0.1 ms of reading, on 10M
/// rows), and the engine's statements are short and many. The engine's
/// functions say the first two themselves; this covers the plain statements.
/// Transactions are read committed, whatever the server's default: the
/// statements are written for it (a row locked meanwhile is skipped or read
/// again as committed), and a serializable default turned picks beside one
/// another into serialization failures, each retried after a backoff.
/// A pool handed in with [`EngineBuilder::pool`] keeps its own settings.
fn connect_options(url: &str) -> Result<sqlx::postgres::PgConnectOptions> {
    let opts: sqlx::postgres::PgConnectOptions = url
        .parse()
        .map_err(|e| Error::config(format!("database url: {e}")))?;
    Ok(opts.options([
        ("jit", "off"),
        ("plan_cache_mode", "force_generic_plan"),
        ("max_parallel_workers_per_gather", "0"),
        // A space in a startup option is escaped with a backslash.
        ("default_transaction_isolation", "read\\ committed"),
    ]))
}
