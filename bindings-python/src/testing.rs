//! For tests (`gendurable.testing`): a throwaway PostgreSQL cluster, and
//! the values of drains and inserted-instance queries.

use crate::block_on;
use crate::errors::{invalid_input, temp_postgres_error};
use crate::instance::instance_to_py;
use crate::lock;
use crate::values::to_json;
use gendurable::{InsertedQuery, Instance, Status};
use gendurable_testing::TempPostgres;
use pyo3::prelude::*;
use pyo3::types::PyList;
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
        let pg = lock(&self.inner).take();
        py.detach(move || drop(pg));
    }
}

/// What a drain ran: `(steps, completed, discarded, cancelled, retried,
/// snoozed, awaiting)`.
pub(crate) type DrainedTuple = (usize, usize, usize, usize, usize, usize, usize);

pub(crate) fn drained_tuple(d: gendurable::Drained) -> DrainedTuple {
    (
        d.steps,
        d.completed,
        d.discarded,
        d.cancelled,
        d.retried,
        d.snoozed,
        d.awaiting,
    )
}

/// The query of `gendurable.testing.inserted`; the state is JSON
/// (containment), the status one of the seven.
pub(crate) fn inserted_query(
    workflow: String,
    state: Option<&Bound<'_, PyAny>>,
    queue: Option<String>,
    status: Option<&str>,
    limit: Option<i64>,
) -> PyResult<InsertedQuery> {
    let mut q = InsertedQuery::new(workflow);
    q.state = match state {
        Some(s) if !s.is_none() => Some(to_json("state", s)?),
        _ => None,
    };
    q.queue = queue;
    q.status = status.map(status_of).transpose()?;
    q.limit = limit;
    Ok(q)
}

pub(crate) fn status_of(s: &str) -> PyResult<Status> {
    Ok(match s {
        "scheduled" => Status::Scheduled,
        "available" => Status::Available,
        "executing" => Status::Executing,
        "awaiting" => Status::Awaiting,
        "completed" => Status::Completed,
        "cancelled" => Status::Cancelled,
        "discarded" => Status::Discarded,
        other => {
            return Err(invalid_input(
                "status",
                format!(
                    "must be one of scheduled, available, executing, awaiting, completed, \
                     cancelled or discarded; got {other:?}"
                ),
            ))
        }
    })
}

/// Instances read back, converted to a list of dicts once the GIL is held.
pub(crate) struct Instances(pub Vec<Instance>);

impl<'py> IntoPyObject<'py> for Instances {
    type Target = PyList;
    type Output = Bound<'py, PyList>;
    type Error = PyErr;
    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for i in &self.0 {
            list.append(instance_to_py(py, i)?)?;
        }
        Ok(list)
    }
}
