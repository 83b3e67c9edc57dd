//! An operator's actions from Python: the filter of `count`, `cancel_where`,
//! `retry_where` and `delete_where`, and what they return.

use crate::errors::invalid_input;
use crate::testing::status_of;
use crate::values::epoch;
use gendurable::{Acted, Engine, Filter};
use pyo3::prelude::*;

/// A filter as `gendurable.Engine` passes it: `(ids, workflow, queue,
/// statuses, concurrency key, error text)`, each `None` when not given.
pub(crate) type FilterArgs = (
    Option<Vec<i64>>,
    Option<String>,
    Option<String>,
    Option<Vec<String>>,
    Option<String>,
    Option<String>,
);

/// The core's filter; at least one condition (the core's `Filter::parse`
/// asks the same: an action on every instance is spelled out with a status).
pub(crate) fn filter_of(args: FilterArgs) -> PyResult<Filter> {
    let (ids, workflow, queue, statuses, concurrency_key, error) = args;
    let statuses = statuses
        .map(|s| s.iter().map(|s| status_of(s)).collect::<PyResult<Vec<_>>>())
        .transpose()?;
    let filter = Filter {
        ids,
        workflow,
        queue,
        statuses,
        concurrency_key,
        error,
    };
    if filter == Filter::default() {
        return Err(invalid_input(
            "filter",
            "give at least one condition (ids, workflow, queue, status, key or error); \
             to act on every instance, name the statuses",
        ));
    }
    Ok(filter)
}

/// `cancel_where`, `retry_where` or `delete_where`.
#[derive(Clone, Copy)]
pub(crate) enum Verb {
    Cancel,
    Retry,
    Delete,
}

impl Verb {
    pub(crate) fn of(verb: &str) -> PyResult<Verb> {
        match verb {
            "cancel" => Ok(Verb::Cancel),
            "retry" => Ok(Verb::Retry),
            "delete" => Ok(Verb::Delete),
            other => Err(invalid_input(
                "action",
                format!("must be cancel, retry or delete; got {other:?}"),
            )),
        }
    }

    /// What the action records in each instance's errors when no reason is
    /// given: what `Engine::cancel` and `Engine::retry` record.
    fn default_reason(self) -> &'static str {
        match self {
            Verb::Cancel => "cancelled",
            Verb::Retry => "retried",
            Verb::Delete => "",
        }
    }
}

/// The action on what `filter` names: `(matched, changed)`.
pub(crate) async fn act(
    engine: &Engine,
    verb: Verb,
    filter: Filter,
    reason: Option<String>,
) -> gendurable::Result<(u64, u64)> {
    let reason = reason.as_deref().unwrap_or(verb.default_reason());
    let Acted { matched, changed } = match verb {
        Verb::Cancel => engine.cancel_where(&filter, reason).await?,
        Verb::Retry => engine.retry_where(&filter, reason).await?,
        Verb::Delete => engine.delete_where(&filter).await?,
    };
    Ok((matched, changed))
}

/// `retry(id)` or `delete(id)`: whether it acted.
pub(crate) async fn act_one(engine: &Engine, verb: Verb, id: i64) -> gendurable::Result<bool> {
    match verb {
        Verb::Retry => engine.retry(id).await,
        Verb::Delete => engine.delete(id).await,
        Verb::Cancel => Err(gendurable::Error::InvalidInput {
            field: "action",
            reason: "cancel one instance with cancel(id)".into(),
        }),
    }
}

/// The paused queues and since when (seconds since the epoch).
pub(crate) async fn paused(engine: &Engine) -> gendurable::Result<Vec<(String, f64)>> {
    Ok(engine
        .paused_queues()
        .await?
        .into_iter()
        .map(|(q, since)| (q, epoch(&since)))
        .collect())
}
