//! The Tokio runtime the engine runs on, and the replies its tasks send.
//!
//! A NIF that waits or touches the network spawns its work here and returns
//! at once; the work answers the calling process with `{ref, result}`. The
//! reply is built on a runtime thread, so it holds small terms only: atoms,
//! numbers, short strings and resources, never a user's value.

use crate::errors::internal_error;
use futures::FutureExt;
use rustler::{Encoder, Env, OwnedEnv, Term};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Mutex, MutexGuard, OnceLock};

pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("gendurable")
            .build()
            .expect("gendurable: cannot start the Tokio runtime")
    })
}

/// Builds the reply term in the message's own environment, on a runtime
/// thread: small terms only (no user values, no map of more than 32 keys).
pub type Reply = Box<dyn for<'a> FnOnce(Env<'a>) -> Term<'a> + Send>;

pub fn reply<F>(f: F) -> Reply
where
    F: for<'a> FnOnce(Env<'a>) -> Term<'a> + Send + 'static,
{
    Box::new(f)
}

/// `{:ok, value}`.
pub fn ok_reply<T>(value: T) -> Reply
where
    T: Encoder + Send + 'static,
{
    reply(move |env| (crate::atoms::ok(), value).encode(env))
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".into()
    }
}

/// Runs `fut` on the runtime and sends `{ref, reply}` to the calling process.
/// A panic in `fut` becomes `{:error, {:internal, nil, message}}`.
pub fn spawn_reply<F>(env: Env, reply_ref: Term, fut: F)
where
    F: Future<Output = Reply> + Send + 'static,
{
    let pid = env.pid();
    let owned = OwnedEnv::new();
    let saved = owned.save(reply_ref);
    runtime().spawn(async move {
        let result = AssertUnwindSafe(fut).catch_unwind().await;
        let mut owned = owned;
        let _ = owned.send_and_clear(&pid, move |env| {
            let r = match result {
                Ok(f) => f(env),
                Err(p) => internal_error(env, format!("panic in the NIF: {}", panic_text(p))),
            };
            (saved.load(env), r).encode(env)
        });
    });
}

/// Locks a mutex, also after a panic while it was held.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
