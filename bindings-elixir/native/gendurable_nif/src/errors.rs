//! Errors as terms: `{:error, {kind, field | nil, message, transient}}`,
//! which `GenDurable.Error.from_native/1` turns into a
//! `%GenDurable.Error{}`. The messages are the core's, unchanged;
//! `transient` is the core's `Error::is_transient`.

use crate::atoms;
use crate::runtime::{reply, Reply};
use rustler::{Atom, Encoder, Env, Term};

/// An error of the binding's own (never transient).
pub fn error_term<'a>(env: Env<'a>, kind: Atom, field: Option<&str>, message: String) -> Term<'a> {
    (atoms::error(), (kind, field, message, false)).encode(env)
}

pub fn internal_error(env: Env, message: String) -> Term {
    error_term(env, atoms::internal(), None, message)
}

pub fn not_running(env: Env) -> Term {
    error_term(
        env,
        atoms::not_running(),
        None,
        "the engine is not running".into(),
    )
}

pub fn input_error<'a>(env: Env<'a>, field: &str, message: impl Into<String>) -> Term<'a> {
    error_term(env, atoms::invalid_input(), Some(field), message.into())
}

/// A core error's kind and field.
fn kind_of(e: &gendurable::Error) -> (Atom, Option<&'static str>) {
    match e {
        gendurable::Error::InvalidInput { field, .. } => (atoms::invalid_input(), Some(*field)),
        gendurable::Error::InvalidConfig(_) => (atoms::invalid_config(), None),
        gendurable::Error::NotFound(_) => (atoms::not_found(), None),
        gendurable::Error::ShutDown => (atoms::shut_down(), None),
        gendurable::Error::Database(_) => (atoms::database(), None),
        gendurable::Error::Contended(_) => (atoms::contended(), None),
        gendurable::Error::Migrate(_) => (atoms::migrate(), None),
        _ => (atoms::internal(), None),
    }
}

/// A core error as a term; `suffix` is added to its message.
pub fn core_error_term<'a>(env: Env<'a>, e: &gendurable::Error, suffix: &str) -> Term<'a> {
    let (kind, field) = kind_of(e);
    let message = format!("{e}{suffix}");
    (atoms::error(), (kind, field, message, e.is_transient())).encode(env)
}

/// A core error as a reply.
pub fn core_error(e: gendurable::Error) -> Reply {
    reply(move |env| core_error_term(env, &e, ""))
}
