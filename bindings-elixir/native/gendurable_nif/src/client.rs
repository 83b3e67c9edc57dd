//! Client calls: insert, get, signal, cancel. Each runs on the runtime with
//! the tree's engine and answers with a message; values a user gives (an
//! insert's options and state, a payload) become JSON first, on a dirty
//! scheduler, and the core reads and checks them.

use crate::atoms;
use crate::convert::{json_to_term, options_to_json, term_to_json};
use crate::engine::{spawn_call, EngineRes};
use crate::errors::{core_error, core_error_term, input_error, internal_error};
use crate::runtime::{lock, ok_reply, reply};
use gendurable::options::{InsertOptions, UniqueStates};
use gendurable::unique::{ACTIVE_STATUSES, ALL_STATUSES};
use gendurable::{Cancelled, Delivery, DrainOptions, InsertedQuery, Instance, NewInstance, Status};
use rustler::{Atom, Encoder, Env, ResourceArc, Term};
use std::sync::Mutex;
use std::time::Duration;

/// An insert: a map of the core's insert options (see
/// `gendurable::options::InsertOptions`). Only its top level is walked to
/// name an option that is not JSON; the state converts whole.
fn new_instance(term: Term) -> gendurable::Result<NewInstance> {
    let json = options_to_json(term, 1).map_err(|(path, e)| {
        let field = path.first().map_or("options", String::as_str);
        InsertOptions::error_at(field, &format!("not JSON: {e}"))
    })?;
    NewInstance::from_json(json)
}

/// Inserts instances, each a map of insert options. Replies `{:ok,
/// [{id, conflict}]}`, in order: `conflict` is true when a unique insert or
/// idempotency key met an instance holding its identity, whose id it is
/// (nothing was inserted for it). Converting large states is CPU work, so
/// this runs on a dirty CPU scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn insert_many<'a>(
    env: Env<'a>,
    res: ResourceArc<EngineRes>,
    news: Vec<Term<'a>>,
    reply_ref: Term<'a>,
) -> Term<'a> {
    let n = news.len();
    let mut batch = Vec::with_capacity(n);
    for (i, t) in news.into_iter().enumerate() {
        match new_instance(t) {
            Ok(new) => batch.push(new),
            Err(e) if n > 1 => {
                let suffix = format!(" (instance {i} of {n}; nothing was inserted)");
                return core_error_term(env, &e, &suffix);
            }
            Err(e) => return core_error_term(env, &e, ""),
        }
    }
    spawn_call(env, &res, reply_ref, |engine| async move {
        match engine.insert_many_unique(batch).await {
            Ok(inserted) => ok_reply(
                inserted
                    .into_iter()
                    .map(|i| (i.id, i.conflict))
                    .collect::<Vec<_>>(),
            ),
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}

/// An instance read by `get/3`, converted by `instance_term/1`.
pub struct InstanceRes {
    instance: Mutex<Option<Instance>>,
}

#[rustler::resource_impl]
impl rustler::Resource for InstanceRes {}

/// A status as its atom, the name the core stores it under.
fn status_atom(s: Status) -> Atom {
    match s {
        Status::Scheduled => atoms::scheduled(),
        Status::Available => atoms::available(),
        Status::Executing => atoms::executing(),
        Status::Awaiting => atoms::awaiting(),
        Status::Completed => atoms::completed(),
        Status::Cancelled => atoms::cancelled(),
        Status::Discarded => atoms::discarded(),
    }
}

fn instance_to_term<'a>(env: Env<'a>, i: &Instance) -> Term<'a> {
    let us = |t: &chrono::DateTime<chrono::Utc>| t.timestamp_micros();
    let errors: Vec<Term> = i.errors.iter().map(|e| json_to_term(env, e)).collect();
    let pairs: Vec<(Term, Term)> = vec![
        (
            atoms::struct_().encode(env),
            atoms::instance_struct().encode(env),
        ),
        (atoms::id().encode(env), i.id.encode(env)),
        (atoms::workflow().encode(env), i.workflow.encode(env)),
        (atoms::step().encode(env), i.step.encode(env)),
        (atoms::state().encode(env), json_to_term(env, &i.state)),
        (atoms::queue().encode(env), i.queue.encode(env)),
        (atoms::priority().encode(env), i.priority.encode(env)),
        (
            atoms::status().encode(env),
            status_atom(i.status).encode(env),
        ),
        (
            atoms::concurrency_key().encode(env),
            i.concurrency_key.encode(env),
        ),
        (atoms::rate_limit().encode(env), i.rate_limit.encode(env)),
        (atoms::attempt().encode(env), i.attempt.encode(env)),
        (
            atoms::max_attempts().encode(env),
            i.max_attempts.encode(env),
        ),
        (atoms::node().encode(env), i.node.encode(env)),
        (
            atoms::cancel_requested().encode(env),
            i.cancel_requested.encode(env),
        ),
        (
            atoms::await_signal().encode(env),
            i.await_signal.encode(env),
        ),
        (
            atoms::await_until().encode(env),
            i.await_until.as_ref().map(us).encode(env),
        ),
        (atoms::errors().encode(env), errors.encode(env)),
        (
            atoms::inserted_at().encode(env),
            us(&i.inserted_at).encode(env),
        ),
        (
            atoms::scheduled_at().encode(env),
            us(&i.scheduled_at).encode(env),
        ),
        (
            atoms::attempted_at().encode(env),
            i.attempted_at.as_ref().map(us).encode(env),
        ),
        (
            atoms::finished_at().encode(env),
            i.finished_at.as_ref().map(us).encode(env),
        ),
    ];
    // Fails only on a duplicate key, and the keys above are distinct.
    Term::map_from_pairs(env, &pairs)
        .unwrap_or_else(|_| internal_error(env, "cannot build the instance's map".into()))
}

/// Reads an instance. Replies `{:ok, instance}`, a resource that
/// `instance_term/1` turns into a `%GenDurable.Instance{}`.
#[rustler::nif]
fn get<'a>(env: Env<'a>, res: ResourceArc<EngineRes>, id: i64, reply_ref: Term<'a>) -> Term<'a> {
    spawn_call(env, &res, reply_ref, move |engine| async move {
        match engine.get(id).await {
            Ok(i) => ok_reply(ResourceArc::new(InstanceRes {
                instance: Mutex::new(Some(i)),
            })),
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}

/// `%GenDurable.Instance{}` of an instance read by `get/3` (timestamps as
/// Unix microseconds; the Elixir side turns them into `DateTime`s), built
/// in the caller's environment on a dirty scheduler. The instance is taken:
/// a second call returns `nil`.
#[rustler::nif(schedule = "DirtyCpu")]
fn instance_term(env: Env, res: ResourceArc<InstanceRes>) -> Term {
    match lock(&res.instance).take() {
        Some(i) => instance_to_term(env, &i),
        None => atoms::nil().encode(env),
    }
}

/// Wakes every instance awaiting `name`. Replies `{:ok, count}`. Given
/// `ttl_ms`, a signal that woke nobody is kept that long for the first
/// instance that awaits `name` (`Engine::signal_with_ttl`). The payload is
/// converted on a dirty scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn signal<'a>(
    env: Env<'a>,
    res: ResourceArc<EngineRes>,
    name: String,
    payload: Term<'a>,
    ttl_ms: Option<u64>,
    reply_ref: Term<'a>,
) -> Term<'a> {
    let payload = match term_to_json(payload) {
        Ok(p) => p,
        Err(e) => return input_error(env, "payload", format!("invalid payload: not JSON: {e}")),
    };
    spawn_call(env, &res, reply_ref, move |engine| async move {
        let woken = match ttl_ms {
            Some(ms) => {
                engine
                    .signal_with_ttl(&name, payload, Duration::from_millis(ms))
                    .await
            }
            None => engine.signal(&name, payload).await,
        };
        match woken {
            Ok(n) => ok_reply(n),
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}

/// Sends a signal to one instance (`Engine::send`): it wakes now if it
/// awaits, else the signal is kept until it awaits `name`. Replies `{:ok,
/// :woken | :kept | {:finished, status}}`; an unknown id is an error of
/// kind `:not_found`. The payload is converted on a dirty scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn send_signal<'a>(
    env: Env<'a>,
    res: ResourceArc<EngineRes>,
    id: i64,
    name: String,
    payload: Term<'a>,
    reply_ref: Term<'a>,
) -> Term<'a> {
    let payload = match term_to_json(payload) {
        Ok(p) => p,
        Err(e) => return input_error(env, "payload", format!("invalid payload: not JSON: {e}")),
    };
    spawn_call(env, &res, reply_ref, move |engine| async move {
        match engine.send(id, &name, payload).await {
            Ok(d) => reply(move |env| {
                let v = match d {
                    Delivery::Woken => atoms::woken().encode(env),
                    Delivery::Kept => atoms::kept().encode(env),
                    Delivery::Finished(s) => (atoms::finished(), status_atom(s)).encode(env),
                };
                (atoms::ok(), v).encode(env)
            }),
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}

/// Wakes one awaiting instance. Replies `{:ok, woken?}`. The payload is
/// converted on a dirty scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn signal_instance<'a>(
    env: Env<'a>,
    res: ResourceArc<EngineRes>,
    id: i64,
    name: String,
    payload: Term<'a>,
    reply_ref: Term<'a>,
) -> Term<'a> {
    let payload = match term_to_json(payload) {
        Ok(p) => p,
        Err(e) => return input_error(env, "payload", format!("invalid payload: not JSON: {e}")),
    };
    spawn_call(env, &res, reply_ref, move |engine| async move {
        match engine.signal_instance(id, &name, payload).await {
            Ok(b) => ok_reply(b),
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}

/// Cancels an instance. Replies `{:ok, :now | :at_outcome | {:already_finished, status}}`.
#[rustler::nif]
fn cancel<'a>(
    env: Env<'a>,
    res: ResourceArc<EngineRes>,
    id: i64,
    reason: Option<String>,
    reply_ref: Term<'a>,
) -> Term<'a> {
    spawn_call(env, &res, reply_ref, move |engine| async move {
        let r = match reason {
            Some(reason) => engine.cancel_with_reason(id, &reason).await,
            None => engine.cancel(id).await,
        };
        match r {
            Ok(c) => reply(move |env| {
                let v = match c {
                    Cancelled::Now => atoms::now().encode(env),
                    Cancelled::AtOutcome => atoms::at_outcome().encode(env),
                    Cancelled::AlreadyFinished(s) => {
                        (atoms::already_finished(), status_atom(s)).encode(env)
                    }
                };
                (atoms::ok(), v).encode(env)
            }),
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}

// ---------------------------------------------------------------------------
// Testing helpers (`GenDurable.Testing`)

/// Runs every runnable instance of `queue` to its end (`Engine::drain_with`;
/// with `scheduled`, scheduled instances too), at most `max_steps` steps.
/// Replies `{:ok, {steps, completed, discarded, cancelled, retried, snoozed,
/// awaiting}}`.
#[rustler::nif]
fn drain<'a>(
    env: Env<'a>,
    res: ResourceArc<EngineRes>,
    queue: String,
    scheduled: bool,
    max_steps: Option<u64>,
    reply_ref: Term<'a>,
) -> Term<'a> {
    let options = DrainOptions {
        scheduled,
        max_steps: max_steps.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
    };
    spawn_call(env, &res, reply_ref, move |engine| async move {
        match engine.drain_with(&queue, options).await {
            Ok(d) => ok_reply((
                d.steps as u64,
                d.completed as u64,
                d.discarded as u64,
                d.cancelled as u64,
                d.retried as u64,
                d.snoozed as u64,
                d.awaiting as u64,
            )),
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}

/// Instances read by `inserted/7`, converted by `instances_term/1`.
pub struct InstancesRes {
    instances: Mutex<Option<Vec<Instance>>>,
}

#[rustler::resource_impl]
impl rustler::Resource for InstancesRes {}

/// The instances of `workflow` whose state contains `state` (nil: any), in
/// `queue`, with `status` (a status's name), at most `limit`, oldest first
/// (`Engine::inserted`). Replies `{:ok, instances}`, a resource that
/// `instances_term/1` turns into a list of `%GenDurable.Instance{}`. The
/// state is converted on a dirty scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
#[allow(clippy::too_many_arguments)]
fn inserted<'a>(
    env: Env<'a>,
    res: ResourceArc<EngineRes>,
    workflow: String,
    state: Term<'a>,
    queue: Option<String>,
    status: Option<String>,
    limit: Option<i64>,
    reply_ref: Term<'a>,
) -> Term<'a> {
    let mut query = InsertedQuery::new(workflow);
    if state.decode::<Atom>().ok() != Some(atoms::nil()) {
        match term_to_json(state) {
            Ok(s) => query = query.state(s),
            Err(e) => return input_error(env, "state", format!("invalid state: not JSON: {e}")),
        }
    }
    if let Some(q) = queue {
        query = query.queue(q);
    }
    if let Some(name) = status {
        match Status::from_name(&name) {
            Some(s) => query = query.status(s),
            None => {
                let known: Vec<&str> = ALL_STATUSES.iter().map(|s| s.as_str()).collect();
                let message = format!(
                    "invalid status: expected one of {}, got {name:?}",
                    known.join(", ")
                );
                return input_error(env, "status", message);
            }
        }
    }
    query.limit = limit;
    spawn_call(env, &res, reply_ref, move |engine| async move {
        match engine.inserted(query).await {
            Ok(all) => ok_reply(ResourceArc::new(InstancesRes {
                instances: Mutex::new(Some(all)),
            })),
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}

/// The list of `%GenDurable.Instance{}` read by `inserted/7`, built in the
/// caller's environment on a dirty scheduler. Taken: a second call returns
/// `nil`.
#[rustler::nif(schedule = "DirtyCpu")]
fn instances_term(env: Env, res: ResourceArc<InstancesRes>) -> Term {
    match lock(&res.instances).take() {
        Some(all) => all
            .iter()
            .map(|i| instance_to_term(env, i))
            .collect::<Vec<_>>()
            .encode(env),
        None => atoms::nil().encode(env),
    }
}

/// The arguments of `<schema>.enqueue(...)` for an insert given like
/// `insert_many/3`'s (a map of the core's insert options), read and typed
/// by the core (`InsertOptions`): `{:ok, [{name, value}]}` in the function's
/// order, only the options given, the state as JSON text and `scheduled_at`
/// as RFC 3339 (`schedule_in` stays milliseconds). The values are checked by
/// the function, in the caller's transaction, with the client's messages;
/// only what PostgreSQL could not take as a value is refused here (a NUL
/// character, which text and jsonb cannot hold), with the same messages. A
/// state converts on a dirty CPU scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn enqueue_args<'a>(env: Env<'a>, term: Term<'a>) -> Term<'a> {
    match enqueue_args_of(term) {
        Ok(args) => {
            let args: Vec<(&str, Term)> = args
                .into_iter()
                .map(|(name, v)| {
                    let v = match v {
                        Arg::Text(s) => s.encode(env),
                        Arg::Int(n) => n.encode(env),
                        Arg::Millis(ms) => ms.encode(env),
                        Arg::Bool(b) => b.encode(env),
                        Arg::List(l) => l.encode(env),
                    };
                    (name, v)
                })
                .collect();
            (atoms::ok(), args).encode(env)
        }
        Err(e) => core_error_term(env, &e, ""),
    }
}

enum Arg {
    Text(String),
    Int(i64),
    Millis(u64),
    Bool(bool),
    List(Vec<String>),
}

fn enqueue_args_of(term: Term) -> gendurable::Result<Vec<(&'static str, Arg)>> {
    use gendurable::validate;
    let json = options_to_json(term, 1).map_err(|(path, e)| {
        let field = path.first().map_or("options", String::as_str);
        InsertOptions::error_at(field, &format!("not JSON: {e}"))
    })?;
    let o = InsertOptions::from_json(json)?;
    // A NUL is the one thing a check in SQL never sees: the value is
    // refused when it is bound or cast. The core's checks word it.
    let name = |field: &'static str, s: String| -> gendurable::Result<Arg> {
        if s.contains('\0') {
            validate::name(field, &s)?;
        }
        Ok(Arg::Text(s))
    };
    let key = |field: &'static str, s: String| -> gendurable::Result<Arg> {
        if s.contains('\0') {
            validate::key(field, &s)?;
        }
        Ok(Arg::Text(s))
    };
    validate::payload("state", &o.state)?;
    let state = serde_json::to_string(&o.state)
        .map_err(|e| InsertOptions::error_at("state", &format!("not JSON: {e}")))?;
    let mut args = vec![
        ("workflow", name("workflow", o.workflow)?),
        ("state", Arg::Text(state)),
    ];
    if let Some(s) = o.step {
        args.push(("step", name("step", s)?));
    }
    if let Some(s) = o.queue {
        args.push(("queue", name("queue", s)?));
    }
    if let Some(p) = o.priority {
        args.push(("priority", Arg::Int(p.into())));
    }
    if let Some(k) = o.concurrency_key {
        args.push(("concurrency_key", key("concurrency_key", k)?));
    }
    if let Some(k) = o.rate_limit {
        args.push(("rate_limit", key("rate_limit", k)?));
    }
    if let Some(n) = o.max_attempts {
        args.push(("max_attempts", Arg::Int(n.into())));
    }
    if let Some(at) = o.scheduled_at {
        let at = at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
        args.push(("scheduled_at", Arg::Text(at)));
    }
    if let Some(ms) = o.schedule_in {
        args.push(("schedule_in", Arg::Millis(ms)));
    }
    // A unique insert: `unique => true` for the defaults, then what it
    // names; `"active"` and `"all"` become their statuses (the function
    // takes a list).
    if let Some(u) = o.unique {
        args.push(("unique", Arg::Bool(true)));
        if let Some(fields) = u.fields {
            for f in fields.iter().filter(|f| f.contains('\0')) {
                validate::name("unique.fields", f)?;
            }
            args.push(("unique_fields", Arg::List(fields)));
        }
        if let Some(ms) = u.period {
            args.push(("unique_period", Arg::Millis(ms)));
        }
        if let Some(states) = u.states {
            let statuses = match states {
                UniqueStates::Active => ACTIVE_STATUSES.to_vec(),
                UniqueStates::All => ALL_STATUSES.to_vec(),
                UniqueStates::List(l) => l,
            };
            let names = statuses.iter().map(|s| s.as_str().to_owned()).collect();
            args.push(("unique_states", Arg::List(names)));
        }
    }
    if let Some(k) = o.idempotency_key {
        if k.contains('\0') {
            // As the core words it (`unique::validate_key`).
            let reason = if k.len() > validate::MAX_KEY_BYTES {
                format!(
                    "is {} bytes long; the limit is {}",
                    k.len(),
                    validate::MAX_KEY_BYTES
                )
            } else {
                "must not contain NUL bytes".to_owned()
            };
            return Err(gendurable::Error::InvalidInput {
                field: "idempotency_key",
                reason,
            });
        }
        args.push(("idempotency_key", Arg::Text(k)));
    }
    Ok(args)
}
