//! Counters of what a node did, for tests, benches and monitoring.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Monotonic counters; read them with [`Stats::snapshot`].
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) picks: AtomicU64,
    pub(crate) claimed: AtomicU64,
    pub(crate) pick_conflicts: AtomicU64,
    pub(crate) pick_errors: AtomicU64,
    pub(crate) outcomes: AtomicU64,
    pub(crate) outcome_batches: AtomicU64,
    pub(crate) fenced: AtomicU64,
    pub(crate) rescued: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) handed_over: AtomicU64,
    pub(crate) started_on_insert: AtomicU64,
    pub(crate) successors: AtomicU64,
    pub(crate) unparked: AtomicU64,
    pub(crate) not_admitted: AtomicU64,
    pub(crate) stopped: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Pick statements run.
    pub picks: u64,
    /// Rows claimed by them.
    pub claimed: u64,
    /// Picks that lost a race on a K = 1 key and were retried.
    pub pick_conflicts: u64,
    /// Picks that failed otherwise (connection lost, ...).
    pub pick_errors: u64,
    /// Outcomes written.
    pub outcomes: u64,
    /// Statements that wrote them.
    pub outcome_batches: u64,
    /// Outcomes dropped because the row had been rescued by then.
    pub fenced: u64,
    /// Rows rescued from dead nodes by this node's reaper.
    pub rescued: u64,
    /// Claimed rows handed back unstarted at shutdown.
    pub released: u64,
    /// Rows claimed without a pick: a key or gate slot an outcome freed in
    /// a dry queue went straight to the key's next row (also in `claimed`).
    pub handed_over: u64,
    /// Rows this process's inserts claimed for its own node, which started
    /// them at once without a pick (also in `claimed`).
    pub started_on_insert: u64,
    /// Reserved successors started in the slot a step of their key freed,
    /// and promoted with that step's outcome.
    pub successors: u64,
    /// Parked rows the maintenance sweep and the rate-limit wake-ups put
    /// back where a pick sees them (those unparked by outcomes not counted).
    pub unparked: u64,
    /// Successors started in a freed slot whose promotion did not happen
    /// (their predecessor's outcome was fenced): stopped, nothing recorded.
    pub not_admitted: u64,
    /// Steps stopped because their claim was no longer this node's (the
    /// node had been presumed dead and the row rescued).
    pub stopped: u64,
}

impl Stats {
    /// Read every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            picks: self.picks.load(Relaxed),
            claimed: self.claimed.load(Relaxed),
            pick_conflicts: self.pick_conflicts.load(Relaxed),
            pick_errors: self.pick_errors.load(Relaxed),
            outcomes: self.outcomes.load(Relaxed),
            outcome_batches: self.outcome_batches.load(Relaxed),
            fenced: self.fenced.load(Relaxed),
            rescued: self.rescued.load(Relaxed),
            released: self.released.load(Relaxed),
            handed_over: self.handed_over.load(Relaxed),
            started_on_insert: self.started_on_insert.load(Relaxed),
            successors: self.successors.load(Relaxed),
            unparked: self.unparked.load(Relaxed),
            not_admitted: self.not_admitted.load(Relaxed),
            stopped: self.stopped.load(Relaxed),
        }
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }
}
