//! An operator's actions on instances, one or many: cancel, retry, delete,
//! and counting what a filter names (a dry run); pausing and resuming a
//! queue. The CLI and the dashboard call these.

use super::Engine;
use crate::error::{Error, Result};
use crate::instance::Status;
use crate::validate;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::Row;

/// Instances an action applies to in one statement; a larger set takes
/// several, in id order.
const BATCH: i32 = 1000;

/// Which instances an action names: every condition given must hold.
///
/// ```
/// use gendurable::{Filter, Status};
/// let f = Filter::parse(["workflow=Charge", "status=discarded,cancelled", "error=timeout"]).unwrap();
/// assert_eq!(f.workflow.as_deref(), Some("Charge"));
/// assert_eq!(f.statuses, Some(vec![Status::Discarded, Status::Cancelled]));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub ids: Option<Vec<i64>>,
    pub workflow: Option<String>,
    pub queue: Option<String>,
    pub statuses: Option<Vec<Status>>,
    pub concurrency_key: Option<String>,
    /// Text in the message of the last error recorded (any case).
    pub error: Option<String>,
}

impl Filter {
    /// The instance `id`.
    pub fn id(id: i64) -> Filter {
        Filter {
            ids: Some(vec![id]),
            ..Default::default()
        }
    }

    /// Conditions written `field=value`: `id=5,6`, `workflow=Charge`,
    /// `queue=billing`, `status=discarded,cancelled`, `key=account:7`,
    /// `error=timed out` (what follows the first `=` is the value). At least
    /// one is needed: an action on every instance is spelled out with
    /// `status=...`.
    pub fn parse<S: AsRef<str>>(terms: impl IntoIterator<Item = S>) -> Result<Filter> {
        let mut f = Filter::default();
        let mut any = false;
        for term in terms {
            let term = term.as_ref();
            let bad = |why: String| Error::input("filter", format!("{term:?}: {why}"));
            let (field, value) = term
                .split_once('=')
                .ok_or_else(|| bad("expected field=value".into()))?;
            let list = || value.split(',').map(str::trim).filter(|v| !v.is_empty());
            match field.trim() {
                "id" => {
                    let ids = list()
                        .map(|v| {
                            v.parse::<i64>()
                                .map_err(|_| bad(format!("{v:?} is not an id")))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    f.ids = Some(ids);
                }
                "workflow" => f.workflow = Some(value.to_owned()),
                "queue" => f.queue = Some(value.to_owned()),
                "status" => {
                    let statuses = list()
                        .map(|v| {
                            Status::from_name(v).ok_or_else(|| {
                                bad(format!(
                                    "{v:?} is not a status (scheduled, available, executing, \
                                     awaiting, completed, cancelled, discarded)"
                                ))
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    f.statuses = Some(statuses);
                }
                "key" => f.concurrency_key = Some(value.to_owned()),
                "error" => f.error = Some(value.to_owned()),
                other => {
                    return Err(bad(format!(
                        "unknown field {other:?} (known: id, workflow, queue, status, key, error)"
                    )))
                }
            }
            any = true;
        }
        if !any {
            return Err(Error::input(
                "filter",
                "give at least one condition (field=value)",
            ));
        }
        Ok(f)
    }

    /// A filter an action may use: at least one condition (an action on
    /// every instance is spelled out, e.g. with every status), and names
    /// that could be names.
    fn check(&self) -> Result<()> {
        if *self == Filter::default() {
            return Err(Error::input(
                "filter",
                "give at least one condition (ids, workflow, queue, statuses, key, error)",
            ));
        }
        if let Some(w) = &self.workflow {
            validate::name("workflow", w)?;
        }
        if let Some(q) = &self.queue {
            validate::name("queue", q)?;
        }
        Ok(())
    }

    pub(in crate::engine) fn bind<'q>(
        &'q self,
        q: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
        after: Option<i64>,
        limit: Option<i32>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        let statuses: Option<Vec<&str>> = self
            .statuses
            .as_ref()
            .map(|s| s.iter().map(|s| s.as_str()).collect());
        q.bind(&self.ids)
            .bind(&self.workflow)
            .bind(&self.queue)
            .bind(statuses)
            .bind(&self.concurrency_key)
            .bind(&self.error)
            .bind(after)
            .bind(limit)
    }
}

/// What a bulk action did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Acted {
    /// Instances the filter named.
    pub matched: u64,
    /// Those the action changed (the others were in a status it does not
    /// apply to).
    pub changed: u64,
}

#[derive(Clone, Copy)]
enum Action {
    Cancel,
    Retry,
    Delete,
}

impl Engine {
    /// How many instances `filter` names: what an action would look at.
    pub async fn count(&self, filter: &Filter) -> Result<u64> {
        filter.check()?;
        let n: i64 = filter
            .bind(sqlx::query(&self.ctx.store.sql.count), None, None)
            .fetch_one(self.ctx.db())
            .await?
            .try_get(0)?;
        Ok(n as u64)
    }

    /// Cancel every instance `filter` names, as [`Engine::cancel`] does one.
    pub async fn cancel_where(&self, filter: &Filter, reason: &str) -> Result<Acted> {
        self.act(Action::Cancel, filter, reason).await
    }

    /// Run again now every scheduled, discarded or cancelled instance
    /// `filter` names: a scheduled one keeps its attempts, a discarded or
    /// cancelled one gets its step's attempts afresh; not one whose unique
    /// identity another instance holds now.
    pub async fn retry_where(&self, filter: &Filter, reason: &str) -> Result<Acted> {
        self.act(Action::Retry, filter, reason).await
    }

    /// [`Engine::retry_where`] for one instance: whether it was made runnable.
    pub async fn retry(&self, id: i64) -> Result<bool> {
        self.one(Action::Retry, id, "retried").await
    }

    /// Delete every instance `filter` names that is not executing or
    /// reserved by a node (cancel those first), with the signals kept for it.
    pub async fn delete_where(&self, filter: &Filter) -> Result<Acted> {
        self.act(Action::Delete, filter, "").await
    }

    /// [`Engine::delete_where`] for one instance: whether it was deleted.
    pub async fn delete(&self, id: i64) -> Result<bool> {
        self.one(Action::Delete, id, "").await
    }

    /// Send signal `name` with `payload` to every instance `filter` names,
    /// as [`Engine::send`] does to one: an instance awaiting it is woken, one
    /// not awaiting it yet keeps it until it does. `changed` counts those
    /// (not the finished ones, to which nothing is kept).
    pub async fn send_where(
        &self,
        filter: &Filter,
        name: &str,
        payload: serde_json::Value,
    ) -> Result<Acted> {
        filter.check()?;
        validate::name("signal", name)?;
        validate::payload("payload", &payload)?;
        let mut acted = Acted::default();
        let mut after = None;
        loop {
            let ids = filter
                .bind(
                    sqlx::query(&self.ctx.store.sql.matching_ids),
                    after,
                    Some(BATCH),
                )
                .fetch_all(self.ctx.db())
                .await?
                .iter()
                .map(|r| r.try_get::<i64, _>(0))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            for &id in &ids {
                match self.send(id, name, payload.clone()).await {
                    Ok(d) => {
                        acted.matched += 1;
                        acted.changed += u64::from(!matches!(d, super::Delivery::Finished(_)));
                    }
                    // Deleted since it was matched.
                    Err(Error::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            match ids.last() {
                Some(&last) if ids.len() == BATCH as usize => after = Some(last),
                _ => return Ok(acted),
            }
        }
    }

    /// Pause `queue` cluster-wide: no node claims from it (nor starts an
    /// inserted row of it at once) until it is resumed; steps running or
    /// already claimed finish and record their outcomes. A key's successor
    /// that a node started as its predecessor ended is stopped instead (it
    /// is not promoted into a paused queue) and runs again once resumed.
    /// Persisted. Returns whether it was running.
    pub async fn pause_queue(&self, queue: &str) -> Result<bool> {
        validate::name("queue", queue)?;
        Ok(sqlx::query_scalar(&self.ctx.store.sql.pause)
            .bind(queue)
            .fetch_one(self.ctx.db())
            .await?)
    }

    /// Resume a paused queue and wake its pickers. Returns whether it was paused.
    pub async fn resume_queue(&self, queue: &str) -> Result<bool> {
        validate::name("queue", queue)?;
        let row = sqlx::query(&self.ctx.store.sql.resume)
            .bind(queue)
            .bind(&self.ctx.store.sql.channel)
            .fetch_one(self.ctx.db())
            .await?;
        Ok(row.try_get(0)?)
    }

    /// The paused queues, and since when.
    pub async fn paused_queues(&self) -> Result<Vec<(String, DateTime<Utc>)>> {
        Ok(sqlx::query_as(&self.ctx.store.sql.paused)
            .fetch_all(self.ctx.db())
            .await?)
    }

    async fn one(&self, action: Action, id: i64, reason: &str) -> Result<bool> {
        let rows = self
            .act_batch(action, &Filter::id(id), None, reason)
            .await?;
        match rows.first() {
            Some(r) => Ok(r.try_get("changed")?),
            None => Err(Error::NotFound(id)),
        }
    }

    /// Cancel one instance: the status it had (None: no such instance).
    pub(super) async fn cancel_one(&self, id: i64, reason: &str) -> Result<Option<Status>> {
        let rows = self
            .act_batch(Action::Cancel, &Filter::id(id), None, reason)
            .await?;
        rows.first()
            .map(|r| Ok(Status::parse(r.try_get::<&str, _>("status")?)))
            .transpose()
    }

    async fn act(&self, action: Action, filter: &Filter, reason: &str) -> Result<Acted> {
        filter.check()?;
        let mut acted = Acted::default();
        let mut after = None;
        loop {
            let rows = self.act_batch(action, filter, after, reason).await?;
            acted.matched += rows.len() as u64;
            for r in &rows {
                let changed: bool = match action {
                    // Cancel reports a count per statement, not per row.
                    Action::Cancel => {
                        let s = Status::parse(r.try_get::<&str, _>("status")?);
                        !s.is_final()
                    }
                    _ => r.try_get("changed")?,
                };
                acted.changed += u64::from(changed);
            }
            match rows.last() {
                Some(r) if rows.len() == BATCH as usize => after = Some(r.try_get("id")?),
                _ => return Ok(acted),
            }
        }
    }

    async fn act_batch(
        &self,
        action: Action,
        filter: &Filter,
        after: Option<i64>,
        reason: &str,
    ) -> Result<Vec<PgRow>> {
        let sql = &self.ctx.store.sql;
        let q = match action {
            Action::Cancel => filter
                .bind(sqlx::query(&sql.cancel), after, Some(BATCH))
                .bind(reason)
                .bind(&sql.cancel_channel),
            Action::Retry => filter
                .bind(sqlx::query(&sql.retry), after, Some(BATCH))
                .bind(reason)
                .bind(&sql.channel),
            Action::Delete => filter.bind(sqlx::query(&sql.delete), after, Some(BATCH)),
        };
        Ok(q.fetch_all(self.ctx.db()).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_read_from_terms() {
        let f = Filter::parse(["id=5, 6", "queue=q", "key=account:7", "error=a=b"]).unwrap();
        assert_eq!(f.ids, Some(vec![5, 6]));
        assert_eq!(f.concurrency_key.as_deref(), Some("account:7"));
        assert_eq!(f.error.as_deref(), Some("a=b"));
        let e = |t: &str| Filter::parse([t]).unwrap_err().to_string();
        assert!(e("status=done").contains("\"done\" is not a status"));
        assert!(e("colour=red").contains("unknown field \"colour\""));
        assert!(e("id=x").contains("\"x\" is not an id"));
        assert!(e("workflow").contains("expected field=value"));
        let none: [&str; 0] = [];
        assert!(Filter::parse(none).is_err());
        assert!(Filter::default().check().is_err());
        assert!(Filter::id(1).check().is_ok());
        let bad = Filter {
            queue: Some(String::new()),
            ..Default::default()
        };
        assert!(bad.check().is_err());
    }
}
