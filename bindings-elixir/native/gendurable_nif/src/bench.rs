//! The benchmark's baseline (`bench/noop.exs`): the same no-op workload run
//! by pure Rust workers, in the same NIF, on the same engine code; and the
//! cross-system benchmark runner's precise pause (`bench_sleep/2`).

use crate::atoms;
use crate::errors::core_error;
use crate::runtime::{ok_reply, reply, spawn_reply};
use gendurable::{Engine, NewInstance, Transition};
use rustler::{Atom, Encoder, Env, NifResult, Term};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `n` no-op one-step instances of a Rust workflow with a queue of
/// `concurrency` on `schema`. Replies `{:ok, {insert_seconds, run_seconds}}`.
#[rustler::nif]
fn bench_rust_noop<'a>(
    env: Env<'a>,
    url: String,
    schema: String,
    n: usize,
    concurrency: u32,
    reply_ref: Term<'a>,
) -> Atom {
    spawn_reply(env, reply_ref, async move {
        match run(url, schema, n, concurrency, true).await {
            Ok(r) => ok_reply(r),
            Err(e) => core_error(e),
        }
    });
    atoms::ok()
}

/// Runs `n` no-op instances of the workflow `Bench.RustNoop` already inserted
/// (by the caller, on `schema`) with a node of `concurrency`: the worker
/// phase alone, for measuring CPU per step against an Elixir worker in the
/// same process. Replies `{:ok, run_seconds}`.
#[rustler::nif]
fn bench_rust_run<'a>(
    env: Env<'a>,
    url: String,
    schema: String,
    n: usize,
    concurrency: u32,
    reply_ref: Term<'a>,
) -> Atom {
    spawn_reply(env, reply_ref, async move {
        match run(url, schema, n, concurrency, false).await {
            Ok((_, r)) => ok_reply(r),
            Err(e) => core_error(e),
        }
    });
    atoms::ok()
}

/// Replies `{ref, :ok}` `micros` microseconds from now: the pause of the
/// cross-system benchmark's W2 and W3 steps (benchmarks/runners/gendurable_ex.exs),
/// as precise as the Rust runner's `sleep_exactly` (cli/src/workload.rs,
/// which wakes every pause from one timer thread): the deadline is fixed
/// here, a blocking thread of the runtime sleeps to it, and the reply's hop
/// back to the caller is part of the pause. The BEAM's own timers count
/// whole milliseconds and round up (`Process.sleep(5)` lasts 5.5-6 ms). The
/// caller waits in `receive`, not on a scheduler. A pause that overflows the
/// clock is `:badarg`.
#[rustler::nif]
fn bench_sleep<'a>(env: Env<'a>, micros: u64, reply_ref: Term<'a>) -> NifResult<Atom> {
    let until = Instant::now()
        .checked_add(Duration::from_micros(micros))
        .ok_or(rustler::Error::BadArg)?;
    spawn_reply(env, reply_ref, async move {
        let _ = tokio::task::spawn_blocking(move || {
            std::thread::sleep(until.saturating_duration_since(Instant::now()))
        })
        .await;
        reply(|env| atoms::ok().encode(env))
    });
    Ok(atoms::ok())
}

async fn run(
    url: String,
    schema: String,
    n: usize,
    concurrency: u32,
    insert: bool,
) -> gendurable::Result<(f64, f64)> {
    let done = Arc::new(AtomicUsize::new(0));
    let notify = Arc::new(tokio::sync::Notify::new());
    let (d, w) = (done.clone(), notify.clone());
    let engine = Engine::builder()
        .url(url)
        .schema(schema)
        .queue("default", concurrency)
        .workflow_fn("Bench.RustNoop", move |_step, state, _ctx| {
            let (d, w) = (d.clone(), w.clone());
            async move {
                if d.fetch_add(1, Ordering::Relaxed) + 1 >= n {
                    w.notify_one();
                }
                Ok(Transition::done(state))
            }
        })
        .build()
        .await?;
    let t0 = Instant::now();
    for chunk in (0..if insert { n } else { 0 })
        .collect::<Vec<_>>()
        .chunks(5000)
    {
        let news = chunk
            .iter()
            .map(|_| NewInstance::new("Bench.RustNoop", serde_json::json!({})))
            .collect();
        engine.insert_many(news).await?;
    }
    let inserted = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    engine.start().await?;
    while done.load(Ordering::Relaxed) < n {
        let _ = tokio::time::timeout(Duration::from_millis(100), notify.notified()).await;
    }
    engine.shutdown().await?;
    Ok((inserted, t1.elapsed().as_secs_f64()))
}
