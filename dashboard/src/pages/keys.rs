//! Keys, gates and rate limits: executing K = 1 keys, every gate key with
//! in-flight / limit / shards and its backlog, rate-limit keys with their
//! next start, the keys with parked rows, and the capture warnings.

use super::AppState;
use crate::html::{esc, num, url_part, when, Nav};
use crate::{failure, respond};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use gendurable::inspect::KeysView;
use gendurable::Parked;
use std::fmt::Write;

pub async fn page(State(app): AppState, headers: HeaderMap) -> Response {
    match app.engine.keys().await {
        Ok(k) => respond(
            &app,
            &headers,
            "Keys & gates",
            Nav::Keys,
            None,
            "",
            render(&k),
        ),
        Err(e) => failure(&e),
    }
}

pub async fn json(State(app): AppState) -> Response {
    super::json(app.engine.keys().await)
}

fn key_link(key: &str) -> String {
    format!(
        "<a href=\"/instances?key={}\">{}</a>",
        url_part(key),
        esc(key)
    )
}

fn render(k: &KeysView) -> String {
    let mut m = String::from("<h1>Keys &amp; gates</h1>");
    for w in &k.warnings {
        let _ = write!(m, "<p class=\"warn\">⚠ {}</p>", esc(w));
    }
    let backlog = |key: &str, kind: Parked| {
        k.parked
            .iter()
            .find(|p| p.key == key && p.waits_for == kind)
            .map_or(0, |p| p.rows)
    };
    m.push_str(
        "<h2>Gates</h2><table id=\"gates\"><tr><th>key</th><th>in flight / limit</th>\
         <th class=\"n\">free slots (counters)</th><th class=\"n\">shards</th><th class=\"n\">backlog (parked)</th></tr>",
    );
    for g in &k.gates {
        let pct = if g.limit > 0 {
            (100 * g.in_flight / g.limit).min(100)
        } else {
            0
        };
        let _ = write!(
            m,
            "<tr><td>{}</td><td><span class=\"bar{}\"><i style=\"width:{pct}%\"></i></span> {}/{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            key_link(&g.key),
            if g.in_flight >= g.limit { " full" } else { "" },
            num(g.in_flight),
            num(g.limit),
            num(g.available),
            g.shards,
            num(backlog(&g.key, Parked::Key)),
        );
    }
    if k.gates.is_empty() {
        m.push_str("<tr><td colspan=\"5\" class=\"muted\">no gate key has run yet</td></tr>");
    }
    m.push_str("</table><h2>Executing K = 1 keys</h2><table id=\"k1\"><tr><th>key</th><th class=\"n\">waiting behind it (parked)</th></tr>");
    for key in &k.executing_keys {
        let _ = write!(
            m,
            "<tr><td>{}</td><td class=\"n\">{}</td></tr>",
            key_link(key),
            num(backlog(key, Parked::Key))
        );
    }
    if k.executing_keys.is_empty() {
        m.push_str("<tr><td colspan=\"2\" class=\"muted\">none</td></tr>");
    }
    m.push_str(
        "</table><h2>Rate limits</h2><table id=\"rates\"><tr><th>key</th>\
         <th>starts spaced until</th><th class=\"n\">backlog (parked)</th></tr>",
    );
    for r in &k.rates {
        let _ = write!(
            m,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td></tr>",
            esc(&r.key),
            if r.tat > k.now {
                when(k.now, r.tat)
            } else {
                "now: a start is allowed".to_owned()
            },
            num(backlog(&r.key, Parked::Rate)),
        );
    }
    if k.rates.is_empty() {
        m.push_str("<tr><td colspan=\"3\" class=\"muted\">no rate limit has been used</td></tr>");
    }
    m.push_str(
        "</table><h2>Parked rows by key</h2><table id=\"parked\"><tr><th>key</th><th>waits for</th>\
         <th class=\"n\">parked</th><th class=\"n\">heads (where a pick sees them)</th></tr>",
    );
    for p in &k.parked {
        let _ = write!(
            m,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            // The list filters by concurrency key: a rate-limit key is text.
            match p.waits_for {
                Parked::Key => key_link(&p.key),
                _ => esc(&p.key),
            },
            match p.waits_for {
                Parked::Key => "room under its key",
                Parked::Rate => "its rate limit",
                _ => "",
            },
            num(p.rows),
            num(p.heads)
        );
    }
    if k.parked.is_empty() {
        m.push_str("<tr><td colspan=\"4\" class=\"muted\">no parked rows</td></tr>");
    }
    m.push_str("</table>");
    m
}
