//! The rate waker: rows parked for a rate limit come back as the limit
//! allows their starts.

use super::maintenance::UNPARK_BATCH;
use super::Shared;
use crate::error::Result;
use crate::stats::Stats;
use std::sync::Arc;
use std::time::Duration;

/// With rate limits configured: puts rows parked for a rate limit back
/// where a pick sees them as soon as their limit allows a start, and wakes
/// the queues, so a rate-limited backlog drains at its limit, not at one
/// start per poll. It sleeps until a limit allows a start beyond the rows
/// already waiting unparked: one sweep per start. With nothing to time, until
/// this node claims a rate-limited row (its limit may be exhausted now, and
/// the pick parks rows for it), or the poll interval: a limit exhausted by
/// another node's claims is that node's waker's to watch, and the poll covers
/// a node that died meanwhile. Short picks do not wake it: an idle node's
/// picks are all short, and it would loop.
pub(super) async fn rate_waker(sh: Arc<Shared>) {
    loop {
        let wait = match rate_sweep(&sh).await {
            Ok((n, next)) => {
                if n > 0 {
                    sh.wake_all();
                }
                next
            }
            Err(e) => {
                tracing::debug!(error = %e, "unparking rate-limited rows failed");
                None
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait.unwrap_or(sh.ctx.cfg.poll_interval)) => {}
            _ = sh.rate_claimed.notified(), if wait.is_none() => {}
            _ = sh.shutdown.cancelled() => return,
        }
    }
}

/// Every rate-limit key's parked rows, as far as its limit allows starts now
/// (`sql/functions/rate_sweep.sql`), `UNPARK_BATCH` keys a call.
/// Returns the rows unparked and how long until a limit allows a start
/// beyond the rows now waiting (None: not before a claim).
pub(super) async fn rate_sweep(sh: &Shared) -> Result<(u64, Option<Duration>)> {
    let ctx = &sh.ctx;
    let (mut unparked, mut next, mut after) = (0, None::<f64>, None::<String>);
    let mut pass = ctx.pass();
    loop {
        let from = after.as_deref();
        let (n, last, next_in) = pass
            .call(async |c| {
                ctx.store
                    .rate_sweep(c, from, UNPARK_BATCH, &ctx.limits)
                    .await
            })
            .await?;
        unparked += n;
        if let Some(s) = next_in {
            next = Some(next.map_or(s, |n| n.min(s)));
        }
        after = last;
        if after.is_none() || sh.shutdown.is_cancelled() {
            break;
        }
    }
    Stats::add(&ctx.stats.unparked, unparked);
    Ok((
        unparked,
        next.map(|s| Duration::from_secs_f64(s.clamp(0.001, 3600.0))),
    ))
}
