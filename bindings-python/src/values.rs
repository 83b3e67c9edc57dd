//! Values between Python and the core: JSON, times, names.

use crate::errors::{invalid_input, IntoPyResult};
use chrono::{DateTime, Utc};
use pyo3::prelude::*;
use serde_json::Value;

/// Deepest nesting accepted in a state or payload.
const MAX_DEPTH: usize = gendurable::validate::MAX_DEPTH;

/// A Python object made of dict (str keys), list, tuple, str, int, float
/// (finite), bool and None, as JSON. Anything else is refused rather than
/// guessed at (a set is not silently turned into a list).
pub(crate) fn to_json(field: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    convert(obj, 0).map_err(|bad| invalid_input(field, format!("is not JSON: {}", bad.why)))
}

/// A value that is not JSON: where (keys and indexes from the outside in)
/// and why.
pub(crate) struct NotJson {
    pub path: Vec<String>,
    pub why: String,
}

impl NotJson {
    fn new(why: String) -> NotJson {
        NotJson {
            path: Vec::new(),
            why,
        }
    }

    /// Inside the item `at` of its container.
    fn within(mut self, at: String) -> NotJson {
        self.path.insert(0, at);
        self
    }
}

/// [`to_json`] for options, saying where a value is not JSON.
pub(crate) fn options_json(obj: &Bound<'_, PyAny>) -> Result<Value, NotJson> {
    convert(obj, 0)
}

fn convert(obj: &Bound<'_, PyAny>, depth: usize) -> Result<Value, NotJson> {
    use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
    let bad = |why: String| Err(NotJson::new(why));
    if depth > MAX_DEPTH {
        return bad(format!("nested deeper than {MAX_DEPTH} levels"));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return match s.extract::<String>() {
            Ok(s) => Ok(Value::String(s)),
            Err(_) => bad("a str that is not valid UTF-8 (lone surrogates)".to_owned()),
        };
    }
    if let Ok(i) = obj.cast::<PyInt>() {
        if let Ok(v) = i.extract::<i64>() {
            return Ok(Value::from(v));
        }
        if let Ok(v) = i.extract::<u64>() {
            return Ok(Value::from(v));
        }
        return bad(format!("the int {i} does not fit in 64 bits"));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        let v = f.value();
        return match serde_json::Number::from_f64(v) {
            Some(n) => Ok(Value::Number(n)),
            None => bad(format!("the float {v} is not a JSON number")),
        };
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = serde_json::Map::with_capacity(d.len());
        for (k, v) in d.iter() {
            let Ok(k) = k.cast::<PyString>() else {
                return bad(format!("a dict key is not a str: {}", repr(&k)));
            };
            let Ok(key) = k.extract::<String>() else {
                return bad("a dict key is not valid UTF-8".to_owned());
            };
            match convert(&v, depth + 1) {
                Ok(value) => map.insert(key, value),
                Err(e) => return Err(e.within(key)),
            };
        }
        return Ok(Value::Object(map));
    }
    let items = |it: &mut dyn Iterator<Item = Bound<'_, PyAny>>| {
        it.enumerate()
            .map(|(i, v)| convert(&v, depth + 1).map_err(|e| e.within(i.to_string())))
            .collect::<Result<_, _>>()
            .map(Value::Array)
    };
    if let Ok(l) = obj.cast::<PyList>() {
        return items(&mut l.iter());
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return items(&mut t.iter());
    }
    bad(format!(
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
