//! The LISTEN task: wake-ups from inserts, outcomes and other nodes.

use super::{Backoff, Shared};
use sqlx::postgres::PgListener;
use sqlx::Executor;
use std::sync::Arc;

/// LISTEN for wake-ups; after any reconnect every picker is woken, since
/// notifications sent meanwhile are lost. A connection quiet for a heartbeat
/// interval is asked a `SELECT 1`: one that stopped answering without
/// closing (a failover, a dropped NAT mapping; the driver sets no TCP
/// keepalive) would otherwise leave the node to its poll interval for good.
/// It is given up after a lease without an answer.
pub(super) async fn listen(sh: Arc<Shared>) {
    let cfg = &sh.ctx.cfg;
    let mut retry = Backoff::new();
    loop {
        let connected = async {
            let mut l = PgListener::connect_with(&sh.ctx.store.pool).await?;
            l.listen_all([
                sh.ctx.store.sql.channel.as_str(),
                sh.ctx.store.sql.cancel_channel.as_str(),
            ])
            .await?;
            Ok::<_, sqlx::Error>(l)
        }
        .await;
        let mut listener = match connected {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "LISTEN connection failed; polling meanwhile");
                tokio::select! {
                    _ = tokio::time::sleep(retry.next()) => continue,
                    _ = sh.shutdown.cancelled() => return,
                }
            }
        };
        retry.reset();
        sh.wake_all();
        loop {
            let received = tokio::select! {
                r = listener.try_recv() => r,
                _ = tokio::time::sleep(cfg.heartbeat_interval) => {
                    let probe = (&mut listener).execute("SELECT 1");
                    match tokio::time::timeout(cfg.lease, probe).await {
                        Ok(Ok(_)) => continue,
                        Ok(Err(e)) => tracing::debug!(error = %e, "LISTEN connection lost; reconnecting"),
                        Err(_) => tracing::warn!("LISTEN connection stopped answering; reconnecting"),
                    }
                    break;
                }
                _ = sh.shutdown.cancelled() => return,
            };
            match received {
                Ok(Some(n)) if n.channel() == sh.ctx.store.sql.cancel_channel => {
                    cancelled(&sh, n.payload())
                }
                Ok(Some(n)) if n.payload().is_empty() => sh.wake_all(),
                Ok(Some(n)) if n.payload().starts_with('*') => {
                    if n.payload()[1..] != sh.ctx.cfg.node_id {
                        sh.wake_all();
                    }
                }
                Ok(Some(n)) => {
                    if let Some(w) = sh.wakes.get(n.payload()) {
                        w.wake();
                    }
                }
                Ok(None) => sh.wake_all(),
                Err(_) => break,
            }
        }
    }
}

/// An instance was cancelled: stop its step if it runs here.
fn cancelled(sh: &Shared, payload: &str) {
    if let Ok(id) = payload.parse::<i64>() {
        sh.stop_cancelled(id);
    }
}
