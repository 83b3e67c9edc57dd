//! gendurable: a durable step engine on PostgreSQL.
//!
//! Instances of workflows are rows; worker nodes claim runnable rows, run the
//! workflow's code for the current step and write the step's transition back
//! in one transaction. Concurrency keys (K-at-a-time per key, cluster-wide),
//! gates and rate limits are enforced by the database in the claim itself.
//! See the crate README and `docs/` for the guarantees.
//!
//! ```
//! use gendurable::{Engine, NewInstance, Transition};
//! use serde_json::json;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let pg = gendurable_testing::TempPostgres::start().await?;
//! # let url = pg.url();
//! # let (ran, mut charged) = tokio::sync::mpsc::unbounded_channel();
//! let engine = Engine::builder()
//!     .url(&url) // e.g. "postgres://localhost/app"
//!     .queue("default", 20)
//!     .workflow_fn("Charge", move |_step, state, _ctx| {
//! #       let _ = ran.send(());
//!         async move { Ok(Transition::done(state)) }
//!     })
//!     .start()
//!     .await?;
//! // At most one step of account 7's instances runs at a time, cluster-wide.
//! engine
//!     .insert(NewInstance::new("Charge", json!({"cents": 500})).concurrency_key("acct:7"))
//!     .await?;
//! # charged.recv().await;
//! engine.shutdown().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Terms
//!
//! - **instance**: one run of a workflow, a row of `instances`, at one step.
//! - **claim**: a node takes a runnable row (`executing`, its node, the
//!   attempt counted) under a new **token**; an outcome applies only under
//!   the token of the claim it answers, so a stale one is **fenced**.
//! - **pick**: the database function that chooses runnable rows in order
//!   (priority, schedule, id) and admits each through its concurrency key,
//!   gate and rate limit.
//! - **handoff**: the claim path's one call (the SQL function `handoff`,
//!   called by the node's `record_and_claim`): record outcomes, promote and
//!   hand over, credit what is left, pick; one round trip, one commit.
//! - **outcome**: what a step's transition does to its row, written by the
//!   node that ran it.
//! - **gate**: a concurrency-key name with a limit K > 1, its slots kept as
//!   sharded counters; without one a key is K = 1.
//! - **handover**: a key or gate slot an outcome frees goes to the key's next
//!   row in the same call.
//! - **successor**, **reservation**, **promotion**: the next row of a full
//!   key, reserved for the node that holds the key; it starts once the call
//!   recording its predecessor's outcome has promoted it into the freed slot.
//! - **credit**: a freed gate slot nobody took over, returned to its counter.
//! - **release**: a claimed row the node will not start goes back, runnable,
//!   through the same call as an outcome.
//! - **parked**: an available row kept out of the pick's index because its
//!   key, its rate limit or its workflow cannot run it now; **unparked** in
//!   the key's order when it can.
//! - **lease**, **heartbeat**, **rescue**: a node that has not heartbeated for
//!   a lease is presumed dead and its executing rows are rescued (made
//!   available again, the attempt counted).
//! - **reconcile**: recompute a gate's counters from its executing rows.
//! - **prefetch**: rows a queue claims beyond its free slots, about as many as
//!   it starts in 50 ms.

pub mod config;
mod context;
pub mod cron;
mod deadline;
mod engine;
mod error;
mod instance;
mod node;
pub mod options;
mod outcome;
mod stats;
mod store;
mod transition;
pub mod unique;
pub mod validate;
mod workflow;

pub use async_trait::async_trait;
pub use config::{EngineConfig, GateConfig, RateConfig};
pub use cron::{CronEntry, Missed};
pub use engine::{
    Acted, Cancelled, ClusterStatus, Delivery, DrainOptions, Drained, Engine, EngineBuilder,
    Filter, GateStatus, InsertedQuery, KeyLimit, NoNode, NodeStatus, Parked, ParkedKey, QueueCount,
    RateStatus, WaitingRows, DRAIN_MAX_STEPS,
};
pub use error::{Error, Result};

/// What the dashboard reads: [`Engine::overview`], [`Engine::list`],
/// [`Engine::why`], [`Engine::keys`].
pub mod inspect {
    pub use crate::engine::{
        capture_warnings, Finished, InstancePage, InstanceRow, KeysView, ListQuery, Minute,
        Overview, QueueLoad, Wait,
    };
}
/// The in-process bulkhead (the `gendurable-bulkhead` crate).
pub use gendurable_bulkhead as bulkhead;
pub use instance::{
    Instance, NewInstance, Status, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, DEFAULT_STEP,
};
pub use node::handover;
pub use options::{CronOptions, EngineOptions, InsertOptions, UniqueOptions, UniqueStates};
pub use stats::{Latencies, Stats, StatsSnapshot};
pub use transition::{AwaitOn, ConcurrencyKey, KeyChange, NextOptions, Transition, Wake};
pub use unique::{Inserted, Unique};
pub use workflow::{BoxError, FnWorkflow, StepContext, StepResult, Workflow, WorkflowDefaults};
