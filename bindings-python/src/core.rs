//! `Core`: the one core engine of a Python `Engine`, its client calls and
//! its worker node.
//!
//! The Python layer collects the workflows, then builds the engine once
//! (`build`, at its first call or when it starts): every call after that,
//! inserts included, goes through this engine, whether or not its node runs.

use crate::block_on;
use crate::config::{builder, connect_timeout, engine_options};
use crate::errors::{connect_error, invalid_config, raise, IntoPyResult};
use crate::instance::{cancelled_str, instance_to_py, new_instance, InstanceOut};
use crate::values::to_json;
use crate::workflow::{register, Hooks, WorkflowTable};
use gendurable::options::EngineOptions;
use gendurable::{Engine, EngineBuilder, NewInstance};
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
    fn builder(&self, workflows: Vec<WorkflowTable>) -> EngineBuilder {
        register(builder(&self.options), workflows, &self.hooks)
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
    /// checks. Nothing connects yet.
    #[new]
    fn new(py: Python<'_>, options: &Bound<'_, PyAny>) -> PyResult<Core> {
        let options = engine_options(options)?;
        builder(&options).validate().py_err()?;
        Ok(Core {
            options,
            hooks: Arc::new(Hooks::new(py)?),
            built: OnceLock::new(),
            running: AtomicBool::new(false),
        })
    }

    /// Check the configuration with these workflows, as `build` would,
    /// without building.
    fn check(&self, workflows: Vec<WorkflowTable>) -> PyResult<()> {
        self.builder(workflows).validate().py_err()
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
        let builder = match options {
            Some(o) => register(builder(&engine_options(o)?), workflows, &self.hooks),
            None => self.builder(workflows),
        };
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
        let c = self.client()?;
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
        let c = self.client()?;
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
