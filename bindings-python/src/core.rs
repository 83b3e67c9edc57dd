//! `Core`: the one core engine of a Python `Engine`, its client calls and
//! its worker node.
//!
//! The Python layer collects the workflows, then builds the engine once
//! (`build`, at its first call or when it starts): every call after that,
//! inserts included, goes through this engine, whether or not its node runs.

use crate::actions::{act, act_one, filter_of, paused, FilterArgs, Verb};
use crate::block_on;
use crate::config::{builder, connect_timeout, engine_options};
use crate::errors::invalid_input;
use crate::errors::{connect_error, invalid_config, raise, IntoPyResult};
use crate::instance::{cancelled_str, instance_to_py, new_instance, InstanceOut};
use crate::testing::{drained_tuple, inserted_query, DrainedTuple, Instances};
use crate::values::to_json;
use crate::workflow::{register, Hooks, WorkflowTable};
use gendurable::options::EngineOptions;
use gendurable::{Delivery, DrainOptions, Engine, EngineBuilder, NewInstance};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::OnceCell;

/// After a second interrupt, how long the shutdown may still take to write
/// the outcomes of the steps it stopped.
const FORCED_GRACE: Duration = Duration::from_secs(5);

/// A configured engine. Made by `gendurable.Engine`; not public API.
#[pyclass(frozen, module = "gendurable._gendurable")]
pub(crate) struct Core {
    options: EngineOptions,
    /// `EngineBuilder::inline`: every insert drains the queues it inserted into.
    inline: bool,
    hooks: Arc<Hooks>,
    built: OnceLock<Built>,
    /// Whether the node runs (started and not yet shut down).
    running: AtomicBool,
}

struct Built {
    engine: Engine,
    /// Set once the schema is created or upgraded (by the first call).
    migrated: Arc<OnceCell<()>>,
}

impl Core {
    /// The builder with these workflows (the core checks them with the rest).
    fn builder(
        &self,
        workflows: Vec<WorkflowTable>,
        options: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<EngineBuilder> {
        let b = match options {
            Some(o) => builder(&engine_options(o)?),
            None => builder(&self.options),
        };
        Ok(register(b.inline(self.inline), workflows, &self.hooks))
    }

    fn engine(&self) -> PyResult<&Engine> {
        self.built.get().map(|b| &b.engine).ok_or_else(not_built)
    }

    fn client(&self) -> PyResult<Client> {
        let built = self.built.get().ok_or_else(not_built)?;
        Ok(Client {
            engine: built.engine.clone(),
            migrated: built.migrated.clone(),
            timeout: connect_timeout(&self.options),
        })
    }
}

fn not_built() -> PyErr {
    Python::attach(|py| {
        raise(
            py,
            "Error",
            "the engine is not built yet: gendurable.Engine builds it at its first call".into(),
            &[],
        )
    })
}

/// What a client call needs: the engine, its migration cell, the connect
/// timeout.
#[derive(Clone)]
struct Client {
    engine: Engine,
    migrated: Arc<OnceCell<()>>,
    timeout: Duration,
}

impl Client {
    /// Run `call` once the schema is migrated, with errors as Python
    /// exceptions. The pool retries a refused connection until its timeout
    /// and then says only "pool timed out": so with no connection open, one
    /// direct connection first tells at once whether and why the database
    /// cannot be reached, and a pool timeout is explained the same way.
    async fn run<T, F, Fut>(self, call: F) -> PyResult<T>
    where
        F: FnOnce(Engine) -> Fut,
        Fut: Future<Output = gendurable::Result<T>>,
    {
        let opts = self.engine.pool().connect_options();
        if self.engine.pool().size() == 0 {
            gendurable_cli::connect::check_with(&opts, self.timeout)
                .await
                .map_err(connect_error)?;
        }
        let result = async {
            self.migrated
                .get_or_try_init(|| self.engine.migrate())
                .await?;
            call(self.engine.clone()).await
        }
        .await;
        match result {
            Ok(v) => Ok(v),
            Err(e) if gendurable_cli::connect::is_pool_timeout(&e) => {
                match gendurable_cli::connect::check_with(&opts, self.timeout).await {
                    Err(c) => Err(connect_error(c)),
                    Ok(()) => Err(crate::errors::to_py(e)),
                }
            }
            Err(e) => Err(crate::errors::to_py(e)),
        }
    }
}

#[pymethods]
impl Core {
    /// `options`: a dict of the core's engine options
    /// (`gendurable::options::EngineOptions`), which the core reads and
    /// checks. `inline`: the builder's `inline`. Nothing connects yet.
    #[new]
    #[pyo3(signature = (options, inline=false))]
    fn new(py: Python<'_>, options: &Bound<'_, PyAny>, inline: bool) -> PyResult<Core> {
        let options = engine_options(options)?;
        builder(&options).validate().py_err()?;
        Ok(Core {
            options,
            inline,
            hooks: Arc::new(Hooks::new(py)?),
            built: OnceLock::new(),
            running: AtomicBool::new(false),
        })
    }

    /// Check the configuration with these workflows (and `options`, as
    /// `build` takes them), as `build` would, without building.
    #[pyo3(signature = (workflows, options=None))]
    fn check(
        &self,
        workflows: Vec<WorkflowTable>,
        options: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.builder(workflows, options)?.validate().py_err()
    }

    /// Build the engine with these workflows: `(name, {step: (fn, is_async,
    /// takes_step)}, fallback or None, {step: rate-limit key})`. Once: it
    /// runs them and inserts for them from then on. Nothing connects yet.
    ///
    /// `options`, if given, are the engine's options again with what the
    /// workflows declare (`workflow_defaults`): the core reads and checks
    /// them here, as `new` did the others.
    #[pyo3(signature = (workflows, options=None))]
    fn build(
        &self,
        py: Python<'_>,
        workflows: Vec<WorkflowTable>,
        options: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if self.built.get().is_some() {
            return Err(invalid_config("the engine is already built"));
        }
        let builder = self.builder(workflows, options)?;
        let engine = block_on(py, move || builder.build()).py_err()?;
        let built = Built {
            engine,
            migrated: Arc::new(OnceCell::new()),
        };
        self.built
            .set(built)
            .map_err(|_| invalid_config("the engine is already built"))
    }

    /// Whether the engine is built.
    #[getter]
    fn built(&self) -> bool {
        self.built.get().is_some()
    }

    /// This node's id.
    #[getter]
    fn node_id(&self) -> PyResult<String> {
        Ok(self.engine()?.node_id().to_owned())
    }

    /// The effective K of a concurrency key under this configuration.
    fn effective_k(&self, key: &str) -> PyResult<u32> {
        Ok(self.engine()?.config().effective_k(key))
    }

    /// Create or upgrade the schema (also done by the first call that needs it).
    fn migrate(&self, py: Python<'_>) -> PyResult<()> {
        let c = self.client()?;
        block_on(py, move || c.run(|_| async { Ok(()) }))
    }

    fn migrate_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let c = self.client()?;
        pyo3_async_runtimes::tokio::future_into_py(py, c.run(|_| async { Ok(()) }))
    }

    /// Insert; while the node runs, an idle one starts what it can at once
    /// (see the core's `Engine::insert_many`). Returns `(id, conflict)` per
    /// instance: a unique insert or idempotency key that met an existing
    /// instance inserted nothing and gives that instance's id
    /// (`Engine::insert_many_unique`).
    fn insert_many(
        &self,
        py: Python<'_>,
        news: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<(i64, bool)>> {
        let news = news
            .iter()
            .map(new_instance)
            .collect::<PyResult<Vec<_>>>()?;
        let c = self.client()?;
        block_on(py, move || {
            c.run(move |e| async move { insert_many(&e, news).await })
        })
    }

    fn insert_many_async<'py>(
        &self,
        py: Python<'py>,
        news: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let news = news
            .iter()
            .map(new_instance)
            .collect::<PyResult<Vec<_>>>()?;
        let c = self.client()?;
        pyo3_async_runtimes::tokio::future_into_py(
            py,
            c.run(move |e| async move { insert_many(&e, news).await }),
        )
    }

    fn get<'py>(&self, py: Python<'py>, id: i64) -> PyResult<Bound<'py, PyDict>> {
        let c = self.client()?;
        let i = block_on(py, move || c.run(move |e| async move { e.get(id).await }))?;
        instance_to_py(py, &i)
    }

    fn get_async<'py>(&self, py: Python<'py>, id: i64) -> PyResult<Bound<'py, PyAny>> {
        let c = self.client()?;
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            c.run(move |e| async move { e.get(id).await })
                .await
                .map(InstanceOut)
        })
    }

    /// Returns the number woken (by name) or 1/0 (by id). `ttl` (seconds,
    /// by name only): kept that long for the first awaiter if it woke
    /// nobody (`Engine::signal_with_ttl`).
    #[pyo3(signature = (name, payload, id=None, ttl=None))]
    fn signal(
        &self,
        py: Python<'_>,
        name: String,
        payload: &Bound<'_, PyAny>,
        id: Option<i64>,
        ttl: Option<f64>,
    ) -> PyResult<u64> {
        let payload = to_json("payload", payload)?;
        let ttl = ttl.map(ttl_of).transpose()?;
        let c = self.client()?;
        block_on(py, move || {
            c.run(move |e| async move { signal(&e, &name, payload, id, ttl).await })
        })
    }

    #[pyo3(signature = (name, payload, id=None, ttl=None))]
    fn signal_async<'py>(
        &self,
        py: Python<'py>,
        name: String,
        payload: &Bound<'_, PyAny>,
        id: Option<i64>,
        ttl: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let payload = to_json("payload", payload)?;
        let ttl = ttl.map(ttl_of).transpose()?;
        let c = self.client()?;
        pyo3_async_runtimes::tokio::future_into_py(
            py,
            c.run(move |e| async move { signal(&e, &name, payload, id, ttl).await }),
        )
    }

    /// Send a signal to one instance, kept until it awaits that name
    /// (`Engine::send`): `("woken" | "kept" | "finished", final status)`.
    fn send(
        &self,
        py: Python<'_>,
        id: i64,
        name: String,
        payload: &Bound<'_, PyAny>,
    ) -> PyResult<(&'static str, Option<&'static str>)> {
        let payload = to_json("payload", payload)?;
        let c = self.client()?;
        block_on(py, move || {
            c.run(move |e| async move { e.send(id, &name, payload).await.map(delivery_str) })
        })
    }

    fn send_async<'py>(
        &self,
        py: Python<'py>,
        id: i64,
        name: String,
        payload: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let payload = to_json("payload", payload)?;
        let c = self.client()?;
        pyo3_async_runtimes::tokio::future_into_py(
            py,
            c.run(move |e| async move { e.send(id, &name, payload).await.map(delivery_str) }),
        )
    }

    /// Run a queue's runnable instances to their end in the calling task
    /// (`Engine::drain_with`); async steps run on the loop given to
    /// `use_loop` (or `start`).
    #[pyo3(signature = (queue, scheduled=false, max_steps=None))]
    fn drain(
        &self,
        py: Python<'_>,
        queue: String,
        scheduled: bool,
        max_steps: Option<usize>,
    ) -> PyResult<DrainedTuple> {
        let c = self.client()?;
        let options = DrainOptions {
            scheduled,
            max_steps,
        };
        block_on(py, move || {
            c.run(move |e| async move { e.drain_with(&queue, options).await.map(drained_tuple) })
        })
    }

    #[pyo3(signature = (queue, scheduled=false, max_steps=None))]
    fn drain_async<'py>(
        &self,
        py: Python<'py>,
        queue: String,
        scheduled: bool,
        max_steps: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let c = self.client()?;
        let options = DrainOptions {
            scheduled,
            max_steps,
        };
        pyo3_async_runtimes::tokio::future_into_py(
            py,
            c.run(move |e| async move { e.drain_with(&queue, options).await.map(drained_tuple) }),
        )
    }

    /// The instances of `workflow` whose state contains `state`, in `queue`,
    /// with `status` (`Engine::inserted`), oldest first.
    #[pyo3(signature = (workflow, state=None, queue=None, status=None, limit=None))]
    fn inserted<'py>(
        &self,
        py: Python<'py>,
        workflow: String,
        state: Option<&Bound<'_, PyAny>>,
        queue: Option<String>,
        status: Option<&str>,
        limit: Option<i64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let q = inserted_query(workflow, state, queue, status, limit)?;
        let c = self.client()?;
        let found = block_on(py, move || {
            c.run(move |e| async move { e.inserted(q).await })
        })?;
        Ok(Instances(found).into_pyobject(py)?.into_any())
    }

    #[pyo3(signature = (workflow, state=None, queue=None, status=None, limit=None))]
    fn inserted_async<'py>(
        &self,
        py: Python<'py>,
        workflow: String,
        state: Option<&Bound<'_, PyAny>>,
        queue: Option<String>,
        status: Option<&str>,
        limit: Option<i64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let q = inserted_query(workflow, state, queue, status, limit)?;
        let c = self.client()?;
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            c.run(move |e| async move { e.inserted(q).await })
                .await
                .map(Instances)
        })
    }

    /// Async steps run by drains (and inline inserts) run on `event_loop`,
    /// the node not being started. `start` gives the node its own.
    fn use_loop(&self, event_loop: Py<PyAny>) -> PyResult<()> {
        if self.running.load(Ordering::SeqCst) {
            return Err(invalid_config(
                "the worker is running: its loop runs the steps",
            ));
        }
        self.hooks.begin(event_loop);
        Ok(())
    }

    #[pyo3(signature = (id, reason=None))]
    fn cancel(
        &self,
        py: Python<'_>,
        id: i64,
        reason: Option<String>,
    ) -> PyResult<(&'static str, Option<&'static str>)> {
        let c = self.client()?;
        block_on(py, move || {
            c.run(move |e| async move { cancel(&e, id, reason).await })
        })
    }

    #[pyo3(signature = (id, reason=None))]
    fn cancel_async<'py>(
        &self,
        py: Python<'py>,
        id: i64,
        reason: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let c = self.client()?;
        pyo3_async_runtimes::tokio::future_into_py(
            py,
            c.run(move |e| async move { cancel(&e, id, reason).await }),
        )
    }

    /// How many instances the filter names (`Engine::count`).
    fn count(&self, py: Python<'_>, filter: FilterArgs) -> PyResult<u64> {
        let filter = filter_of(filter)?;
        let c = self.client()?;
        block_on(py, move || {
            c.run(move |e| async move { e.count(&filter).await })
        })
    }

    fn count_async<'py>(&self, py: Python<'py>, filter: FilterArgs) -> PyResult<Bound<'py, PyAny>> {
        let filter = filter_of(filter)?;
        let c = self.client()?;
        pyo3_async_runtimes::tokio::future_into_py(
            py,
            c.run(move |e| async move { e.count(&filter).await }),
        )
    }

    /// `action` ("cancel", "retry" or "delete") on every instance the filter
    /// names (`Engine::cancel_where`...): `(matched, changed)`.
    #[pyo3(signature = (action, filter, reason=None))]
    fn act(
        &self,
        py: Python<'_>,
        action: &str,
        filter: FilterArgs,
        reason: Option<String>,
    ) -> PyResult<(u64, u64)> {
        let (verb, filter) = (Verb::of(action)?, filter_of(filter)?);
        let c = self.client()?;
        block_on(py, move || {
            c.run(move |e| async move { act(&e, verb, filter, reason).await })
        })
    }

    #[pyo3(signature = (action, filter, reason=None))]
    fn act_async<'py>(
        &self,
        py: Python<'py>,
        action: &str,
        filter: FilterArgs,
        reason: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (verb, filter) = (Verb::of(action)?, filter_of(filter)?);
        let c = self.client()?;
        pyo3_async_runtimes::tokio::future_into_py(
            py,
            c.run(move |e| async move { act(&e, verb, filter, reason).await }),
        )
    }

    /// `action` ("retry" or "delete") on one instance (`Engine::retry`,
    /// `Engine::delete`): whether it acted.
    fn act_one(&self, py: Python<'_>, action: &str, id: i64) -> PyResult<bool> {
        let verb = Verb::of(action)?;
        let c = self.client()?;
        block_on(py, move || {
            c.run(move |e| async move { act_one(&e, verb, id).await })
        })
    }

    fn act_one_async<'py>(
        &self,
        py: Python<'py>,
        action: &str,
        id: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let verb = Verb::of(action)?;
        let c = self.client()?;
        pyo3_async_runtimes::tokio::future_into_py(
            py,
            c.run(move |e| async move { act_one(&e, verb, id).await }),
        )
    }

    /// Pause (`paused` true) or resume a queue (`Engine::pause_queue`,
    /// `Engine::resume_queue`): whether it was running (pause) or paused
    /// (resume).
    fn pause_queue(&self, py: Python<'_>, queue: String, paused: bool) -> PyResult<bool> {
        let c = self.client()?;
        block_on(py, move || {
            c.run(move |e| async move { pause(&e, &queue, paused).await })
        })
    }

    fn pause_queue_async<'py>(
        &self,
        py: Python<'py>,
        queue: String,
        paused: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let c = self.client()?;
        pyo3_async_runtimes::tokio::future_into_py(
            py,
            c.run(move |e| async move { pause(&e, &queue, paused).await }),
        )
    }

    /// The paused queues: `(queue, since)`, since in seconds from the epoch.
    fn paused_queues(&self, py: Python<'_>) -> PyResult<Vec<(String, f64)>> {
        let c = self.client()?;
        block_on(py, move || c.run(move |e| async move { paused(&e).await }))
    }

    fn paused_queues_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let c = self.client()?;
        pyo3_async_runtimes::tokio::future_into_py(
            py,
            c.run(move |e| async move { paused(&e).await }),
        )
    }

    /// Start the engine's node; its async steps run on `event_loop`.
    fn start(&self, py: Python<'_>, event_loop: Py<PyAny>) -> PyResult<()> {
        let c = self.client()?;
        if self.running.load(Ordering::SeqCst) {
            return Err(invalid_config("the worker is already running"));
        }
        self.hooks.begin(event_loop);
        block_on(py, move || c.run(move |e| async move { e.start().await }))?;
        self.running.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Whether the node runs.
    #[getter]
    fn running(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }

    /// Stop the node gracefully (see `Engine.shutdown`); the engine stays
    /// usable for calls. While it waits for running steps, Python's signal
    /// handlers run: one that raises (Ctrl-C) stops the running steps at
    /// once, recorded as errors, and the exception propagates once their
    /// outcomes are written.
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        if !self.running.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        let engine = self.engine()?.clone();
        let mut stopping = crate::runtime().spawn(async move { engine.shutdown().await });
        let mut wait = |py: Python<'_>, limit: Duration| {
            py.detach(|| {
                crate::runtime()
                    .block_on(async { tokio::time::timeout(limit, &mut stopping).await })
            })
        };
        loop {
            if let Ok(joined) = wait(py, Duration::from_millis(50)) {
                return joined
                    .map_err(|e| crate::errors::internal(e.to_string()))?
                    .py_err();
            }
            if let Err(interrupt) = py.check_signals() {
                self.hooks.fire();
                // Give the stopped steps' outcomes a moment to be written;
                // another interrupt gives up at once.
                let deadline = std::time::Instant::now() + FORCED_GRACE;
                while std::time::Instant::now() < deadline {
                    if wait(py, Duration::from_millis(50)).is_ok() || py.check_signals().is_err() {
                        break;
                    }
                }
                return Err(interrupt);
            }
        }
    }

    fn shutdown_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let engine = match self.running.swap(false, Ordering::SeqCst) {
            true => Some(self.engine()?.clone()),
            false => None,
        };
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            match engine {
                Some(engine) => engine.shutdown().await.py_err(),
                None => Ok(()),
            }
        })
    }

    /// Stop the node's running steps now, recording each as an error (a
    /// second interrupt while the worker shuts down). Does not stop the node:
    /// `shutdown` does.
    fn force_stop(&self) {
        self.hooks.fire();
    }

    fn __repr__(&self) -> String {
        match self.built.get() {
            Some(b) => format!("<gendurable engine node={:?}>", b.engine.node_id()),
            None => "<gendurable engine, not built>".to_owned(),
        }
    }
}

async fn insert_many(
    engine: &Engine,
    news: Vec<NewInstance>,
) -> gendurable::Result<Vec<(i64, bool)>> {
    let inserted = engine.insert_many_unique(news).await?;
    Ok(inserted.into_iter().map(|i| (i.id, i.conflict)).collect())
}

async fn signal(
    engine: &Engine,
    name: &str,
    payload: serde_json::Value,
    id: Option<i64>,
    ttl: Option<Duration>,
) -> gendurable::Result<u64> {
    match (id, ttl) {
        (Some(_), Some(_)) => Err(gendurable::Error::InvalidInput {
            field: "ttl",
            reason:
                "applies to a signal by name; a signal sent to one instance with send() is kept \
             until it awaits that name"
                    .into(),
        }),
        (Some(id), None) => engine
            .signal_instance(id, name, payload)
            .await
            .map(u64::from),
        (None, Some(ttl)) => engine.signal_with_ttl(name, payload, ttl).await,
        (None, None) => engine.signal(name, payload).await,
    }
}

/// Seconds as a signal's time to live.
fn ttl_of(secs: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(secs).map_err(|_| {
        invalid_input(
            "ttl",
            format!("must be a finite number of seconds, more than zero; got {secs}"),
        )
    })
}

/// What a send did, and the final status it found.
fn delivery_str(d: Delivery) -> (&'static str, Option<&'static str>) {
    match d {
        Delivery::Woken => ("woken", None),
        Delivery::Kept => ("kept", None),
        Delivery::Finished(s) => ("finished", Some(s.as_str())),
        #[allow(unreachable_patterns)]
        _ => ("unknown", None),
    }
}

async fn cancel(
    engine: &Engine,
    id: i64,
    reason: Option<String>,
) -> gendurable::Result<(&'static str, Option<&'static str>)> {
    match reason {
        Some(r) => engine.cancel_with_reason(id, &r).await,
        None => engine.cancel(id).await,
    }
    .map(cancelled_str)
}

async fn pause(engine: &Engine, queue: &str, paused: bool) -> gendurable::Result<bool> {
    if paused {
        engine.pause_queue(queue).await
    } else {
        engine.resume_queue(queue).await
    }
}
