//! An operator's actions: count, cancel, retry and delete the instances a
//! filter names, retry and delete one instance, pause and resume a queue;
//! and the engine's metrics. Each runs on the runtime with the tree's engine
//! and answers with a message; the core checks the filter (at least one
//! condition, names that could be names) and words its errors.

use crate::atoms;
use crate::engine::{spawn_call, EngineRes};
use crate::errors::{core_error, input_error};
use crate::runtime::ok_reply;
use gendurable::unique::ALL_STATUSES;
use gendurable::{Acted, Filter, Status};
use rustler::{Atom, Encoder, Env, ResourceArc, Term};

/// A filter as `GenDurable` passes it: `{ids, workflow, queue, statuses,
/// key, error}`, each `nil` when not given; statuses by name.
type FilterTerm = (
    Option<Vec<i64>>,
    Option<String>,
    Option<String>,
    Option<Vec<String>>,
    Option<String>,
    Option<String>,
);

/// The core's filter; a status must be one of the core's names.
fn filter_of(t: FilterTerm) -> Result<Filter, (&'static str, String)> {
    let (ids, workflow, queue, statuses, concurrency_key, error) = t;
    let statuses = statuses
        .map(|names| {
            names
                .iter()
                .map(|name| {
                    Status::from_name(name).ok_or_else(|| {
                        let known: Vec<&str> = ALL_STATUSES.iter().map(|s| s.as_str()).collect();
                        (
                            "status",
                            format!(
                                "invalid status: expected one of {}, got {name:?}",
                                known.join(", ")
                            ),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    Ok(Filter {
        ids,
        workflow,
        queue,
        statuses,
        concurrency_key,
        error,
    })
}

fn acted(a: Acted) -> (u64, u64) {
    (a.matched, a.changed)
}

/// How many instances the filter names (`Engine::count`). Replies `{:ok, n}`.
#[rustler::nif]
fn count<'a>(
    env: Env<'a>,
    res: ResourceArc<EngineRes>,
    filter: FilterTerm,
    reply_ref: Term<'a>,
) -> Term<'a> {
    let filter = match filter_of(filter) {
        Ok(f) => f,
        Err((field, message)) => return input_error(env, field, message),
    };
    spawn_call(env, &res, reply_ref, move |engine| async move {
        match engine.count(&filter).await {
            Ok(n) => ok_reply(n),
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}

/// `:cancel`, `:retry` or `:delete` on every instance the filter names
/// (`Engine::cancel_where`, `retry_where`, `delete_where`; the reason is
/// recorded by the first two). Replies `{:ok, {matched, changed}}`.
#[rustler::nif]
fn act_where<'a>(
    env: Env<'a>,
    res: ResourceArc<EngineRes>,
    action: Atom,
    filter: FilterTerm,
    reason: String,
    reply_ref: Term<'a>,
) -> Term<'a> {
    let filter = match filter_of(filter) {
        Ok(f) => f,
        Err((field, message)) => return input_error(env, field, message),
    };
    let action = match Action::of(action) {
        Some(a) => a,
        None => return input_error(env, "action", "must be :cancel, :retry or :delete"),
    };
    spawn_call(env, &res, reply_ref, move |engine| async move {
        let r = match action {
            Action::Cancel => engine.cancel_where(&filter, &reason).await,
            Action::Retry => engine.retry_where(&filter, &reason).await,
            Action::Delete => engine.delete_where(&filter).await,
        };
        match r {
            Ok(a) => ok_reply(acted(a)),
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}

/// `:retry` or `:delete` one instance (`Engine::retry`, `Engine::delete`).
/// Replies `{:ok, acted?}`; an unknown id is an error of kind `:not_found`.
#[rustler::nif]
fn act_one<'a>(
    env: Env<'a>,
    res: ResourceArc<EngineRes>,
    action: Atom,
    id: i64,
    reply_ref: Term<'a>,
) -> Term<'a> {
    let action = match Action::of(action) {
        Some(a @ (Action::Retry | Action::Delete)) => a,
        _ => return input_error(env, "action", "must be :retry or :delete"),
    };
    spawn_call(env, &res, reply_ref, move |engine| async move {
        let r = match action {
            Action::Retry => engine.retry(id).await,
            _ => engine.delete(id).await,
        };
        match r {
            Ok(b) => ok_reply(b),
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}

#[derive(Clone, Copy)]
enum Action {
    Cancel,
    Retry,
    Delete,
}

impl Action {
    fn of(a: Atom) -> Option<Action> {
        if a == atoms::cancel() {
            Some(Action::Cancel)
        } else if a == atoms::retry() {
            Some(Action::Retry)
        } else if a == atoms::delete() {
            Some(Action::Delete)
        } else {
            None
        }
    }
}

/// Pauses (`paused` true) or resumes a queue (`Engine::pause_queue`,
/// `Engine::resume_queue`). Replies `{:ok, changed?}`: whether it was
/// running (pause) or paused (resume).
#[rustler::nif]
fn pause_queue<'a>(
    env: Env<'a>,
    res: ResourceArc<EngineRes>,
    queue: String,
    paused: bool,
    reply_ref: Term<'a>,
) -> Term<'a> {
    spawn_call(env, &res, reply_ref, move |engine| async move {
        let r = if paused {
            engine.pause_queue(&queue).await
        } else {
            engine.resume_queue(&queue).await
        };
        match r {
            Ok(b) => ok_reply(b),
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}

/// The paused queues (`Engine::paused_queues`). Replies `{:ok, [{queue,
/// since}]}`, since in Unix microseconds.
#[rustler::nif]
fn paused_queues<'a>(env: Env<'a>, res: ResourceArc<EngineRes>, reply_ref: Term<'a>) -> Term<'a> {
    spawn_call(env, &res, reply_ref, move |engine| async move {
        match engine.paused_queues().await {
            Ok(all) => ok_reply(
                all.into_iter()
                    .map(|(q, since)| (q, since.timestamp_micros()))
                    .collect::<Vec<_>>(),
            ),
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}

/// The engine's metrics in the Prometheus text format (`Engine::metrics`).
/// Replies `{:ok, text}`: one binary, the engine's own text (a few
/// kilobytes, more with many queues and gates), no value of a user's.
#[rustler::nif]
fn metrics<'a>(env: Env<'a>, res: ResourceArc<EngineRes>, reply_ref: Term<'a>) -> Term<'a> {
    spawn_call(env, &res, reply_ref, move |engine| async move {
        match engine.metrics().await {
            Ok(text) => ok_reply(text),
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}

/// Where the running node's metrics listener listens (`Engine::metrics_addr`;
/// the bound port when the option gave port 0). Replies `{:ok, "host:port"}`,
/// or `{:ok, nil}` without a listener.
#[rustler::nif]
fn metrics_addr<'a>(env: Env<'a>, res: ResourceArc<EngineRes>, reply_ref: Term<'a>) -> Term<'a> {
    spawn_call(env, &res, reply_ref, move |engine| async move {
        ok_reply(engine.metrics_addr().await.map(|a| a.to_string()))
    });
    atoms::ok().encode(env)
}
