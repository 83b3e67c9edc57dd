//! Calls that give up: a run of calls on one connection of a pool, each
//! given up once it went unanswered for a limit.
//!
//! sqlx 0.8 sets no TCP keepalive, so a call on a connection whose server
//! went away without closing it (a failover, a dropped NAT mapping) waits
//! forever. The node's background work (maintenance, the rate waker, the
//! periodic workflows, its start and its stop) runs its calls through a
//! [`Pass`] limited to a lease, the application's through [`Limited`] (or a
//! `Pass` for a transaction) limited to `call_timeout`: a call unanswered for
//! its limit fails as a lost connection would, and its connection is closed
//! at once. What the abandoned call did, if it committed, is a committed call
//! whose answer was lost: the node's are safe to run again, and a claim one
//! made is found by the lost-claim check.

use super::kept::{close_now, unanswered};
use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{Describe, Either, Execute, Executor, PgConnection, PgPool, Postgres};
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
    /// `limit`. A connection whose call was given up, or failed otherwise
    /// than by the server's answer, is closed: it may be broken, and the
    /// pool's check of it on return may wait forever as well. One whose call
    /// the server refused (a constraint, a trigger, a lock timeout) stays:
    /// a transaction the call dropped is rolled back before its next call.
    pub async fn call<T, E: From<sqlx::Error> + Answered>(
        &mut self,
        call: impl AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
    ) -> Result<T, E> {
        let deadline = tokio::time::Instant::from_std(crate::deadline::after(self.limit));
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
                if e.answered() {
                    self.conn = Some(conn);
                } else {
                    close_now(conn);
                }
                Err(e)
            }
            Err(_) => {
                close_now(conn);
                Err(unanswered(self.limit).into())
            }
        }
    }
}

/// Whether a call's error is the server's answer to it, which leaves its
/// connection fit for the next call, rather than a broken, stalled or
/// closing connection.
pub(crate) trait Answered {
    fn answered(&self) -> bool;
}

impl Answered for sqlx::Error {
    fn answered(&self) -> bool {
        matches!(self, sqlx::Error::Database(db)
            if !db.code().is_some_and(|c| crate::error::ends_connection(&c)))
    }
}

impl Answered for crate::Error {
    fn answered(&self) -> bool {
        match self {
            crate::Error::Database(e) => e.answered(),
            // The call's own refusal: the connection is as fit as after a success.
            crate::Error::InvalidInput { .. }
            | crate::Error::NotFound(_)
            | crate::Error::Contended(_) => true,
            _ => false,
        }
    }
}

/// A pool as an executor whose every call runs through a [`Pass`] of its own:
/// given up after `limit` unanswered, its connection closed. Rows are read
/// whole before they are handed on (the engine's statements return few).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limited<'p> {
    pub pool: &'p PgPool,
    pub limit: Duration,
}

impl<'c> Executor<'c> for Limited<'c> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let all = async move {
            Pass::new(self.pool, self.limit)
                .call(async move |c| c.fetch_many(query).try_collect::<Vec<_>>().await)
                .await
        };
        stream::once(all)
            .flat_map(|all| match all {
                Ok(items) => stream::iter(items.into_iter().map(Ok)).left_stream(),
                Err(e) => stream::once(async { Err(e) }).right_stream(),
            })
            .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        Box::pin(async move {
            Pass::new(self.pool, self.limit)
                .call(async move |c| c.fetch_optional(query).await)
                .await
        })
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        Box::pin(async move {
            Pass::new(self.pool, self.limit)
                .call(async move |c| c.prepare_with(sql, parameters).await)
                .await
        })
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        Box::pin(async move {
            Pass::new(self.pool, self.limit)
                .call(async move |c| c.describe(sql).await)
                .await
        })
    }
}
