//! The cron service of a running node: at each tick of each configured
//! schedule, insert the tick's instance in the transaction that records the
//! tick, under the schedule's row lock, so that every node may try and each
//! tick is inserted once (see `sql/migrations/*_cron.sql`).

use super::insert;
use crate::context::Context;
use crate::cron::{CronEntry, Schedule};
use crate::error::Result;
use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The longest sleep between rounds: a clock that jumped, or a schedule
/// whose next tick is far off, is looked at again this often.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// The wait after a round that failed (the database away, say).
const RETRY_WAIT: Duration = Duration::from_secs(1);

/// The running service.
pub(crate) struct Cron {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Cron {
    /// Start the service for the configured entries (validated by the builder).
    pub fn start(ctx: Arc<Context>) -> Result<Option<Cron>> {
        let entries = ctx
            .cfg
            .cron
            .iter()
            .map(|e| e.parse().map(|s| (e.clone(), s)))
            .collect::<Result<Vec<_>>>()?;
        if entries.is_empty() {
            return Ok(None);
        }
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(ctx, entries, stop.clone()));
        Ok(Some(Cron { stop, task }))
    }

    /// Stop; a round under way finishes (its transaction commits or not).
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

async fn run(ctx: Arc<Context>, entries: Vec<(CronEntry, Schedule)>, stop: CancellationToken) {
    loop {
        let mut wait = MAX_WAIT;
        for (entry, schedule) in &entries {
            // Each round on a connection of its own, given up after a lease
            // unanswered: its transaction rolls back with the connection.
            let round = ctx
                .pass()
                .call(async |c| fire(&ctx, c, entry, schedule).await)
                .await;
            match round {
                Ok((now, Some(next))) => {
                    wait = wait.min((next - now).to_std().unwrap_or_default());
                }
                Ok((_, None)) => {}
                Err(e) => {
                    tracing::warn!(cron = entry.entry_name(), error = %e, "cron round failed");
                    wait = wait.min(RETRY_WAIT);
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Insert the ticks of `entry` that are due by the database's clock, and
/// return that clock and the next tick.
async fn fire(
    ctx: &Context,
    conn: &mut sqlx::PgConnection,
    entry: &CronEntry,
    schedule: &Schedule,
) -> Result<(DateTime<Utc>, Option<DateTime<Utc>>)> {
    let name = entry.entry_name();
    let sql = &ctx.store.sql;
    let mut tx = sqlx::Connection::begin(conn).await?;
    let mut row = lock(ctx, &mut tx, name).await?;
    if row.is_none() {
        // Seen for the first time (once per entry, not per round).
        if let Some(first) = schedule.latest_until(Utc::now()) {
            sqlx::query(&sql.cron_register)
                .bind(name)
                .bind(first)
                .execute(&mut *tx)
                .await?;
            row = lock(ctx, &mut tx, name).await?;
        }
    }
    let Some((last, now)) = row else {
        // A schedule with no tick before now: nothing can be due yet.
        return Ok((Utc::now(), schedule.next_after(Utc::now())));
    };
    let (ticks, new_last) = schedule.due(last, now, entry.missed);
    if !ticks.is_empty() {
        let news = ticks
            .iter()
            .map(|t| entry.instance.clone().scheduled_at(*t))
            .collect();
        let rows = insert::Rows::new(ctx, news)?;
        insert::insert_unique(ctx, &mut tx, rows, None).await?;
        tracing::debug!(cron = name, ticks = ticks.len(), "inserted");
    }
    if new_last != last {
        sqlx::query(&sql.cron_advance)
            .bind(name)
            .bind(new_last)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    // A round capped short of now goes on at once.
    let behind = schedule.latest_until(now).is_some_and(|t| t > new_last);
    Ok((
        now,
        if behind {
            Some(now)
        } else {
            schedule.next_after(now)
        },
    ))
}

/// The entry's last tick, locked, and the database's clock (None: the entry
/// has no row yet).
async fn lock(
    ctx: &Context,
    tx: &mut sqlx::PgConnection,
    name: &str,
) -> Result<Option<(DateTime<Utc>, DateTime<Utc>)>> {
    Ok(sqlx::query_as(&ctx.store.sql.cron_lock)
        .bind(name)
        .fetch_optional(tx)
        .await?)
}
