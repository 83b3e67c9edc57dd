//! The engine's options: the Python layer's dict, as JSON, read by the core
//! (`gendurable::options::EngineOptions`), whose errors name the option.

use crate::errors::{to_py, IntoPyResult};
use crate::values::options_json;
use gendurable::options::EngineOptions;
use gendurable::{Engine, EngineBuilder};
use pyo3::prelude::*;
use std::time::Duration;

/// How long a call waits for a connection unless `connect_timeout` says
/// otherwise (the core's default). A refused connection fails at once.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The options in `obj` (a dict of the core's option names).
pub(crate) fn engine_options(obj: &Bound<'_, PyAny>) -> PyResult<EngineOptions> {
    let value = options_json(obj).map_err(|bad| {
        let path: Vec<&str> = bad.path.iter().map(String::as_str).collect();
        to_py(EngineOptions::error_at(
            &path,
            &format!("is not JSON: {}", bad.why),
        ))
    })?;
    EngineOptions::from_json(value).py_err()
}

/// How long a call waits for a database connection.
pub(crate) fn connect_timeout(options: &EngineOptions) -> Duration {
    options
        .connect_timeout
        .map_or(CONNECT_TIMEOUT, Duration::from_millis)
}

/// The core's builder with these options; it migrates on the first call
/// instead of when built (see `core::Client`).
pub(crate) fn builder(options: &EngineOptions) -> EngineBuilder {
    options.apply(Engine::builder()).migrate(false)
}
