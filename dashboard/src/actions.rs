//! The operator's actions, when the dashboard allows them: on one instance,
//! on every instance a filter names (confirmed with their count first),
//! and pausing or resuming a queue. Each answers with a redirect to the
//! page it came from and a message saying what happened.

use crate::html::{esc, num, token_field, url_part, Nav};
use crate::pages::instances::Params;
use crate::pages::AppState;
use crate::{failure, App};
use axum::extract::{Form, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use gendurable::{Cancelled, Delivery};

/// Why an action is refused before it is looked at: actions are off, or the
/// form does not carry this server's token (a page from elsewhere).
fn refused(app: &App, token: &str) -> Option<Response> {
    if !app.allow_actions {
        return Some(
            (
                StatusCode::FORBIDDEN,
                "actions are disabled: start the dashboard with --allow-actions\n",
            )
                .into_response(),
        );
    }
    if token != app.token {
        return Some(
            (
                StatusCode::FORBIDDEN,
                "this form is stale or not from this dashboard: reload the page and try again\n",
            )
                .into_response(),
        );
    }
    None
}

fn back(to: &str, msg: &str) -> Response {
    let sep = if to.contains('?') { '&' } else { '?' };
    Redirect::to(&format!("{to}{sep}msg={}", url_part(msg))).into_response()
}

#[derive(serde::Deserialize)]
pub struct InstanceForm {
    #[serde(default)]
    token: String,
    id: i64,
    action: String,
    signal: Option<String>,
    payload: Option<String>,
}

pub async fn instance(State(app): AppState, Form(f): Form<InstanceForm>) -> Response {
    if let Some(no) = refused(&app, &f.token) {
        return no;
    }
    let (e, id) = (&app.engine, f.id);
    let page = format!("/instances/{id}");
    let done = match f.action.as_str() {
        "cancel" => e.cancel_with_reason(id, "cancelled from the dashboard").await.map(|c| match c {
            Cancelled::Now => format!("#{id} cancelled"),
            Cancelled::AtOutcome => format!("#{id} is executing: its node stops it and records the cancellation"),
            Cancelled::AlreadyFinished(s) => format!("#{id} had already finished ({})", s.as_str()),
        }),
        "retry" => e.retry(id).await.map(|made| match made {
            true => format!("#{id} is runnable again"),
            false => format!("#{id} was not retried: only scheduled, discarded or cancelled instances are (or its unique identity is held by another)"),
        }),
        "delete" => match e.delete(id).await {
            Ok(true) => return back("/instances", &format!("#{id} deleted")),
            Ok(false) => Ok(format!("#{id} was not deleted: it is executing or reserved (cancel it first)")),
            Err(err) => Err(err),
        },
        "signal" => {
            let name = f.signal.unwrap_or_default();
            let payload = match serde_json::from_str(f.payload.as_deref().unwrap_or("null")) {
                Ok(p) => p,
                Err(err) => return back(&page, &format!("the payload is not JSON: {err}")),
            };
            e.send(id, name.trim(), payload).await.map(|d| match d {
                Delivery::Woken => format!("#{id} woken by signal {name}"),
                Delivery::Kept => format!("signal {name} kept for #{id} until it awaits it"),
                Delivery::Finished(s) => format!("#{id} had already finished ({}): signal not kept", s.as_str()),
            })
        }
        other => return (StatusCode::BAD_REQUEST, format!("unknown action {other:?}\n")).into_response(),
    };
    match done {
        Ok(msg) => back(&page, &msg),
        Err(err @ gendurable::Error::InvalidInput { .. }) => back(&page, &err.to_string()),
        Err(err) => failure(&err),
    }
}

#[derive(serde::Deserialize)]
pub struct BulkForm {
    #[serde(default)]
    token: String,
    action: String,
    #[serde(default)]
    workflow: String,
    #[serde(default)]
    queue: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    error: String,
    /// For `signal`: its name and JSON payload.
    #[serde(default)]
    signal: String,
    payload: Option<String>,
    /// Present once the count was shown and confirmed.
    confirm: Option<String>,
}

pub async fn bulk(State(app): AppState, Form(f): Form<BulkForm>) -> Response {
    if let Some(no) = refused(&app, &f.token) {
        return no;
    }
    let p = Params {
        workflow: f.workflow,
        queue: f.queue,
        status: f.status,
        key: f.key,
        error: f.error,
        ..Default::default()
    };
    let list = format!("/instances?{}", p.query());
    let filter = match p.filter() {
        Ok(filter) => filter,
        Err(e) => return back(&list, &e.to_string()),
    };
    let payload_text = f.payload.as_deref().unwrap_or("null");
    let payload: serde_json::Value = match serde_json::from_str(payload_text) {
        Ok(p) => p,
        Err(err) => return back(&list, &format!("the payload is not JSON: {err}")),
    };
    let signal = f.signal.trim();
    let send = format!("send signal {signal:?} to");
    let (verb, done) = match f.action.as_str() {
        "cancel" => ("cancel", "cancelled"),
        "retry" => ("retry now", "made runnable"),
        "delete" => ("delete", "deleted"),
        "signal" if signal.is_empty() => return back(&list, "name the signal to send"),
        "signal" => (send.as_str(), "woken or keeping it"),
        other => {
            return (
                StatusCode::BAD_REQUEST,
                format!("unknown action {other:?}\n"),
            )
                .into_response()
        }
    };
    let e = &app.engine;
    if f.confirm.as_deref() != Some("yes") {
        let verb = esc(verb);
        let n = match e.count(&filter).await {
            Ok(n) => n,
            Err(err @ gendurable::Error::InvalidInput { .. }) => {
                return back(&list, &err.to_string())
            }
            Err(err) => return failure(&err),
        };
        let main = format!(
            "<h1>Confirm</h1><p id=\"confirm-count\">{verb} <b>{}</b> instances: every one this filter names \
             (<code>{}</code>)?</p><form method=\"post\" action=\"/actions/bulk\">{}{}\
             <input type=\"hidden\" name=\"action\" value=\"{}\"><input type=\"hidden\" name=\"confirm\" value=\"yes\">\
             <input type=\"hidden\" name=\"signal\" value=\"{}\"><input type=\"hidden\" name=\"payload\" value=\"{}\">\
             <button id=\"confirm\" class=\"danger\">Yes, {verb} {}</button> <a href=\"{}\">back</a></form>",
            num(n as i64),
            esc(&p.query()),
            token_field(&app.token),
            p.hidden(),
            esc(&f.action),
            esc(signal),
            esc(payload_text),
            num(n as i64),
            esc(&list),
        );
        let page = crate::html::page("Confirm", Nav::Instances, None, "", &main, 0);
        return ([(header::CACHE_CONTROL, "no-store")], Html(page)).into_response();
    }
    let reason = "by an operator, from the dashboard";
    let acted = match f.action.as_str() {
        "cancel" => e.cancel_where(&filter, reason).await,
        "retry" => e.retry_where(&filter, reason).await,
        "signal" => e.send_where(&filter, signal, payload).await,
        _ => e.delete_where(&filter).await,
    };
    match acted {
        Ok(a) => back(
            &list,
            &format!("{} of {} matching instances {done}", a.changed, a.matched),
        ),
        Err(err @ gendurable::Error::InvalidInput { .. }) => back(&list, &err.to_string()),
        Err(err) => failure(&err),
    }
}

#[derive(serde::Deserialize)]
pub struct QueueForm {
    #[serde(default)]
    token: String,
    queue: String,
    action: String,
}

pub async fn queue(State(app): AppState, Form(f): Form<QueueForm>) -> Response {
    if let Some(no) = refused(&app, &f.token) {
        return no;
    }
    let q = f.queue.trim();
    let r = match f.action.as_str() {
        "pause" => app.engine.pause_queue(q).await.map(|was| match was {
            true => format!("queue {q} paused: no node claims from it until it is resumed"),
            false => format!("queue {q} was already paused"),
        }),
        "resume" => app.engine.resume_queue(q).await.map(|was| match was {
            true => format!("queue {q} resumed"),
            false => format!("queue {q} was not paused"),
        }),
        other => {
            return (
                StatusCode::BAD_REQUEST,
                format!("unknown action {other:?}\n"),
            )
                .into_response()
        }
    };
    match r {
        Ok(msg) => back("/", &msg),
        Err(err @ gendurable::Error::InvalidInput { .. }) => back("/", &err.to_string()),
        Err(err) => failure(&err),
    }
}
