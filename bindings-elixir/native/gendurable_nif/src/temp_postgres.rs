//! `GenDurable.TempPostgres`: a throwaway PostgreSQL cluster (tests,
//! examples), from `gendurable-testing`.

use crate::atoms;
use crate::errors::error_term;
use crate::runtime::{lock, ok_reply, reply, spawn_reply};
use gendurable_testing::TempPostgres;
use rustler::{Atom, Env, ResourceArc, Term};
use std::sync::Mutex;

/// A throwaway PostgreSQL cluster; stopped when released or garbage-collected.
pub struct TempPgRes {
    pg: Mutex<Option<TempPostgres>>,
}

#[rustler::resource_impl]
impl rustler::Resource for TempPgRes {}

impl Drop for TempPgRes {
    // Stopping the server waits for pg_ctl: never on the scheduler thread
    // that happens to collect the handle.
    fn drop(&mut self) {
        if let Some(pg) = self.pg.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = std::thread::Builder::new()
                .name("gendurable-pg-stop".into())
                .spawn(move || drop(pg));
        }
    }
}

/// Starts a throwaway cluster. Replies `{:ok, {handle, url}}`, or
/// `{:error, {:embedded, nil, message}}`.
#[rustler::nif]
fn temp_postgres_start<'a>(env: Env<'a>, reply_ref: Term<'a>) -> Atom {
    spawn_reply(env, reply_ref, async move {
        match TempPostgres::start().await {
            Ok(pg) => {
                let url = pg.url();
                let res = ResourceArc::new(TempPgRes {
                    pg: Mutex::new(Some(pg)),
                });
                ok_reply((res, url))
            }
            Err(e) => reply(move |env| error_term(env, atoms::embedded(), None, e.to_string())),
        }
    });
    atoms::ok()
}

/// Stops a throwaway cluster now (it also stops when garbage-collected).
#[rustler::nif(schedule = "DirtyIo")]
fn temp_postgres_stop(res: ResourceArc<TempPgRes>) -> Atom {
    drop(lock(&res.pg).take());
    atoms::ok()
}
