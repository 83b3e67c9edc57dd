//! The instance list: newest first, filtered, paginated by id (keyset).
//! Each page reads windows of the primary key downwards until it is full or
//! its time is up, so no filter can make one request walk the whole table;
//! a page cut short says where to search on from.

use super::Engine;
use crate::engine::Filter;
use crate::error::Result;
use crate::instance::Status;
use crate::validate;
use chrono::{DateTime, Utc};
use sqlx::Row;
use std::time::{Duration, Instant};

/// The first window's width in ids; each window that leaves the page short
/// doubles it, up to [`MAX_WINDOW`].
const FIRST_WINDOW: i64 = 10_000;
const MAX_WINDOW: i64 = 1_000_000;
/// The most a page may be in the making before it returns what it found.
const PAGE_TIME: Duration = Duration::from_millis(300);
/// The most rows a page holds.
const MAX_PAGE: usize = 500;

/// A page request: which instances, and from where.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// The conditions; none: every instance.
    pub filter: Filter,
    /// Instances with ids below this (the previous page's `next`); none:
    /// from the newest.
    pub before: Option<i64>,
    /// Rows per page (1 to 500; 0 means 50).
    pub limit: usize,
}

/// One page of the list.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InstancePage {
    pub rows: Vec<InstanceRow>,
    /// Where the next page starts (its `before`); none: nothing older.
    pub next: Option<i64>,
    /// The page stopped short of full because its time was up: ids from
    /// `next` down are not searched yet.
    pub partial: bool,
}

/// One instance in the list.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InstanceRow {
    pub id: i64,
    pub workflow: String,
    pub step: String,
    pub queue: String,
    pub status: Status,
    pub priority: i16,
    pub concurrency_key: Option<String>,
    pub rate_limit: Option<String>,
    pub attempt: i32,
    pub max_attempts: i32,
    pub node: Option<String>,
    /// Why an available row is out of the pick's sight: `key`, `rate` or
    /// `workflow`.
    pub parked: Option<String>,
    pub inserted_at: DateTime<Utc>,
    pub scheduled_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The last error's message.
    pub last_error: Option<String>,
}

impl Engine {
    /// A page of instances, newest first; see [`ListQuery`]. Reads the
    /// primary key in windows: the time a page takes is bounded whatever
    /// the filter and the table's size.
    pub async fn list(&self, q: &ListQuery) -> Result<InstancePage> {
        if let Some(w) = &q.filter.workflow {
            validate::name("workflow", w)?;
        }
        if let Some(queue) = &q.filter.queue {
            validate::name("queue", queue)?;
        }
        let limit = match q.limit {
            0 => 50,
            n => n.min(MAX_PAGE),
        };
        let (sql, pool) = (&self.ctx.store.sql, self.ctx.db());
        let bounds = sqlx::query(&sql.id_bounds).fetch_one(pool).await?;
        let (Some(lowest), Some(highest)) = (
            bounds.try_get::<Option<i64>, _>(0)?,
            bounds.try_get::<Option<i64>, _>(1)?,
        ) else {
            return Ok(InstancePage {
                rows: Vec::new(),
                next: None,
                partial: false,
            });
        };
        let started = Instant::now();
        let mut top = q.before.unwrap_or(i64::MAX).min(highest.saturating_add(1));
        let mut window = FIRST_WINDOW;
        let mut rows = Vec::new();
        while top > lowest && rows.len() < limit {
            if started.elapsed() >= PAGE_TIME {
                return Ok(InstancePage {
                    rows,
                    next: Some(top),
                    partial: true,
                });
            }
            let floor = top.saturating_sub(window).max(lowest);
            let want = (limit - rows.len()) as i64;
            let found = q
                .filter
                .bind(sqlx::query(&sql.list_window), Some(top), Some(want as i32))
                .bind(floor)
                .fetch_all(pool)
                .await?;
            let full = found.len() as i64 == want;
            for r in &found {
                rows.push(row(r)?);
            }
            top = match (full, rows.last()) {
                (true, Some(last)) => last.id,
                _ => floor,
            };
            if !full {
                window = (window * 2).min(MAX_WINDOW);
            }
        }
        Ok(InstancePage {
            next: (top > lowest).then_some(top),
            rows,
            partial: false,
        })
    }
}

fn row(r: &sqlx::postgres::PgRow) -> Result<InstanceRow> {
    Ok(InstanceRow {
        id: r.try_get(0)?,
        workflow: r.try_get(1)?,
        step: r.try_get(2)?,
        queue: r.try_get(3)?,
        status: Status::parse(r.try_get::<&str, _>(4)?),
        priority: r.try_get(5)?,
        concurrency_key: r.try_get(6)?,
        rate_limit: r.try_get(7)?,
        attempt: r.try_get(8)?,
        max_attempts: r.try_get(9)?,
        node: r.try_get(10)?,
        parked: r.try_get(11)?,
        inserted_at: r.try_get(12)?,
        scheduled_at: r.try_get(13)?,
        finished_at: r.try_get(14)?,
        last_error: r.try_get(15)?,
    })
}
