//! The engine of one `GenDurable` supervision tree: reading its options,
//! starting and stopping its node, and the engine client calls use.
//!
//! The options arrive as a map (`GenDurable.Options` translates the keyword
//! list) and are read by the core (`gendurable::options::EngineOptions`),
//! which checks them and words every error; the workflows arrive as
//! `[{name, module}]`.

use crate::atoms;
use crate::convert::options_to_json;
use crate::errors::{core_error, core_error_term, not_running};
use crate::runtime::{reply, runtime, spawn_reply, Reply};
use crate::step::{Dispatcher, ElixirWorkflow};
use gendurable::options::EngineOptions;
use gendurable::{Engine, EngineBuilder};
use rustler::{Atom, Encoder, Env, LocalPid, Monitor, ResourceArc, Term};
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;

/// How deep the options are walked to name one that is not JSON
/// (`step_rate_limits.<workflow>.<step>` is three levels).
const OPTION_DEPTH: usize = 4;

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
// Configuration

/// The engine's options and workflows, read.
struct Config {
    options: EngineOptions,
    /// `inline`: every insert drains the queues it inserted into (see
    /// `EngineBuilder::inline`). A builder setting, not one of the core's
    /// `EngineOptions`: taken out of the map before the core reads it.
    inline: bool,
    /// Workflow names and the modules that run them.
    workflows: Vec<(String, String)>,
}

impl Config {
    /// `options`: a map of the core's engine options; `workflows`:
    /// `[{name, module}]`, the modules as atoms.
    fn read(options: Term, workflows: Vec<(String, Term)>) -> gendurable::Result<Config> {
        let mut json = options_to_json(options, OPTION_DEPTH).map_err(|(path, e)| {
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            EngineOptions::error_at(&path, &format!("not JSON: {e}"))
        })?;
        let inline = match json.as_object_mut().and_then(|o| o.remove("inline")) {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => b,
            Some(other) => {
                return Err(EngineOptions::error_at(
                    &["inline"],
                    &format!("expected true or false, got {other}"),
                ))
            }
        };
        let options = EngineOptions::from_json(json)?;
        let workflows = workflows
            .into_iter()
            .map(|(name, module)| match module.atom_to_string() {
                Ok(module) => Ok((name, module)),
                Err(_) => Err(gendurable::Error::InvalidConfig(format!(
                    "workflow {name:?}: the module is not an atom"
                ))),
            })
            .collect::<gendurable::Result<_>>()?;
        Ok(Config {
            options,
            inline,
            workflows,
        })
    }

    /// A builder with every option and workflow; the builder checks the
    /// values when it validates or builds.
    fn builder(&self, dispatcher: &Arc<Dispatcher>) -> EngineBuilder {
        let mut b = self.options.apply(Engine::builder()).inline(self.inline);
        for (name, module) in &self.workflows {
            let workflow = ElixirWorkflow {
                dispatcher: dispatcher.clone(),
                module: module.clone(),
            };
            b = b.workflow(name, workflow);
        }
        b
    }
}

/// Checks the options and workflows as the engine will when it starts,
/// without connecting: `:ok` or `{:error, {kind, field, message}}`. On a
/// dirty scheduler: the options are the caller's, of any size.
#[rustler::nif(schedule = "DirtyCpu")]
fn engine_check<'a>(
    env: Env<'a>,
    options: Term<'a>,
    workflows: Vec<(String, Term<'a>)>,
) -> Term<'a> {
    let checked = Config::read(options, workflows)
        .and_then(|c| c.builder(&Arc::new(Dispatcher::new())).validate());
    match checked {
        Ok(()) => atoms::ok().encode(env),
        Err(e) => core_error_term(env, &e, ""),
    }
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
/// tree never runs two. Replies `:ok`. The options were checked by
/// `engine_check/2` before the tree started; they are read again here, on
/// a dirty scheduler too, whatever their size.
#[rustler::nif(schedule = "DirtyCpu")]
fn engine_start<'a>(
    env: Env<'a>,
    res: ResourceArc<EngineRes>,
    options: Term<'a>,
    workflows: Vec<(String, Term<'a>)>,
    reply_ref: Term<'a>,
) -> Term<'a> {
    let config = match Config::read(options, workflows) {
        Ok(c) => c,
        Err(e) => return core_error_term(env, &e, ""),
    };
    // The same configuration twice: the node, and its standby for client
    // calls while it stops.
    let builder = config.builder(&res.tree.dispatcher);
    let standby = config.builder(&res.tree.dispatcher);
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
