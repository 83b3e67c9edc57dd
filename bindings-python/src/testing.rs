//! A throwaway PostgreSQL cluster for tests (`gendurable.testing`).

use crate::block_on;
use crate::errors::temp_postgres_error;
use gendurable_testing::TempPostgres;
use pyo3::prelude::*;
use std::sync::Mutex;

#[pyclass(frozen, name = "_TempPostgres", module = "gendurable._gendurable")]
pub(crate) struct PyTempPostgres {
    inner: Mutex<Option<TempPostgres>>,
    url: String,
}

#[pymethods]
impl PyTempPostgres {
    /// Start a cluster from the installed server binaries.
    #[staticmethod]
    fn start(py: Python<'_>) -> PyResult<Self> {
        let pg =
            block_on(py, || async { TempPostgres::start().await }).map_err(temp_postgres_error)?;
        Ok(PyTempPostgres {
            url: pg.url(),
            inner: Mutex::new(Some(pg)),
        })
    }

    #[getter]
    fn url(&self) -> String {
        self.url.clone()
    }

    /// Stop the cluster and remove its files (idempotent).
    fn stop(&self, py: Python<'_>) {
        let pg = self.inner.lock().unwrap().take();
        py.detach(move || drop(pg));
    }
}
