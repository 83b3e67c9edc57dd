//! Instances: what is inserted and what is read back.

use crate::error::Result;
use crate::transition::ConcurrencyKey;
use crate::unique::{self, Unique};
use crate::validate;
use crate::workflow::WorkflowDefaults;
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::time::Duration;

/// Where an instance is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Waiting for its scheduled time (a delay, a retry backoff, a snooze).
    Scheduled,
    /// Runnable now.
    Available,
    /// Claimed by a node.
    Executing,
    /// Parked on a signal or a timeout; holds no slot.
    Awaiting,
    /// Finished with `done`.
    Completed,
    /// Stopped by `cancel`.
    Cancelled,
    /// Gave up: after `max_attempts` errors, or a discard.
    Discarded,
}

impl serde::Serialize for Status {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl Status {
    /// The status as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Scheduled => "scheduled",
            Status::Available => "available",
            Status::Executing => "executing",
            Status::Awaiting => "awaiting",
            Status::Completed => "completed",
            Status::Cancelled => "cancelled",
            Status::Discarded => "discarded",
        }
    }

    /// Whether the instance is finished for good.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Status::Completed | Status::Cancelled | Status::Discarded
        )
    }

    /// The status named `name`, as stored.
    pub fn from_name(name: &str) -> Option<Status> {
        crate::unique::ALL_STATUSES
            .into_iter()
            .find(|s| s.as_str() == name)
    }

    pub(crate) fn parse(s: &str) -> Status {
        match s {
            "scheduled" => Status::Scheduled,
            "available" => Status::Available,
            "executing" => Status::Executing,
            "awaiting" => Status::Awaiting,
            "completed" => Status::Completed,
            "cancelled" => Status::Cancelled,
            _ => Status::Discarded,
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An instance as stored, read back with [`crate::Engine::get`].
#[derive(Debug, Clone)]
pub struct Instance {
    pub id: i64,
    pub workflow: String,
    pub step: String,
    pub state: Value,
    pub queue: String,
    pub priority: i16,
    pub status: Status,
    pub concurrency_key: Option<String>,
    pub rate_limit: Option<String>,
    /// Attempts of the current step so far.
    pub attempt: i32,
    pub max_attempts: i32,
    /// The node executing it, while executing.
    pub node: Option<String>,
    pub cancel_requested: bool,
    pub await_signal: Option<String>,
    pub await_until: Option<DateTime<Utc>>,
    /// Every error, rescue and cancellation recorded, oldest first.
    pub errors: Vec<Value>,
    pub inserted_at: DateTime<Utc>,
    pub scheduled_at: DateTime<Utc>,
    pub attempted_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// A new instance, built fluently and passed to [`crate::Engine::insert`].
///
/// ```
/// use gendurable::NewInstance;
/// use serde_json::json;
/// let new = NewInstance::new("Account.Sync", json!({"id": 7}))
///     .concurrency_key(("account", 7))
///     .queue("sync")
///     .priority(1);
/// ```
#[derive(Debug, Clone)]
pub struct NewInstance {
    pub(crate) workflow: String,
    pub(crate) state: Value,
    pub(crate) step: String,
    /// Unset: the workflow's default, else [`DEFAULT_QUEUE`].
    pub(crate) queue: Option<String>,
    pub(crate) priority: Option<i16>,
    pub(crate) concurrency_key: Option<String>,
    pub(crate) rate_limit: Option<String>,
    pub(crate) schedule: Schedule,
    pub(crate) max_attempts: Option<i32>,
    pub(crate) unique: Option<Unique>,
    pub(crate) idempotency_key: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Schedule {
    Now,
    In(Duration),
    At(DateTime<Utc>),
}

/// Default step of a new instance.
pub const DEFAULT_STEP: &str = "start";
/// Default queue.
pub const DEFAULT_QUEUE: &str = "default";
/// Default attempts per step.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 20;

impl NewInstance {
    /// An instance of `workflow` starting at step `"start"` with `state` (a JSON object).
    pub fn new(workflow: impl Into<String>, state: Value) -> Self {
        NewInstance {
            workflow: workflow.into(),
            state,
            step: DEFAULT_STEP.into(),
            queue: None,
            priority: None,
            concurrency_key: None,
            rate_limit: None,
            schedule: Schedule::Now,
            max_attempts: None,
            unique: None,
            idempotency_key: None,
        }
    }

    /// The first step (default `"start"`).
    pub fn step(mut self, step: impl Into<String>) -> Self {
        self.step = step.into();
        self
    }

    /// The queue (default: the workflow's, else `"default"`).
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// 0 (first) to 9 (last); default: the workflow's, else 0.
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = Some(priority);
        self
    }

    /// A concurrency key: `"account:7"` or `("account", 7)`.
    pub fn concurrency_key(mut self, key: impl Into<ConcurrencyKey>) -> Self {
        self.concurrency_key = Some(key.into().0);
        self
    }

    /// A rate-limit key for the first step, e.g. `"openai:tenant7"`.
    pub fn rate_limit(mut self, key: impl Into<String>) -> Self {
        self.rate_limit = Some(key.into());
        self
    }

    /// Run no sooner than `delay` from now (the database's clock).
    pub fn schedule_in(mut self, delay: Duration) -> Self {
        self.schedule = Schedule::In(delay);
        self
    }

    /// Run no sooner than `at`.
    pub fn scheduled_at(mut self, at: DateTime<Utc>) -> Self {
        self.schedule = Schedule::At(at);
        self
    }

    /// Attempts per step before the instance is discarded (default: the
    /// workflow's, else 20).
    pub fn max_attempts(mut self, max_attempts: i32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// Insert nothing if an instance with the same identity exists (see
    /// [`Unique`]); the insert reports that instance's id.
    pub fn unique(mut self, unique: Unique) -> Self {
        self.unique = Some(unique);
        self
    }

    /// At most one instance with this key (1 to 1024 bytes, across
    /// workflows) in the statuses of [`NewInstance::unique`], by default
    /// [`crate::unique::DEFAULT_STATUSES`]; a repeated insert reports the
    /// instance that holds it.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// What the SQL function `unique_key` reads, for a unique insert.
    pub(crate) fn unique_spec(&self) -> Option<Value> {
        if self.unique.is_none() && self.idempotency_key.is_none() {
            return None;
        }
        let unique = self.unique.clone().unwrap_or_default();
        Some(unique.spec(self.idempotency_key.as_deref()))
    }

    /// Queue, priority and attempts: as set, else the workflow's defaults
    /// (`defaults`), else the engine's. Takes the queue out of `self`.
    pub(crate) fn resolve(&mut self, defaults: Option<&WorkflowDefaults>) -> (String, i16, i32) {
        let queue = self.queue.take().unwrap_or_else(|| {
            defaults
                .and_then(|d| d.queue.clone())
                .unwrap_or_else(|| DEFAULT_QUEUE.to_owned())
        });
        let priority = self.priority.or(defaults.and_then(|d| d.priority));
        let attempts = self.max_attempts.or(defaults.and_then(|d| d.max_attempts));
        (
            queue,
            priority.unwrap_or(0),
            attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS),
        )
    }

    pub(crate) fn validate(&self) -> Result<()> {
        validate::name("workflow", &self.workflow)?;
        validate::name("step", &self.step)?;
        if let Some(q) = &self.queue {
            validate::name("queue", q)?;
        }
        validate::state("state", &self.state)?;
        if let Some(p) = self.priority {
            validate::priority("priority", p)?;
        }
        if let Some(n) = self.max_attempts {
            validate::max_attempts("max_attempts", n)?;
        }
        if let Some(k) = &self.concurrency_key {
            validate::key("concurrency_key", k)?;
        }
        if let Some(k) = &self.rate_limit {
            validate::key("rate_limit", k)?;
        }
        if let Some(u) = &self.unique {
            u.validate()?;
        }
        if let Some(k) = &self.idempotency_key {
            unique::validate_key(k)?;
        }
        Ok(())
    }
}
