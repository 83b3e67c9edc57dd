//! Counters of what a node did, for tests, benches and monitoring.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

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
    pub(crate) rate_limited: AtomicU64,
    pub(crate) not_admitted: AtomicU64,
    pub(crate) stopped: AtomicU64,
    pub(crate) steps_started: AtomicU64,
    pub(crate) steps_completed: AtomicU64,
    pub(crate) steps_failed: AtomicU64,
    pub(crate) repaired: AtomicU64,
    /// How long claiming calls took (see `Stats::pick_latency`).
    pub(crate) pick_time: Histogram,
    /// How long steps ran.
    pub(crate) step_time: Histogram,
}

/// Durations in buckets a quarter of a power of two wide (about 19 % apart),
/// from 1 µs to about 70 s: enough to read a p99 from, lock-free to record;
/// and their sum, in microseconds.
#[derive(Debug)]
pub(crate) struct Histogram([AtomicU64; Histogram::BUCKETS], AtomicU64);

impl Default for Histogram {
    fn default() -> Self {
        Histogram(
            std::array::from_fn(|_| AtomicU64::new(0)),
            AtomicU64::new(0),
        )
    }
}

impl Histogram {
    const BUCKETS: usize = 104;

    fn bucket(d: Duration) -> usize {
        let us = d.as_secs_f64() * 1e6;
        ((us.max(1.0).log2() * 4.0) as usize).min(Self::BUCKETS - 1)
    }

    pub fn record(&self, d: Duration) {
        self.0[Self::bucket(d)].fetch_add(1, Relaxed);
        self.1
            .fetch_add(d.as_micros().min(u128::from(u32::MAX)) as u64, Relaxed);
    }

    /// The sum of the durations recorded.
    pub fn sum(&self) -> Duration {
        Duration::from_micros(self.1.load(Relaxed))
    }

    /// How many durations were at most `le`, counting each bucket whose
    /// upper bound is at most `le` (a Prometheus histogram's bucket).
    pub fn at_most(&self, le: Duration) -> u64 {
        let us = le.as_secs_f64() * 1e6;
        self.0
            .iter()
            .enumerate()
            .take_while(|(i, _)| 2f64.powf((*i + 1) as f64 / 4.0) <= us)
            .map(|(_, c)| c.load(Relaxed))
            .sum()
    }

    /// How many durations were recorded.
    pub fn count(&self) -> u64 {
        self.0.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// A copy of the counts, to compare with a later one.
    pub fn copy(&self) -> Latencies {
        Latencies(self.0.iter().map(|c| c.load(Relaxed)).collect())
    }

    pub fn quantile(&self, q: f64) -> Duration {
        self.copy().quantile(q)
    }
}

/// Durations counted in [`Stats`]' buckets at one moment: read a quantile
/// from them, or from what was recorded between two moments
/// ([`Latencies::since`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Latencies(Vec<u64>);

impl Latencies {
    /// What was recorded after `earlier` (a copy taken before this one).
    pub fn since(&self, earlier: &Latencies) -> Latencies {
        Latencies(
            self.0
                .iter()
                .zip(earlier.0.iter().chain(std::iter::repeat(&0)))
                .map(|(now, then)| now.saturating_sub(*then))
                .collect(),
        )
    }

    /// How many durations are counted.
    pub fn count(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The count in each bucket (bucket `i` ends at 2^((i + 1) / 4) µs).
    pub fn counts(&self) -> &[u64] {
        &self.0
    }

    /// Latencies from bucket counts (as [`Latencies::counts`] gives them),
    /// to read quantiles of durations recorded elsewhere.
    pub fn from_counts(counts: Vec<u64>) -> Latencies {
        Latencies(counts)
    }

    /// These durations and `other`'s together (of several nodes, say).
    pub fn plus(&self, other: &Latencies) -> Latencies {
        let n = self.0.len().max(other.0.len());
        let at = |l: &Latencies, i: usize| l.0.get(i).copied().unwrap_or(0);
        Latencies((0..n).map(|i| at(self, i) + at(other, i)).collect())
    }

    /// The upper bound of the bucket holding quantile `q` (0 if empty), to
    /// within about 19 %.
    pub fn quantile(&self, q: f64) -> Duration {
        let counts = &self.0;
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return Duration::ZERO;
        }
        let rank = ((total as f64) * q.clamp(0.0, 1.0)).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Duration::from_secs_f64(2f64.powf((i + 1) as f64 / 4.0) / 1e6);
            }
        }
        Duration::MAX
    }
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
    /// Runnable rows this node's claims found under a rate limit that
    /// allowed no start now, and parked until it allows one (as
    /// `gendurable_rate_limited_total`).
    pub rate_limited: u64,
    /// Successors started in a freed slot whose promotion did not happen
    /// (their queue paused meanwhile, or their predecessor's row rescued):
    /// stopped, nothing they did recorded.
    pub not_admitted: u64,
    /// Steps stopped because their claim was, or may soon be, no longer
    /// this node's: the node could not heartbeat within its lease (its rows
    /// may be rescued), or it had been presumed dead and the row rescued.
    pub stopped: u64,
    /// Steps started on this node.
    pub steps_started: u64,
    /// Steps whose outcome completed their instance.
    pub steps_completed: u64,
    /// Steps whose outcome recorded an error (returned or raised, a panic,
    /// a timeout, a discard, a cancellation while running).
    pub steps_failed: u64,
    /// Gate counters the reconciler repaired.
    pub repaired: u64,
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
            rate_limited: self.rate_limited.load(Relaxed),
            not_admitted: self.not_admitted.load(Relaxed),
            stopped: self.stopped.load(Relaxed),
            steps_started: self.steps_started.load(Relaxed),
            steps_completed: self.steps_completed.load(Relaxed),
            steps_failed: self.steps_failed.load(Relaxed),
            repaired: self.repaired.load(Relaxed),
        }
    }

    /// Quantile `q` (0.99: the p99) of how long this node's claiming calls
    /// took (picks, and outcome calls that also claim), to within about 19 %.
    pub fn pick_latency(&self, q: f64) -> Duration {
        self.pick_time.quantile(q)
    }

    /// The claiming calls' durations so far (see `pick_latency`): take one
    /// copy before and one after a stretch of work, and read the stretch's
    /// quantiles from `after.since(&before)`.
    pub fn pick_latencies(&self) -> Latencies {
        self.pick_time.copy()
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_the_buckets() {
        let h = Histogram::default();
        assert_eq!(h.quantile(0.99), Duration::ZERO);
        for _ in 0..99 {
            h.record(Duration::from_micros(100));
        }
        h.record(Duration::from_millis(50));
        let p50 = h.quantile(0.5);
        assert!(
            p50 >= Duration::from_micros(100) && p50 < Duration::from_micros(120),
            "{p50:?}"
        );
        assert!(h.quantile(0.99) < Duration::from_micros(120));
        assert!(h.quantile(1.0) >= Duration::from_millis(50));
        h.record(Duration::MAX);
        assert!(h.quantile(1.0) >= Duration::from_secs(60));
    }

    #[test]
    fn a_stretch_reads_only_what_it_recorded() {
        let h = Histogram::default();
        for _ in 0..100 {
            h.record(Duration::from_millis(300));
        }
        let before = h.copy();
        for _ in 0..100 {
            h.record(Duration::from_micros(100));
        }
        let stretch = h.copy().since(&before);
        assert_eq!(stretch.count(), 100);
        assert!(stretch.quantile(0.99) < Duration::from_micros(120));
        assert!(h.quantile(0.99) >= Duration::from_millis(300));
    }

    /// Two nodes' latencies read as one: the slow one's few slow calls are
    /// its own p99, not the pair's.
    #[test]
    fn latencies_of_several_nodes_add_up() {
        let (fast, slow) = (Histogram::default(), Histogram::default());
        for _ in 0..1000 {
            fast.record(Duration::from_micros(100));
        }
        for _ in 0..50 {
            slow.record(Duration::from_micros(100));
        }
        slow.record(Duration::from_millis(50));
        let sent = Latencies::from_counts(slow.copy().counts().to_vec());
        assert_eq!(sent, slow.copy());
        let both = fast.copy().plus(&sent);
        assert_eq!(both.count(), 1051);
        assert!(slow.quantile(0.99) >= Duration::from_millis(50));
        assert!(both.quantile(0.99) < Duration::from_micros(120));
        assert!(both.quantile(1.0) >= Duration::from_millis(50));
    }
}
