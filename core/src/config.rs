//! Engine configuration and its validation.

use crate::cron::CronEntry;
use crate::error::{Error, Result};
use crate::validate;
use crate::workflow::WorkflowDefaults;
use gendurable_bulkhead::Bulkhead;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// A concurrency gate: every key whose name (the part before the first `:`) is
/// `name` may have at most `limit` steps executing at once, cluster-wide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateConfig {
    /// Most steps of one key executing at once.
    pub limit: u32,
    /// Counter rows the limit is split over; clamped to `limit`.
    pub shards: u32,
}

impl GateConfig {
    /// A gate of `limit` with one counter row.
    pub fn new(limit: u32) -> Self {
        GateConfig { limit, shards: 1 }
    }

    /// Split the limit over `shards` counter rows (clamped to the limit).
    pub fn shards(mut self, shards: u32) -> Self {
        self.shards = shards;
        self
    }

    /// The shard count actually used.
    pub fn effective_shards(&self) -> u32 {
        self.shards.min(self.limit).max(1)
    }
}

/// Reads a gate given on a command line: `NAME=LIMIT` or `NAME=LIMIT/SHARDS`
/// (`gendurable status --gate`, `mix gendurable.status --gate`).
pub fn parse_gate(s: &str) -> Result<(String, GateConfig)> {
    let bad = |what: &str| Error::input("gate", format!("{s:?}: {what}"));
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| bad("expected NAME=LIMIT or NAME=LIMIT/SHARDS"))?;
    let (limit, shards) = rest.split_once('/').unwrap_or((rest, "1"));
    let limit = limit.parse().map_err(|_| bad("bad limit"))?;
    let shards = shards.parse().map_err(|_| bad("bad shard count"))?;
    Ok((name.to_owned(), GateConfig::new(limit).shards(shards)))
}

/// A rate limit: steps carrying a rate-limit key whose name is configured start
/// at a sustained `limit` per `period`, with at most `burst` back to back.
/// In any window of one `period` at most `limit + burst - 1` steps start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateConfig {
    /// Starts per period, sustained.
    pub limit: u32,
    /// The period.
    pub period: Duration,
    /// How many may start back to back after an idle spell (default 1: evenly spaced).
    pub burst: u32,
}

impl RateConfig {
    /// `limit` starts per `period`, evenly spaced (burst 1).
    pub fn new(limit: u32, period: Duration) -> Self {
        RateConfig {
            limit,
            period,
            burst: 1,
        }
    }

    /// Allow `burst` starts back to back.
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = burst;
        self
    }

    /// GCRA emission interval, in seconds.
    pub(crate) fn interval_secs(&self) -> f64 {
        self.period.as_secs_f64() / f64::from(self.limit)
    }

    /// GCRA tolerance, in seconds.
    pub(crate) fn tolerance_secs(&self) -> f64 {
        self.interval_secs() * f64::from(self.burst - 1)
    }
}

/// Everything about a node's behaviour; built by [`crate::EngineBuilder`].
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub(crate) schema: String,
    pub(crate) node_id: String,
    pub(crate) queues: BTreeMap<String, u32>,
    /// The most rows claimed ahead per queue, beyond its concurrency.
    pub(crate) prefetch: Option<u32>,
    pub(crate) gates: BTreeMap<String, GateConfig>,
    pub(crate) rates: BTreeMap<String, RateConfig>,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) lease: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) gc_interval: Duration,
    pub(crate) shutdown_timeout: Duration,
    /// How long an application call may go unanswered before it is given up.
    pub(crate) call_timeout: Duration,
    pub(crate) retention: Option<Duration>,
    pub(crate) backoff_base: Duration,
    pub(crate) backoff_max: Duration,
    /// Per workflow: insert defaults and retry backoff.
    pub(crate) workflow_defaults: BTreeMap<String, WorkflowDefaults>,
    /// Periodic workflows this node inserts.
    pub(crate) cron: Vec<CronEntry>,
    /// Per workflow, per step: how long it may run.
    pub(crate) step_timeouts: BTreeMap<String, BTreeMap<String, Duration>>,
    /// Inserts run what they insert before they return (tests).
    pub(crate) inline: bool,
    /// Where a started node serves `GET /metrics`.
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,
    /// The application's bulkheads whose gauges the metrics show, by name.
    pub(crate) bulkheads: BTreeMap<String, Arc<Bulkhead>>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            schema: "gendurable".into(),
            node_id: default_node_id(),
            queues: BTreeMap::new(),
            prefetch: None,
            gates: BTreeMap::new(),
            rates: BTreeMap::new(),
            heartbeat_interval: Duration::from_secs(5),
            lease: Duration::from_secs(20),
            poll_interval: Duration::from_secs(1),
            gc_interval: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(15),
            call_timeout: Duration::from_secs(60),
            retention: Some(Duration::from_secs(7 * 24 * 3600)),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(3600),
            workflow_defaults: BTreeMap::new(),
            cron: Vec::new(),
            step_timeouts: BTreeMap::new(),
            inline: false,
            metrics_listen: None,
            bulkheads: BTreeMap::new(),
        }
    }
}

impl EngineConfig {
    /// How long a step of `workflow` may run: the step's own timeout, else
    /// the workflow's, else none.
    pub(crate) fn timeout_of(&self, workflow: &str, step: &str) -> Option<Duration> {
        self.step_timeouts
            .get(workflow)
            .and_then(|steps| steps.get(step))
            .copied()
            .or_else(|| self.workflow_defaults.get(workflow)?.timeout)
    }
}

/// The most steps one queue of one node runs at once.
pub const MAX_QUEUE_CONCURRENCY: u32 = 10_000;
/// The most rows one queue claims ahead of its free slots.
pub const MAX_PREFETCH: u32 = 1_000_000;
/// The default cap on rows claimed ahead, per running slot: no-op steps at
/// concurrency 20 fill calls of about 1,600 rows (2,000 claimed ahead filled
/// about 500, and ran W1 a fifth slower; docs/performance.md).
const PREFETCH_PER_SLOT: u32 = 250;

impl EngineConfig {
    /// The most rows a queue of this concurrency claims ahead.
    pub(crate) fn prefetch_for(&self, concurrency: u32) -> u32 {
        self.prefetch.unwrap_or(
            concurrency
                .saturating_mul(PREFETCH_PER_SLOT)
                .min(MAX_PREFETCH),
        )
    }

    /// Check every setting; the first problem found is returned.
    pub fn validate(&self) -> Result<()> {
        validate::schema(&self.schema)?;
        validate::name("node_id", &self.node_id).map_err(|e| Error::config(e.to_string()))?;
        for (queue, &concurrency) in &self.queues {
            validate::name("queue", queue).map_err(|e| Error::config(e.to_string()))?;
            if !(1..=MAX_QUEUE_CONCURRENCY).contains(&concurrency) {
                return Err(Error::config(format!(
                    "queue {queue:?}: concurrency must be from 1 to {MAX_QUEUE_CONCURRENCY}, \
                     got {concurrency}"
                )));
            }
        }
        if let Some(n) = self.prefetch.filter(|&n| n > MAX_PREFETCH) {
            return Err(Error::config(format!(
                "prefetch must be at most {MAX_PREFETCH}, got {n}"
            )));
        }
        for (name, gate) in &self.gates {
            config_name("concurrency_limits", name)?;
            if gate.limit < 1 {
                return Err(Error::config(format!(
                    "concurrency_limits {name:?}: limit must be at least 1, got {}",
                    gate.limit
                )));
            }
            if gate.shards < 1 {
                return Err(Error::config(format!(
                    "concurrency_limits {name:?}: shards must be at least 1, got {}",
                    gate.shards
                )));
            }
        }
        for (name, rate) in &self.rates {
            config_name("rate_limits", name)?;
            if rate.limit < 1 {
                return Err(Error::config(format!(
                    "rate_limits {name:?}: limit must be at least 1, got {}",
                    rate.limit
                )));
            }
            if rate.period.is_zero() {
                return Err(Error::config(format!(
                    "rate_limits {name:?}: period must be longer than zero"
                )));
            }
            if rate.burst < 1 {
                return Err(Error::config(format!(
                    "rate_limits {name:?}: burst must be at least 1, got {}",
                    rate.burst
                )));
            }
        }
        for name in self.bulkheads.keys() {
            validate::name("bulkhead", name).map_err(|e| Error::config(e.to_string()))?;
        }
        for (what, d) in [
            ("heartbeat_interval", self.heartbeat_interval),
            ("lease", self.lease),
            ("poll_interval", self.poll_interval),
            ("gc_interval", self.gc_interval),
            ("backoff_base", self.backoff_base),
            ("call_timeout", self.call_timeout),
        ] {
            if d.is_zero() {
                return Err(Error::config(format!("{what} must be longer than zero")));
            }
        }
        for (workflow, d) in &self.workflow_defaults {
            d.validate(workflow)?;
        }
        if self
            .heartbeat_interval
            .checked_mul(2)
            .is_none_or(|twice| self.lease <= twice)
        {
            return Err(Error::config(format!(
                "lease ({:?}) must be more than twice the heartbeat interval ({:?}), or live nodes would be reaped",
                self.lease, self.heartbeat_interval
            )));
        }
        Ok(())
    }

    /// The retry backoff (base, max) of `workflow`'s errors.
    pub(crate) fn backoff_for(&self, workflow: &str) -> (Duration, Duration) {
        self.workflow_defaults
            .get(workflow)
            .and_then(|d| d.backoff)
            .unwrap_or((self.backoff_base, self.backoff_max))
    }

    /// The gate that captures `key`, if any: configured names capture every key
    /// with that name before the first `:`.
    pub fn gate_for(&self, key: &str) -> Option<(&str, &GateConfig)> {
        self.gates
            .get_key_value(validate::key_name(key))
            .map(|(n, g)| (n.as_str(), g))
    }

    /// The effective K of a concurrency key on this node: the gate's limit, or 1.
    pub fn effective_k(&self, key: &str) -> u32 {
        self.gate_for(key).map_or(1, |(_, g)| g.limit)
    }

    /// The rate limit that captures a rate-limit key, if any.
    pub fn rate_for(&self, key: &str) -> Option<(&str, &RateConfig)> {
        self.rates
            .get_key_value(validate::key_name(key))
            .map(|(n, r)| (n.as_str(), r))
    }
}

fn config_name(section: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.contains(':') || name.chars().any(char::is_control) {
        return Err(Error::config(format!(
            "{section}: {name:?} is not a key name (non-empty, no ':' and no control characters)"
        )));
    }
    Ok(())
}

fn default_node_id() -> String {
    let host = hostname();
    format!(
        "{host}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// This machine's host name, for node ids and `status`.
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_of_any_size_are_checked_without_overflow() {
        let huge = EngineConfig {
            heartbeat_interval: Duration::MAX,
            lease: Duration::MAX,
            ..EngineConfig::default()
        };
        assert!(huge.validate().is_err(), "no lease is twice Duration::MAX");
        let long = EngineConfig {
            lease: Duration::MAX,
            shutdown_timeout: Duration::MAX,
            call_timeout: Duration::MAX,
            ..EngineConfig::default()
        };
        long.validate().unwrap();
    }

    #[test]
    fn the_default_claim_ahead_stays_within_the_documented_maximum() {
        let c = EngineConfig::default();
        assert_eq!(c.prefetch_for(20), 20 * PREFETCH_PER_SLOT);
        assert_eq!(c.prefetch_for(MAX_QUEUE_CONCURRENCY), MAX_PREFETCH);
        let set = EngineConfig {
            prefetch: Some(7),
            ..EngineConfig::default()
        };
        assert_eq!(set.prefetch_for(MAX_QUEUE_CONCURRENCY), 7);
    }

    #[test]
    fn rejects_bad_values() {
        let mut c = EngineConfig::default();
        c.queues.insert("default".into(), 0);
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("concurrency must be from 1 to 10000, got 0"));

        let mut c = EngineConfig::default();
        c.gates.insert("stripe".into(), GateConfig::new(0));
        assert!(c.validate().is_err());

        let mut c = EngineConfig::default();
        c.gates
            .insert("stripe".into(), GateConfig::new(5).shards(0));
        assert!(c.validate().is_err());

        let mut c = EngineConfig::default();
        c.rates
            .insert("openai".into(), RateConfig::new(10, Duration::ZERO));
        assert!(c.validate().is_err());

        let mut c = EngineConfig::default();
        c.gates.insert("a:b".into(), GateConfig::new(2));
        assert!(c.validate().is_err());

        let c = EngineConfig {
            schema: "Bad".into(),
            ..Default::default()
        };
        assert!(c.validate().is_err());
    }

    #[test]
    fn capture_and_shards() {
        let mut c = EngineConfig::default();
        c.gates.insert("order".into(), GateConfig::new(5).shards(9));
        assert_eq!(c.effective_k("order:42"), 5);
        assert_eq!(c.effective_k("order"), 5);
        assert_eq!(c.effective_k("orders:1"), 1);
        assert_eq!(c.gate_for("order:1").unwrap().1.effective_shards(), 5);
    }
}
