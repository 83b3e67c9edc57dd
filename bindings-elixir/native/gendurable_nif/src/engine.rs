//! The engine of one `GenDurable` supervision tree: its configuration,
//! starting and stopping its node, and the engine client calls use.

use crate::atoms;
use crate::errors::{core_error, error_term, not_running};
use crate::runtime::{reply, runtime, spawn_reply, Reply};
use crate::step::{Dispatcher, ElixirWorkflow};
use gendurable::{Engine, EngineBuilder, GateConfig, RateConfig};
use rustler::{Atom, Encoder, Env, LocalPid, Monitor, ResourceArc, Term};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// One `GenDurable` supervision tree: the engine its Engine process runs,
/// the dispatcher its steps are sent to, and the engine client calls use.
pub struct EngineRes {
    pub tree: Arc<Tree>,
}

pub struct Tree {
    pub dispatcher: Arc<Dispatcher>,
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

/// Runs a client call with the tree's engine; answers that the engine is
/// not running if there is none. Waits while a node stops (see `Tree`).
pub fn spawn_call<F, Fut>(env: Env, res: &EngineRes, reply_ref: Term, call: F)
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

// ---------------------------------------------------------------------------
// Configuration: a map with atom keys (see `GenDurable.Options`)

/// An option of an Elixir map with atom keys.
pub fn field<'a, T: rustler::Decoder<'a>>(map: Term<'a>, key: &str) -> Result<T, String> {
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

fn build_engine(config: Term, dispatcher: &Arc<Dispatcher>) -> Result<EngineBuilder, String> {
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
        let workflow = ElixirWorkflow {
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

// ---------------------------------------------------------------------------
// Engine lifecycle

/// A new tree, with no engine and no dispatcher yet.
#[rustler::nif]
fn engine_new(env: Env) -> Term {
    ResourceArc::new(EngineRes {
        tree: Arc::new(Tree {
            dispatcher: Arc::new(Dispatcher::new()),
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
