//! `Core`: one configured engine, its client calls and its worker node.

use crate::block_on;
use crate::errors::{connect_error, invalid_config, invalid_input, IntoPyResult};
use crate::values::{config_seconds, epoch, seconds, timestamp, to_json, to_py};
use crate::workflow::{Force, Hooks, PyStep, PyWorkflow};
use gendurable::{Cancelled, Engine, EngineBuilder, GateConfig, Instance, NewInstance, RateConfig};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::OnceCell;

/// How long a call waits for a connection unless `connect_timeout` says
/// otherwise (the core's default). A refused connection fails at once.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// After a second interrupt, how long the shutdown may still take to write
/// the outcomes of the steps it stopped.
const FORCED_GRACE: Duration = Duration::from_secs(5);

/// Everything needed to build the core engine again (the worker engine is
/// built when the node starts, with the workflows registered by then).
#[derive(Clone)]
struct Settings {
    url: String,
    schema: String,
    node_id: Option<String>,
    queues: Vec<(String, u32)>,
    gates: Vec<(String, u32, u32)>,
    rates: Vec<(String, u32, Duration, u32)>,
    heartbeat_interval: Option<Duration>,
    lease: Option<Duration>,
    poll_interval: Option<Duration>,
    gc_interval: Option<Duration>,
    shutdown_timeout: Option<Duration>,
    retention: Option<Option<Duration>>,
    backoff: Option<(Duration, Duration)>,
    max_connections: Option<u32>,
    connect_timeout: Duration,
}

impl Settings {
    fn builder(&self) -> EngineBuilder {
        let mut b = Engine::builder().url(&self.url).schema(&self.schema);
        if let Some(id) = &self.node_id {
            b = b.node_id(id);
        }
        for (q, n) in &self.queues {
            b = b.queue(q, *n);
        }
        for (name, limit, shards) in &self.gates {
            b = b.concurrency_limit(name, GateConfig::new(*limit).shards(*shards));
        }
        for (name, limit, period, burst) in &self.rates {
            b = b.rate_limit(name, RateConfig::new(*limit, *period).burst(*burst));
        }
        if let Some(d) = self.heartbeat_interval {
            b = b.heartbeat_interval(d);
        }
        if let Some(d) = self.lease {
            b = b.lease(d);
        }
        if let Some(d) = self.poll_interval {
            b = b.poll_interval(d);
        }
        if let Some(d) = self.gc_interval {
            b = b.gc_interval(d);
        }
        if let Some(d) = self.shutdown_timeout {
            b = b.shutdown_timeout(d);
        }
        if let Some(r) = self.retention {
            b = b.retention(r);
        }
        if let Some((base, max)) = self.backoff {
            b = b.backoff(base, max);
        }
        if let Some(n) = self.max_connections {
            b = b.max_connections(n);
        }
        b.connect_timeout(self.connect_timeout).migrate(false)
    }
}

/// A configured engine. Built by `gendurable.Engine`; not public API.
#[pyclass(frozen, module = "gendurable._gendurable")]
pub(crate) struct Core {
    settings: Settings,
    client: Engine,
    migrated: Arc<OnceCell<()>>,
    worker: Mutex<Option<Engine>>,
    /// Stops the running steps of the worker at once (a second interrupt).
    force: Mutex<Option<Arc<Force>>>,
}

impl Core {
    /// Inserts go through the worker engine while it runs: an idle worker
    /// then starts what this process inserts at once (see the core's
    /// `Engine::insert_many`). Both share one pool.
    fn inserter(&self) -> Client {
        let worker = self.worker.lock().unwrap().clone();
        Client {
            engine: worker.unwrap_or_else(|| self.client.clone()),
            ..self.caller()
        }
    }

    /// The client engine, for calls.
    fn caller(&self) -> Client {
        Client {
            engine: self.client.clone(),
            migrated: self.migrated.clone(),
            timeout: self.settings.connect_timeout,
        }
    }
}

/// Migrate once per `Core`.
async fn ensure_migrated(engine: &Engine, cell: &OnceCell<()>) -> gendurable::Result<()> {
    cell.get_or_try_init(|| engine.migrate()).await.map(|_| ())
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
            ensure_migrated(&self.engine, &self.migrated).await?;
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

/// A workflow as the Python layer registers it: `(name, {step: step fn},
/// catch-all step fn, {step: declared rate-limit key})`.
type WorkflowTable = (
    String,
    HashMap<String, PyStep>,
    Option<PyStep>,
    HashMap<String, String>,
);

/// One instance to insert, as passed by the Python layer:
/// `(workflow, state, step, queue, priority, concurrency_key, rate_limit,
///   schedule_in, scheduled_at, max_attempts)`.
type NewTuple<'py> = (
    String,
    Bound<'py, PyAny>,
    String,
    String,
    i64,
    Option<String>,
    Option<String>,
    Option<f64>,
    Option<f64>,
    i64,
);

fn new_instance(t: NewTuple<'_>) -> PyResult<NewInstance> {
    let (
        workflow,
        state,
        step,
        queue,
        priority,
        ckey,
        rkey,
        schedule_in,
        scheduled_at,
        max_attempts,
    ) = t;
    let state = to_json("state", &state)?;
    let priority = i16::try_from(priority)
        .map_err(|_| invalid_input("priority", format!("must be 0 to 9, got {priority}")))?;
    let max_attempts = i32::try_from(max_attempts).map_err(|_| {
        invalid_input(
            "max_attempts",
            format!("must be at least 1 and fit in 32 bits, got {max_attempts}"),
        )
    })?;
    let mut new = NewInstance::new(workflow, state)
        .step(step)
        .queue(queue)
        .priority(priority)
        .max_attempts(max_attempts);
    if let Some(k) = ckey {
        new = new.concurrency_key(k);
    }
    if let Some(k) = rkey {
        new = new.rate_limit(k);
    }
    if let Some(s) = schedule_in {
        new = new.schedule_in(seconds("schedule_in", s)?);
    }
    if let Some(t) = scheduled_at {
        new = new.scheduled_at(timestamp("scheduled_at", t)?);
    }
    Ok(new)
}

fn instance_to_py<'py>(py: Python<'py>, i: &Instance) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", i.id)?;
    d.set_item("workflow", &i.workflow)?;
    d.set_item("step", &i.step)?;
    d.set_item("state", to_py(py, &i.state)?)?;
    d.set_item("queue", &i.queue)?;
    d.set_item("priority", i.priority)?;
    d.set_item("status", i.status.as_str())?;
    d.set_item("concurrency_key", &i.concurrency_key)?;
    d.set_item("rate_limit", &i.rate_limit)?;
    d.set_item("attempt", i.attempt)?;
    d.set_item("max_attempts", i.max_attempts)?;
    d.set_item("node", &i.node)?;
    d.set_item("cancel_requested", i.cancel_requested)?;
    d.set_item("await_signal", &i.await_signal)?;
    d.set_item("await_until", i.await_until.as_ref().map(epoch))?;
    let errors = PyList::empty(py);
    for e in &i.errors {
        errors.append(to_py(py, e)?)?;
    }
    d.set_item("errors", errors)?;
    d.set_item("inserted_at", epoch(&i.inserted_at))?;
    d.set_item("scheduled_at", epoch(&i.scheduled_at))?;
    d.set_item("attempted_at", i.attempted_at.as_ref().map(epoch))?;
    d.set_item("finished_at", i.finished_at.as_ref().map(epoch))?;
    Ok(d)
}

fn cancelled_str(c: Cancelled) -> (&'static str, Option<&'static str>) {
    match c {
        Cancelled::Now => ("now", None),
        Cancelled::AtOutcome => ("at_outcome", None),
        Cancelled::AlreadyFinished(s) => ("already_finished", Some(s.as_str())),
        #[allow(unreachable_patterns)]
        _ => ("unknown", None),
    }
}

/// A Python-held owned instance, converted back under the GIL.
struct InstanceOut(Instance);

impl<'py> IntoPyObject<'py> for InstanceOut {
    type Target = PyDict;
    type Output = Bound<'py, PyDict>;
    type Error = PyErr;
    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        instance_to_py(py, &self.0)
    }
}

#[pymethods]
impl Core {
    #[new]
    #[pyo3(signature = (url, schema, node_id, queues, gates, rates, heartbeat_interval,
        lease, poll_interval, gc_interval, shutdown_timeout, retention_set, retention,
        backoff, max_connections, connect_timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        url: String,
        schema: String,
        node_id: Option<String>,
        queues: Vec<(String, u32)>,
        gates: Vec<(String, u32, u32)>,
        rates: Vec<(String, u32, f64, u32)>,
        heartbeat_interval: Option<f64>,
        lease: Option<f64>,
        poll_interval: Option<f64>,
        gc_interval: Option<f64>,
        shutdown_timeout: Option<f64>,
        retention_set: bool,
        retention: Option<f64>,
        backoff: Option<(f64, f64)>,
        max_connections: Option<u32>,
        connect_timeout: Option<f64>,
    ) -> PyResult<Core> {
        let opt = |what: &str, v: Option<f64>| v.map(|s| config_seconds(what, s)).transpose();
        let mut rates_d = Vec::with_capacity(rates.len());
        for (name, limit, period, burst) in rates {
            let period = config_seconds(&format!("rate_limits[{name:?}] period"), period)?;
            rates_d.push((name, limit, period, burst));
        }
        let mut settings = Settings {
            url,
            schema,
            node_id,
            queues,
            gates,
            rates: rates_d,
            heartbeat_interval: opt("heartbeat_interval", heartbeat_interval)?,
            lease: opt("lease", lease)?,
            poll_interval: opt("poll_interval", poll_interval)?,
            gc_interval: opt("gc_interval", gc_interval)?,
            shutdown_timeout: opt("shutdown_timeout", shutdown_timeout)?,
            retention: if retention_set {
                Some(opt("retention", retention)?)
            } else {
                None
            },
            backoff: match backoff {
                Some((b, m)) => Some((
                    config_seconds("backoff base", b)?,
                    config_seconds("backoff max", m)?,
                )),
                None => None,
            },
            max_connections,
            connect_timeout: opt("connect_timeout", connect_timeout)?.unwrap_or(CONNECT_TIMEOUT),
        };
        if settings.queues.is_empty() {
            return Err(invalid_config("queues: give at least one queue"));
        }
        // Validates everything and makes a lazy pool; nothing touches the
        // database until the first call.
        let builder = settings.builder();
        let client = block_on(py, move || builder.build()).py_err()?;
        // One node id for the client and the worker built later (else each
        // would draw its own default).
        settings.node_id = Some(client.node_id().to_owned());
        Ok(Core {
            settings,
            client,
            migrated: Arc::new(OnceCell::new()),
            worker: Mutex::new(None),
            force: Mutex::new(None),
        })
    }

    /// This node's id.
    #[getter]
    fn node_id(&self) -> String {
        self.client.node_id().to_owned()
    }

    /// The effective K of a concurrency key under this configuration.
    fn effective_k(&self, key: &str) -> u32 {
        self.client.config().effective_k(key)
    }

    /// Create or upgrade the schema (also done by the first call that needs it).
    fn migrate(&self, py: Python<'_>) -> PyResult<()> {
        let c = self.caller();
        block_on(py, move || c.run(|_| async { Ok(()) }))
    }

    fn migrate_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let c = self.caller();
        pyo3_async_runtimes::tokio::future_into_py(py, c.run(|_| async { Ok(()) }))
    }

    fn insert_many(&self, py: Python<'_>, news: Vec<NewTuple<'_>>) -> PyResult<Vec<i64>> {
        let news = news
            .into_iter()
            .map(new_instance)
            .collect::<PyResult<Vec<_>>>()?;
        let c = self.inserter();
        block_on(py, move || {
            c.run(move |e| async move { e.insert_many(news).await })
        })
    }

    fn insert_many_async<'py>(
        &self,
        py: Python<'py>,
        news: Vec<NewTuple<'_>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let news = news
            .into_iter()
            .map(new_instance)
            .collect::<PyResult<Vec<_>>>()?;
        let c = self.inserter();
        pyo3_async_runtimes::tokio::future_into_py(
            py,
            c.run(move |e| async move { e.insert_many(news).await }),
        )
    }

    fn get<'py>(&self, py: Python<'py>, id: i64) -> PyResult<Bound<'py, PyDict>> {
        let c = self.caller();
        let i = block_on(py, move || c.run(move |e| async move { e.get(id).await }))?;
        instance_to_py(py, &i)
    }

    fn get_async<'py>(&self, py: Python<'py>, id: i64) -> PyResult<Bound<'py, PyAny>> {
        let c = self.caller();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            c.run(move |e| async move { e.get(id).await })
                .await
                .map(InstanceOut)
        })
    }

    /// Returns the number woken (by name) or 1/0 (by id).
    #[pyo3(signature = (name, payload, id=None))]
    fn signal(
        &self,
        py: Python<'_>,
        name: String,
        payload: &Bound<'_, PyAny>,
        id: Option<i64>,
    ) -> PyResult<u64> {
        let payload = to_json("payload", payload)?;
        let c = self.caller();
        block_on(py, move || {
            c.run(move |e| async move { signal(&e, &name, payload, id).await })
        })
    }

    #[pyo3(signature = (name, payload, id=None))]
    fn signal_async<'py>(
        &self,
        py: Python<'py>,
        name: String,
        payload: &Bound<'_, PyAny>,
        id: Option<i64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let payload = to_json("payload", payload)?;
        let c = self.caller();
        pyo3_async_runtimes::tokio::future_into_py(
            py,
            c.run(move |e| async move { signal(&e, &name, payload, id).await }),
        )
    }

    #[pyo3(signature = (id, reason=None))]
    fn cancel(
        &self,
        py: Python<'_>,
        id: i64,
        reason: Option<String>,
    ) -> PyResult<(&'static str, Option<&'static str>)> {
        let c = self.caller();
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
        let c = self.caller();
        pyo3_async_runtimes::tokio::future_into_py(
            py,
            c.run(move |e| async move { cancel(&e, id, reason).await }),
        )
    }

    /// Start the worker node with `workflows`: a list of
    /// `(name, {step: (fn, is_async, takes_step)}, fallback or None,
    /// {step: rate-limit key})`;
    /// `invoke` / `invoke_async` are the package's step runners and `loop`
    /// the asyncio loop async steps run on.
    fn start(
        &self,
        py: Python<'_>,
        workflows: Vec<WorkflowTable>,
        invoke: Py<PyAny>,
        invoke_async: Py<PyAny>,
        event_loop: Py<PyAny>,
    ) -> PyResult<()> {
        // Never hold the mutex while the GIL is released: a thread holding
        // the GIL and waiting for it would deadlock with us.
        if self.worker.lock().unwrap().is_some() {
            return Err(crate::errors::to_py(gendurable::Error::InvalidConfig(
                "the worker is already running".into(),
            )));
        }
        let force = Arc::new(Force::default());
        let hooks = Arc::new(Hooks {
            invoke,
            invoke_async,
            event_loop,
            force: force.clone(),
        });
        // The worker shares the client's pool (built from the same settings).
        let mut b = self.settings.builder().pool(self.client.pool().clone());
        for (name, steps, fallback, rate_limits) in workflows {
            b = b.workflow(
                name,
                PyWorkflow {
                    steps,
                    fallback,
                    rate_limits,
                    hooks: hooks.clone(),
                },
            );
        }
        let c = self.caller();
        let engine = block_on(py, move || {
            c.run(move |_| async move {
                let engine = b.build().await?;
                engine.start().await?;
                Ok(engine)
            })
        })?;
        let previous = self.worker.lock().unwrap().replace(engine);
        *self.force.lock().unwrap() = Some(force);
        if let Some(other) = previous {
            // Started twice concurrently: keep one node.
            block_on(py, move || async move { other.shutdown().await }).py_err()?;
        }
        Ok(())
    }

    /// Whether the worker node runs.
    #[getter]
    fn running(&self) -> bool {
        self.worker.lock().unwrap().is_some()
    }

    /// Stop the worker node gracefully (see `Engine.shutdown`). While it
    /// waits for running steps, Python's signal handlers run: one that raises
    /// (Ctrl-C) stops the running steps at once, recorded as errors, and the
    /// exception propagates once their outcomes are written.
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let Some(engine) = self.worker.lock().unwrap().take() else {
            return Ok(());
        };
        let force = self.force.lock().unwrap().clone();
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
                if let Some(f) = &force {
                    f.fire();
                }
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
        let engine = self.worker.lock().unwrap().take();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            match engine {
                Some(engine) => engine.shutdown().await.py_err(),
                None => Ok(()),
            }
        })
    }

    /// Stop the worker's running steps now, recording each as an error (a
    /// second interrupt while the worker shuts down). Does not stop the node:
    /// `shutdown` does.
    fn force_stop(&self) {
        if let Some(f) = &*self.force.lock().unwrap() {
            f.fire();
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<gendurable engine schema={:?} node={:?}>",
            self.settings.schema,
            self.client.node_id()
        )
    }
}

async fn signal(
    engine: &Engine,
    name: &str,
    payload: serde_json::Value,
    id: Option<i64>,
) -> gendurable::Result<u64> {
    match id {
        Some(id) => engine
            .signal_instance(id, name, payload)
            .await
            .map(u64::from),
        None => engine.signal(name, payload).await,
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
