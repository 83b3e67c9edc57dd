//! `gendurable._gendurable`: the native half of the Python package.
//!
//! Everything here is thin: it converts values between Python and the core,
//! maps the core's errors onto the Python exception classes of
//! `gendurable.errors`, and runs Python step functions for the core's node.
//! The Python package (`python/gendurable/`) is the public interface.

/// mimalloc, for memory made and freed on different threads (`gendurable_alloc`).
#[global_allocator]
static GLOBAL: gendurable_alloc::Allocator = gendurable_alloc::Allocator;

mod actions;
mod bench;
mod bulkhead;
mod config;
mod core;
mod errors;
mod instance;
mod testing;
mod values;
mod workflow;

use pyo3::prelude::*;

/// The binding's mutexes are held briefly and never while waiting for the
/// GIL (a thread holding the GIL and waiting for the lock would deadlock with
/// it). A lock poisoned by a panic elsewhere is taken as it is: its value is
/// always whole.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The tokio runtime shared by every engine, the async calls and the bulkhead.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

/// How the shared runtime is built (before its first use). Its blocking
/// threads, which run the sync steps, are kept for the life of the process:
/// each keeps its Python thread state (see `workflow::pin_thread_state`), and
/// a thread that ended would leave that state behind. There are never more of
/// them than steps ran at once.
fn configure_runtime() {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .enable_all()
        .thread_keep_alive(std::time::Duration::MAX);
    pyo3_async_runtimes::tokio::init(builder);
}

/// Run the future `make` returns to completion on the shared runtime, with
/// the GIL released. (The future is made on the releasing thread, so it need
/// not be `Send`: some of the core's futures are not provably so.)
pub(crate) fn block_on<M, F>(py: Python<'_>, make: M) -> F::Output
where
    M: FnOnce() -> F + Send,
    F: std::future::Future,
    F::Output: Send,
{
    py.detach(|| runtime().block_on(make()))
}

/// With `GENDURABLE_LOG` set (e.g. `info`, `gendurable=debug`), the core's
/// log goes to stderr.
fn init_logging() {
    if let Ok(filter) = std::env::var("GENDURABLE_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// Run the `gendurable` command line (`argv[0]` is the program name) with
/// the GIL released, and return its exit status. The CLI handles Ctrl-C
/// itself; the console script sets a Python SIGINT handler that does nothing
/// while it runs, and the signal Python also saw is consumed here.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<std::ffi::OsString>) -> i32 {
    let code = py.detach(move || gendurable_cli::run(argv));
    let _ = py.check_signals();
    code
}

#[pymodule]
fn _gendurable(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_logging();
    configure_runtime();
    m.add_class::<core::Core>()?;
    m.add_class::<bulkhead::PyBulkhead>()?;
    m.add_class::<bulkhead::PyPermit>()?;
    m.add_class::<testing::PyTempPostgres>()?;
    m.add_function(wrap_pyfunction!(values::check_name, m)?)?;
    m.add_function(wrap_pyfunction!(values::check_key, m)?)?;
    m.add_function(wrap_pyfunction!(bench::_bench_rust_noop, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(workflow::running_sync_steps, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
