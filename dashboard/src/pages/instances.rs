//! The instance list: a filter, a page of instances newest first, older
//! pages by id, and (actions allowed) a bulk action over the filter.

use super::AppState;
use crate::html::{badge, esc, num, token_field, url_part, when, Nav};
use crate::{failure, respond};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use gendurable::inspect::{InstancePage, ListQuery};
use gendurable::{Filter, Status};
use std::fmt::Write;

/// The list's conditions as a form and a URL carry them; empty is absent.
#[derive(serde::Deserialize, Default, Clone)]
pub struct Params {
    #[serde(default)]
    pub workflow: String,
    #[serde(default)]
    pub queue: String,
    /// One status or several, comma-separated.
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub key: String,
    /// Text in the last error's message.
    #[serde(default)]
    pub error: String,
    pub before: Option<i64>,
    pub limit: Option<usize>,
    pub msg: Option<String>,
}

impl Params {
    /// The engine's filter (no condition: every instance).
    pub fn filter(&self) -> gendurable::Result<Filter> {
        let some = |s: &str| Some(s.trim().to_owned()).filter(|s| !s.is_empty());
        let statuses = match some(&self.status) {
            None => None,
            Some(s) => Some(
                s.split(',')
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .map(|v| {
                        Status::from_name(v).ok_or_else(|| gendurable::Error::InvalidInput {
                            field: "status",
                            reason: format!(
                                "{v:?} is not a status (scheduled, available, executing, \
                                 awaiting, completed, cancelled, discarded)"
                            ),
                        })
                    })
                    .collect::<gendurable::Result<Vec<_>>>()?,
            ),
        };
        Ok(Filter {
            ids: None,
            workflow: some(&self.workflow),
            queue: some(&self.queue),
            statuses,
            concurrency_key: some(&self.key),
            error: some(&self.error),
        })
    }

    /// The conditions, by name.
    fn fields(&self) -> [(&'static str, &str); 5] {
        [
            ("workflow", self.workflow.trim()),
            ("queue", self.queue.trim()),
            ("status", self.status.trim()),
            ("key", self.key.trim()),
            ("error", self.error.trim()),
        ]
    }

    /// The conditions given, as a query string (for links).
    pub fn query(&self) -> String {
        self.fields()
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| format!("{k}={}", url_part(v)))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// The conditions as hidden form fields.
    pub fn hidden(&self) -> String {
        self.fields()
            .iter()
            .map(|(k, v)| format!("<input type=\"hidden\" name=\"{k}\" value=\"{}\">", esc(v)))
            .collect()
    }
}

async fn load(app: &crate::App, p: &Params) -> gendurable::Result<InstancePage> {
    app.engine
        .list(&ListQuery {
            filter: p.filter()?,
            before: p.before,
            limit: p.limit.unwrap_or(50),
        })
        .await
}

pub async fn page(State(app): AppState, headers: HeaderMap, Query(p): Query<Params>) -> Response {
    let listed = load(&app, &p).await;
    let now = chrono::Utc::now();
    let list = match listed {
        Ok(page) => render(&page, &p, now),
        Err(e @ gendurable::Error::InvalidInput { .. }) => {
            format!("<p class=\"err\" id=\"error\">{}</p>", esc(&e.to_string()))
        }
        Err(e) => return failure(&e),
    };
    let mut top = form(&p);
    if app.allow_actions && !p.query().is_empty() {
        top.push_str(&bulk_form(&app.token, &p));
    }
    respond(
        &app,
        &headers,
        "Instances",
        Nav::Instances,
        p.msg.as_deref(),
        &top,
        list,
    )
}

pub async fn json(State(app): AppState, Query(p): Query<Params>) -> Response {
    super::json(load(&app, &p).await)
}

fn form(p: &Params) -> String {
    let field = |name: &str, label: &str, value: &str, hint: &str| {
        format!(
            "<label>{label}<input name=\"{name}\" value=\"{}\" placeholder=\"{hint}\"></label>",
            esc(value)
        )
    };
    format!(
        "<h1>Instances</h1><form class=\"filter\" id=\"filter\" method=\"get\" action=\"/instances\">\
         {}{}{}{}{}<button type=\"submit\">Filter</button> <a href=\"/instances\">clear</a></form>",
        field("workflow", "workflow", &p.workflow, "Account.Sync"),
        field("queue", "queue", &p.queue, "default"),
        field("status", "status", &p.status, "discarded,cancelled"),
        field("key", "key", &p.key, "account:7"),
        field("error", "error text", &p.error, "timeout"),
    )
}

fn bulk_form(token: &str, p: &Params) -> String {
    format!(
        "<form class=\"filter\" id=\"bulk\" method=\"post\" action=\"/actions/bulk\">{}{}\
         <label>to every instance this filter names<select name=\"action\">\
         <option value=\"cancel\">cancel</option><option value=\"retry\">retry now</option>\
         <option value=\"delete\">delete</option><option value=\"signal\">send a signal</option>\
         </select></label><label>signal (to send one)<input name=\"signal\" placeholder=\"approved\"></label>\
         <label>payload (JSON)<input name=\"payload\" value=\"null\"></label>\
         <button type=\"submit\">Review…</button></form>",
        token_field(token),
        p.hidden()
    )
}

fn render(page: &InstancePage, p: &Params, now: chrono::DateTime<chrono::Utc>) -> String {
    let mut m = String::from(
        "<table id=\"instances\"><tr><th class=\"n\">id</th><th>workflow</th><th>step</th>\
         <th>queue</th><th>status</th><th>key</th><th class=\"n\">attempt</th><th>scheduled</th>\
         <th>last error</th></tr>",
    );
    for r in &page.rows {
        let status = match &r.parked {
            Some(why) => format!(
                "{} <span class=\"muted\">parked: {}</span>",
                badge(r.status.as_str()),
                esc(why)
            ),
            None => badge(r.status.as_str()),
        };
        let error: String = r
            .last_error
            .as_deref()
            .unwrap_or("")
            .chars()
            .take(120)
            .collect();
        let _ = write!(
            m,
            "<tr><td class=\"n\"><a href=\"/instances/{id}\">#{id}</a></td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{status}</td><td>{}</td><td class=\"n\">{}/{}</td><td>{}</td>\
             <td class=\"err\">{}</td></tr>",
            esc(&r.workflow),
            esc(&r.step),
            esc(&r.queue),
            r.concurrency_key.as_deref().map(esc).unwrap_or_default(),
            r.attempt,
            r.max_attempts,
            when(now, r.scheduled_at),
            esc(&error),
            id = r.id,
        );
    }
    if page.rows.is_empty() {
        m.push_str("<tr><td colspan=\"9\" class=\"muted\">no instance here matches</td></tr>");
    }
    m.push_str("</table><div class=\"pager\">");
    let base = p.query();
    let sep = if base.is_empty() { "" } else { "&amp;" };
    if p.before.is_some() {
        let _ = write!(m, "<a href=\"/instances?{}\">newest</a>", esc(&base));
    }
    if let Some(next) = page.next {
        let (label, note) = if page.partial {
            (
                "search older",
                format!(
                    "<span class=\"muted\">{} found; ids from #{} down not searched yet</span>",
                    num(page.rows.len() as i64),
                    num(next - 1)
                ),
            )
        } else {
            ("older →", String::new())
        };
        let _ = write!(
            m,
            "<a id=\"older\" href=\"/instances?{}{sep}before={next}\">{label}</a>{note}",
            esc(&base)
        );
    }
    m.push_str("</div>");
    m
}
