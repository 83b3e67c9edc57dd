//! The configuration the SQL functions take, as arrays.

use crate::config::EngineConfig;

/// The workflows an engine runs and its configured gates and rate limits, in
/// the parallel arrays the SQL functions take (`gi`/`ri` index them there).
/// Built once per engine.
#[derive(Debug)]
pub(crate) struct Limits {
    pub workflows: Vec<String>,
    pub gate_names: Vec<String>,
    pub gate_limits: Vec<i32>,
    pub gate_shards: Vec<i32>,
    pub rate_names: Vec<String>,
    /// GCRA emission intervals, in seconds.
    pub rate_intervals: Vec<f64>,
    /// GCRA tolerances, in seconds.
    pub rate_tolerances: Vec<f64>,
}

impl Limits {
    pub fn new<'a>(cfg: &EngineConfig, workflows: impl Iterator<Item = &'a String>) -> Limits {
        Limits {
            workflows: workflows.cloned().collect(),
            gate_names: cfg.gates.keys().cloned().collect(),
            gate_limits: cfg.gates.values().map(|g| g.limit as i32).collect(),
            gate_shards: cfg
                .gates
                .values()
                .map(|g| g.effective_shards() as i32)
                .collect(),
            rate_names: cfg.rates.keys().cloned().collect(),
            rate_intervals: cfg.rates.values().map(|r| r.interval_secs()).collect(),
            rate_tolerances: cfg.rates.values().map(|r| r.tolerance_secs()).collect(),
        }
    }
}
