//! A pure-Rust baseline for `bench/noop.py`.

use crate::block_on;
use crate::errors::IntoPyResult;
use gendurable::{Engine, NewInstance, Transition};
use pyo3::prelude::*;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Insert `n` no-op instances (unless `insert` is false: they are in the
/// schema already), start a Rust node running `concurrency` steps at once,
/// and return the seconds until the `n`-th step ran.
#[pyfunction]
#[pyo3(signature = (url, n, concurrency, schema="gendurable_bench", insert=true))]
pub(crate) fn _bench_rust_noop(
    py: Python<'_>,
    url: String,
    n: usize,
    concurrency: u32,
    schema: &str,
    insert: bool,
) -> PyResult<f64> {
    let schema = schema.to_owned();
    block_on(py, move || async move {
        let count = Arc::new(AtomicUsize::new(0));
        let all_done = Arc::new(Notify::new());
        let (c, d) = (count.clone(), all_done.clone());
        let engine = Engine::builder()
            .url(url)
            .schema(schema)
            .queue("default", concurrency)
            .poll_interval(Duration::from_millis(100))
            .workflow_fn("bench.RustNoop", move |_, state, _| {
                let (c, d) = (c.clone(), d.clone());
                async move {
                    if c.fetch_add(1, Ordering::Relaxed) + 1 == n {
                        d.notify_one();
                    }
                    Ok(Transition::done(state))
                }
            })
            .build()
            .await?;
        if insert {
            engine
                .insert_many(
                    (0..n)
                        .map(|i| NewInstance::new("bench.RustNoop", json!({"i": i})))
                        .collect(),
                )
                .await?;
        }
        let t = Instant::now();
        engine.start().await?;
        all_done.notified().await;
        let elapsed = t.elapsed();
        engine.shutdown().await?;
        Ok::<_, gendurable::Error>(elapsed.as_secs_f64())
    })
    .py_err()
}
