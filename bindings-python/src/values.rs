//! Values between Python and the core: JSON, durations, times, names.

use crate::errors::{invalid_config, invalid_input, IntoPyResult};
use chrono::{DateTime, Utc};
use pyo3::prelude::*;
use serde_json::Value;
use std::time::Duration;

/// A Python object (dict, list, str, int, float, bool, None) as JSON.
pub(crate) fn to_json(field: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    pythonize::depythonize::<Value>(obj)
        .map_err(|e| invalid_input(field, format!("is not JSON-serialisable: {e}")))
}

/// JSON as a Python object.
pub(crate) fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    pythonize::pythonize(py, value).map_err(PyErr::from)
}

/// Seconds (a float) as a duration; `field` names it in the error.
pub(crate) fn seconds(field: &'static str, secs: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(secs).map_err(|_| {
        invalid_input(
            field,
            format!("must be a finite number of seconds, zero or more; got {secs}"),
        )
    })
}

/// Seconds of a configuration setting.
pub(crate) fn config_seconds(what: &str, secs: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(secs).map_err(|_| {
        invalid_config(format!(
            "{what} must be a finite number of seconds, zero or more; got {secs}"
        ))
    })
}

/// A Unix timestamp (seconds) as a UTC time.
pub(crate) fn timestamp(field: &'static str, secs: f64) -> PyResult<DateTime<Utc>> {
    if !secs.is_finite() {
        return Err(invalid_input(field, "must be a finite time"));
    }
    let micros = (secs * 1e6).round();
    DateTime::<Utc>::from_timestamp_micros(micros as i64)
        .ok_or_else(|| invalid_input(field, format!("is out of range: {secs}")))
}

/// A UTC time as a Unix timestamp (seconds).
pub(crate) fn epoch(t: &DateTime<Utc>) -> f64 {
    t.timestamp_micros() as f64 / 1e6
}

/// Check a workflow, step, queue or signal name as the core would.
#[pyfunction]
pub(crate) fn check_name(field: &str, value: &str) -> PyResult<()> {
    let field = static_field(field);
    gendurable::validate::name(field, value).py_err()
}

/// Check a concurrency or rate-limit key as the core would.
#[pyfunction]
pub(crate) fn check_key(field: &str, value: &str) -> PyResult<()> {
    let field = static_field(field);
    gendurable::validate::key(field, value).py_err()
}

/// The core's error carries a `&'static str` field name; map the ones the
/// package uses.
pub(crate) fn static_field(field: &str) -> &'static str {
    match field {
        "workflow" => "workflow",
        "step" => "step",
        "queue" => "queue",
        "signal" => "signal",
        "concurrency_key" => "concurrency_key",
        "rate_limit" => "rate_limit",
        "state" => "state",
        "payload" => "payload",
        _ => "value",
    }
}
