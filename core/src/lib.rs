//! gendurable: a durable step engine on PostgreSQL.
//!
//! Instances of workflows are rows; worker nodes claim runnable rows, run the
//! workflow's code for the current step and write the step's transition back
//! in one transaction. Concurrency keys (K-at-a-time per key, cluster-wide),
//! gates and rate limits are enforced by the database in the claim itself.
//! See the crate README and `docs/` for the guarantees.

pub mod bulkhead;
pub mod config;
mod db;
pub mod embedded;
mod engine;
mod error;
mod insert;
mod instance;
mod liveness;
mod node;
mod outcome;
mod prefetch;
mod stats;
mod status;
mod successors;
mod transition;
pub mod validate;
mod workflow;

pub use async_trait::async_trait;
pub use config::{EngineConfig, GateConfig, RateConfig};
pub use engine::{Cancelled, Engine, EngineBuilder};
pub use error::{Error, Result};
pub use instance::{
    Instance, NewInstance, Status, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, DEFAULT_STEP,
};
pub use stats::{Latencies, Stats, StatsSnapshot};
pub use status::{
    ClusterStatus, GateStatus, KeyLimit, NoNode, NodeStatus, Parked, ParkedKey, QueueCount,
    RateStatus, WaitingRows,
};
pub use transition::{AwaitOn, ConcurrencyKey, KeyChange, NextOptions, Transition, Wake};
pub use workflow::{BoxError, FnWorkflow, StepContext, StepResult, Workflow};
