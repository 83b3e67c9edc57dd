//! Heartbeats: the node's row in `nodes`, renewed on a connection of its
//! own, and what the node does after a gap in which it may have been
//! presumed dead.

use super::{lock, Backoff, Shared};
use crate::context::Context;
use crate::error::Result;
use crate::stats::Stats;
use crate::store::Beat;
use futures::future::AbortHandle;
use std::collections::HashSet;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Record this node's heartbeat on `exec`. Returns how long ago its previous
/// heartbeat was recorded (None: it had none, or its row was deleted as dead).
pub(super) async fn beat<'e>(
    ctx: &Context,
    exec: impl sqlx::PgExecutor<'e>,
) -> Result<Option<f64>> {
    let beat = Beat {
        node_id: &ctx.cfg.node_id,
        hostname: &crate::config::hostname(),
        queues: serde_json::to_value(&ctx.cfg.queues).unwrap_or_default(),
        workflows: serde_json::to_value(&ctx.limits.workflows).unwrap_or_default(),
        lease: ctx.cfg.lease.as_secs_f64(),
    };
    let (others, gap) = ctx.store.heartbeat(exec, &beat).await?;
    ctx.others_alive.store(others > 0, Relaxed);
    Ok(gap)
}

/// Heartbeats, on a connection of their own, so that nothing else the node
/// does (maintenance, a pool busy with claims, a reconnect storm) holds them
/// back. Failed ones are retried at once after a short pause. After a gap in
/// which the node may have been presumed dead, its running steps whose rows
/// were rescued meanwhile are stopped (their outcomes would be fenced anyway)
/// and lost claims are looked for.
pub(super) async fn heartbeats(sh: Arc<Shared>, stop: CancellationToken) {
    let ctx = &sh.ctx;
    let cfg = &ctx.cfg;
    let mut conn: Option<sqlx::PgConnection> = None;
    let mut retry = Backoff::new();
    let mut last_ok = Instant::now();
    loop {
        let sent = Instant::now();
        let beat = async {
            if conn.is_none() {
                let options = ctx.store.pool.connect_options();
                conn = Some(sqlx::Connection::connect_with(&*options).await?);
            }
            let c = conn.as_mut().ok_or(sqlx::Error::PoolClosed)?;
            beat(ctx, &mut *c).await
        };
        let limit = cfg.heartbeat_interval.max(Duration::from_secs(1));
        let pause = match tokio::time::timeout(limit, beat).await {
            Ok(Ok(gap)) => {
                retry.reset();
                let was_live = sh.live.renewed(sent);
                let late =
                    gap.is_none_or(|g| g >= cfg.lease.as_secs_f64()) || sent - last_ok >= cfg.lease;
                last_ok = sent;
                if !was_live || late {
                    tracing::warn!(
                        "this node was not heartbeating for a lease or more; checking which of its steps are still its own"
                    );
                    sh.check_lost.store(true, SeqCst);
                    if let Some(c) = conn.as_mut() {
                        if let Err(e) = stop_lost_steps(&sh, c).await {
                            tracing::warn!(error = %e, "checking this node's steps failed");
                            conn = None;
                        }
                    }
                }
                if let Some(c) = conn.as_mut() {
                    if let Err(e) = stop_cancelled_steps(&sh, c).await {
                        tracing::warn!(error = %e, "checking for cancelled steps failed");
                        conn = None;
                    }
                }
                cfg.heartbeat_interval
            }
            failed => {
                match failed {
                    Ok(Err(e)) => tracing::warn!(error = %e, "heartbeat failed"),
                    _ => tracing::warn!("heartbeat timed out"),
                }
                conn = None;
                retry.next().min(cfg.heartbeat_interval)
            }
        };
        // Also while the node stops: its last outcomes are written under a
        // live heartbeat. `Node::stop` ends this task after the writer, here
        // between beats: a beat cut short could still be applied after the
        // stop deleted the node's row, and bring it back.
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Stop every running step once the node is no longer live by its own clock:
/// a heartbeat interval before its lease runs out, counted from the last
/// heartbeat it sent, with no heartbeat since. Whether the node or the
/// database is cut off, its rows may then be rescued by a node that can
/// still reach the database, and their steps must not run here while they
/// run there. (The same moment the node stops starting work; a node stopped
/// by its host, as by `SIGSTOP`, stops them the moment it runs again.)
pub(super) async fn stop_steps_when_lapsed(sh: Arc<Shared>) {
    loop {
        sh.live.lapsed().await;
        let stopped = sh.stop_all_if_lapsed();
        if stopped > 0 {
            tracing::warn!(
                steps = stopped,
                "this node could not heartbeat within its lease: stopped its running steps, whose rows may be rescued"
            );
            Stats::add(&sh.ctx.stats.stopped, stopped as u64);
        }
        sh.live.wait().await;
    }
}

/// Stop the running steps whose instances were cancelled: the nodes hear of
/// cancellations on a channel, and one sent while this node was not
/// listening (starting, or its LISTEN connection reconnecting) is lost.
async fn stop_cancelled_steps(sh: &Shared, conn: &mut sqlx::PgConnection) -> Result<()> {
    let running: Vec<i64> = lock(&sh.running).keys().copied().collect();
    if running.is_empty() {
        return Ok(());
    }
    for id in sh.ctx.store.cancel_requested(&mut *conn, &running).await? {
        sh.stop_cancelled(id);
    }
    Ok(())
}

/// Stop the running steps whose claim the database no longer holds for this
/// node (rescued while the node was presumed dead). A successor runs here
/// before its promotion, under the token the promotion gives its reservation.
pub(super) async fn stop_lost_steps(sh: &Shared, conn: &mut sqlx::PgConnection) -> Result<()> {
    let ctx = &sh.ctx;
    let ours: HashSet<(i64, i64)> = ctx
        .store
        .held_by_node(&mut *conn, &ctx.cfg.node_id)
        .await?
        .iter()
        .map(|h| (h.row.id, h.row.token + !h.executing as i64))
        .collect();
    let lost: Vec<(i64, AbortHandle)> = lock(&sh.running)
        .iter()
        .filter(|(id, r)| !ours.contains(&(**id, r.token)))
        .map(|(id, r)| (*id, r.abort.clone()))
        .collect();
    for (id, abort) in lost {
        tracing::warn!(
            id,
            "stopping a step whose row was rescued while this node was presumed dead"
        );
        Stats::add(&sh.ctx.stats.stopped, 1);
        abort.abort();
    }
    Ok(())
}
