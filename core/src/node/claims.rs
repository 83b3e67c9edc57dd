//! The node's side of the claim path's one call: what it records, claims,
//! reserves and gives back, and the bookkeeping around it.

use super::{lock, Shared};
use crate::outcome::{Claimed, OutcomeRow, Promotion};
use crate::stats::Stats;
use crate::store::{close_now, read_handoff, unanswered, Answered, Call, Demand, Handoff};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::time::{Duration, Instant};
use tracing::Instrument;

/// The one statement of the claim path (`sql/functions/handoff.sql`):
/// record `outcomes` and promote the successors started in the
/// slots they free, hand the other freed keys and slots to their keys' next
/// rows, give back `unreserve`, credit what is left, claim per queue and
/// reserve successors. Atomic: it applies whole or not at all.
/// Reserved rows go to the successor bookkeeping; claimed rows are returned.
pub(super) async fn record_and_claim(
    sh: &Shared,
    outcomes: &[OutcomeRow],
    demand: &[Demand<'_>],
    unreserve: Vec<(i64, i64)>,
) -> sqlx::Result<Handoff> {
    let ctx = &sh.ctx;
    let picks = demand.iter().filter(|d| !d.skip_pick).count();
    Stats::add(&ctx.stats.picks, picks as u64);
    // A call that may claim or reserve keeps the check for lost claims out
    // until what it claimed is on record here.
    let _claiming = match demand.is_empty() {
        true => None,
        false => Some(sh.claiming.read().await),
    };
    let t = Instant::now();
    let mark = lock(&sh.successors).mark();
    let call = Call {
        node_id: &ctx.cfg.node_id,
        notify: ctx.others_alive.load(Relaxed),
        outcomes,
        demand,
        unreserve: &unreserve,
    };
    let span = tracing::debug_span!(
        "gendurable.claim",
        outcomes = outcomes.len(),
        queues = demand.len(),
        claimed = tracing::field::Empty,
    );
    // A call unanswered for a lease is given up, and its connection closed:
    // one whose server went away without closing it (a failover, a dropped
    // NAT mapping) would otherwise wait for an answer forever, holding its
    // outcomes and slots. What the call did, if it committed, its retry
    // finds fenced, as after any connection lost after a commit.
    let limit = ctx.cfg.lease;
    let result = async {
        let mut conn = ctx.store.claim_conn(limit).await?;
        match tokio::time::timeout(limit, ctx.store.handoff(&mut *conn, &call, &ctx.limits)).await {
            Ok(Ok(rows)) => {
                ctx.store.keep_claim_conn(conn);
                Ok(rows)
            }
            Ok(Err(e)) => {
                // Broken, closing, or on a server that takes no writes: the
                // next call gets a new one.
                if !e.answered() {
                    close_now(conn);
                }
                Err(e)
            }
            Err(_) => {
                close_now(conn);
                Err(unanswered(limit))
            }
        }
    }
    .instrument(span.clone())
    .await;
    if let Ok(rows) = &result {
        span.record("claimed", rows.len().saturating_sub(1));
    }
    sh.call_time.add(t.elapsed());
    if picks > 0 {
        ctx.stats.pick_time.record(t.elapsed());
    }
    let rows = match result {
        Ok(rows) => rows,
        Err(e) => {
            sh.successors(|s| s.restore_dangling(unreserve));
            if !demand.is_empty() {
                sh.check_lost.store(true, SeqCst);
            }
            return Err(e);
        }
    };
    let (h, reserved) = match read_handoff(&rows) {
        Ok(read) => read,
        Err(e) => {
            // Committed, but what it claimed is unknown here.
            sh.check_lost.store(true, SeqCst);
            return Err(e);
        }
    };
    // An outcome naming a successor not promoted here did not apply: its row
    // stays held, and the outcome is recorded alone once the successor stops.
    let refused = |o: &OutcomeRow| o.next.is_some_and(|n| !h.promoted.contains(&n));
    {
        // Outcomes first: the same call may claim a row it just recorded.
        let mut holding = lock(&sh.holding);
        for o in outcomes {
            if holding.get(&o.id) == Some(&o.token) && !refused(o) {
                holding.remove(&o.id);
            }
        }
        holding.extend(h.claimed.iter().map(|r| (r.id, r.token)));
    }
    for o in outcomes.iter().filter(|o| o.next.is_some()) {
        let promoted = !refused(o);
        Stats::add(&ctx.stats.successors, promoted as u64);
        Promotion::settle(o, promoted);
    }
    // The claimed rows hold their keys before their successors are filed.
    sh.successors(|s| {
        for row in &h.claimed {
            s.claimed(row);
        }
        for row in reserved {
            s.reserved(row, mark);
        }
        for key in &h.released_keys {
            s.freed(key);
        }
    });
    if h.claimed.iter().any(|r| r.rate_key.is_some()) {
        // A rate limit may be exhausted now: the rate waker looks when it
        // allows the next start.
        sh.rate_claimed.notify_one();
    }
    Stats::add(&ctx.stats.claimed, h.claimed.len() as u64);
    Stats::add(&ctx.stats.handed_over, h.handed_over as u64);
    Stats::add(&ctx.stats.rate_limited, h.rate_parked);
    if !outcomes.is_empty() {
        Stats::add(&ctx.stats.outcome_batches, 1);
        Stats::add(&ctx.stats.outcomes, h.written as u64);
        Stats::add(&ctx.stats.fenced, (outcomes.len() - h.written) as u64);
    }
    Ok(h)
}

/// The connections the claim path holds at most at once, on a node of
/// `queues` queues: a picker's call per queue and the outcome writer's.
pub(crate) fn claim_connections(queues: usize) -> u32 {
    (queues + super::completer::WRITERS).min(u32::MAX as usize) as u32
}

/// Prepare the connections the claim path will use, before any work:
/// PostgreSQL compiles the functions and plans the pick on a connection's
/// first call (about 30 ms of CPU), which would otherwise stall the first
/// claim and outcome on every new connection. A call that records an outcome
/// for no row and picks from no queue does it and changes nothing.
///
/// Every connection the claim path will hold (`Store::claims`): one per
/// picker and one per outcome call in flight.
pub(super) async fn warm_up(sh: &Shared) {
    let pool = &sh.ctx.store.claims;
    let n = claim_connections(sh.wakes.len()).min(pool.options().get_max_connections()) as usize;
    // A pool shared with the application may have no connection to spare:
    // warm what can be had quickly rather than delay the start.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        match tokio::time::timeout_at(deadline, pool.acquire()).await {
            Ok(Ok(c)) => conns.push(c),
            _ => break,
        }
    }
    let nothing = OutcomeRow::release(&Claimed::none());
    let demand = [Demand {
        queue: "",
        rows: 1,
        skip_pick: false,
        reserve: false,
    }];
    let ctx = &sh.ctx;
    let call = Call {
        node_id: &ctx.cfg.node_id,
        notify: false,
        outcomes: std::slice::from_ref(&nothing),
        demand: &demand,
        unreserve: &[],
    };
    let calls = conns
        .iter_mut()
        .map(|c| ctx.store.handoff(&mut **c, &call, &ctx.limits));
    let results = futures::future::join_all(calls).await;
    for (conn, r) in conns.into_iter().zip(results) {
        match r {
            Ok(_) => ctx.store.keep_claim_conn(conn),
            Err(e) => tracing::debug!(error = %e, "warming a connection failed"),
        }
    }
}
