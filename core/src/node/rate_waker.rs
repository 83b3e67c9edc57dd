//! The rate waker: rows parked for a rate limit come back as the limit
//! allows their starts.

use super::maintenance::UNPARK_BATCH;
use super::Shared;
use crate::error::Result;
use crate::stats::Stats;
use crate::store::{Pass, RateSwept};
use std::sync::Arc;
use std::time::Duration;

/// With rate limits configured: puts rows parked for a rate limit back
/// where a pick sees them as soon as their limit allows a start, and wakes
/// a picker, so a rate-limited backlog drains at its limit, not at one
/// start per poll. It sleeps until a limit allows a start beyond the rows
/// already waiting unparked: one sweep per start. With nothing to time, until
/// this node claims a rate-limited row (its limit may be exhausted now, and
/// the pick parks rows for it), or the poll interval: a limit exhausted by
/// another node's claims is that node's waker's to watch, and the poll covers
/// a node that died meanwhile. Short picks do not wake it: an idle node's
/// picks are all short, and it would loop.
///
/// One node sweeps at a time: a timed sweep that finds another under way
/// leaves the timing to it and sleeps as if it had nothing to time, so the
/// wakers of a cluster settle on one, and a start costs one sweep and one
/// pick, not one of each per node. The poll takes over when that node dies.
/// A sweep after this node's claim waits for its turn instead: the sweep under
/// way may have begun before the claim committed.
pub(super) async fn rate_waker(sh: Arc<Shared>) {
    let mut claimed = false;
    loop {
        let wait = match rate_sweep(&sh, claimed).await {
            Ok(next) => next,
            Err(e) => {
                tracing::debug!(error = %e, "unparking rate-limited rows failed");
                None
            }
        };
        claimed = tokio::select! {
            _ = tokio::time::sleep(wait.unwrap_or(sh.ctx.cfg.poll_interval)) => false,
            _ = sh.rate_claimed.notified(), if wait.is_none() => true,
            _ = sh.shutdown.cancelled() => return,
        };
    }
}

/// Every rate-limit key's parked rows, as far as its limit allows starts now,
/// `UNPARK_BATCH` keys a call, after a claim of this node's (`claimed`) or
/// not. Returns how long until a limit allows a start beyond the rows now
/// waiting (None: not before a claim, or another node is sweeping and times
/// it).
async fn rate_sweep(sh: &Shared, claimed: bool) -> Result<Option<Duration>> {
    let mut pass = sh.ctx.pass();
    let (mut next, mut after) = (None::<f64>, None::<String>);
    loop {
        let swept = sweep_rates(sh, &mut pass, after.as_deref(), claimed).await?;
        if let Some(s) = swept.next_in {
            next = Some(next.map_or(s, |n| n.min(s)));
        }
        after = swept.last_key;
        if after.is_none() || sh.shutdown.is_cancelled() {
            break;
        }
    }
    Ok(next.map(|s| Duration::from_secs_f64(s.clamp(0.001, 3600.0))))
}

/// One call of the sweep (`sql/functions/rate_sweep.sql`), from the key
/// after `after`; `wait_turn`: behind a sweep under way rather than not at
/// all. Queues whose unparked rows this node has free claim slots for are
/// woken here; the call wakes the others for every node.
pub(in crate::node) async fn sweep_rates(
    sh: &Shared,
    pass: &mut Pass<'_>,
    after: Option<&str>,
    wait_turn: bool,
) -> Result<RateSwept> {
    let ctx = &sh.ctx;
    let own = sh.claim_room();
    let swept = pass
        .call(async |c| {
            ctx.store
                .rate_sweep(c, after, UNPARK_BATCH, &ctx.limits, &own, wait_turn)
                .await
        })
        .await?;
    Stats::add(&ctx.stats.unparked, swept.unparked);
    for q in &swept.own_woken {
        if let Some(w) = sh.wakes.get(q) {
            w.wake();
        }
    }
    Ok(swept)
}
