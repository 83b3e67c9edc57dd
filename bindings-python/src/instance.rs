//! Instances between Python and the core: what is inserted, what is read
//! back, what a cancel did.

use crate::errors::invalid_input;
use crate::values::{epoch, seconds, timestamp, to_json, to_py};
use gendurable::{Cancelled, Instance, NewInstance};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// One instance to insert, as passed by the Python layer:
/// `(workflow, state, step, queue, priority, concurrency_key, rate_limit,
///   schedule_in, scheduled_at, max_attempts)`.
pub(crate) type NewTuple<'py> = (
    String,
    Bound<'py, PyAny>,
    String,
    String,
    Bound<'py, PyAny>,
    Option<String>,
    Option<String>,
    Option<f64>,
    Option<f64>,
    Bound<'py, PyAny>,
);

/// The core's `NewInstance`; the core checks every value when it inserts.
pub(crate) fn new_instance(t: NewTuple<'_>) -> PyResult<NewInstance> {
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
    let mut new = NewInstance::new(workflow, state)
        .step(step)
        .queue(queue)
        .priority(int("priority", &priority)?)
        .max_attempts(int("max_attempts", &max_attempts)?);
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

/// A Python int as the integer type the core takes for `field`: one that
/// does not fit is refused as such; what fits, the core judges.
fn int<'py, T>(field: &'static str, v: &Bound<'py, PyAny>) -> PyResult<T>
where
    T: for<'a> FromPyObject<'a, 'py>,
{
    v.extract::<T>().map_err(|_| {
        invalid_input(
            field,
            format!("{v} does not fit in {}", std::any::type_name::<T>()),
        )
    })
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
