//! One instance: why it waits, its fields, state and every recorded error;
//! (actions allowed) cancel, retry now, delete, signal.

use super::AppState;
use crate::html::{badge, esc, token_field, url_part, when, Nav};
use crate::{failure, respond};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use gendurable::inspect::Wait;
use gendurable::{Instance, Status};
use serde_json::Value;
use std::fmt::Write;

#[derive(serde::Deserialize, Default)]
pub struct Params {
    msg: Option<String>,
}

/// An instance and why it waits, as the JSON endpoint serves them.
#[derive(serde::Serialize)]
struct Detail {
    id: i64,
    workflow: String,
    step: String,
    state: Value,
    queue: String,
    priority: i16,
    status: Status,
    concurrency_key: Option<String>,
    rate_limit: Option<String>,
    attempt: i32,
    max_attempts: i32,
    node: Option<String>,
    cancel_requested: bool,
    await_signal: Option<String>,
    await_until: Option<chrono::DateTime<chrono::Utc>>,
    errors: Vec<Value>,
    inserted_at: chrono::DateTime<chrono::Utc>,
    scheduled_at: chrono::DateTime<chrono::Utc>,
    attempted_at: Option<chrono::DateTime<chrono::Utc>>,
    finished_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Each reason as data, and `why_text` as sentences.
    why: Vec<Wait>,
    why_text: Vec<String>,
}

async fn load(app: &crate::App, id: i64) -> gendurable::Result<(Instance, Vec<Wait>)> {
    let i = app.engine.get(id).await?;
    let why = app.engine.why(id).await?;
    Ok((i, why))
}

pub async fn page(
    State(app): AppState,
    headers: HeaderMap,
    Path(id): Path<i64>,
    Query(p): Query<Params>,
) -> Response {
    match load(&app, id).await {
        Ok((i, why)) => {
            let main = render(&i, &why, &app);
            respond(
                &app,
                &headers,
                &format!("#{id}"),
                Nav::Instances,
                p.msg.as_deref(),
                "",
                main,
            )
        }
        Err(e) => failure(&e),
    }
}

pub async fn json(State(app): AppState, Path(id): Path<i64>) -> Response {
    super::json(load(&app, id).await.map(|(i, why)| Detail {
        why_text: why.iter().map(ToString::to_string).collect(),
        why,
        id: i.id,
        workflow: i.workflow,
        step: i.step,
        state: i.state,
        queue: i.queue,
        priority: i.priority,
        status: i.status,
        concurrency_key: i.concurrency_key,
        rate_limit: i.rate_limit,
        attempt: i.attempt,
        max_attempts: i.max_attempts,
        node: i.node,
        cancel_requested: i.cancel_requested,
        await_signal: i.await_signal,
        await_until: i.await_until,
        errors: i.errors,
        inserted_at: i.inserted_at,
        scheduled_at: i.scheduled_at,
        attempted_at: i.attempted_at,
        finished_at: i.finished_at,
    }))
}

fn render(i: &Instance, why: &[Wait], app: &crate::App) -> String {
    let now = chrono::Utc::now();
    let mut m = format!(
        "<h1>#{} {} {}</h1>",
        i.id,
        esc(&i.workflow),
        badge(i.status.as_str())
    );
    if !why.is_empty() {
        m.push_str("<div class=\"why\" id=\"why\"><b>Why it is where it is</b><ul>");
        for w in why {
            let _ = write!(m, "<li>{}</li>", link_reason(w));
        }
        m.push_str("</ul></div>");
    }
    if app.allow_actions {
        m.push_str(&actions(i, &app.token));
    }
    let opt_time =
        |t: Option<chrono::DateTime<chrono::Utc>>| t.map(|t| when(now, t)).unwrap_or_default();
    let rows = [
        ("step", esc(&i.step)),
        (
            "queue",
            format!(
                "<a href=\"/instances?queue={}\">{}</a>",
                url_part(&i.queue),
                esc(&i.queue)
            ),
        ),
        ("priority", i.priority.to_string()),
        (
            "concurrency key",
            i.concurrency_key
                .as_deref()
                .map(|k| format!("<a href=\"/instances?key={}\">{}</a>", url_part(k), esc(k)))
                .unwrap_or_default(),
        ),
        (
            "rate limit",
            i.rate_limit.as_deref().map(esc).unwrap_or_default(),
        ),
        ("attempt", format!("{} of {}", i.attempt, i.max_attempts)),
        ("node", i.node.as_deref().map(esc).unwrap_or_default()),
        (
            "cancel requested",
            if i.cancel_requested {
                "yes".into()
            } else {
                String::new()
            },
        ),
        (
            "awaits signal",
            i.await_signal.as_deref().map(esc).unwrap_or_default(),
        ),
        ("awaits until", opt_time(i.await_until)),
        ("inserted", when(now, i.inserted_at)),
        ("scheduled", when(now, i.scheduled_at)),
        ("attempted", opt_time(i.attempted_at)),
        ("finished", opt_time(i.finished_at)),
    ];
    m.push_str("<table id=\"fields\">");
    for (k, v) in rows.iter().filter(|(_, v)| !v.is_empty()) {
        let _ = write!(m, "<tr><th>{k}</th><td>{v}</td></tr>");
    }
    let state = serde_json::to_string_pretty(&i.state).unwrap_or_default();
    let _ = write!(
        m,
        "</table><h2>State</h2><pre id=\"state\">{}</pre>",
        esc(&state)
    );
    let _ = write!(m, "<h2>Errors ({})</h2>", i.errors.len());
    m.push_str("<div id=\"errors\">");
    for e in i.errors.iter().rev() {
        m.push_str(&error(e));
    }
    if i.errors.is_empty() {
        m.push_str("<p class=\"muted\">none recorded</p>");
    }
    m.push_str("</div>");
    m
}

/// A reason with its key, holder and queue linked to where they are seen.
fn link_reason(w: &Wait) -> String {
    let text = esc(&w.to_string());
    match w {
        Wait::KeyHeld {
            holder: Some(h), ..
        } => text.replacen(
            &format!("#{h}"),
            &format!("<a href=\"/instances/{h}\">#{h}</a>"),
            1,
        ),
        _ => text,
    }
}

/// One recorded error: its message, where and when, and its detail (a
/// stack trace when the step's language gave one).
fn error(e: &Value) -> String {
    let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("");
    let mut out = format!(
        "<div class=\"error\"><b class=\"err\">{}</b> <span class=\"muted\">{} · step {} · attempt {} · {}</span>",
        esc(s("message")),
        esc(s("kind")),
        esc(s("step")),
        e.get("attempt").map(|a| a.to_string()).unwrap_or_default(),
        esc(s("at"))
    );
    match e.get("detail") {
        None | Some(Value::Null) => {}
        Some(Value::String(d)) => {
            let _ = write!(out, "<pre>{}</pre>", esc(d));
        }
        Some(d) => {
            let _ = write!(
                out,
                "<pre>{}</pre>",
                esc(&serde_json::to_string_pretty(d).unwrap_or_default())
            );
        }
    }
    out.push_str("</div>");
    out
}

fn actions(i: &Instance, token: &str) -> String {
    let button = |action: &str, label: &str, class: &str| {
        format!(
            "<form class=\"inline\" method=\"post\" action=\"/actions/instance\">{}\
             <input type=\"hidden\" name=\"id\" value=\"{}\">\
             <button id=\"do-{action}\" name=\"action\" value=\"{action}\" class=\"{class}\">{label}</button></form> ",
            token_field(token),
            i.id
        )
    };
    let mut m = String::from("<div class=\"actions\" id=\"actions\">");
    let finished = matches!(
        i.status,
        Status::Completed | Status::Cancelled | Status::Discarded
    );
    if !finished {
        m.push_str(&button("cancel", "Cancel", "danger"));
    }
    if matches!(
        i.status,
        Status::Scheduled | Status::Discarded | Status::Cancelled
    ) {
        m.push_str(&button("retry", "Retry now", ""));
    }
    if i.status != Status::Executing {
        m.push_str(&button("delete", "Delete", "danger"));
    }
    if !finished {
        let _ = write!(
            m,
            "<form class=\"inline\" method=\"post\" action=\"/actions/instance\">{}\
             <input type=\"hidden\" name=\"id\" value=\"{}\">\
             <input name=\"signal\" placeholder=\"signal name\" value=\"{}\" required>\
             <input name=\"payload\" placeholder=\"payload (JSON)\" value=\"null\">\
             <button id=\"do-signal\" name=\"action\" value=\"signal\">Send signal</button></form>",
            token_field(token),
            i.id,
            esc(i.await_signal.as_deref().unwrap_or(""))
        );
    }
    m.push_str("</div>");
    m
}
