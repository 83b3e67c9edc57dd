//! The engine's configuration as the Python layer passes it, turned into the
//! core's builder. The core validates it (`EngineBuilder::validate`).

use gendurable::{Engine, EngineBuilder, GateConfig, RateConfig};
use std::time::Duration;

/// How long a call waits for a connection unless `connect_timeout` says
/// otherwise (the core's default). A refused connection fails at once.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything the core's builder needs apart from the workflows.
pub(crate) struct Settings {
    pub url: String,
    pub schema: String,
    pub node_id: Option<String>,
    pub queues: Vec<(String, u32)>,
    pub gates: Vec<(String, u32, u32)>,
    pub rates: Vec<(String, u32, Duration, u32)>,
    pub heartbeat_interval: Option<Duration>,
    pub lease: Option<Duration>,
    pub poll_interval: Option<Duration>,
    pub gc_interval: Option<Duration>,
    pub shutdown_timeout: Option<Duration>,
    pub retention: Option<Option<Duration>>,
    pub backoff: Option<(Duration, Duration)>,
    pub max_connections: Option<u32>,
    pub connect_timeout: Duration,
}

impl Settings {
    /// The core's builder with these settings; it migrates on the first
    /// call instead of when built (see `core::Client`).
    pub fn builder(&self) -> EngineBuilder {
        let mut b = Engine::builder().url(&self.url).schema(&self.schema);
        if let Some(id) = &self.node_id {
            b = b.node_id(id);
        }
        for (q, n) in &self.queues {
            b = b.queue(q, *n);
        }
        for (name, limit, shards) in &self.gates {
            b = b.concurrency_limit(name, GateConfig::new(*limit).shards(*shards));
        }
        for (name, limit, period, burst) in &self.rates {
            b = b.rate_limit(name, RateConfig::new(*limit, *period).burst(*burst));
        }
        if let Some(d) = self.heartbeat_interval {
            b = b.heartbeat_interval(d);
        }
        if let Some(d) = self.lease {
            b = b.lease(d);
        }
        if let Some(d) = self.poll_interval {
            b = b.poll_interval(d);
        }
        if let Some(d) = self.gc_interval {
            b = b.gc_interval(d);
        }
        if let Some(d) = self.shutdown_timeout {
            b = b.shutdown_timeout(d);
        }
        if let Some(r) = self.retention {
            b = b.retention(r);
        }
        if let Some((base, max)) = self.backoff {
            b = b.backoff(base, max);
        }
        if let Some(n) = self.max_connections {
            b = b.max_connections(n);
        }
        b.connect_timeout(self.connect_timeout).migrate(false)
    }
}
