//! Values between Python and the core: JSON, durations, times, names.

use crate::errors::{invalid_config, invalid_input, IntoPyResult};
use chrono::{DateTime, Utc};
use pyo3::prelude::*;
use serde_json::Value;
use std::time::Duration;

/// Deepest nesting accepted in a state or payload.
const MAX_DEPTH: usize = gendurable::validate::MAX_DEPTH;

/// A Python object made of dict (str keys), list, tuple, str, int, float
/// (finite), bool and None, as JSON. Anything else is refused rather than
/// guessed at (a set is not silently turned into a list).
pub(crate) fn to_json(field: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    convert(obj, 0).map_err(|why| invalid_input(field, format!("is not JSON: {why}")))
}

fn convert(obj: &Bound<'_, PyAny>, depth: usize) -> Result<Value, String> {
    use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
    if depth > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return s
            .extract::<String>()
            .map(Value::String)
            .map_err(|_| "a str that is not valid UTF-8 (lone surrogates)".to_owned());
    }
    if let Ok(i) = obj.cast::<PyInt>() {
        if let Ok(v) = i.extract::<i64>() {
            return Ok(Value::from(v));
        }
        if let Ok(v) = i.extract::<u64>() {
            return Ok(Value::from(v));
        }
        return Err(format!("the int {i} does not fit in 64 bits"));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        let v = f.value();
        return serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| format!("the float {v} is not a JSON number"));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = serde_json::Map::with_capacity(d.len());
        for (k, v) in d.iter() {
            let key = k
                .cast::<PyString>()
                .map_err(|_| format!("a dict key is not a str: {}", repr(&k)))?
                .extract::<String>()
                .map_err(|_| "a dict key is not valid UTF-8".to_owned())?;
            let value = convert(&v, depth + 1)?;
            map.insert(key, value);
        }
        return Ok(Value::Object(map));
    }
    if let Ok(l) = obj.cast::<PyList>() {
        return l
            .iter()
            .map(|v| convert(&v, depth + 1))
            .collect::<Result<_, _>>()
            .map(Value::Array);
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return t
            .iter()
            .map(|v| convert(&v, depth + 1))
            .collect::<Result<_, _>>()
            .map(Value::Array);
    }
    Err(format!(
        "a {} is not a JSON value ({})",
        type_name(obj),
        repr(obj)
    ))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "value".into())
}

fn repr(obj: &Bound<'_, PyAny>) -> String {
    let mut r = obj
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "?".into());
    if r.len() > 60 {
        let mut cut = 57;
        while !r.is_char_boundary(cut) {
            cut -= 1;
        }
        r.truncate(cut);
        r.push_str("...");
    }
    r
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
