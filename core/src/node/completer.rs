//! The outcome writer: outcomes in batches, each recorded in the call that
//! claims the next rows into the slots they free.

use super::claims::record_and_claim;
use super::executor::release_unstarted;
use super::picker::{start_claimed, QueueWake};
use super::{lock, payload_message, Backoff, Shared};
use crate::error::Result;
use crate::outcome::{Claimed, OutcomeRow};
use crate::store::Demand;
use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

/// Largest number of outcomes written by one statement.
pub(super) const MAX_OUTCOME_BATCH: usize = 2000;
/// Outcome transactions in flight at once.
pub(super) const WRITERS: usize = 2;
/// A call starts beside one in flight only with at least this many outcomes:
/// two concurrent calls let the database use both cores for large batches,
/// but small ones contend for the same rows and pages and gain nothing, so
/// they wait for the call in flight and grow meanwhile.
pub(super) const PARALLEL_BATCH: usize = 64;
/// Writes outcomes in batches: whatever accumulated while earlier batches
/// were in flight goes in the next transaction. Up to `WRITERS` transactions
/// run at once, so one waiting for its commit does not hold back the next
/// batch and the database can use more than one core.
pub(super) async fn write_outcomes(
    sh: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<OutcomeRow>,
    stop: CancellationToken,
) {
    let mut inflight = tokio::task::JoinSet::new();
    loop {
        if inflight.len() >= WRITERS {
            inflight.join_next().await;
            continue;
        }
        let first = tokio::select! {
            o = rx.recv() => o,
            Some(_) = inflight.join_next() => continue,
            _ = sh.writer_wake.notified() => None,
            _ = stop.cancelled() => None,
        };
        let mut batch = Vec::new();
        match first {
            Some(o) => batch.push(o),
            None if !stop.is_cancelled() => {} // reserved rows to give back
            None => {
                // Stopping: every step has finished; write what is left.
                // Reserved rows are given back when the node deregisters.
                while inflight.join_next().await.is_some() {}
                while let Ok(o) = rx.try_recv() {
                    batch.push(o);
                }
                for chunk in batch.chunks(MAX_OUTCOME_BATCH) {
                    write_batch(
                        &sh,
                        chunk.to_vec(),
                        // The node still heartbeats meanwhile, so nothing
                        // is rescued: a lease to reconnect (a server that
                        // just restarted) rather than re-run finished steps.
                        Some(crate::deadline::after(
                            sh.ctx.cfg.shutdown_timeout.max(sh.ctx.cfg.lease),
                        )),
                    )
                    .await;
                }
                return;
            }
        }
        // Let outcomes finishing at the same moment join the batch, unless a
        // successor waits for this call to promote it.
        if batch.iter().all(|o| o.promotion.is_none()) {
            tokio::task::yield_now().await;
        }
        while batch.len() < MAX_OUTCOME_BATCH {
            match rx.try_recv() {
                Ok(o) => batch.push(o),
                Err(_) => break,
            }
        }
        while !inflight.is_empty() && batch.len() < PARALLEL_BATCH && !stop.is_cancelled() {
            tokio::select! {
                Some(o) = rx.recv() => batch.push(o),
                _ = inflight.join_next() => {}
                _ = stop.cancelled() => {}
            }
        }
        if batch.is_empty() && !lock(&sh.successors).has_dangling() {
            continue;
        }
        let sh = sh.clone();
        inflight.spawn(async move {
            use futures::FutureExt;
            let mut batch = batch;
            let carried = carried_slots(&mut batch);
            let first = std::panic::AssertUnwindSafe(write_and_claim(&sh, &batch, carried))
                .catch_unwind()
                .await;
            match first {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "outcome and claim in one call failed; writing the outcomes alone");
                    write_batch(&sh, batch, None).await;
                }
                Err(panic) => {
                    tracing::error!(panic = %payload_message(&*panic), "writing outcomes panicked; writing them alone");
                    sh.check_lost.store(true, SeqCst);
                    write_batch(&sh, batch, None).await;
                }
            }
        });
    }
}

/// The claim slots a batch's outcomes carry, merged per queue. A slot is
/// merged only with slots of its own queue's semaphore (a slot that came
/// from another goes back to it).
pub(super) fn carried_slots(batch: &mut [OutcomeRow]) -> HashMap<String, OwnedSemaphorePermit> {
    let mut carried: HashMap<String, OwnedSemaphorePermit> = HashMap::new();
    for o in batch {
        let Some(slot) = o.slot.take().and_then(|s| Arc::try_unwrap(s).ok()) else {
            continue;
        };
        match carried.get_mut(&o.queue) {
            Some(p) if Arc::ptr_eq(p.semaphore(), slot.semaphore()) => p.merge(slot),
            Some(_) => drop(slot),
            None => {
                carried.insert(o.queue.clone(), slot);
            }
        }
    }
    carried
}

/// The fast path: write a batch of outcomes and, in the same statement,
/// claim rows for the batch's queues: into the slots the outcomes carry and as
/// many free ones as the prefetch wants. Slots and keys the outcomes free go
/// to the next rows with one round trip and one commit.
pub(super) async fn write_and_claim(
    sh: &Arc<Shared>,
    batch: &[OutcomeRow],
    mut carried: HashMap<String, OwnedSemaphorePermit>,
) -> Result<()> {
    struct Claim<'a> {
        want: Demand<'a>,
        wake: &'a QueueWake,
        permits: OwnedSemaphorePermit,
        before: u64,
    }
    let mut claims = Vec::new();
    if !sh.shutdown.is_cancelled() && sh.live.is_live() {
        // The queues these outcomes freed slots in.
        for (queue, slots) in sh
            .slots
            .iter()
            .filter(|(q, _)| batch.iter().any(|o| &o.queue == *q))
        {
            // The slots the outcomes carry, and as many free ones as the
            // prefetch wants on top. Even with none (a picker may hold the
            // free ones) the queue is listed: the successors promoted here
            // get their own reserved.
            let carried = carried
                .remove(queue.as_str())
                .filter(|p| Arc::ptr_eq(p.semaphore(), slots));
            let Some(mut permits) =
                carried.or_else(|| slots.clone().try_acquire_many_owned(0).ok())
            else {
                continue;
            };
            let own = permits.num_permits();
            let want = sh.prefetch[queue].demand(slots.available_permits() + own);
            if want > own {
                if let Ok(more) = slots.clone().try_acquire_many_owned((want - own) as u32) {
                    permits.merge(more);
                }
            }
            let free = permits.num_permits();
            let wake = &*sh.wakes[queue];
            // A pick can only find something new if these outcomes made a row
            // runnable, or if rate limits refilled meanwhile: the keys and
            // slots they free are handed over to their keys' next rows in the
            // call, and one left free wakes the queues after it.
            let nothing_new = sh.ctx.limits.rate_names.is_empty()
                && batch.iter().all(|o| &o.queue != queue || !o.runnable_now());
            claims.push(Claim {
                want: Demand {
                    queue,
                    rows: free,
                    skip_pick: nothing_new && wake.is_dry(),
                    reserve: sh.wants_successors(queue),
                },
                wake,
                permits,
                before: wake.before_pick(),
            });
        }
    }
    let demand: Vec<Demand> = claims.iter().map(|c| c.want).collect();
    let unreserve = sh.successors(|s| s.take_dangling());
    let mut h = record_and_claim(sh, batch, &demand, unreserve).await?;
    let mut claimed = std::mem::take(&mut h.claimed);
    if h.released > 0 {
        // Keys or slots went free with nobody taking them over: rows of those
        // keys may wait in any queue.
        sh.wake_all();
    }
    for c in &claims {
        if !c.want.skip_pick && c.want.rows > 0 {
            let got = claimed.iter().filter(|r| r.queue == c.want.queue).count();
            c.wake.picked(c.before, c.want.rows, got);
        }
        if c.wake.before_pick() != c.before {
            // Woken while this call held the queue's free slots: the picker
            // may have found none, and this pick may have missed the rows.
            c.wake.notify.notify_one();
        }
    }
    for c in claims {
        let (mine, rest): (Vec<Claimed>, Vec<Claimed>) =
            claimed.into_iter().partition(|r| r.queue == c.want.queue);
        claimed = rest;
        start_claimed(sh, mine, c.permits);
    }
    if !claimed.is_empty() {
        tracing::error!(
            rows = claimed.len(),
            "a call claimed rows for a queue it did not ask for; giving them back"
        );
        release_unstarted(sh, claimed);
    }
    Ok(())
}

/// Write one batch, retrying through connection loss (until `deadline`, if
/// any). A batch the database refuses for another reason is written row by
/// row so one bad row cannot hold back the others; so is one the server gave
/// up waiting for (a row locked past `lock_timeout`, a call longer than
/// `statement_timeout`), whose rows are then each retried until written.
pub(super) async fn write_batch(sh: &Shared, batch: Vec<OutcomeRow>, deadline: Option<Instant>) {
    let wake = batch.iter().any(|o| o.hkey.is_some() || o.runnable_now());
    let mut retry = Backoff::new();
    loop {
        match write_outcome_rows(sh, &batch).await {
            Ok(()) => break,
            Err(e) if e.is_transient() && !(e.gave_up_waiting() && batch.len() > 1) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    tracing::error!(outcomes = batch.len(), error = %e,
                        "giving up writing outcomes at shutdown; the rows will be rescued");
                    return;
                }
                tracing::warn!(error = %e, "writing outcomes failed; retrying");
                tokio::time::sleep(retry.next()).await;
            }
            Err(e) if batch.len() > 1 => {
                tracing::warn!(error = %e, "an outcome batch failed; writing row by row");
                for o in batch {
                    Box::pin(write_batch(sh, vec![o], deadline)).await;
                }
                return;
            }
            Err(e) => {
                tracing::error!(id = batch[0].id, error = %e, "an outcome was refused; recording it as an error");
                let fallback = OutcomeRow::refused(&batch[0], &e.to_string());
                if let Err(e) = write_outcome_rows(sh, &[fallback]).await {
                    tracing::error!(id = batch[0].id, error = %e, "recording the refused outcome failed too");
                }
                break;
            }
        }
    }
    if wake {
        sh.wake_all();
    }
}

pub(super) async fn write_outcome_rows(sh: &Shared, batch: &[OutcomeRow]) -> Result<()> {
    record_and_claim(sh, batch, &[], Vec::new()).await?;
    Ok(())
}
