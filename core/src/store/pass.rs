//! Calls that give up: a run of calls on one connection of a pool, each
//! given up once it went unanswered for a limit.
//!
//! sqlx 0.8 sets no TCP keepalive, so a call on a connection whose server
//! went away without closing it (a failover, a dropped NAT mapping) waits
//! forever. The node's background work (maintenance, the rate waker, its
//! start and its stop) runs its calls through a [`Pass`]: a call unanswered
//! for the limit fails as a lost connection would, and its connection is
//! closed at once. What the abandoned call did, if it committed, is a
//! committed call whose answer was lost; every such call is safe to run again.

use super::kept::{close_now, unanswered};
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};
use std::time::Duration;

/// Calls on one connection of `pool`, taken at the first and given back when
/// the pass ends (one check by the pool per pass, not per call).
pub(crate) struct Pass<'p> {
    pool: &'p PgPool,
    limit: Duration,
    conn: Option<PoolConnection<Postgres>>,
}

impl<'p> Pass<'p> {
    pub fn new(pool: &'p PgPool, limit: Duration) -> Pass<'p> {
        Pass {
            pool,
            limit,
            conn: None,
        }
    }

    /// Run `call` on the pass's connection (taken from the pool first if it
    /// has none), giving up once the wait for a connection and the call took
    /// `limit`. A connection whose call failed or was given up is closed: it
    /// may be broken, and the pool's check of it on return may wait forever
    /// as well.
    pub async fn call<T, E: From<sqlx::Error>>(
        &mut self,
        call: impl AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
    ) -> Result<T, E> {
        let deadline = tokio::time::Instant::now() + self.limit;
        let mut conn = match self.conn.take() {
            Some(conn) => conn,
            None => tokio::time::timeout_at(deadline, self.pool.acquire())
                .await
                .map_err(|_| unanswered(self.limit))??,
        };
        match tokio::time::timeout_at(deadline, call(&mut conn)).await {
            Ok(Ok(v)) => {
                self.conn = Some(conn);
                Ok(v)
            }
            Ok(Err(e)) => {
                close_now(conn);
                Err(e)
            }
            Err(_) => {
                close_now(conn);
                Err(unanswered(self.limit).into())
            }
        }
    }
}
