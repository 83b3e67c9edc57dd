//! The core's bulkhead for Python: `gendurable.Bulkhead` wraps these.

use crate::errors::{invalid_config, raise};
use crate::lock;
use gendurable::bulkhead::{Bulkhead, BulkheadConfig, OwnedPermit, Wait};
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[pyclass(frozen, name = "_Bulkhead", module = "gendurable._gendurable")]
pub(crate) struct PyBulkhead {
    inner: Arc<Bulkhead>,
}

/// A held slot. Released by `release()`, by leaving its `with` block, or when
/// it is garbage-collected.
#[pyclass(frozen, name = "Permit", module = "gendurable._gendurable")]
pub(crate) struct PyPermit {
    inner: Mutex<Option<OwnedPermit>>,
}

impl PyPermit {
    fn new(p: OwnedPermit) -> Self {
        PyPermit {
            inner: Mutex::new(Some(p)),
        }
    }
}

fn saturated(py: Python<'_>, b: &Bulkhead) -> PyErr {
    let msg = match b.wait() {
        Some(w) => format!(
            "all {} permits are in use (waited {:.3} s)",
            b.limit(),
            w.as_secs_f64()
        ),
        None => format!("all {} permits are in use", b.limit()),
    };
    raise(py, "Saturated", msg, &[])
}

#[pymethods]
impl PyBulkhead {
    #[new]
    #[pyo3(signature = (limit, reclaim_after, wait=None, name=None))]
    fn new(
        limit: i64,
        reclaim_after: f64,
        wait: Option<f64>,
        name: Option<String>,
    ) -> PyResult<Self> {
        // The bulkhead checks the values (a limit below 1, a zero
        // reclaim_after, an unbounded wait); a negative limit is below 1 too.
        let limit = usize::try_from(limit).unwrap_or(0);
        let reclaim_after = Duration::try_from_secs_f64(reclaim_after).map_err(|_| {
            invalid_config(format!(
                "bulkhead reclaim_after must be a finite number of seconds, zero or more; got {reclaim_after}"
            ))
        })?;
        let wait = match wait {
            None => Wait::None,
            Some(w) if w == f64::INFINITY => Wait::Unbounded,
            Some(w) => Wait::Bounded(Duration::try_from_secs_f64(w).map_err(|_| {
                invalid_config(format!(
                    "bulkhead wait must be None or a finite number of seconds, zero or more; got {w}"
                ))
            })?),
        };
        let cfg = BulkheadConfig::new(limit, reclaim_after).with_wait(wait);
        let inner = match name {
            Some(n) => Bulkhead::configure(n, cfg),
            None => Bulkhead::new(cfg).map(Arc::new),
        }
        .map_err(|e| invalid_config(e.to_string()))?;
        Ok(PyBulkhead { inner })
    }

    /// A permit if one is free now, else None. Never waits.
    fn try_acquire(&self) -> Option<PyPermit> {
        self.inner.try_acquire_owned().ok().map(PyPermit::new)
    }

    /// A permit, waiting (GIL released) up to the wait budget; raises Saturated.
    fn acquire(&self, py: Python<'_>) -> PyResult<PyPermit> {
        if let Ok(p) = self.inner.try_acquire_owned() {
            return Ok(PyPermit::new(p));
        }
        if self.inner.wait().is_none() {
            return Err(saturated(py, &self.inner));
        }
        let b = self.inner.clone();
        match py.detach(move || b.acquire_blocking_owned()) {
            Ok(p) => Ok(PyPermit::new(p)),
            Err(_) => Err(saturated(py, &self.inner)),
        }
    }

    /// An awaitable of a permit, waiting up to the wait budget; raises Saturated.
    fn acquire_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let b = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            match b.acquire_owned().await {
                Ok(p) => Ok(PyPermit::new(p)),
                Err(_) => Python::attach(|py| Err(saturated(py, &b))),
            }
        })
    }

    #[getter]
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    #[getter]
    fn limit(&self) -> usize {
        self.inner.limit()
    }

    #[getter]
    fn waiting(&self) -> usize {
        self.inner.waiting()
    }

    #[getter]
    fn wait(&self) -> Option<f64> {
        self.inner.wait().map(|d| d.as_secs_f64())
    }

    #[getter]
    fn reclaim_after(&self) -> f64 {
        self.inner.reclaim_after().as_secs_f64()
    }

    fn reset(&self) {
        self.inner.reset();
    }
}

#[pymethods]
impl PyPermit {
    /// Give the slot back (idempotent).
    fn release(&self) {
        drop(lock(&self.inner).take());
    }

    /// Whether this permit still owns its slot (false once released, reset
    /// or reclaimed after `reclaim_after`).
    #[getter]
    fn is_current(&self) -> bool {
        lock(&self.inner).as_ref().is_some_and(|p| p.is_current())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release();
        false
    }

    fn __aenter__<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        ready(slf.into_any())
    }

    #[pyo3(signature = (*_args))]
    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        _args: &Bound<'_, pyo3::types::PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.release();
        ready(pyo3::types::PyBool::new(py, false).to_owned().into_any())
    }
}

/// An awaitable already holding `value`.
fn ready(value: Bound<'_, PyAny>) -> PyResult<Bound<'_, PyAny>> {
    let py = value.py();
    py.import("gendurable._util")?
        .getattr("ready")?
        .call1((value,))
}
