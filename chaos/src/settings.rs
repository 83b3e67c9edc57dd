//! What the controller, the nodes and the observer must agree on: the
//! engine's timings, queues, gate and rate limit, and the key spaces.

use gendurable::{Engine, EngineBuilder, GateConfig, RateConfig};
use std::time::Duration;

/// The one workflow every instance runs.
pub const WORKFLOW: &str = "Chaos.Plan";
/// The schema of the run.
pub const SCHEMA: &str = "chaos";

/// Short, so that presumed deaths happen within a run.
pub const LEASE: Duration = Duration::from_secs(2);
pub const HEARTBEAT: Duration = Duration::from_millis(300);
pub const POLL: Duration = Duration::from_millis(150);
pub const GC: Duration = Duration::from_millis(500);

/// Queues and their concurrency; they share keys.
pub const QUEUES: &[(&str, u32)] = &[("a", 4), ("b", 3)];

/// The queues node slot `i` serves: the first both, the second only `a`,
/// the third only `b`, and so on. A row run by a node that does not serve
/// its queue is then visible in the records.
pub fn node_queues(i: usize) -> Vec<&'static str> {
    match i % 3 {
        0 => vec!["a", "b"],
        1 => vec!["a"],
        _ => vec!["b"],
    }
}

/// K = 1 keys are `acct:0` .. `acct:{ACCT_KEYS - 1}`.
pub const ACCT: &str = "acct";
pub const ACCT_KEYS: u32 = 6;
/// Gated keys are `api:0` .. `api:{API_KEYS - 1}`, each `GATE_LIMIT` at once.
pub const GATE: &str = "api";
pub const API_KEYS: u32 = 2;
pub const GATE_LIMIT: u32 = 3;
pub const GATE_SHARDS: u32 = 2;
/// Rate-limit keys are `rl:0` .. `rl:{RATE_KEYS - 1}`.
pub const RATE: &str = "rl";
pub const RATE_KEYS: u32 = 3;
pub const RATE_LIMIT: u32 = 20;
pub const RATE_PERIOD: Duration = Duration::from_secs(2);
pub const RATE_BURST: u32 = 2;

/// The most a step sleeps (plans stay below it), but for the long ones.
pub const MAX_SLEEP_MS: u64 = 400;

/// A long step (one in a hundred) sleeps this long: past the lease, so that a
/// node that lost the database must stop it before its row runs elsewhere.
pub const LONG_SLEEP_MS: std::ops::Range<u64> = 2_500..3_500;
const _: () = assert!(LONG_SLEEP_MS.start > LEASE.as_millis() as u64);

/// A builder with the run's limits and timings, for nodes and the client.
pub fn builder(url: &str) -> EngineBuilder {
    Engine::builder()
        .url(url)
        .schema(SCHEMA)
        .lease(LEASE)
        .heartbeat_interval(HEARTBEAT)
        .poll_interval(POLL)
        .gc_interval(GC)
        .backoff(Duration::from_millis(10), Duration::from_millis(200))
        // Short: a graceful restart aborts the longer steps.
        .shutdown_timeout(Duration::from_millis(250))
        .retention(None)
        .connect_timeout(Duration::from_secs(5))
        .concurrency_limit(GATE, GateConfig::new(GATE_LIMIT).shards(GATE_SHARDS))
        .rate_limit(
            RATE,
            RateConfig::new(RATE_LIMIT, RATE_PERIOD).burst(RATE_BURST),
        )
}

/// The limit of a concurrency key: the gate's, or 1.
pub fn key_limit(key: &str) -> u32 {
    if key.split(':').next() == Some(GATE) {
        GATE_LIMIT
    } else {
        1
    }
}

/// A queue's concurrency on one node.
pub fn queue_limit(queue: &str) -> Option<u32> {
    QUEUES.iter().find(|(q, _)| *q == queue).map(|&(_, n)| n)
}
