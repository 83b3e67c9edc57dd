//! The picker of a queue: claims rows while the node has room for them.

use super::claims::record_and_claim;
use super::executor::{release_unstarted, spawn_step};
use super::{Backoff, Shared};
use crate::error::Result;
use crate::outcome::Claimed;
use crate::stats::Stats;
use crate::store::Demand;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use tokio::sync::{Notify, OwnedSemaphorePermit};

/// A queue's wake-ups, and whether its last pick came back short with
/// nothing new since: then the writer only hands over the keys its outcomes
/// free and skips the pick, which would only walk the same blocked rows again.
#[derive(Default)]
pub(super) struct QueueWake {
    pub(super) notify: Notify,
    /// Counts events that may have made rows runnable (wake-ups, polls).
    events: AtomicU64,
    /// `events + 1` as of the start of the last pick that came back short; 0
    /// while the queue is not known to be dry.
    dry_at: AtomicU64,
    /// Whether the last pick came back short.
    short: AtomicBool,
}

impl QueueWake {
    pub(super) fn wake(&self) {
        self.events.fetch_add(1, SeqCst);
        self.notify.notify_one();
    }

    /// Call before a pick; pass the result to `picked`.
    pub(super) fn before_pick(&self) -> u64 {
        self.events.load(SeqCst)
    }

    pub(super) fn picked(&self, before: u64, wanted: usize, got: usize) {
        if got >= wanted {
            // A full pick may have locked rows past those it claimed (its
            // window), which a pick running beside it skipped and came back
            // short for: free again now, so that short pick proves nothing.
            // Without this, a node with rows left slept until its next poll.
            self.events.fetch_add(1, SeqCst);
        }
        let dry = if got < wanted { before + 1 } else { 0 };
        self.dry_at.store(dry, SeqCst);
        self.short.store(got < wanted, SeqCst);
    }

    pub(super) fn is_short(&self) -> bool {
        self.short.load(SeqCst)
    }

    pub(super) fn is_dry(&self) -> bool {
        self.dry_at.load(SeqCst) == self.events.load(SeqCst) + 1
    }
}

pub(super) async fn picker(sh: Arc<Shared>, queue: String) {
    let slots = sh.slots[&queue].clone();
    let wake = sh.wakes[&queue].clone();
    let prefetch = &sh.prefetch[&queue];
    let mut retry = Backoff::new();
    loop {
        // A node that may have been presumed dead claims nothing until it
        // has heartbeated again.
        tokio::select! {
            _ = sh.live.wait() => {}
            _ = sh.shutdown.cancelled() => return,
        }
        // Claim while there is room and the queue has work.
        loop {
            if sh.shutdown.is_cancelled() {
                return;
            }
            let free = prefetch.demand(slots.available_permits());
            if free == 0 || !sh.live.is_live() {
                break;
            }
            let Ok(permits) = slots.clone().try_acquire_many_owned(free as u32) else {
                break;
            };
            let before = wake.before_pick();
            match pick(&sh, &queue, free).await {
                Ok(rows) => {
                    wake.picked(before, free, rows.len());
                    retry.reset();
                    let got = rows.len();
                    start_claimed(&sh, rows, permits);
                    if got < free {
                        break;
                    }
                }
                Err(e) => {
                    drop(permits);
                    tracing::warn!(queue, error = %e, "pick failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(retry.next()) => {}
                        _ = sh.shutdown.cancelled() => return,
                    }
                    break;
                }
            }
        }
        tokio::select! {
            _ = wake.notify.notified() => {}
            _ = tokio::time::sleep(sh.ctx.cfg.poll_interval) => wake.wake(),
            _ = sh.shutdown.cancelled() => return,
        }
    }
}

/// Start claimed rows, one claim permit each (rows beyond the permits, which
/// a correct call never returns, and rows claimed while stopping go back).
pub(super) fn start_claimed(
    sh: &Arc<Shared>,
    rows: Vec<Claimed>,
    mut permits: OwnedSemaphorePermit,
) {
    if sh.shutdown.is_cancelled() {
        release_unstarted(sh, rows);
        return;
    }
    let mut extra = Vec::new();
    for row in rows {
        match permits.split(1) {
            Some(permit) => spawn_step(sh, row, permit, None, None),
            None => extra.push(row),
        }
    }
    if !extra.is_empty() {
        tracing::error!(
            rows = extra.len(),
            "a call claimed more rows than it had slots for; giving them back"
        );
        release_unstarted(sh, extra);
    }
}

/// One pick on the pool; a lost K = 1 race (the unique index refusing a
/// second executing row) is retried at once, as the loser now sees the
/// winner's claim.
pub(super) async fn pick(sh: &Arc<Shared>, queue: &str, demand: usize) -> Result<Vec<Claimed>> {
    let reserve = sh.wants_successors(queue);
    let want = Demand {
        queue,
        rows: demand,
        skip_pick: false,
        reserve,
    };
    for _ in 0..5 {
        match record_and_claim(sh, &[], &[want], Vec::new()).await {
            Ok(h) => return Ok(h.claimed),
            Err(e) if is_conflict(&e) => Stats::add(&sh.ctx.stats.pick_conflicts, 1),
            Err(e) => {
                Stats::add(&sh.ctx.stats.pick_errors, 1);
                return Err(e.into());
            }
        }
    }
    Ok(Vec::new())
}

/// Constraints a concurrent pick can win first: the K = 1 index (another
/// pick claimed the key), and the counters of a gate or a rate limit minted
/// by another pick at the same moment.
pub(super) const RACED: [&str; 3] = ["instances_k1", "gate_slots_pkey", "rate_state_pkey"];

/// A lost race, which the retry resolves: a deadlock, or a unique violation
/// of a constraint in `RACED`. Any other violation is an error to report,
/// not a race to retry.
pub(super) fn is_conflict(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => is_race(db.code().as_deref(), db.constraint()),
        _ => false,
    }
}

pub(super) fn is_race(code: Option<&str>, constraint: Option<&str>) -> bool {
    match code {
        Some("40P01") => true,
        Some("23505") => constraint.is_some_and(|c| RACED.contains(&c)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{is_race, QueueWake};

    #[test]
    fn a_short_pick_beside_a_full_one_does_not_make_the_queue_dry() {
        let w = QueueWake::default();
        let short = w.before_pick();
        let full = w.before_pick();
        // The full pick locked a window past its claims; the short one,
        // running meanwhile, skipped those rows. The full one ends first.
        w.picked(full, 10, 10);
        w.picked(short, 10, 3);
        assert!(!w.is_dry());
        // A short pick that started after the full one ended saw its rows.
        let after = w.before_pick();
        w.picked(after, 10, 3);
        assert!(w.is_dry());
        w.wake();
        assert!(!w.is_dry(), "a wake-up may have made rows runnable");
    }

    #[test]
    fn only_the_constraints_a_concurrent_pick_can_win_are_races() {
        assert!(is_race(Some("23505"), Some("instances_k1")));
        assert!(is_race(Some("23505"), Some("gate_slots_pkey")));
        assert!(is_race(Some("23505"), Some("rate_state_pkey")));
        assert!(is_race(Some("40P01"), None));
        // Anything else is an error to report, not to retry.
        assert!(!is_race(Some("23505"), Some("instances_pkey")));
        assert!(!is_race(Some("23505"), None));
        assert!(!is_race(Some("23514"), Some("gate_slots_available_check")));
        assert!(!is_race(None, None));
    }

    /// The names are PostgreSQL's for the engine's own index and keys.
    #[test]
    fn the_raced_constraints_exist_in_the_baseline() {
        let sql = include_str!("../../sql/migrations/20261201000000_baseline.sql");
        assert!(sql.contains("CREATE UNIQUE INDEX instances_k1"));
        assert!(sql.contains("CREATE TABLE gate_slots ("));
        assert!(sql.contains("CREATE TABLE rate_state ("));
    }
}
