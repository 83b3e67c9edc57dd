//! The node's maintenance services, one per file, run in turn by one loop
//! ([`maintain`]), each on its own cadence and bounded per pass.

mod lost_claims;
mod pruner;
mod reaper;
mod reconciler;
mod stager;
mod throughput;
mod unparker;

pub(crate) use pruner::prune;
pub(crate) use reaper::reap;
pub(crate) use reconciler::reconcile_gates;

use super::rate_waker::sweep_rates;
use super::Shared;
use lost_claims::give_back_lost;
use pruner::prune_batch;
use reconciler::reconcile_gates_from;
use stager::stage;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::{Duration, Instant};
pub(crate) use throughput::{record_throughput, Recorded};
use unparker::{park_by_workflow, unpark_keys};

/// Rows the stager moves per statement.
const STAGE_BATCH: i64 = 10_000;
/// How often a node adds its step counts to `throughput`.
const THROUGHPUT_EVERY: Duration = Duration::from_secs(5);
/// Finished rows pruned per maintenance pass.
const PRUNE_BATCH: i64 = 10_000;
/// Gate keys the reconciler sweeps per maintenance pass.
const RECONCILE_BATCH: i32 = 1000;
/// Keys (and rate-limit keys) with parked rows the sweep looks at per pass.
pub(in crate::node) const UNPARK_BATCH: i32 = 1000;
/// Rows at the head of a queue looked at for workflows no live node runs,
/// per batch, and batches per pass at most.
const ORPHAN_BATCH: i32 = 1000;
const ORPHAN_PASSES: usize = 10;
/// Rows parked for their workflow taken back per (queue, workflow) per pass.
const UNPARK_WORKFLOW_BATCH: i32 = 10_000;

/// Stage due rows, rescue rows of dead nodes, give back lost claims,
/// reconcile gates and prune, each on its own cadence and each bounded per
/// pass. Failures are logged and retried next time.
pub(super) async fn maintain(sh: Arc<Shared>) {
    let ctx = &sh.ctx;
    let cfg = &ctx.cfg;
    let tick = cfg.poll_interval.min(cfg.heartbeat_interval);
    // None: the first pass reaps.
    let mut last_reap: Option<Instant> = None;
    let mut last_gc = Instant::now();
    let mut gates_after: Option<String> = None;
    let mut parked_after: Option<String> = None;
    let mut last_prune = Instant::now() - Duration::from_secs(3600);
    let mut prune_from = None;
    let mut last_recorded = Instant::now();
    let mut last_lost_check = Instant::now();
    loop {
        let now = Instant::now();
        // One connection for the pass, each call given up after a lease.
        let mut pass = ctx.pass();
        if let Err(e) = stage(ctx, &mut pass).await {
            tracing::debug!(error = %e, "staging failed");
        }
        if last_reap.is_none_or(|t| now - t >= cfg.heartbeat_interval) {
            last_reap = Some(now);
            if let Err(e) = reap(ctx, &mut pass, None).await {
                tracing::debug!(error = %e, "reaping failed");
            }
        }
        if sh.live.is_live() {
            if let Err(e) = park_by_workflow(&sh, &mut pass).await {
                tracing::debug!(error = %e, "parking by workflow failed");
            }
        }
        // Parked rows whose key has room (a race, a rescue, a repaired gate).
        // Rows unparked here wake this node's pickers: nothing else would
        // (the sweeps send no NOTIFY), and a long poll interval would leave
        // them waiting.
        match unpark_keys(&sh, &mut pass, parked_after.as_deref()).await {
            Ok((n, next)) => {
                parked_after = next;
                if n > 0 {
                    sh.wake_all();
                }
            }
            Err(e) => tracing::debug!(error = %e, "unparking failed"),
        }
        // Rate-limited rows too, every tick: the rate waker times the next
        // start, and this pass covers what it sleeps through (a limit another
        // node's claims used, a node without a waker).
        if let Err(e) = sweep_rates(&sh, &mut pass, None, false).await {
            tracing::debug!(error = %e, "unparking rate-limited rows failed");
        }
        // Also every lease: a call given up may commit after the check its
        // failure asked for (a statement waiting for a lock outlives its
        // connection), and nothing else finds what it claimed while this
        // node heartbeats.
        if sh.check_lost.swap(false, SeqCst) || now - last_lost_check >= cfg.lease {
            last_lost_check = now;
            if let Err(e) = give_back_lost(&sh, &mut pass).await {
                sh.check_lost.store(true, SeqCst);
                tracing::debug!(error = %e, "checking for lost claims failed");
            }
        }
        // A sweep over many gate keys goes on at the next tick.
        if gates_after.is_some() || now - last_gc >= cfg.gc_interval {
            if gates_after.is_none() {
                last_gc = now;
            }
            match reconcile_gates_from(ctx, &mut pass, gates_after.as_deref()).await {
                Ok((_, next)) => gates_after = next,
                Err(e) => tracing::debug!(error = %e, "gate reconciliation failed"),
            }
        }
        if now - last_recorded >= THROUGHPUT_EVERY {
            last_recorded = now;
            if let Err(e) =
                record_throughput(ctx, &mut pass, &mut *sh.throughput.lock().await).await
            {
                tracing::debug!(error = %e, "recording throughput failed");
            }
        }
        if now - last_prune >= Duration::from_secs(60) {
            // Full batches: more is due. Go on for up to half a tick (so a
            // node prunes as fast as a busy cluster finishes rows, not one
            // batch a tick), then at the next tick.
            let began = Instant::now();
            loop {
                match prune_batch(ctx, &mut pass, &mut prune_from).await {
                    Ok(n) if n >= PRUNE_BATCH as u64 => {
                        if began.elapsed() >= tick / 2 {
                            break;
                        }
                    }
                    Ok(_) => {
                        last_prune = now;
                        break;
                    }
                    Err(e) => {
                        last_prune = now;
                        tracing::debug!(error = %e, "pruning failed");
                        break;
                    }
                }
            }
        }
        drop(pass);
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = sh.shutdown.cancelled() => return,
        }
    }
}
