//! The NIF behind the `:gen_durable` Mix package.
//!
//! The engine runs in the Rust core on a Tokio runtime owned by this library.
//! Nothing here waits or touches the network on a normal BEAM scheduler:
//! calls that do are spawned on the runtime and answer the calling process
//! with a `{ref, result}` message. Steps are run by Elixir processes (see
//! `step`).
//!
//! Terms are only ever built by scheduler threads: a message built on a
//! runtime thread holds atoms, numbers, short strings and resources, never a
//! user's value. States, payloads and instances are converted in the process
//! that asked for them (`step_begin/1`, `instance_term/1`), and Elixir values
//! become JSON, on dirty schedulers unless they are small (a step's values
//! under a thousand values and 64 KiB convert on the caller's scheduler, in
//! well under a millisecond): a value of any size neither blocks a normal
//! scheduler nor builds a large map on a thread the BEAM does not manage
//! (which it does not support).
//!
//! This crate only converts values, maps errors and bridges callbacks; every
//! semantic lives in the core.

mod convert;
mod status;
mod step;

use convert::{json_to_term, term_to_json};
use futures::FutureExt;
use gendurable::bulkhead::{Bulkhead, BulkheadConfig, BulkheadError, OwnedPermit, Wait};
use gendurable::{Cancelled, Engine, GateConfig, Instance, NewInstance, RateConfig, Transition};
use gendurable_testing::TempPostgres;
use rustler::{Atom, Encoder, Env, LocalPid, Monitor, OwnedEnv, ResourceArc, Term};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

mod atoms {
    rustler::atoms! {
        ok,
        error,
        nil,
        keep,
        release,
        set,
        next,
        done,
        await_ = "await",
        snooze,
        cancel,
        signal,
        timeout,
        gen_durable_step,
        gen_durable_cancel,
        skip,
        dirty,
        not_running,
        saturated,
        wait,
        none,
        not_found,
        already_replied,
        now,
        at_outcome,
        already_finished,
        invalid_input,
        invalid_config,
        shut_down,
        database,
        migrate,
        embedded,
        internal,
        struct_ = "__struct__",
        id,
        workflow,
        queue,
        attempt,
        max_attempts,
        concurrency_key,
        rate_limit,
        wake,
        step,
        state,
        priority,
        status,
        node,
        cancel_requested,
        await_signal,
        await_until,
        errors,
        inserted_at,
        scheduled_at,
        attempted_at,
        finished_at,
    }
}

// ---------------------------------------------------------------------------
// Runtime and replies

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("gendurable")
            .build()
            .expect("gendurable: cannot start the Tokio runtime")
    })
}

/// Builds the reply term in the message's own environment, on a runtime
/// thread: small terms only (no user values, no map of more than 32 keys).
type Reply = Box<dyn for<'a> FnOnce(Env<'a>) -> Term<'a> + Send>;

fn reply<F>(f: F) -> Reply
where
    F: for<'a> FnOnce(Env<'a>) -> Term<'a> + Send + 'static,
{
    Box::new(f)
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".into()
    }
}

/// Runs `fut` on the runtime and sends `{ref, reply}` to the calling process.
/// A panic in `fut` becomes `{:error, {:internal, nil, message}}`.
fn spawn_reply<F>(env: Env, reply_ref: Term, fut: F)
where
    F: Future<Output = Reply> + Send + 'static,
{
    let pid = env.pid();
    let owned = OwnedEnv::new();
    let saved = owned.save(reply_ref);
    runtime().spawn(async move {
        let result = AssertUnwindSafe(fut).catch_unwind().await;
        let mut owned = owned;
        let _ = owned.send_and_clear(&pid, move |env| {
            let r = match result {
                Ok(f) => f(env),
                Err(p) => internal_error(env, format!("panic in the NIF: {}", panic_text(p))),
            };
            (saved.load(env), r).encode(env)
        });
    });
}

// ---------------------------------------------------------------------------
// Errors: {:error, {kind, field | nil, message}}

fn error_term<'a>(env: Env<'a>, kind: Atom, field: Option<&str>, message: String) -> Term<'a> {
    (atoms::error(), (kind, field, message)).encode(env)
}

fn internal_error(env: Env, message: String) -> Term {
    error_term(env, atoms::internal(), None, message)
}

fn core_error(e: gendurable::Error) -> Reply {
    reply(move |env| {
        let message = e.to_string();
        match &e {
            gendurable::Error::InvalidInput { field, reason } => {
                let _ = reason;
                error_term(env, atoms::invalid_input(), Some(field), message)
            }
            gendurable::Error::InvalidConfig(_) => {
                error_term(env, atoms::invalid_config(), None, message)
            }
            gendurable::Error::NotFound(_) => error_term(env, atoms::not_found(), None, message),
            gendurable::Error::ShutDown => error_term(env, atoms::shut_down(), None, message),
            gendurable::Error::Database(_) => error_term(env, atoms::database(), None, message),
            gendurable::Error::Migrate(_) => error_term(env, atoms::migrate(), None, message),
            _ => internal_error(env, message),
        }
    })
}

/// A throwaway cluster's failure: `{:error, {:embedded, nil, message}}`.
fn temp_postgres_error(e: gendurable_testing::Error) -> Reply {
    reply(move |env| error_term(env, atoms::embedded(), None, e.to_string()))
}

fn ok_reply<T>(value: T) -> Reply
where
    T: Encoder + Send + 'static,
{
    reply(move |env| (atoms::ok(), value).encode(env))
}

fn not_running(env: Env) -> Term {
    error_term(
        env,
        atoms::not_running(),
        None,
        "the engine is not running".into(),
    )
}

fn input_error<'a>(env: Env<'a>, field: &str, message: impl Into<String>) -> Term<'a> {
    error_term(env, atoms::invalid_input(), Some(field), message.into())
}

// ---------------------------------------------------------------------------
// Resources

/// One `GenDurable` supervision tree: the engine its Engine process runs,
/// the dispatcher its steps are sent to, and the engine client calls use.
pub struct EngineRes {
    tree: Arc<Tree>,
}

struct Tree {
    dispatcher: Arc<step::Dispatcher>,
    /// The engine client calls use: the running node's, until the tree
    /// stops. Each call holds a read lock while it runs (see `Tree::stop`).
    client: Arc<tokio::sync::RwLock<Option<Engine>>>,
    /// The running node and the process that owns it.
    node: tokio::sync::Mutex<Option<Running>>,
}

struct Running {
    engine: Engine,
    owner: LocalPid,
    /// The same configuration on the same pool, without a node: what client
    /// calls use while the node stops and until the next one runs.
    standby: Engine,
}

impl Tree {
    /// Stops the running node gracefully (see `Engine::shutdown`) if `owner`
    /// owns it. A stop under way is waited for.
    async fn stop_node(&self, owner: LocalPid, last: bool) -> gendurable::Result<()> {
        let mut node = self.node.lock().await;
        match node.take() {
            Some(r) if r.owner == owner => self.stop(r, last).await,
            other => {
                *node = other;
                if last {
                    *self.client.write().await = None;
                }
                Ok(())
            }
        }
    }

    /// Client calls move to the standby engine (or to none if `last`) once
    /// the calls under way are done, then the node stops: an insert may
    /// hand rows to the node it runs on, and none must reach a stopping
    /// node. Calls made while it stops (a step inserting, say) do not wait.
    async fn stop(&self, r: Running, last: bool) -> gendurable::Result<()> {
        *self.client.write().await = if last { None } else { Some(r.standby) };
        r.engine.shutdown().await
    }
}

/// Runs a client call with the tree's engine; answers that the engine is
/// not running if there is none. Waits while a node stops (see `Tree`).
fn spawn_call<F, Fut>(env: Env, res: &EngineRes, reply_ref: Term, call: F)
where
    F: FnOnce(Engine) -> Fut + Send + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    let client = res.tree.client.clone();
    spawn_reply(env, reply_ref, async move {
        let engine = client.read_owned().await;
        match &*engine {
            Some(e) => call(e.clone()).await,
            None => reply(not_running),
        }
    });
}

#[rustler::resource_impl]
impl rustler::Resource for EngineRes {
    /// The process owning the running node died: the node stops.
    fn down<'a>(&'a self, _env: Env<'a>, pid: LocalPid, _mon: Monitor) {
        let tree = self.tree.clone();
        runtime().spawn(async move {
            if let Err(e) = tree.stop_node(pid, false).await {
                eprintln!("gendurable: stopping the node of a dead engine process: {e}");
            }
        });
    }
}

/// An instance read by `get/3`, converted by `instance_term/1`.
pub struct InstanceRes {
    instance: Mutex<Option<Instance>>,
}

#[rustler::resource_impl]
impl rustler::Resource for InstanceRes {}

/// A bulkhead permit; released by `bulkhead_release/1` or when garbage-collected.
pub struct PermitRes {
    permit: Mutex<Option<OwnedPermit>>,
}

#[rustler::resource_impl]
impl rustler::Resource for PermitRes {}

/// A throwaway PostgreSQL cluster; stopped when released or garbage-collected.
pub struct TempPgRes {
    pg: Mutex<Option<TempPostgres>>,
}

#[rustler::resource_impl]
impl rustler::Resource for TempPgRes {}

impl Drop for TempPgRes {
    // Stopping the server waits for pg_ctl: never on the scheduler thread
    // that happens to collect the handle.
    fn drop(&mut self) {
        if let Some(pg) = self.pg.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = std::thread::Builder::new()
                .name("gendurable-pg-stop".into())
                .spawn(move || drop(pg));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------
// Reading Elixir maps with atom keys

fn field<'a, T: rustler::Decoder<'a>>(map: Term<'a>, key: &str) -> Result<T, String> {
    let env = map.get_env();
    let k = Atom::from_str(env, key).map_err(|_| format!("bad key {key}"))?;
    let v = map
        .map_get(k)
        .map_err(|_| format!("missing option {key}"))?;
    v.decode::<T>()
        .map_err(|_| format!("option {key} has the wrong type"))
}

fn ms(v: Option<u64>) -> Option<Duration> {
    v.map(Duration::from_millis)
}

// ---------------------------------------------------------------------------
// Engine lifecycle

fn build_engine(
    config: Term,
    dispatcher: &Arc<step::Dispatcher>,
) -> Result<gendurable::EngineBuilder, String> {
    let mut b = Engine::builder().url(field::<String>(config, "url")?);
    if let Some(s) = field::<Option<String>>(config, "schema")? {
        b = b.schema(s);
    }
    if let Some(s) = field::<Option<String>>(config, "node_id")? {
        b = b.node_id(s);
    }
    for (q, n) in field::<Vec<(String, u32)>>(config, "queues")? {
        b = b.queue(q, n);
    }
    for (name, limit, shards) in field::<Vec<(String, u32, u32)>>(config, "gates")? {
        b = b.concurrency_limit(name, GateConfig::new(limit).shards(shards));
    }
    for (name, limit, period, burst) in field::<Vec<(String, u32, u64, u32)>>(config, "rates")? {
        b = b.rate_limit(
            name,
            RateConfig::new(limit, Duration::from_millis(period)).burst(burst),
        );
    }
    // {name, module, [{step, rate_limit_key}]}: the keys declared with
    // `use GenDurable, rate_limits: %{step => key}`.
    type WorkflowSpec = (String, Atom, Vec<(String, String)>);
    for (name, module, step_rates) in field::<Vec<WorkflowSpec>>(config, "workflows")? {
        let module = module
            .to_term(config.get_env())
            .atom_to_string()
            .map_err(|_| "bad module".to_string())?;
        let workflow = step::ElixirWorkflow {
            dispatcher: dispatcher.clone(),
            module,
        };
        b = b.workflow(name.clone(), workflow);
        for (step, key) in step_rates {
            b = b.step_rate_limit(name.clone(), step, key);
        }
    }
    if let Some(d) = ms(field(config, "poll_interval")?) {
        b = b.poll_interval(d);
    }
    if let Some(d) = ms(field(config, "heartbeat_interval")?) {
        b = b.heartbeat_interval(d);
    }
    if let Some(d) = ms(field(config, "lease")?) {
        b = b.lease(d);
    }
    if let Some(d) = ms(field(config, "shutdown_timeout")?) {
        b = b.shutdown_timeout(d);
    }
    if let Some(d) = ms(field(config, "gc_interval")?) {
        b = b.gc_interval(d);
    }
    if let Some((base, max)) = field::<Option<(u64, u64)>>(config, "backoff")? {
        b = b.backoff(Duration::from_millis(base), Duration::from_millis(max));
    }
    // nil: the default; 0: keep finished instances forever.
    if let Some(r) = field::<Option<u64>>(config, "retention")? {
        b = b.retention(if r == 0 {
            None
        } else {
            Some(Duration::from_millis(r))
        });
    }
    if let Some(n) = field::<Option<u32>>(config, "pool_size")? {
        b = b.max_connections(n);
    }
    Ok(b)
}

/// A new tree, with no engine and no dispatcher yet.
#[rustler::nif]
fn engine_new(env: Env) -> Term {
    ResourceArc::new(EngineRes {
        tree: Arc::new(Tree {
            dispatcher: Arc::new(step::Dispatcher::new()),
            client: Arc::new(tokio::sync::RwLock::new(None)),
            node: tokio::sync::Mutex::new(None),
        }),
    })
    .encode(env)
}

/// Builds (validates, connects, migrates) and starts the tree's engine,
/// owned by the calling process: when it dies, the node stops. A node the
/// tree still runs (its previous owner was killed) is stopped first, so a
/// tree never runs two. Replies `:ok`.
#[rustler::nif]
fn engine_start<'a>(
    env: Env<'a>,
    res: ResourceArc<EngineRes>,
    config: Term<'a>,
    reply_ref: Term<'a>,
) -> Term<'a> {
    // The same configuration twice: the node, and its standby for client
    // calls while it stops.
    let (builder, standby) = match (
        build_engine(config, &res.tree.dispatcher),
        build_engine(config, &res.tree.dispatcher),
    ) {
        (Ok(b), Ok(s)) => (b, s),
        (Err(e), _) | (_, Err(e)) => return error_term(env, atoms::invalid_config(), None, e),
    };
    let owner = env.pid();
    spawn_reply(env, reply_ref, async move {
        let tree = res.tree.clone();
        let mut node = tree.node.lock().await;
        if let Some(previous) = node.take() {
            if let Err(e) = tree.stop(previous, false).await {
                eprintln!("gendurable: stopping the node of a dead engine process: {e}");
            }
        }
        let engine = match builder.start().await {
            Ok(e) => e,
            Err(e) => return core_error(e),
        };
        let standby = match standby
            .pool(engine.pool().clone())
            .migrate(false)
            .build()
            .await
        {
            Ok(s) => s,
            Err(e) => {
                let _ = engine.shutdown().await;
                return core_error(e);
            }
        };
        if res.monitor(None, &owner).is_none() {
            // The owner died while the node started.
            let _ = engine.shutdown().await;
            return reply(not_running);
        }
        *tree.client.write().await = Some(engine.clone());
        *node = Some(Running {
            engine,
            owner,
            standby,
        });
        reply(|env| atoms::ok().encode(env))
    });
    atoms::ok().encode(env)
}

/// Stops the calling process's node gracefully (see `Engine::shutdown`);
/// client calls then answer that the engine is not running. Replies `:ok`.
#[rustler::nif]
fn engine_stop<'a>(env: Env<'a>, res: ResourceArc<EngineRes>, reply_ref: Term<'a>) -> Atom {
    let owner = env.pid();
    spawn_reply(env, reply_ref, async move {
        match res.tree.stop_node(owner, true).await {
            Ok(()) => reply(|env| atoms::ok().encode(env)),
            Err(e) => core_error(e),
        }
    });
    atoms::ok()
}

// ---------------------------------------------------------------------------
// Client calls

fn decode_new(term: Term) -> Result<NewInstance, (String, String)> {
    let f = |k: &str| (k.to_string(), format!("{k} has the wrong type"));
    let workflow: String = field(term, "workflow").map_err(|_| f("workflow"))?;
    let state = term_to_json(term.map_get(atoms::state()).map_err(|_| f("state"))?)
        .map_err(|e| ("state".to_string(), format!("invalid state: not JSON: {e}")))?;
    let mut new = NewInstance::new(workflow, state);
    if let Some(s) = field::<Option<String>>(term, "step").map_err(|_| f("step"))? {
        new = new.step(s);
    }
    if let Some(q) = field::<Option<String>>(term, "queue").map_err(|_| f("queue"))? {
        new = new.queue(q);
    }
    if let Some(p) = field::<Option<i16>>(term, "priority").map_err(|_| f("priority"))? {
        new = new.priority(p);
    }
    if let Some(k) =
        field::<Option<String>>(term, "concurrency_key").map_err(|_| f("concurrency_key"))?
    {
        new = new.concurrency_key(k);
    }
    if let Some(r) = field::<Option<String>>(term, "rate_limit").map_err(|_| f("rate_limit"))? {
        new = new.rate_limit(r);
    }
    if let Some(d) = field::<Option<u64>>(term, "schedule_in").map_err(|_| f("schedule_in"))? {
        new = new.schedule_in(Duration::from_millis(d));
    }
    if let Some(us) = field::<Option<i64>>(term, "scheduled_at").map_err(|_| f("scheduled_at"))? {
        let at = chrono::DateTime::from_timestamp_micros(us).ok_or_else(|| {
            (
                "scheduled_at".to_string(),
                "invalid scheduled_at: out of range".to_string(),
            )
        })?;
        new = new.scheduled_at(at);
    }
    if let Some(m) = field::<Option<i32>>(term, "max_attempts").map_err(|_| f("max_attempts"))? {
        new = new.max_attempts(m);
    }
    Ok(new)
}

/// Inserts instances (maps with every option key present, `nil` when
/// unset). Replies `{:ok, [id]}`. Converting large states is CPU work, so
/// this runs on a dirty CPU scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn insert_many<'a>(
    env: Env<'a>,
    res: ResourceArc<EngineRes>,
    news: Vec<Term<'a>>,
    reply_ref: Term<'a>,
) -> Term<'a> {
    let mut batch = Vec::with_capacity(news.len());
    let n = news.len();
    for (i, t) in news.into_iter().enumerate() {
        match decode_new(t) {
            Ok(new) => batch.push(new),
            Err((f, mut m)) => {
                if n > 1 {
                    m = format!("{m} (instance {i} of {n}; nothing was inserted)");
                }
                return input_error(env, &f, m);
            }
        }
    }
    spawn_call(env, &res, reply_ref, |engine| async move {
        match engine.insert_many(batch).await {
            Ok(ids) => ok_reply(ids),
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}

fn instance_to_term<'a>(env: Env<'a>, i: &Instance) -> Term<'a> {
    let us = |t: &chrono::DateTime<chrono::Utc>| t.timestamp_micros();
    let errors: Vec<Term> = i.errors.iter().map(|e| json_to_term(env, e)).collect();
    let pairs: Vec<(Term, Term)> = vec![
        (
            atoms::struct_().encode(env),
            Atom::from_str(env, "Elixir.GenDurable.Instance")
                .unwrap()
                .encode(env),
        ),
        (atoms::id().encode(env), i.id.encode(env)),
        (atoms::workflow().encode(env), i.workflow.encode(env)),
        (atoms::step().encode(env), i.step.encode(env)),
        (atoms::state().encode(env), json_to_term(env, &i.state)),
        (atoms::queue().encode(env), i.queue.encode(env)),
        (atoms::priority().encode(env), i.priority.encode(env)),
        (
            atoms::status().encode(env),
            Atom::from_str(env, i.status.as_str()).unwrap().encode(env),
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
    Term::map_from_pairs(env, &pairs).unwrap()
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

/// Wakes every instance awaiting `name`. Replies `{:ok, count}`. The
/// payload is converted on a dirty scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn signal<'a>(
    env: Env<'a>,
    res: ResourceArc<EngineRes>,
    name: String,
    payload: Term<'a>,
    reply_ref: Term<'a>,
) -> Term<'a> {
    let payload = match term_to_json(payload) {
        Ok(p) => p,
        Err(e) => return input_error(env, "payload", format!("invalid payload: not JSON: {e}")),
    };
    spawn_call(env, &res, reply_ref, move |engine| async move {
        match engine.signal(&name, payload).await {
            Ok(n) => ok_reply(n),
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
                    Cancelled::AlreadyFinished(s) => (
                        atoms::already_finished(),
                        Atom::from_str(env, s.as_str()).unwrap(),
                    )
                        .encode(env),
                };
                (atoms::ok(), v).encode(env)
            }),
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}

// ---------------------------------------------------------------------------
// Throwaway PostgreSQL (tests, examples)

/// Starts a throwaway cluster. Replies `{:ok, {handle, url}}`.
#[rustler::nif]
fn temp_postgres_start<'a>(env: Env<'a>, reply_ref: Term<'a>) -> Atom {
    spawn_reply(env, reply_ref, async move {
        match TempPostgres::start().await {
            Ok(pg) => {
                let url = pg.url();
                let res = ResourceArc::new(TempPgRes {
                    pg: Mutex::new(Some(pg)),
                });
                ok_reply((res, url))
            }
            Err(e) => temp_postgres_error(e),
        }
    });
    atoms::ok()
}

/// Stops a throwaway cluster now (it also stops when garbage-collected).
#[rustler::nif(schedule = "DirtyIo")]
fn temp_postgres_stop(res: ResourceArc<TempPgRes>) -> Atom {
    drop(lock(&res.pg).take());
    atoms::ok()
}

// ---------------------------------------------------------------------------
// Bulkhead

/// Registers (or replaces) a bulkhead. `wait_ms`: `nil` sheds at once.
#[rustler::nif]
fn bulkhead_configure<'a>(
    env: Env<'a>,
    name: String,
    limit: usize,
    reclaim_after_ms: u64,
    wait_ms: Option<u64>,
) -> Term<'a> {
    let wait = match wait_ms {
        None => Wait::None,
        Some(ms) => Wait::Bounded(Duration::from_millis(ms)),
    };
    let config =
        BulkheadConfig::new(limit, Duration::from_millis(reclaim_after_ms)).with_wait(wait);
    match Bulkhead::configure(name, config) {
        Ok(_) => atoms::ok().encode(env),
        Err(BulkheadError::InvalidConfig(m)) => error_term(env, atoms::invalid_config(), None, m),
    }
}

fn permit(p: OwnedPermit) -> ResourceArc<PermitRes> {
    ResourceArc::new(PermitRes {
        permit: Mutex::new(Some(p)),
    })
}

/// Takes a permit: `{:ok, permit}`, `:saturated`, `:none` (no bulkhead of
/// that name: calls pass through) or `:wait` (full, with a wait budget: the
/// answer comes later as `{ref, {:ok, permit} | :saturated}`, from the
/// runtime, so no scheduler is blocked while waiting).
#[rustler::nif]
fn bulkhead_acquire<'a>(env: Env<'a>, name: &str, reply_ref: Term<'a>) -> Term<'a> {
    let Some(b) = Bulkhead::named(name) else {
        return atoms::none().encode(env);
    };
    match b.try_acquire_owned() {
        Ok(p) => (atoms::ok(), permit(p)).encode(env),
        Err(_) if b.wait().is_none() => atoms::saturated().encode(env),
        Err(_) => {
            spawn_reply(env, reply_ref, async move {
                match b.acquire_owned().await {
                    Ok(p) => ok_reply(permit(p)),
                    Err(_) => reply(|env| atoms::saturated().encode(env)),
                }
            });
            atoms::wait().encode(env)
        }
    }
}

/// Releases a permit (idempotent).
#[rustler::nif]
fn bulkhead_release(p: ResourceArc<PermitRes>) -> Atom {
    drop(lock(&p.permit).take());
    atoms::ok()
}

#[rustler::nif]
fn bulkhead_in_flight(name: &str) -> usize {
    Bulkhead::in_flight_of(name)
}

#[rustler::nif]
fn bulkhead_limit(name: &str) -> Option<usize> {
    Bulkhead::limit_of(name)
}

#[rustler::nif]
fn bulkhead_reset(name: &str) -> Atom {
    match Bulkhead::reset_named(name) {
        Ok(()) => atoms::ok(),
        Err(_) => atoms::not_found(),
    }
}

// ---------------------------------------------------------------------------
// Benchmark: the same no-op workload run by pure Rust workers

/// Runs `n` no-op one-step instances of a Rust workflow with a queue of
/// `concurrency` on `schema`. Replies `{:ok, {insert_seconds, run_seconds}}`.
#[rustler::nif]
fn bench_rust_noop<'a>(
    env: Env<'a>,
    url: String,
    schema: String,
    n: usize,
    concurrency: u32,
    reply_ref: Term<'a>,
) -> Atom {
    spawn_reply(env, reply_ref, async move {
        match bench(url, schema, n, concurrency).await {
            Ok(r) => ok_reply(r),
            Err(e) => core_error(e),
        }
    });
    atoms::ok()
}

async fn bench(
    url: String,
    schema: String,
    n: usize,
    concurrency: u32,
) -> gendurable::Result<(f64, f64)> {
    let done = Arc::new(AtomicUsize::new(0));
    let notify = Arc::new(tokio::sync::Notify::new());
    let (d, w) = (done.clone(), notify.clone());
    let engine = Engine::builder()
        .url(url)
        .schema(schema)
        .queue("default", concurrency)
        .workflow_fn("Bench.RustNoop", move |_step, state, _ctx| {
            let (d, w) = (d.clone(), w.clone());
            async move {
                if d.fetch_add(1, Ordering::Relaxed) + 1 >= n {
                    w.notify_one();
                }
                Ok(Transition::done(state))
            }
        })
        .build()
        .await?;
    let t0 = Instant::now();
    for chunk in (0..n).collect::<Vec<_>>().chunks(5000) {
        let news = chunk
            .iter()
            .map(|_| NewInstance::new("Bench.RustNoop", serde_json::json!({})))
            .collect();
        engine.insert_many(news).await?;
    }
    let inserted = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    engine.start().await?;
    while done.load(Ordering::Relaxed) < n {
        let _ = tokio::time::timeout(Duration::from_millis(100), notify.notified()).await;
    }
    engine.shutdown().await?;
    Ok((inserted, t1.elapsed().as_secs_f64()))
}

/// The BEAM ignores SIGCHLD, which makes the kernel reap child processes
/// itself, so `waitpid` in `std::process::Command` (used by the throwaway
/// PostgreSQL to run `initdb` and `pg_ctl`) fails with ECHILD. The BEAM does
/// not rely on it (ports are spawned by its `erl_child_setup` helper), so the
/// default disposition is restored when the library loads.
fn load(_env: Env, _info: Term) -> bool {
    // SAFETY: reading and setting a signal disposition; no handler is installed.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGCHLD, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
        {
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        }
    }
    true
}

rustler::init!("Elixir.GenDurable.Native", load = load);
