//! Rows an insert on this process claims for this node start here at once,
//! without a wake-up and a pick (see `Engine::insert_many`).

use super::executor::{release_unstarted, spawn_step};
use super::{lock, Shared};
use crate::outcome::Claimed;
use crate::stats::Stats;
use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use tokio::sync::OwnedSemaphorePermit;

/// Claim slots for up to `n` rows an insert on this process starts at once
/// (see `Engine::insert_many`): only while `queue` has running slots idle and
/// its last pick found nothing more, so an inserted row never goes ahead of a
/// backlog this node could be running.
pub(crate) fn local_slots(sh: &Shared, queue: &str, n: usize) -> Option<OwnedSemaphorePermit> {
    if sh.shutdown.is_cancelled() || !sh.live.is_live() || !sh.wakes.get(queue)?.is_short() {
        return None;
    }
    let idle = sh.runs[queue].available_permits().min(n);
    if idle == 0 {
        return None;
    }
    sh.slots[queue]
        .clone()
        .try_acquire_many_owned(idle as u32)
        .ok()
}

/// Held by an insert that claims rows for this node until they are started
/// (see `give_back_lost`). Dropped before [`Claiming::done`] (the insert
/// failed, or its future was dropped: a caller's timeout, a cancelled
/// request), it may have committed, and the node looks for the claims it
/// never got.
pub(crate) struct Claiming<'a> {
    sh: &'a Shared,
    _held: tokio::sync::RwLockReadGuard<'a, ()>,
    done: bool,
}

impl Claiming<'_> {
    /// The insert's rows are started (or it claimed none).
    pub fn done(mut self) {
        self.done = true;
    }
}

impl Drop for Claiming<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.sh.check_lost.store(true, SeqCst);
        }
    }
}

pub(crate) async fn claiming(sh: &Shared) -> Claiming<'_> {
    Claiming {
        sh,
        _held: sh.claiming.read().await,
        done: false,
    }
}

/// Run rows an insert claimed for this node, in the slots `local_slots` gave.
pub(crate) fn start_inserted(
    sh: &Arc<Shared>,
    rows: Vec<Claimed>,
    mut slots: HashMap<String, OwnedSemaphorePermit>,
) {
    let n = rows.len() as u64;
    Stats::add(&sh.ctx.stats.claimed, n);
    Stats::add(&sh.ctx.stats.started_on_insert, n);
    lock(&sh.holding).extend(rows.iter().map(|r| (r.id, r.token)));
    let mut extra = Vec::new();
    for row in rows {
        match slots.get_mut(&row.queue).and_then(|p| p.split(1)) {
            Some(claim) => spawn_step(sh, row, claim, None, None),
            None => extra.push(row),
        }
    }
    if !extra.is_empty() {
        tracing::error!(
            rows = extra.len(),
            "an insert claimed more rows than it had slots for; giving them back"
        );
        release_unstarted(sh, extra);
    }
}
