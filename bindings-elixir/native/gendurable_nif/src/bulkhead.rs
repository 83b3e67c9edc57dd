//! `GenDurable.Bulkhead`: the core's in-process bulkhead. A permit is a
//! resource, so a process killed while holding one frees its slot when the
//! permit is garbage-collected.

use crate::atoms;
use crate::errors::error_term;
use crate::runtime::{lock, ok_reply, reply, spawn_reply};
use gendurable::bulkhead::{Bulkhead, BulkheadConfig, BulkheadError, OwnedPermit, Wait};
use rustler::{Atom, Encoder, Env, ResourceArc, Term};
use std::sync::Mutex;
use std::time::Duration;

/// A bulkhead permit; released by `bulkhead_release/1` or when garbage-collected.
pub struct PermitRes {
    permit: Mutex<Option<OwnedPermit>>,
}

#[rustler::resource_impl]
impl rustler::Resource for PermitRes {}

fn permit(p: OwnedPermit) -> ResourceArc<PermitRes> {
    ResourceArc::new(PermitRes {
        permit: Mutex::new(Some(p)),
    })
}

/// Registers (or replaces) a bulkhead. `wait_ms`: `nil` sheds at once.
#[rustler::nif]
fn bulkhead_configure<'a>(
    env: Env<'a>,
    name: String,
    limit: usize,
    reclaim_after_ms: u64,
    wait_ms: Option<u64>,
) -> Term<'a> {
    let wait = match wait_ms {
        None => Wait::None,
        Some(ms) => Wait::Bounded(Duration::from_millis(ms)),
    };
    let config =
        BulkheadConfig::new(limit, Duration::from_millis(reclaim_after_ms)).with_wait(wait);
    match Bulkhead::configure(name, config) {
        Ok(_) => atoms::ok().encode(env),
        Err(BulkheadError::InvalidConfig(m)) => error_term(env, atoms::invalid_config(), None, m),
    }
}

/// Takes a permit: `{:ok, permit}`, `:saturated`, `:none` (no bulkhead of
/// that name: calls pass through) or `:wait` (full, with a wait budget: the
/// answer comes later as `{ref, {:ok, permit} | :saturated}`, from the
/// runtime, so no scheduler is blocked while waiting).
#[rustler::nif]
fn bulkhead_acquire<'a>(env: Env<'a>, name: &str, reply_ref: Term<'a>) -> Term<'a> {
    let Some(b) = Bulkhead::named(name) else {
        return atoms::none().encode(env);
    };
    match b.try_acquire_owned() {
        Ok(p) => (atoms::ok(), permit(p)).encode(env),
        Err(_) if b.wait().is_none() => atoms::saturated().encode(env),
        Err(_) => {
            spawn_reply(env, reply_ref, async move {
                match b.acquire_owned().await {
                    Ok(p) => ok_reply(permit(p)),
                    Err(_) => reply(|env| atoms::saturated().encode(env)),
                }
            });
            atoms::wait().encode(env)
        }
    }
}

/// Releases a permit (idempotent).
#[rustler::nif]
fn bulkhead_release(p: ResourceArc<PermitRes>) -> Atom {
    drop(lock(&p.permit).take());
    atoms::ok()
}

#[rustler::nif]
fn bulkhead_in_flight(name: &str) -> usize {
    Bulkhead::in_flight_of(name)
}

#[rustler::nif]
fn bulkhead_limit(name: &str) -> Option<usize> {
    Bulkhead::limit_of(name)
}

#[rustler::nif]
fn bulkhead_reset(name: &str) -> Atom {
    match Bulkhead::reset_named(name) {
        Ok(()) => atoms::ok(),
        Err(_) => atoms::not_found(),
    }
}
