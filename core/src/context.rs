//! What an engine and its worker node share.

use crate::config::EngineConfig;
use crate::stats::Stats;
use crate::store::{Limited, Limits, Pass, Store};
use crate::workflow::Workflow;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The database, the configuration, the registered workflows and the
/// counters: built once by [`crate::EngineBuilder::build`].
pub(crate) struct Context {
    pub store: Store,
    pub cfg: EngineConfig,
    pub workflows: HashMap<String, Arc<dyn Workflow>>,
    /// The workflows and the configured gates and rate limits, as the SQL
    /// functions take them.
    pub limits: Limits,
    pub stats: Stats,
    /// Whether other nodes were alive at the last heartbeat: outcomes that free
    /// keys or slots only notify when someone else may be waiting for them.
    pub others_alive: AtomicBool,
}

impl Context {
    pub fn new(
        store: Store,
        cfg: EngineConfig,
        workflows: HashMap<String, Arc<dyn Workflow>>,
    ) -> Context {
        Context {
            limits: Limits::new(&cfg, workflows.keys()),
            store,
            cfg,
            workflows,
            stats: Stats::default(),
            others_alive: AtomicBool::new(true),
        }
    }

    /// The engine's pool for the application's calls, each statement given
    /// up after `call_timeout` unanswered (see [`Limited`]).
    pub fn db(&self) -> Limited<'_> {
        Limited {
            pool: &self.store.pool,
            limit: self.cfg.call_timeout,
        }
    }

    /// A pass of the application's calls on one connection, each given up
    /// after `call_timeout` unanswered (for transactions).
    pub fn calls(&self) -> Pass<'_> {
        Pass::new(&self.store.pool, self.cfg.call_timeout)
    }

    /// A pass of background calls on the engine's pool, each given up after
    /// a lease unanswered (see [`Pass`]).
    pub fn pass(&self) -> Pass<'_> {
        Pass::new(&self.store.pool, self.cfg.lease)
    }
}
