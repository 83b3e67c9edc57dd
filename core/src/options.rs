//! Options as data: the engine's configuration and an insert, read from JSON.
//!
//! Every front door can turn its native values into a [`serde_json::Value`]
//! (Elixir keyword lists and Python dicts become objects, atoms become
//! strings). Reading options from one gives every language the same option
//! names, the same shapes and the same messages, each naming the option:
//!
//! ```
//! use gendurable::options::EngineOptions;
//! use serde_json::json;
//!
//! let err = EngineOptions::from_json(json!({"queues": {"default": -1}})).unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "invalid configuration: engine option queues.default: expected a positive integer, got -1"
//! );
//! ```
//!
//! Only shapes and types are checked here. The values (a limit below 1, a
//! lease shorter than two heartbeats, a priority above 9, an empty key) are
//! checked where they are for every caller, by [`EngineBuilder::build`] and
//! [`crate::Engine::insert`], so each rule and its message exists once.
//!
//! Durations are integer milliseconds. `null` is the same as leaving an
//! option out.

use crate::cron::{CronEntry, Missed};
use crate::instance::Status;
use crate::unique::{Unique, ACTIVE_STATUSES, ALL_STATUSES};
use crate::{EngineBuilder, Error, GateConfig, NewInstance, RateConfig, Result, WorkflowDefaults};
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// The engine's configuration, as every front door passes it: what
/// [`EngineOptions::apply`] gives an [`EngineBuilder`]. Workflows are code
/// and are registered with the builder by each front door.
///
/// ```
/// use gendurable::{options::EngineOptions, Engine};
/// use serde_json::json;
///
/// let options = EngineOptions::from_json(json!({
///     "url": "postgres://localhost/app",
///     "queues": {"default": 10},
///     "concurrency_limits": {"stripe": {"limit": 100, "shards": 10}},
///     "rate_limits": {"openai": {"limit": 100, "period": 60000, "burst": 10}},
///     "retention": "infinity",
/// }))?;
/// options.apply(Engine::builder()).validate()?;
/// # Ok::<(), gendurable::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineOptions {
    /// The database URL.
    pub url: Option<String>,
    /// The schema holding the engine's tables (default `gendurable`).
    pub schema: Option<String>,
    /// This node's id (default: host, pid and a random suffix).
    pub node_id: Option<String>,
    /// Queue name → how many of its steps this node runs at once.
    #[serde(deserialize_with = "de::counts")]
    pub queues: BTreeMap<String, u32>,
    /// Key name → its gate.
    #[serde(deserialize_with = "de::structs")]
    pub concurrency_limits: BTreeMap<String, GateOptions>,
    /// Rate-limit key name → its rate.
    #[serde(deserialize_with = "de::structs")]
    pub rate_limits: BTreeMap<String, RateOptions>,
    /// Workflow name → step → the rate-limit key declared for that step
    /// (see [`EngineBuilder::step_rate_limit`]).
    #[serde(deserialize_with = "de::nullable")]
    pub step_rate_limits: BTreeMap<String, BTreeMap<String, String>>,
    /// Workflow name → step → milliseconds it may run (see
    /// [`EngineBuilder::step_timeout`]).
    #[serde(deserialize_with = "de::step_millis")]
    pub step_timeouts: BTreeMap<String, BTreeMap<String, u64>>,
    /// Workflow name → its defaults (see [`EngineBuilder::workflow_defaults`]).
    #[serde(deserialize_with = "de::structs")]
    pub workflow_defaults: BTreeMap<String, WorkflowDefaultsOptions>,
    /// Milliseconds; see [`EngineBuilder::poll_interval`].
    #[serde(deserialize_with = "de::opt_millis")]
    pub poll_interval: Option<u64>,
    /// Milliseconds; see [`EngineBuilder::heartbeat_interval`].
    #[serde(deserialize_with = "de::opt_millis")]
    pub heartbeat_interval: Option<u64>,
    /// Milliseconds; see [`EngineBuilder::lease`].
    #[serde(deserialize_with = "de::opt_millis")]
    pub lease: Option<u64>,
    /// Milliseconds; see [`EngineBuilder::shutdown_timeout`].
    #[serde(deserialize_with = "de::opt_millis_or_zero")]
    pub shutdown_timeout: Option<u64>,
    /// Milliseconds; see [`EngineBuilder::gc_interval`].
    #[serde(deserialize_with = "de::opt_millis")]
    pub gc_interval: Option<u64>,
    /// Milliseconds; see [`EngineBuilder::connect_timeout`].
    #[serde(deserialize_with = "de::opt_millis")]
    pub connect_timeout: Option<u64>,
    /// Milliseconds; see [`EngineBuilder::call_timeout`].
    #[serde(deserialize_with = "de::opt_millis")]
    pub call_timeout: Option<u64>,
    /// Retry backoff; see [`EngineBuilder::backoff`].
    #[serde(deserialize_with = "de::opt_struct")]
    pub backoff: Option<BackoffOptions>,
    /// How long finished instances are kept; see [`EngineBuilder::retention`].
    #[serde(deserialize_with = "de::opt_retention")]
    pub retention: Option<Retention>,
    /// Database connections; see [`EngineBuilder::max_connections`].
    #[serde(deserialize_with = "de::opt_pool_size")]
    pub pool_size: Option<u32>,
    /// Rows claimed ahead per queue; see [`EngineBuilder::prefetch`].
    #[serde(deserialize_with = "de::opt_prefetch")]
    pub prefetch: Option<u32>,
    /// Periodic workflows; see [`EngineBuilder::cron`].
    #[serde(deserialize_with = "de::structs_list")]
    pub cron: Vec<CronOptions>,
    /// `"127.0.0.1:9090"`; see [`EngineBuilder::metrics_listen`].
    #[serde(deserialize_with = "de::opt_addr")]
    pub metrics_listen: Option<std::net::SocketAddr>,
}

/// A periodic workflow: `{"schedule": "*/5 * * * *", "instance": {"workflow":
/// "Report", ...}, "name": "reports", "timezone": "Europe/Paris", "missed":
/// "latest"}`; `instance` holds insert options (see [`CronEntry`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CronOptions {
    pub schedule: String,
    #[serde(deserialize_with = "de::structure")]
    pub instance: InsertOptions,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub timezone: Option<String>,
    /// `"latest"`, `"all"` or `"skip"` (see [`Missed`]).
    #[serde(
        default,
        deserialize_with = "de::opt_missed",
        serialize_with = "missed_name"
    )]
    pub missed: Option<Missed>,
}

fn missed_name<S: Serializer>(m: &Option<Missed>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match m {
        Some(m) => s.serialize_str(m.as_str()),
        None => s.serialize_none(),
    }
}

impl From<CronOptions> for CronEntry {
    fn from(o: CronOptions) -> CronEntry {
        let mut entry = CronEntry::new(o.schedule, NewInstance::from(o.instance));
        if let Some(name) = o.name {
            entry = entry.name(name);
        }
        if let Some(tz) = o.timezone {
            entry = entry.timezone(tz);
        }
        if let Some(m) = o.missed {
            entry = entry.missed(m);
        }
        entry
    }
}

/// A gate: `{"limit": 100, "shards": 10}` (see [`GateConfig`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateOptions {
    #[serde(deserialize_with = "de::count")]
    pub limit: u32,
    /// Default: [`GateConfig::new`]'s.
    #[serde(default, deserialize_with = "de::opt_count")]
    pub shards: Option<u32>,
}

/// A rate limit: `{"limit": 100, "period": 60000, "burst": 10}`, the period
/// in milliseconds (see [`RateConfig`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateOptions {
    #[serde(deserialize_with = "de::count")]
    pub limit: u32,
    #[serde(deserialize_with = "de::millis")]
    pub period: u64,
    /// Default: [`RateConfig::new`]'s.
    #[serde(default, deserialize_with = "de::opt_count")]
    pub burst: Option<u32>,
}

/// A workflow's defaults: `{"queue": "billing", "priority": 1,
/// "max_attempts": 5, "backoff": {"base": 1000, "max": 60000}}`, each
/// optional (see [`crate::WorkflowDefaults`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowDefaultsOptions {
    #[serde(default)]
    pub queue: Option<String>,
    #[serde(default, deserialize_with = "de::opt_priority")]
    pub priority: Option<i16>,
    #[serde(default, deserialize_with = "de::opt_max_attempts")]
    pub max_attempts: Option<i32>,
    #[serde(default, deserialize_with = "de::opt_struct")]
    pub backoff: Option<BackoffOptions>,
    /// Milliseconds a step may run (see [`WorkflowDefaults::timeout`]).
    #[serde(default, deserialize_with = "de::opt_millis")]
    pub timeout: Option<u64>,
}

/// Retry backoff: `{"base": 1000, "max": 3600000}`, in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackoffOptions {
    #[serde(deserialize_with = "de::millis")]
    pub base: u64,
    #[serde(deserialize_with = "de::millis")]
    pub max: u64,
}

/// How long finished instances are kept: milliseconds, or `"infinity"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Deleted this many milliseconds after they finish.
    Millis(u64),
    /// Kept forever (`"infinity"`).
    Forever,
}

impl Serialize for Retention {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Retention::Millis(ms) => s.serialize_u64(*ms),
            Retention::Forever => s.serialize_str("infinity"),
        }
    }
}

impl EngineOptions {
    /// Reads the options from a JSON object. Errors are
    /// [`Error::InvalidConfig`] naming the option: `engine option
    /// rate_limits.openai: period is required`.
    pub fn from_json(value: Value) -> Result<EngineOptions> {
        read(value).map_err(|p| Error::InvalidConfig(p.engine_message()))
    }

    /// The error for the engine option at `path` (from the top, e.g.
    /// `["queues", "default"]`) that a front door could not turn into JSON,
    /// worded like the errors of [`EngineOptions::from_json`].
    pub fn error_at(path: &[&str], reason: &str) -> Error {
        let path = path.iter().map(|s| s.to_string()).collect();
        Error::InvalidConfig(Problem::Other(reason.to_owned()).at(path).engine_message())
    }

    /// Gives every option set to `builder`. Values are checked by the
    /// builder ([`EngineBuilder::validate`], [`EngineBuilder::build`]).
    pub fn apply(&self, builder: EngineBuilder) -> EngineBuilder {
        let ms = Duration::from_millis;
        let mut b = builder;
        if let Some(url) = &self.url {
            b = b.url(url);
        }
        if let Some(schema) = &self.schema {
            b = b.schema(schema);
        }
        if let Some(id) = &self.node_id {
            b = b.node_id(id);
        }
        for (queue, &n) in &self.queues {
            b = b.queue(queue, n);
        }
        for (name, g) in &self.concurrency_limits {
            let mut gate = GateConfig::new(g.limit);
            if let Some(shards) = g.shards {
                gate = gate.shards(shards);
            }
            b = b.concurrency_limit(name, gate);
        }
        for (name, r) in &self.rate_limits {
            let mut rate = RateConfig::new(r.limit, ms(r.period));
            if let Some(burst) = r.burst {
                rate = rate.burst(burst);
            }
            b = b.rate_limit(name, rate);
        }
        for (workflow, steps) in &self.step_rate_limits {
            for (step, key) in steps {
                b = b.step_rate_limit(workflow, step, key);
            }
        }
        for (workflow, steps) in &self.step_timeouts {
            for (step, t) in steps {
                b = b.step_timeout(workflow, step, ms(*t));
            }
        }
        for (workflow, d) in &self.workflow_defaults {
            let defaults = WorkflowDefaults {
                queue: d.queue.clone(),
                priority: d.priority,
                max_attempts: d.max_attempts,
                backoff: d.backoff.as_ref().map(|bo| (ms(bo.base), ms(bo.max))),
                timeout: d.timeout.map(ms),
            };
            b = b.workflow_defaults(workflow, defaults);
        }
        if let Some(addr) = self.metrics_listen {
            b = b.metrics_listen(addr);
        }
        for c in &self.cron {
            b = b.cron(c.clone().into());
        }
        if let Some(d) = self.poll_interval {
            b = b.poll_interval(ms(d));
        }
        if let Some(d) = self.heartbeat_interval {
            b = b.heartbeat_interval(ms(d));
        }
        if let Some(d) = self.lease {
            b = b.lease(ms(d));
        }
        if let Some(d) = self.shutdown_timeout {
            b = b.shutdown_timeout(ms(d));
        }
        if let Some(d) = self.gc_interval {
            b = b.gc_interval(ms(d));
        }
        if let Some(d) = self.connect_timeout {
            b = b.connect_timeout(ms(d));
        }
        if let Some(d) = self.call_timeout {
            b = b.call_timeout(ms(d));
        }
        if let Some(bo) = &self.backoff {
            b = b.backoff(ms(bo.base), ms(bo.max));
        }
        match self.retention {
            Some(Retention::Millis(d)) => b = b.retention(Some(ms(d))),
            Some(Retention::Forever) => b = b.retention(None),
            None => {}
        }
        if let Some(n) = self.pool_size {
            b = b.max_connections(n);
        }
        if let Some(n) = self.prefetch {
            b = b.prefetch(n);
        }
        b
    }
}

/// An instance to insert, as every front door passes it: `{"workflow":
/// "Account.Sync", "state": {...}, "concurrency_key": "account:7", ...}`.
/// Options left out take [`NewInstance`]'s defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InsertOptions {
    pub workflow: String,
    /// Any JSON here; [`crate::Engine::insert`] requires an object (default `{}`).
    #[serde(default = "empty_object")]
    pub state: Value,
    pub step: Option<String>,
    pub queue: Option<String>,
    #[serde(default, deserialize_with = "de::opt_priority")]
    pub priority: Option<i16>,
    pub concurrency_key: Option<String>,
    pub rate_limit: Option<String>,
    /// Milliseconds from now.
    #[serde(default, deserialize_with = "de::opt_delay")]
    pub schedule_in: Option<u64>,
    /// An RFC 3339 timestamp (`"2030-01-01T12:00:00Z"`). Not with `schedule_in`.
    #[serde(default, deserialize_with = "de::opt_timestamp")]
    pub scheduled_at: Option<DateTime<Utc>>,
    #[serde(default, deserialize_with = "de::opt_max_attempts")]
    pub max_attempts: Option<i32>,
    /// Insert nothing if an instance with the same identity exists; `{}` for
    /// the defaults (see [`crate::Unique`]).
    #[serde(default, deserialize_with = "de::opt_struct")]
    pub unique: Option<UniqueOptions>,
    /// At most one instance with this key (see [`NewInstance::idempotency_key`]).
    pub idempotency_key: Option<String>,
}

/// A unique insert: `{"fields": ["account"], "period": 3600000, "states":
/// "active"}`, each optional (see [`crate::Unique`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UniqueOptions {
    /// The state's top-level fields that make the identity (default: all of it).
    #[serde(default)]
    pub fields: Option<Vec<String>>,
    /// Milliseconds: duplicates are refused within windows this long.
    #[serde(default, deserialize_with = "de::opt_millis")]
    pub period: Option<u64>,
    /// `"active"`, `"all"` or a list of statuses (default: the active ones
    /// and `completed`).
    #[serde(default, deserialize_with = "de::opt_statuses")]
    pub states: Option<UniqueStates>,
}

/// The statuses in which an instance refuses a duplicate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UniqueStates {
    /// Until it is final ([`crate::unique::ACTIVE_STATUSES`]).
    Active,
    /// As long as it is kept ([`crate::unique::ALL_STATUSES`]).
    All,
    /// These.
    List(Vec<Status>),
}

impl UniqueStates {
    fn statuses(&self) -> Vec<Status> {
        match self {
            UniqueStates::Active => ACTIVE_STATUSES.to_vec(),
            UniqueStates::All => ALL_STATUSES.to_vec(),
            UniqueStates::List(l) => l.clone(),
        }
    }
}

impl Serialize for UniqueStates {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            UniqueStates::Active => s.serialize_str("active"),
            UniqueStates::All => s.serialize_str("all"),
            UniqueStates::List(l) => s.collect_seq(l.iter().map(|st| st.as_str())),
        }
    }
}

impl From<UniqueOptions> for Unique {
    fn from(o: UniqueOptions) -> Unique {
        let mut u = Unique::new();
        if let Some(fields) = o.fields {
            u = u.fields(fields);
        }
        if let Some(ms) = o.period {
            u = u.period(Duration::from_millis(ms));
        }
        if let Some(states) = o.states {
            u = u.statuses(states.statuses());
        }
        u
    }
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// The options that name an insert's fields in errors (see [`Error::InvalidInput`]).
const INSERT_FIELDS: [&str; 15] = [
    "workflow",
    "state",
    "step",
    "queue",
    "priority",
    "concurrency_key",
    "rate_limit",
    "schedule_in",
    "scheduled_at",
    "max_attempts",
    "unique",
    "unique.fields",
    "unique.period",
    "unique.states",
    "idempotency_key",
];

fn insert_field(name: &str) -> Option<&'static str> {
    INSERT_FIELDS.iter().find(|f| **f == name).copied()
}

impl InsertOptions {
    /// Reads an insert from a JSON object. Errors are
    /// [`Error::InvalidInput`] whose field is the option (`options` for an
    /// unknown one or for a value that is not an object).
    pub fn from_json(value: Value) -> Result<InsertOptions> {
        // The state is taken as it is: it is any JSON, possibly large, and
        // the engine checks it when inserting.
        let (value, state) = match value {
            Value::Object(mut map) => {
                let state = map.remove("state");
                (Value::Object(map), state)
            }
            other => (other, None),
        };
        let mut options: InsertOptions = read(value).map_err(Located::insert_error)?;
        if let Some(state) = state {
            options.state = state;
        }
        if options.schedule_in.is_some() && options.scheduled_at.is_some() {
            return Err(input(
                "scheduled_at",
                "give schedule_in or scheduled_at, not both",
            ));
        }
        Ok(options)
    }

    /// The error for the insert option `field` that a front door could not
    /// turn into JSON, worded like the errors of [`InsertOptions::from_json`].
    pub fn error_at(field: &str, reason: &str) -> Error {
        Problem::Other(reason.to_owned())
            .at(vec![field.to_owned()])
            .insert_error()
    }
}

impl From<InsertOptions> for NewInstance {
    /// The instance; with both `schedule_in` and `scheduled_at` set (which
    /// [`InsertOptions::from_json`] refuses), `scheduled_at` wins.
    fn from(o: InsertOptions) -> NewInstance {
        let mut new = NewInstance::new(o.workflow, o.state);
        if let Some(step) = o.step {
            new = new.step(step);
        }
        if let Some(queue) = o.queue {
            new = new.queue(queue);
        }
        if let Some(p) = o.priority {
            new = new.priority(p);
        }
        if let Some(key) = o.concurrency_key {
            new = new.concurrency_key(key);
        }
        if let Some(key) = o.rate_limit {
            new = new.rate_limit(key);
        }
        if let Some(ms) = o.schedule_in {
            new = new.schedule_in(Duration::from_millis(ms));
        }
        if let Some(at) = o.scheduled_at {
            new = new.scheduled_at(at);
        }
        if let Some(n) = o.max_attempts {
            new = new.max_attempts(n);
        }
        if let Some(u) = o.unique {
            new = new.unique(u.into());
        }
        if let Some(k) = o.idempotency_key {
            new = new.idempotency_key(k);
        }
        new
    }
}

impl NewInstance {
    /// [`InsertOptions::from_json`], as a [`NewInstance`].
    pub fn from_json(value: Value) -> Result<NewInstance> {
        InsertOptions::from_json(value).map(NewInstance::from)
    }
}

// ---------------------------------------------------------------------------
// Errors

/// What is wrong, and where: `path` runs from the top (`["queues", "default"]`).
struct Located {
    path: Vec<String>,
    problem: Problem,
}

enum Problem {
    /// An option nobody knows, with the ones known at that place.
    Unknown { name: String, known: String },
    /// A required option left out.
    Missing(String),
    /// Anything else: "expected ..., got ...".
    Other(String),
}

impl Problem {
    fn at(self, path: Vec<String>) -> Located {
        Located {
            path,
            problem: self,
        }
    }
}

impl Located {
    /// `engine option rate_limits.openai: period is required`.
    fn engine_message(&self) -> String {
        let place = if self.path.is_empty() {
            "engine options".to_owned()
        } else {
            format!("engine option {}", path_text(&self.path))
        };
        match &self.problem {
            Problem::Unknown { name, known } => {
                format!("{place}: unknown option {name:?} (known: {known})")
            }
            Problem::Missing(name) => format!("{place}: {name} is required"),
            Problem::Other(detail) => format!("{place}: {detail}"),
        }
    }

    /// An insert's field is the option named first in the path, or
    /// `options` for an option nobody knows (then named in the reason).
    fn insert_error(self) -> Error {
        // The deepest field the path names ("unique.period" before
        // "unique"), and what of the path is below it.
        let (field, depth) = (1..=self.path.len().min(2))
            .rev()
            .find_map(|n| insert_field(&self.path[..n].join(".")).map(|f| (f, n)))
            .unwrap_or(("options", 0));
        let detail = match self.problem {
            Problem::Unknown { name, known } => {
                return input(field, format!("unknown option {name:?} (known: {known})"))
            }
            Problem::Missing(name) => {
                return input(insert_field(&name).unwrap_or(field), "is required")
            }
            Problem::Other(detail) => detail,
        };
        let rest = &self.path[depth..];
        if rest.is_empty() {
            input(field, detail)
        } else {
            input(field, format!("{}: {detail}", path_text(rest)))
        }
    }
}

fn input(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidInput {
        field,
        reason: reason.into(),
    }
}

/// `queues.default`, `step_rate_limits["Account.Sync"].push`.
fn path_text(path: &[String]) -> String {
    let mut out = String::new();
    for (i, seg) in path.iter().enumerate() {
        // A list's index, as `read` writes it.
        if seg.starts_with('[') && seg.ends_with(']') {
            out.push_str(seg);
            continue;
        }
        let plain = !seg.is_empty()
            && seg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !seg.starts_with(|c: char| c.is_ascii_digit());
        match (plain, i) {
            (true, 0) => out.push_str(seg),
            (true, _) => {
                out.push('.');
                out.push_str(seg);
            }
            (false, _) => out.push_str(&format!("[{seg:?}]")),
        }
    }
    out
}

/// Deserializes `value`, locating the first problem.
fn read<T: DeserializeOwned + de::Described>(value: Value) -> std::result::Result<T, Located> {
    let read: std::result::Result<de::MapOnly<T>, _> = serde_path_to_error::deserialize(value);
    read.map(|m| m.0).map_err(|e| {
        let mut path: Vec<String> = e
            .path()
            .iter()
            .filter_map(|seg| match seg {
                serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                serde_path_to_error::Segment::Seq { index } => Some(format!("[{index}]")),
                serde_path_to_error::Segment::Enum { variant } => Some(variant.clone()),
                serde_path_to_error::Segment::Unknown => None,
            })
            .collect();
        let problem = explain(&e.into_inner().to_string());
        // An unknown option is reported at the map it is in.
        if let Problem::Unknown { name, .. } = &problem {
            if path.last() == Some(name) {
                path.pop();
            }
        }
        problem.at(path)
    })
}

/// Rewords serde's messages: `invalid type: integer `5`, expected a string`
/// becomes `expected a string, got 5`. The messages of this module's own
/// readers are already worded so and pass through.
fn explain(message: &str) -> Problem {
    if let Some(rest) = message.strip_prefix("unknown field `") {
        if let Some((name, rest)) = rest.split_once('`') {
            let known = rest
                .strip_prefix(", expected one of ")
                .or_else(|| rest.strip_prefix(", expected "))
                .unwrap_or("none")
                .replace('`', "")
                .replace(" or ", ", ");
            let known = if known.starts_with("there are no fields") {
                "none".to_owned()
            } else {
                known
            };
            return Problem::Unknown {
                name: name.to_owned(),
                known,
            };
        }
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        return Problem::Missing(rest.trim_end_matches('`').to_owned());
    }
    let rest = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "));
    if let Some((got, expected)) = rest.and_then(|r| r.rsplit_once(", expected ")) {
        let expected = match expected {
            "a sequence" => "a list",
            e => e,
        };
        return Problem::Other(format!("expected {expected}, got {}", unexpected(got)));
    }
    Problem::Other(message.to_owned())
}

/// serde's description of a value as this module's readers give it.
fn unexpected(got: &str) -> String {
    let quoted = |s: &str| s.strip_prefix('`')?.strip_suffix('`').map(str::to_owned);
    if let Some(v) = got.strip_prefix("integer ").and_then(quoted) {
        return v;
    }
    if let Some(v) = got.strip_prefix("floating point ").and_then(quoted) {
        return v;
    }
    if let Some(v) = got.strip_prefix("boolean ").and_then(quoted) {
        return v;
    }
    if let Some(v) = got.strip_prefix("string ") {
        return shorten(v);
    }
    match got {
        "unit value" | "null" => "null".into(),
        "map" => "a map".into(),
        "sequence" => "a list".into(),
        other => shorten(other),
    }
}

/// At most 60 characters of a value shown in a message.
fn shorten(s: &str) -> String {
    const MAX: usize = 60;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

// ---------------------------------------------------------------------------
// Readers with messages that say what is expected

mod de {
    use super::{
        shorten, BackoffOptions, CronOptions, EngineOptions, GateOptions, InsertOptions,
        RateOptions, Retention, UniqueOptions, UniqueStates, WorkflowDefaultsOptions,
    };
    use crate::cron::Missed;
    use crate::instance::Status;
    use chrono::{DateTime, Utc};
    use serde::de::value::MapAccessDeserializer;
    use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
    use serde::Deserialize;
    use std::collections::BTreeMap;
    use std::fmt;
    use std::marker::PhantomData;

    /// What a value of this type is called in messages.
    pub(super) trait Described {
        const WHAT: &'static str;
    }

    impl Described for EngineOptions {
        const WHAT: &'static str = "a map of engine options";
    }

    impl Described for GateOptions {
        const WHAT: &'static str = "a map with limit and optionally shards";
    }

    impl Described for RateOptions {
        const WHAT: &'static str = "a map with limit, period (milliseconds) and optionally burst";
    }

    impl Described for WorkflowDefaultsOptions {
        const WHAT: &'static str =
            "a map with queue, priority, max_attempts, backoff and timeout, each optional";
    }

    impl Described for BackoffOptions {
        const WHAT: &'static str = "a map with base and max (milliseconds)";
    }

    impl Described for InsertOptions {
        const WHAT: &'static str = "a map of insert options";
    }

    impl Described for CronOptions {
        const WHAT: &'static str =
            "a map with schedule, instance and optionally name, timezone and missed";
    }

    impl Described for UniqueOptions {
        const WHAT: &'static str =
            "a map with fields, period (milliseconds) and states, each optional";
    }

    /// A struct read from a map only: serde would also read one from a list,
    /// by position, which no front door means.
    pub(super) struct MapOnly<T>(pub T);

    impl<'de, T: Deserialize<'de> + Described> Deserialize<'de> for MapOnly<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Fields<T>(PhantomData<T>);

            impl<'de, T: Deserialize<'de> + Described> Visitor<'de> for Fields<T> {
                type Value = T;

                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str(T::WHAT)
                }

                fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                    T::deserialize(MapAccessDeserializer::new(map))
                }
            }

            d.deserialize_map(Fields(PhantomData)).map(MapOnly)
        }
    }

    /// An optional struct.
    pub(super) fn opt_struct<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de> + Described,
    {
        Option::<MapOnly<T>>::deserialize(d).map(|o| o.map(|m| m.0))
    }

    /// A struct.
    pub(super) fn structure<'de, D, T>(d: D) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de> + Described,
    {
        MapOnly::<T>::deserialize(d).map(|m| m.0)
    }

    /// A list of structs; `null` is empty.
    pub(super) fn structs_list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de> + Described,
    {
        let list: Option<Vec<MapOnly<T>>> = Option::deserialize(d)?;
        Ok(list.unwrap_or_default().into_iter().map(|m| m.0).collect())
    }

    pub(super) fn opt_addr<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<std::net::SocketAddr>, D::Error> {
        d.deserialize_option(Nullable(Any {
            what: "an address such as \"127.0.0.1:9090\"",
            take: |got| match got {
                Got::Str(s) => s.parse().map_err(|_| Got::Str(s)),
                other => Err(other),
            },
        }))
    }

    pub(super) fn opt_missed<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Missed>, D::Error> {
        d.deserialize_option(Nullable(Any {
            what: "\"latest\", \"all\" or \"skip\"",
            take: |got| match got {
                Got::Str(s) => Missed::from_name(&s).ok_or(Got::Str(s)),
                other => Err(other),
            },
        }))
    }

    /// Name → struct; `null` is empty.
    pub(super) fn structs<'de, D, T>(d: D) -> Result<BTreeMap<String, T>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de> + Described,
    {
        let map: Option<BTreeMap<String, MapOnly<T>>> = Option::deserialize(d)?;
        Ok(map
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect())
    }

    /// What a value that is not the one expected is shown as.
    enum Got {
        Int(i128),
        Float(f64),
        Str(String),
        Bool(bool),
        Null,
        Map,
        List,
    }

    impl fmt::Display for Got {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                Got::Int(v) => write!(f, "{v}"),
                Got::Float(v) => write!(f, "{v:?}"),
                Got::Str(s) => f.write_str(&shorten(&format!("{s:?}"))),
                Got::Bool(b) => write!(f, "{b}"),
                Got::Null => f.write_str("null"),
                Got::Map => f.write_str("a map"),
                Got::List => f.write_str("a list"),
            }
        }
    }

    fn wrong<E: de::Error>(what: &str, got: Got) -> E {
        E::custom(format_args!("expected {what}, got {got}"))
    }

    /// Reads any value and hands it to `take`, which accepts it or says it
    /// is not what was expected.
    struct Any<F> {
        what: &'static str,
        take: F,
    }

    impl<'de, T, F: FnOnce(Got) -> Result<T, Got>> Visitor<'de> for Any<F> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.what)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
            self.got(Got::Int(v.into()))
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
            self.got(Got::Int(v.into()))
        }

        fn visit_i128<E: de::Error>(self, v: i128) -> Result<T, E> {
            self.got(Got::Int(v))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
            self.got(Got::Float(v))
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
            self.got(Got::Str(v.to_owned()))
        }

        fn visit_string<E: de::Error>(self, v: String) -> Result<T, E> {
            self.got(Got::Str(v))
        }

        fn visit_bool<E: de::Error>(self, v: bool) -> Result<T, E> {
            self.got(Got::Bool(v))
        }

        fn visit_unit<E: de::Error>(self) -> Result<T, E> {
            self.got(Got::Null)
        }

        fn visit_none<E: de::Error>(self) -> Result<T, E> {
            self.got(Got::Null)
        }

        fn visit_map<A: MapAccess<'de>>(self, _map: A) -> Result<T, A::Error> {
            self.got(Got::Map)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, _seq: A) -> Result<T, A::Error> {
            self.got(Got::List)
        }
    }

    impl<F> Any<F> {
        fn got<T, E: de::Error>(self, got: Got) -> Result<T, E>
        where
            F: FnOnce(Got) -> Result<T, Got>,
        {
            let what = self.what;
            (self.take)(got).map_err(|got| wrong(what, got))
        }
    }

    /// `null` is `None`; anything else is read by `some`.
    struct Nullable<V>(V);

    impl<'de, V: Visitor<'de>> Visitor<'de> for Nullable<V> {
        type Value = Option<V::Value>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.expecting(f)
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self.0).map(Some)
        }
    }

    /// An integer from `min` to `max`, or what it is not.
    fn int(min: i128, max: i128, got: Got) -> Result<i128, Got> {
        match got {
            Got::Int(v) if (min..=max).contains(&v) => Ok(v),
            other => Err(other),
        }
    }

    /// Integer readers: `$req` for a required value, `$opt` for one that may
    /// be `null` or left out.
    macro_rules! integer {
        ($req:ident, $opt:ident, $t:ty, $min:expr, $what:literal) => {
            #[allow(dead_code)]
            pub(super) fn $req<'de, D: Deserializer<'de>>(d: D) -> Result<$t, D::Error> {
                d.deserialize_any(Any {
                    what: $what,
                    take: |got| int($min, <$t>::MAX.into(), got),
                })
                .map(|v| v as $t)
            }

            #[allow(dead_code)]
            pub(super) fn $opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<$t>, D::Error> {
                d.deserialize_option(Nullable(Any {
                    what: $what,
                    take: |got| int($min, <$t>::MAX.into(), got),
                }))
                .map(|v| v.map(|v| v as $t))
            }
        };
    }

    integer!(count, opt_count, u32, 0, "a positive integer");
    integer!(prefetch, opt_prefetch, u32, 0, "a non-negative integer");
    integer!(pool_size, opt_pool_size, u32, 1, "a positive integer");
    integer!(
        millis,
        opt_millis,
        u64,
        0,
        "a positive integer (milliseconds)"
    );
    integer!(
        millis_or_zero,
        opt_millis_or_zero,
        u64,
        0,
        "a non-negative integer (milliseconds)"
    );
    integer!(
        delay,
        opt_delay,
        u64,
        0,
        "a non-negative integer (milliseconds)"
    );
    integer!(priority, opt_priority, i16, i16::MIN.into(), "an integer");
    integer!(
        max_attempts,
        opt_max_attempts,
        i32,
        i32::MIN.into(),
        "a positive integer"
    );

    /// A map whose `null` is empty.
    pub(super) fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de> + Default,
    {
        Option::<T>::deserialize(d).map(Option::unwrap_or_default)
    }

    /// A count read by `count`, in maps.
    struct Count(u32);

    impl<'de> Deserialize<'de> for Count {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            count(d).map(Count)
        }
    }

    /// Milliseconds read by `millis`, in maps.
    struct Millis(u64);

    impl<'de> Deserialize<'de> for Millis {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            millis(d).map(Millis)
        }
    }

    /// Name → name → milliseconds; `null` is empty.
    pub(super) fn step_millis<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, BTreeMap<String, u64>>, D::Error> {
        let map: Option<BTreeMap<String, BTreeMap<String, Millis>>> = Option::deserialize(d)?;
        Ok(map
            .unwrap_or_default()
            .into_iter()
            .map(|(w, steps)| (w, steps.into_iter().map(|(s, Millis(m))| (s, m)).collect()))
            .collect())
    }

    /// Name → count; `null` is empty.
    pub(super) fn counts<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, u32>, D::Error> {
        let counts: Option<BTreeMap<String, Count>> = Option::deserialize(d)?;
        Ok(counts
            .unwrap_or_default()
            .into_iter()
            .map(|(k, Count(n))| (k, n))
            .collect())
    }

    pub(super) fn opt_retention<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Retention>, D::Error> {
        d.deserialize_option(Nullable(Any {
            what: "a non-negative integer (milliseconds) or \"infinity\"",
            take: |got| match got {
                Got::Str(s) if s == "infinity" => Ok(Retention::Forever),
                got => int(0, u64::MAX.into(), got).map(|v| Retention::Millis(v as u64)),
            },
        }))
    }

    /// `"active"`, `"all"` or a list of status names.
    pub(super) fn opt_statuses<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<UniqueStates>, D::Error> {
        const WHAT: &str = "\"active\", \"all\" or a list of statuses";
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Name(String),
            List(Vec<String>),
            Other(serde_json::Value),
        }
        let Some(raw) = Option::<Raw>::deserialize(d)? else {
            return Ok(None);
        };
        let status = |name: &str| {
            Status::from_name(name).ok_or_else(|| {
                de::Error::custom(format_args!(
                    "{} is not a status (scheduled, available, executing, awaiting, completed, \
                     cancelled, discarded)",
                    shorten(&format!("{name:?}"))
                ))
            })
        };
        match raw {
            Raw::Name(n) if n == "active" => Ok(Some(UniqueStates::Active)),
            Raw::Name(n) if n == "all" => Ok(Some(UniqueStates::All)),
            Raw::Name(n) => Err(wrong(WHAT, Got::Str(n))),
            Raw::List(l) => l
                .iter()
                .map(|n| status(n))
                .collect::<Result<Vec<_>, _>>()
                .map(|l| Some(UniqueStates::List(l))),
            Raw::Other(v) => Err(wrong(
                WHAT,
                match v {
                    serde_json::Value::Null => Got::Null,
                    serde_json::Value::Bool(b) => Got::Bool(b),
                    serde_json::Value::Number(n) => n
                        .as_i64()
                        .map(|i| Got::Int(i.into()))
                        .unwrap_or(Got::Float(n.as_f64().unwrap_or(f64::NAN))),
                    serde_json::Value::String(s) => Got::Str(s),
                    serde_json::Value::Array(_) => Got::List,
                    serde_json::Value::Object(_) => Got::Map,
                },
            )),
        }
    }

    pub(super) fn opt_timestamp<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<DateTime<Utc>>, D::Error> {
        d.deserialize_option(Nullable(Any {
            what: "an RFC 3339 timestamp such as \"2030-01-01T12:00:00Z\"",
            take: |got| match got {
                Got::Str(s) => match DateTime::parse_from_rfc3339(&s) {
                    Ok(t) => Ok(t.with_timezone(&Utc)),
                    Err(_) => Err(Got::Str(s)),
                },
                other => Err(other),
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance::Schedule;
    use crate::Engine;
    use serde_json::json;

    fn engine_err(v: Value) -> String {
        match EngineOptions::from_json(v) {
            Err(Error::InvalidConfig(m)) => m,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    fn insert_err(v: Value) -> (&'static str, String) {
        match InsertOptions::from_json(v) {
            Err(Error::InvalidInput { field, reason }) => (field, reason),
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn unknown_options_are_named() {
        let m = engine_err(json!({"queues": {"default": 1}, "colour": "blue"}));
        assert!(m.starts_with(r#"engine options: unknown option "colour" (known: url, schema,"#));
        assert!(m.contains("rate_limits"), "{m}");

        let m = engine_err(json!({"concurrency_limits": {"stripe": {"limit": 2, "size": 1}}}));
        assert_eq!(
            m,
            r#"engine option concurrency_limits.stripe: unknown option "size" (known: limit, shards)"#
        );

        let (field, m) = insert_err(json!({"workflow": "W", "colour": "blue"}));
        assert_eq!(field, "options");
        assert!(
            m.starts_with(r#"unknown option "colour" (known: workflow, state,"#),
            "{m}"
        );
    }

    #[test]
    fn wrong_types_are_named() {
        let cases = [
            (
                json!({"queues": {"default": "x"}}),
                r#"engine option queues.default: expected a positive integer, got "x""#,
            ),
            (
                json!({"queues": {"default": -1}}),
                "engine option queues.default: expected a positive integer, got -1",
            ),
            (
                json!({"queues": {"default": 4_294_967_296u64}}),
                "engine option queues.default: expected a positive integer, got 4294967296",
            ),
            (
                json!({"queues": ["default"]}),
                "engine option queues: expected a map, got a list",
            ),
            (
                json!({"schema": 5}),
                "engine option schema: expected a string, got 5",
            ),
            (
                json!({"poll_interval": 1.5}),
                "engine option poll_interval: expected a positive integer (milliseconds), got 1.5",
            ),
            (
                json!({"rate_limits": {"openai": {"limit": 10}}}),
                "engine option rate_limits.openai: period is required",
            ),
            (
                json!({"rate_limits": {"openai": 10}}),
                "engine option rate_limits.openai: expected a map with limit, period \
                 (milliseconds) and optionally burst, got 10",
            ),
            (
                json!({"retention": "forever"}),
                r#"engine option retention: expected a non-negative integer (milliseconds) or "infinity", got "forever""#,
            ),
            (
                json!({"pool_size": 0}),
                "engine option pool_size: expected a positive integer, got 0",
            ),
            (
                json!({"step_rate_limits": {"Account.Sync": {"push": 7}}}),
                r#"engine option step_rate_limits["Account.Sync"].push: expected a string, got 7"#,
            ),
            (
                json!(["queues"]),
                "engine options: expected a map of engine options, got a list",
            ),
        ];
        for (v, want) in cases {
            assert_eq!(engine_err(v), want);
        }

        let cases = [
            (
                json!({"workflow": "W", "priority": "high"}),
                "priority",
                r#"expected an integer, got "high""#,
            ),
            (
                json!({"workflow": "W", "priority": 100_000}),
                "priority",
                "expected an integer, got 100000",
            ),
            (
                json!({"workflow": "W", "schedule_in": -5}),
                "schedule_in",
                "expected a non-negative integer (milliseconds), got -5",
            ),
            (
                json!({"workflow": "W", "scheduled_at": "tomorrow"}),
                "scheduled_at",
                r#"expected an RFC 3339 timestamp such as "2030-01-01T12:00:00Z", got "tomorrow""#,
            ),
            (
                json!({"workflow": "W", "queue": 5}),
                "queue",
                "expected a string, got 5",
            ),
            (
                json!({"workflow": 5}),
                "workflow",
                "expected a string, got 5",
            ),
            (json!({"state": {}}), "workflow", "is required"),
            (
                json!({"workflow": "W", "schedule_in": 5, "scheduled_at": "2030-01-01T00:00:00Z"}),
                "scheduled_at",
                "give schedule_in or scheduled_at, not both",
            ),
            (
                json!("W"),
                "options",
                r#"expected a map of insert options, got "W""#,
            ),
            (
                json!({"workflow": "W", "unique": {"period": -1}}),
                "unique.period",
                "expected a positive integer (milliseconds), got -1",
            ),
            (
                json!({"workflow": "W", "unique": {"states": "done"}}),
                "unique.states",
                r#"expected "active", "all" or a list of statuses, got "done""#,
            ),
            (
                json!({"workflow": "W", "unique": {"states": ["finished"]}}),
                "unique.states",
                r#""finished" is not a status (scheduled, available, executing, awaiting, completed, cancelled, discarded)"#,
            ),
            (
                json!({"workflow": "W", "unique": {"fields": "account"}}),
                "unique.fields",
                r#"expected a list, got "account""#,
            ),
            (
                json!({"workflow": "W", "unique": {"keys": ["account"]}}),
                "unique",
                r#"unknown option "keys" (known: fields, period, states)"#,
            ),
            (
                json!({"workflow": "W", "unique": true}),
                "unique",
                "expected a map with fields, period (milliseconds) and states, each optional, got true",
            ),
            (
                json!({"workflow": "W", "idempotency_key": 42}),
                "idempotency_key",
                "expected a string, got 42",
            ),
        ];
        for (v, field, want) in cases {
            assert_eq!(insert_err(v), (field, want.to_owned()));
        }
        let long = "x".repeat(1000);
        let (_, m) = insert_err(json!({"workflow": "W", "queue": [long]}));
        assert_eq!(m, "expected a string, got a list");
        let (_, m) = insert_err(json!({"workflow": "W", "priority": long}));
        assert!(m.len() < 120, "{m}");
    }

    #[test]
    fn bindings_name_what_they_cannot_convert() {
        let e =
            EngineOptions::error_at(&["step_rate_limits", "A.B", "push"], "a tuple is not JSON");
        assert_eq!(
            e.to_string(),
            r#"invalid configuration: engine option step_rate_limits["A.B"].push: a tuple is not JSON"#
        );
        let e = InsertOptions::error_at("state", "not JSON: a pid is not JSON");
        assert_eq!(e.to_string(), "invalid state: not JSON: a pid is not JSON");
        let e = InsertOptions::error_at("colour", "not JSON");
        assert!(matches!(
            e,
            Error::InvalidInput {
                field: "options",
                ..
            }
        ));
    }

    #[test]
    fn defaults() {
        assert_eq!(
            EngineOptions::from_json(json!({})).unwrap(),
            EngineOptions::default()
        );
        let nulls = json!({"url": null, "queues": null, "concurrency_limits": null,
            "lease": null, "retention": null, "backoff": null, "pool_size": null});
        assert_eq!(
            EngineOptions::from_json(nulls).unwrap(),
            EngineOptions::default()
        );

        let o = EngineOptions::from_json(json!({
            "concurrency_limits": {"stripe": {"limit": 3}},
            "rate_limits": {"openai": {"limit": 10, "period": 1000}},
        }))
        .unwrap();
        assert_eq!(o.concurrency_limits["stripe"].shards, None);
        assert_eq!(o.rate_limits["openai"].burst, None);

        let new = NewInstance::from_json(json!({"workflow": "W"})).unwrap();
        let plain = NewInstance::new("W", json!({}));
        assert_eq!(new.state, json!({}));
        assert_eq!(new.step, plain.step);
        assert_eq!(new.queue, plain.queue);
        assert_eq!(new.priority, plain.priority);
        assert_eq!(new.max_attempts, plain.max_attempts);
        assert_eq!(new.concurrency_key, None);
        assert_eq!(new.rate_limit, None);
        assert_eq!(new.schedule, Schedule::Now);
    }

    #[test]
    fn applied_values_are_checked_by_the_builder() {
        let o = EngineOptions::from_json(json!({
            "url": "postgres://localhost/app",
            "queues": {"default": 0},
        }))
        .unwrap();
        let e = o.apply(Engine::builder()).validate().unwrap_err();
        assert!(
            e.to_string()
                .contains("concurrency must be from 1 to 10000, got 0"),
            "{e}"
        );

        let o = EngineOptions::from_json(json!({
            "url": "postgres://localhost/app",
            "rate_limits": {"api": {"limit": 5, "period": 1000}},
            "step_rate_limits": {"Account.Sync": {"push": "openai:x"}},
        }))
        .unwrap();
        let b = o
            .apply(Engine::builder())
            .workflow_fn("Account.Sync", |_step, state, _ctx| async move {
                Ok(crate::Transition::done(state))
            });
        let e = b.validate().unwrap_err().to_string();
        assert!(
            e.contains("Account.Sync") && e.contains("\"openai\""),
            "{e}"
        );
    }

    #[test]
    fn round_trip() {
        let full = json!({
            "url": "postgres://localhost/app",
            "schema": "app_jobs",
            "node_id": "web-1",
            "queues": {"default": 10, "mailers": 5},
            "concurrency_limits": {"stripe": {"limit": 100, "shards": 10}, "db": {"limit": 2, "shards": null}},
            "rate_limits": {"openai": {"limit": 100, "period": 60000, "burst": 10}},
            "step_rate_limits": {"Summarize": {"call_api": "openai:default"}},
            "workflow_defaults": {"Summarize": {"queue": "ai", "priority": 1, "max_attempts": 3,
                                                "backoff": {"base": 10, "max": 20},
                                                "timeout": 30000}},
            "step_timeouts": {"Summarize": {"call_api": 5000}},
            "poll_interval": 500,
            "heartbeat_interval": 1000,
            "lease": 5000,
            "shutdown_timeout": 0,
            "gc_interval": 2000,
            "connect_timeout": 3000,
            "call_timeout": 45000,
            "backoff": {"base": 100, "max": 60000},
            "retention": "infinity",
            "pool_size": 12,
            "prefetch": 0,
            "cron": [],
            "metrics_listen": "127.0.0.1:9090",
        });
        let o = EngineOptions::from_json(full.clone()).unwrap();
        assert_eq!(o.queues["mailers"], 5);
        assert_eq!(o.retention, Some(Retention::Forever));
        assert_eq!(serde_json::to_value(&o).unwrap(), full);
        assert_eq!(
            EngineOptions::from_json(serde_json::to_value(&o).unwrap()).unwrap(),
            o
        );
        let o2 = EngineOptions::from_json(json!({"retention": 86_400_000})).unwrap();
        assert_eq!(o2.retention, Some(Retention::Millis(86_400_000)));
        o.apply(Engine::builder())
            .workflow_fn("Summarize", |_step, state, _ctx| async move {
                Ok(crate::Transition::done(state))
            })
            .validate()
            .unwrap();

        let full = json!({
            "workflow": "Account.Sync",
            "state": {"id": 7, "tags": ["a"]},
            "step": "push",
            "queue": "sync",
            "priority": 3,
            "concurrency_key": "account:7",
            "rate_limit": "openai:7",
            "schedule_in": null,
            "scheduled_at": "2030-01-01T12:00:00.123456Z",
            "max_attempts": 5,
            "unique": {"fields": ["id"], "period": 60000, "states": ["scheduled", "available",
                       "executing", "awaiting", "cancelled"]},
            "idempotency_key": "sync:7",
        });
        let o = InsertOptions::from_json(full.clone()).unwrap();
        assert_eq!(serde_json::to_value(&o).unwrap(), full);
        assert_eq!(
            InsertOptions::from_json(serde_json::to_value(&o).unwrap()).unwrap(),
            o
        );
        let new = NewInstance::from(o);
        assert_eq!(new.workflow, "Account.Sync");
        assert_eq!(new.state, json!({"id": 7, "tags": ["a"]}));
        assert_eq!(new.step, "push");
        assert_eq!(new.queue.as_deref(), Some("sync"));
        assert_eq!(new.priority, Some(3));
        assert_eq!(new.concurrency_key.as_deref(), Some("account:7"));
        assert_eq!(new.rate_limit.as_deref(), Some("openai:7"));
        assert_eq!(new.max_attempts, Some(5));
        let at = DateTime::parse_from_rfc3339("2030-01-01T12:00:00.123456Z").unwrap();
        assert_eq!(new.schedule, Schedule::At(at.with_timezone(&Utc)));
        assert_eq!(new.idempotency_key.as_deref(), Some("sync:7"));
        assert_eq!(
            new.unique,
            Some(
                Unique::new()
                    .fields(["id"])
                    .period(Duration::from_secs(60))
                    .statuses([
                        Status::Scheduled,
                        Status::Available,
                        Status::Executing,
                        Status::Awaiting,
                        Status::Cancelled
                    ])
            )
        );
        new.validate().unwrap();
        for (states, want) in [("active", &ACTIVE_STATUSES[..]), ("all", &ALL_STATUSES[..])] {
            let new =
                NewInstance::from_json(json!({"workflow": "W", "unique": {"states": states}}))
                    .unwrap();
            assert_eq!(new.unique.unwrap().statuses, want);
        }

        let new = NewInstance::from_json(json!({"workflow": "W", "schedule_in": 1500})).unwrap();
        assert_eq!(new.schedule, Schedule::In(Duration::from_millis(1500)));
    }

    #[test]
    fn cron_entries() {
        let o = EngineOptions::from_json(json!({"cron": [
            {"schedule": "0 6 * * *", "instance": {"workflow": "Report", "state": {"k": 1},
             "unique": {}}, "name": "daily", "timezone": "Europe/Paris", "missed": "all"},
            {"schedule": "*/5 * * * *", "instance": {"workflow": "Sweep"}},
        ]}))
        .unwrap();
        assert_eq!(
            EngineOptions::from_json(serde_json::to_value(&o).unwrap()).unwrap(),
            o
        );
        let entry = CronEntry::from(o.cron[0].clone());
        assert_eq!(entry.entry_name(), "daily");
        assert_eq!(
            (entry.timezone.as_str(), entry.missed),
            ("Europe/Paris", Missed::All)
        );
        assert_eq!(entry.instance.state, json!({"k": 1}));
        assert!(entry.instance.unique.is_some());
        assert_eq!(CronEntry::from(o.cron[1].clone()).missed, Missed::Latest);

        for (v, want) in [
            (
                json!({"cron": [{"schedule": "* * * * *"}]}),
                "engine option cron[0]: instance is required",
            ),
            (
                json!({"cron": [{"schedule": "* * * * *", "instance": {"workflow": "W"},
                                 "missed": "never"}]}),
                r#"engine option cron[0].missed: expected "latest", "all" or "skip", got "never""#,
            ),
            (
                json!({"cron": [{"schedule": "* * * * *", "instance": {"workflow": "W", "priority": "x"}}]}),
                r#"engine option cron[0].instance.priority: expected an integer, got "x""#,
            ),
            (
                json!({"cron": {"schedule": "* * * * *"}}),
                "engine option cron: expected a list, got a map",
            ),
        ] {
            assert_eq!(engine_err(v), want);
        }
    }
}
