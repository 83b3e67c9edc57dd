//! The claim path's connections, kept checked out between its calls.
//!
//! sqlx pings every connection returned to its pool: a second round trip
//! after each `handoff`, which wakes the server's backend and a runtime
//! thread once more per call and keeps the connection from the next call
//! until it answers. The claim path makes a call per outcome batch, so it
//! keeps the connections of its own pool instead, and gives one back to the
//! pool (which pings it, closing it if broken) only after a call failed.

use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgPool, Postgres};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a connection may sit idle before it is pinged when taken: one
/// idle that long may have been dropped by the server or the network.
pub(crate) const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Connections checked out of a pool, each with the moment it was put back.
pub(crate) struct Kept(Mutex<Vec<(PoolConnection<Postgres>, Instant)>>);

impl Kept {
    pub fn new() -> Kept {
        Kept(Mutex::new(Vec::new()))
    }

    /// A kept connection (pinged if it idled for `IDLE_CHECK`), else one of
    /// `pool`'s. One whose ping fails goes back to the pool, which closes
    /// it; one whose ping goes unanswered for `limit` is closed here.
    pub async fn take(
        &self,
        pool: &PgPool,
        limit: Duration,
    ) -> sqlx::Result<PoolConnection<Postgres>> {
        loop {
            let kept = self.0.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let Some((mut conn, since)) = kept else {
                return pool.acquire().await;
            };
            if since.elapsed() < IDLE_CHECK {
                return Ok(conn);
            }
            match tokio::time::timeout(limit, conn.ping()).await {
                Ok(Ok(())) => return Ok(conn),
                Ok(Err(_)) => {}
                Err(_) => close_now(conn),
            }
        }
    }

    /// Keep `conn`, after a call on it succeeded.
    pub fn put(&self, conn: PoolConnection<Postgres>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((conn, Instant::now()));
    }
}

/// Close `conn` at once, without returning it to its pool: the pool would
/// ping it first (waiting for an answer that may never come), and needs a
/// runtime to do so.
pub(crate) fn close_now(conn: PoolConnection<Postgres>) {
    drop(conn.detach());
}

/// The error of a call that went unanswered for `limit`: a lost connection,
/// retried as one.
pub(crate) fn unanswered(limit: Duration) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("the database did not answer within {limit:?}; the connection is closed"),
    ))
}

impl Drop for Kept {
    /// Returning a connection to its pool needs a runtime, and the engine may
    /// be dropped outside one: the kept ones are detached and closed instead.
    fn drop(&mut self) {
        let kept = self.0.get_mut().unwrap_or_else(|p| p.into_inner());
        for (conn, _) in kept.drain(..) {
            close_now(conn);
        }
    }
}
