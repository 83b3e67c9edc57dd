//! `mix gendurable.status` and `mix gendurable.migrate`: what the Rust
//! CLI's `gendurable status` and `gendurable migrate` print, read through the
//! core. Status is read-only: a schema that does not exist is reported, not
//! created.

use crate::atoms;
use crate::errors::{core_error, error_term};
use crate::runtime::{reply, spawn_reply, Reply};
use gendurable::{Engine, GateConfig};
use rustler::{Encoder, Env, Term};
use std::time::Duration;

fn config_error(message: String) -> Reply {
    reply(move |env| error_term(env, atoms::invalid_config(), None, message))
}

/// A client engine on `url` and `schema`, creating nothing.
async fn client(url: &str, schema: &str, connect_timeout: Duration) -> Result<Engine, Reply> {
    Engine::builder()
        .url(url)
        .schema(schema)
        .connect_timeout(connect_timeout)
        .migrate(false)
        .build()
        .await
        .map_err(core_error)
}

/// The text of `gendurable status`. Replies `{:ok, text}`; a schema that
/// does not exist is an error of kind `:not_found`, and nothing is created.
#[rustler::nif]
fn status<'a>(
    env: Env<'a>,
    url: String,
    schema: String,
    keys: Vec<String>,
    gates: Vec<String>,
    connect_timeout_ms: u64,
    reply_ref: Term<'a>,
) -> Term<'a> {
    for k in &keys {
        if let Err(e) = gendurable::validate::key("key", k) {
            return error_term(env, atoms::invalid_input(), Some("key"), e.to_string());
        }
    }
    let gates: Vec<(String, GateConfig)> = match gates
        .iter()
        .map(|g| gendurable::config::parse_gate(g))
        .collect()
    {
        Ok(g) => g,
        Err(e) => return error_term(env, atoms::invalid_input(), Some("gate"), e.to_string()),
    };
    spawn_reply(env, reply_ref, async move {
        let timeout = Duration::from_millis(connect_timeout_ms);
        let engine = match client(&url, &schema, timeout).await {
            Ok(e) => e,
            Err(r) => return r,
        };
        match engine.schema_exists().await {
            Ok(true) => {}
            Ok(false) => {
                let message = format!(
                    "no gendurable schema {schema:?} in this database (nothing was created); \
                     `mix gendurable.migrate --schema {schema}` creates it"
                );
                return reply(move |env| error_term(env, atoms::not_found(), None, message));
            }
            Err(e) => return core_error(e),
        }
        let st = match engine.status().await {
            Ok(st) => st,
            Err(e) => return core_error(e),
        };
        let mut out = st.to_string();
        if !keys.is_empty() {
            // The nodes' gate config is not stored: take it from the gates given.
            let mut b = Engine::builder().pool(engine.pool().clone()).migrate(false);
            for (name, g) in gates {
                b = b.concurrency_limit(name, g);
            }
            let local = match b.build().await {
                Ok(l) => l,
                Err(e) => return config_error(e.to_string()),
            };
            out.push_str("\neffective K\n");
            for k in &keys {
                out.push_str(&format!("  {}\n", local.key_limit(k).describe(k)));
            }
        }
        reply(move |env| (atoms::ok(), out).encode(env))
    });
    atoms::ok().encode(env)
}

/// Creates or upgrades the schema, as `gendurable migrate`. Replies
/// `{:ok, text}`.
#[rustler::nif]
fn migrate<'a>(
    env: Env<'a>,
    url: String,
    schema: String,
    connect_timeout_ms: u64,
    reply_ref: Term<'a>,
) -> Term<'a> {
    spawn_reply(env, reply_ref, async move {
        let timeout = Duration::from_millis(connect_timeout_ms);
        let engine = match client(&url, &schema, timeout).await {
            Ok(e) => e,
            Err(r) => return r,
        };
        match engine.migrate().await {
            Ok(()) => {
                let out = format!("schema {schema:?} is up to date\n");
                reply(move |env| (atoms::ok(), out).encode(env))
            }
            Err(e) => core_error(e),
        }
    });
    atoms::ok().encode(env)
}
