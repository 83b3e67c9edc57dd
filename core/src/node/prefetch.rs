//! How many rows a queue claims ahead of its free running slots: about as
//! many as it starts in `HORIZON`, up to a cap. Fast steps fill large batches
//! (one round trip and one commit for many rows); slow steps claim almost
//! nothing ahead, so their rows, keys and slots stay free for other nodes.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The look-ahead: rows the queue is expected to start within this time.
pub(crate) const HORIZON: Duration = Duration::from_millis(50);
/// The start rate is re-estimated at most this often.
const SAMPLE: Duration = Duration::from_millis(10);

pub(crate) struct Prefetch {
    cap: usize,
    /// The queue's running slots.
    concurrency: usize,
    started: AtomicU64,
    estimate: Mutex<Estimate>,
    /// How long the queue's steps run, smoothed (microseconds).
    step_micros: Smoothed,
}

/// A smoothed duration, updated without a lock (a lost update under a race
/// only delays the average).
#[derive(Default)]
pub(crate) struct Smoothed(AtomicU64);

impl Smoothed {
    pub fn add(&self, d: Duration) {
        let sample = d.as_micros().min(u64::MAX as u128) as u64;
        let old = self.0.load(Relaxed);
        let new = if old == 0 {
            sample
        } else {
            (old * 7 + sample) / 8
        };
        self.0.store(new.max(1), Relaxed);
    }

    pub fn get(&self) -> Duration {
        Duration::from_micros(self.0.load(Relaxed))
    }
}

struct Estimate {
    at: Instant,
    started: u64,
    per_sec: f64,
}

impl Prefetch {
    pub fn new(cap: u32, concurrency: u32) -> Prefetch {
        Prefetch {
            cap: cap as usize,
            concurrency: concurrency as usize,
            started: AtomicU64::new(0),
            estimate: Mutex::new(Estimate {
                at: Instant::now(),
                started: 0,
                per_sec: 0.0,
            }),
            step_micros: Smoothed::default(),
        }
    }

    /// A step of the queue ran for `d`.
    pub fn ran(&self, d: Duration) {
        self.step_micros.add(d);
    }

    /// How long the queue's steps run, smoothed.
    pub fn step_time(&self) -> Duration {
        self.step_micros.get()
    }

    /// A step of the queue started.
    pub fn started(&self) {
        self.started.fetch_add(1, Relaxed);
    }

    /// Rows to claim ahead now.
    pub fn ahead(&self) -> usize {
        let mut e = self.estimate.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let dt = now.duration_since(e.at);
        if dt >= SAMPLE {
            let n = self.started.load(Relaxed);
            let rate = (n - e.started) as f64 / dt.as_secs_f64();
            // Smoothed, but quick to follow a burst.
            e.per_sec = if rate > e.per_sec {
                rate
            } else {
                0.5 * e.per_sec + 0.5 * rate
            };
            e.at = now;
            e.started = n;
        }
        let by_rate = (e.per_sec * HORIZON.as_secs_f64()).ceil() as usize;
        // What full slots would start within the horizon, from how long the
        // steps take: the start rate alone only grows as fast as the claims
        // that feed it, so a node starting on a backlog of fast steps took
        // several round trips to claim ahead; this takes one.
        let by_steps = match self.step_micros.get().as_micros() {
            0 => 0,
            us => (self.concurrency as u128 * HORIZON.as_micros() / us) as usize,
        };
        by_rate.max(by_steps).min(self.cap)
    }

    /// Of `free` claim permits (the queue has concurrency + cap in all), how
    /// many to use now.
    pub fn demand(&self, free: usize) -> usize {
        free.saturating_sub(self.cap - self.ahead())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_queue_claims_only_for_free_slots() {
        let p = Prefetch::new(100, 10);
        // 10 slots free, 100 permits of look-ahead unused.
        assert_eq!(p.demand(110), 10);
        assert_eq!(p.demand(50), 0);
    }

    #[test]
    fn fast_steps_claim_ahead_from_their_first_runs() {
        let p = Prefetch::new(100, 10);
        assert_eq!(p.demand(110), 10, "nothing ran yet");
        p.ran(Duration::from_micros(5));
        assert_eq!(p.demand(110), 110);
        let slow = Prefetch::new(100, 10);
        slow.ran(Duration::from_secs(1));
        assert_eq!(slow.demand(110), 10, "one-second steps claim nothing ahead");
    }

    #[test]
    fn a_busy_queue_claims_ahead_up_to_the_cap() {
        let p = Prefetch::new(100, 10);
        for _ in 0..100_000 {
            p.started();
        }
        std::thread::sleep(SAMPLE);
        assert_eq!(p.ahead(), 100);
        assert_eq!(p.demand(110), 110);
    }
}
