//! Instances between Python and the core: what is inserted, what is read
//! back, what a cancel did.

use crate::errors::{to_py as error, IntoPyResult};
use crate::values::{epoch, options_json, to_py};
use gendurable::options::InsertOptions;
use gendurable::{Cancelled, Instance, NewInstance};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// An instance to insert from a dict of the core's insert options
/// (`gendurable::options::InsertOptions`), read and checked by the core.
pub(crate) fn new_instance(obj: &Bound<'_, PyAny>) -> PyResult<NewInstance> {
    let d = obj.cast::<PyDict>()?;
    let mut map = serde_json::Map::with_capacity(d.len());
    for (k, v) in d.iter() {
        let option: String = k.extract()?;
        // Each option on its own: the state's nesting counts from the state.
        let value = options_json(&v).map_err(|bad| {
            error(InsertOptions::error_at(
                &option,
                &format!("is not JSON: {}", bad.why),
            ))
        })?;
        map.insert(option, value);
    }
    NewInstance::from_json(serde_json::Value::Object(map)).py_err()
}

pub(crate) fn instance_to_py<'py>(py: Python<'py>, i: &Instance) -> PyResult<Bound<'py, PyDict>> {
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

/// An instance read back, converted to a dict once the GIL is held again.
pub(crate) struct InstanceOut(pub Instance);

impl<'py> IntoPyObject<'py> for InstanceOut {
    type Target = PyDict;
    type Output = Bound<'py, PyDict>;
    type Error = PyErr;
    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        instance_to_py(py, &self.0)
    }
}

/// What a cancel did, and the final status it found.
pub(crate) fn cancelled_str(c: Cancelled) -> (&'static str, Option<&'static str>) {
    match c {
        Cancelled::Now => ("now", None),
        Cancelled::AtOutcome => ("at_outcome", None),
        Cancelled::AlreadyFinished(s) => ("already_finished", Some(s.as_str())),
        #[allow(unreachable_patterns)]
        _ => ("unknown", None),
    }
}
