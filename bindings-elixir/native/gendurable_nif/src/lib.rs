//! The NIF behind the `:gen_durable` Mix package.
//!
//! The engine runs in the Rust core on a Tokio runtime owned by this library.
//! Nothing here waits or touches the network on a normal BEAM scheduler:
//! calls that do are spawned on the runtime and answer the calling process
//! with a `{ref, result}` message. Steps are run by Elixir processes (see
//! `step`).
//!
//! Terms are only ever built by scheduler threads: a message built on a
//! runtime thread holds atoms, numbers, short strings and resources, never a
//! user's value. States, payloads and instances are converted in the process
//! that asked for them (`step_begin/1`, `instance_term/1`), and Elixir values
//! become JSON, on dirty schedulers unless they are small (a step's values
//! under a thousand values and 64 KiB convert on the caller's scheduler, in
//! well under a millisecond): a value of any size neither blocks a normal
//! scheduler nor builds a large map on a thread the BEAM does not manage
//! (which it does not support).
//!
//! This crate only converts values, maps errors and bridges callbacks; every
//! semantic lives in the core, options included: the engine's options and
//! inserts arrive as maps, become JSON and are read and checked by
//! `gendurable::options`, whose messages reach the caller unchanged.
//!
//! * `engine`: a supervision tree's engine, its options, start and stop.
//! * `client`: insert, get, signal, send, cancel; drain and inserted for
//!   `GenDurable.Testing`.
//! * `actions`: count, cancel, retry and delete by conditions, retry and
//!   delete one instance, pause and resume a queue; metrics.
//! * `step`: steps run by Elixir processes.
//! * `convert`: terms to JSON and back.
//! * `errors`: core errors as terms. `runtime`: the Tokio runtime, replies.
//! * `bulkhead`, `temp_postgres`, `status` (the Mix tasks), `bench`.
//!
//! Resources (`EngineRes`, `StepRes`, `InstanceRes`, `PermitRes`,
//! `TempPgRes`) are registered when the library loads, by their
//! `#[rustler::resource_impl]`.

/// mimalloc, for memory made and freed on different threads (`gendurable_alloc`).
#[global_allocator]
static GLOBAL: gendurable_alloc::Allocator = gendurable_alloc::Allocator;

mod actions;
mod bench;
mod bulkhead;
mod client;
mod convert;
mod engine;
mod errors;
mod runtime;
mod status;
mod step;
mod temp_postgres;

mod atoms {
    rustler::atoms! {
        ok,
        error,
        nil,
        keep,
        release,
        set,
        next,
        done,
        await_ = "await",
        snooze,
        discard,
        cancel,
        signal,
        timeout,
        gen_durable_step,
        gen_durable_steps,
        stop,
        gen_durable_cancel,
        skip,
        dirty,
        not_running,
        saturated,
        wait,
        none,
        not_found,
        already_replied,
        now,
        at_outcome,
        already_finished,
        invalid_input,
        invalid_config,
        shut_down,
        database,
        contended,
        migrate,
        embedded,
        internal,
        struct_ = "__struct__",
        instance_struct = "Elixir.GenDurable.Instance",
        context_struct = "Elixir.GenDurable.Context",
        id,
        workflow,
        queue,
        attempt,
        max_attempts,
        concurrency_key,
        rate_limit,
        wake,
        step,
        state,
        priority,
        status,
        node,
        cancel_requested,
        await_signal,
        await_until,
        errors,
        inserted_at,
        scheduled_at,
        attempted_at,
        finished_at,
        scheduled,
        available,
        executing,
        awaiting,
        completed,
        cancelled,
        discarded,
        woken,
        kept,
        finished,
        retry,
        delete,
    }
}

/// The BEAM ignores SIGCHLD, which makes the kernel reap child processes
/// itself, so `waitpid` in `std::process::Command` (used by the throwaway
/// PostgreSQL to run `initdb` and `pg_ctl`) fails with ECHILD. The BEAM does
/// not rely on it (ports are spawned by its `erl_child_setup` helper), so the
/// default disposition is restored when the library loads.
fn load(_env: rustler::Env, _info: rustler::Term) -> bool {
    // SAFETY: reading and setting a signal disposition; no handler is installed.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGCHLD, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
        {
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        }
    }
    true
}

rustler::init!("Elixir.GenDurable.Native", load = load);
