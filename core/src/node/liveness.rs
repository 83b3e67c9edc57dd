//! Whether this node may start work: its last heartbeat is recent enough that
//! no other node can have presumed it dead.
//!
//! The reaper rescues a node's rows once its `heartbeat_at` (the database's
//! clock when the heartbeat committed) is older than the lease. A heartbeat
//! commits after it was sent, so a node that measures from the moment it
//! sent its last successful heartbeat is never later than the reaper. The
//! node stops starting work a heartbeat interval before that point, which
//! leaves room for a step to be handed to the runtime and for clock drift.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

pub(crate) struct Liveness {
    epoch: Instant,
    /// Nanoseconds after `epoch` until which the node may start work.
    until: AtomicU64,
    /// How long after a heartbeat is sent the node stays live.
    window: Duration,
    renewed: Notify,
}

impl Liveness {
    /// Live for `window` after each heartbeat sent; not live until the first.
    pub fn new(window: Duration) -> Liveness {
        Liveness {
            epoch: Instant::now(),
            until: AtomicU64::new(0),
            window,
            renewed: Notify::new(),
        }
    }

    fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    pub fn is_live(&self) -> bool {
        self.nanos(Instant::now()) < self.until.load(SeqCst)
    }

    /// A heartbeat sent at `sent` committed. Returns whether the node was
    /// live until then: if not, it may have been presumed dead meanwhile.
    pub fn renewed(&self, sent: Instant) -> bool {
        let was = self.nanos(sent) < self.until.load(SeqCst);
        self.until.fetch_max(self.nanos(sent + self.window), SeqCst);
        self.renewed.notify_waiters();
        was
    }

    /// Wait until the node is no longer live: a window passed without a
    /// heartbeat renewing it.
    pub async fn lapsed(&self) {
        loop {
            let until = self.until.load(SeqCst);
            if self.nanos(Instant::now()) >= until {
                return;
            }
            let at = self.epoch + Duration::from_nanos(until);
            tokio::time::sleep_until(at.into()).await;
        }
    }

    /// Wait until the node is live again.
    pub async fn wait(&self) {
        loop {
            let renewed = self.renewed.notified();
            if self.is_live() {
                return;
            }
            renewed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_only_within_the_window_of_a_heartbeat() {
        let l = Liveness::new(Duration::from_secs(3600));
        assert!(!l.is_live(), "not live before the first heartbeat");
        assert!(!l.renewed(Instant::now()));
        assert!(l.is_live());
        assert!(l.renewed(Instant::now()));
        let stale = Liveness::new(Duration::ZERO);
        stale.renewed(Instant::now());
        assert!(!stale.is_live(), "a heartbeat older than the window");
    }

    #[tokio::test]
    async fn lapses_once_the_window_of_the_last_heartbeat_passed() {
        let l = Liveness::new(Duration::from_millis(20));
        l.lapsed().await;
        l.renewed(Instant::now());
        assert!(l.is_live());
        l.lapsed().await;
        assert!(!l.is_live(), "lapsed while still live");
    }
}
