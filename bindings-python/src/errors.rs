//! The core's errors as the exception classes of `gendurable.errors`.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Build an exception of class `gendurable.errors.<class>` with `message`
/// and keyword attributes.
pub(crate) fn raise(
    py: Python<'_>,
    class: &str,
    message: String,
    attrs: &[(&str, Py<PyAny>)],
) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let cls = py.import("gendurable.errors")?.getattr(class)?;
        let kwargs = PyDict::new(py);
        for (k, v) in attrs {
            kwargs.set_item(k, v)?;
        }
        let exc = cls.call((message.clone(),), Some(&kwargs))?;
        Ok(PyErr::from_value(exc))
    };
    build().unwrap_or_else(|e| e)
}

/// The Python exception for a core error.
pub(crate) fn to_py(e: gendurable::Error) -> PyErr {
    Python::attach(|py| {
        let msg = e.to_string();
        match &e {
            gendurable::Error::InvalidInput { field, .. } => raise(
                py,
                "InvalidInput",
                msg,
                &[(
                    "field",
                    field.into_pyobject(py).unwrap().into_any().unbind(),
                )],
            ),
            gendurable::Error::InvalidConfig(_) => raise(py, "InvalidConfig", msg, &[]),
            gendurable::Error::NotFound(id) => raise(
                py,
                "NotFound",
                msg,
                &[("id", id.into_pyobject(py).unwrap().into_any().unbind())],
            ),
            gendurable::Error::ShutDown => raise(py, "ShutDown", msg, &[]),
            gendurable::Error::Database(_) => raise(
                py,
                "DatabaseError",
                msg,
                &[(
                    "transient",
                    pyo3::types::PyBool::new(py, e.is_transient())
                        .to_owned()
                        .into_any()
                        .unbind(),
                )],
            ),
            gendurable::Error::Contended(_) => raise(py, "Contended", msg, &[]),
            gendurable::Error::Migrate(_) => raise(py, "MigrationError", msg, &[]),
            _ => raise(py, "Error", msg, &[]),
        }
    })
}

/// `EmbeddedPostgresError` for a throwaway cluster that failed.
pub(crate) fn temp_postgres_error(e: gendurable_testing::Error) -> PyErr {
    Python::attach(|py| raise(py, "EmbeddedPostgresError", e.to_string(), &[]))
}

/// `CannotConnect` for a connection that failed: `.cause` names why
/// (`refused`, `unknown_host`, `auth`, `no_database`, `not_ready`,
/// `timeout`, `other`).
pub(crate) fn connect_error(e: gendurable_cli::connect::ConnectError) -> PyErr {
    Python::attach(|py| {
        raise(
            py,
            "CannotConnect",
            e.message.clone(),
            &[
                (
                    "cause",
                    e.cause
                        .as_str()
                        .into_pyobject(py)
                        .unwrap()
                        .into_any()
                        .unbind(),
                ),
                (
                    "transient",
                    pyo3::types::PyBool::new(py, e.cause.is_transient())
                        .to_owned()
                        .into_any()
                        .unbind(),
                ),
            ],
        )
    })
}

/// `InvalidInput` for a field, raised before anything reaches the core.
pub(crate) fn invalid_input(field: &'static str, reason: impl Into<String>) -> PyErr {
    to_py(gendurable::Error::InvalidInput {
        field,
        reason: reason.into(),
    })
}

/// `InvalidConfig` with a message.
pub(crate) fn invalid_config(msg: impl Into<String>) -> PyErr {
    to_py(gendurable::Error::InvalidConfig(msg.into()))
}

/// For failures that are bugs of this package rather than of the caller.
#[allow(dead_code)]
pub(crate) fn internal(msg: impl Into<String>) -> PyErr {
    PyRuntimeError::new_err(msg.into())
}

/// `Result<T, gendurable::Error>` into `PyResult<T>`.
pub(crate) trait IntoPyResult<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, gendurable::Error> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
