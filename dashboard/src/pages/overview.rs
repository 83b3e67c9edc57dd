//! The overview: backlog per queue, the last hour's steps as a chart, live
//! nodes.

use super::AppState;
use crate::html::{esc, num, token_field, url_part, when, Nav};
use crate::{failure, respond};
use axum::extract::Query;
use axum::http::HeaderMap;
use axum::response::Response;
use gendurable::inspect::{Minute, Overview};
use std::fmt::Write;

#[derive(serde::Deserialize, Default)]
pub struct Params {
    /// A message to show (after an action).
    msg: Option<String>,
}

pub async fn page(State(app): AppState, headers: HeaderMap, Query(p): Query<Params>) -> Response {
    match app.engine.overview().await {
        Ok(o) => respond(
            &app,
            &headers,
            "Overview",
            Nav::Overview,
            p.msg.as_deref(),
            "",
            render(&o, &app),
        ),
        Err(e) => failure(&e),
    }
}

pub async fn json(State(app): AppState) -> Response {
    super::json(app.engine.overview().await)
}

use axum::extract::State;

fn render(o: &Overview, app: &crate::App) -> String {
    let mut m = String::from("<h1>Overview</h1><div class=\"cards\">");
    let total = |f: fn(&gendurable::inspect::QueueLoad) -> i64| o.queues.iter().map(f).sum::<i64>();
    let last = o.throughput.last();
    let hour_started: i64 = o.throughput.iter().map(|m| m.started).sum();
    let hour_failed: i64 = o.throughput.iter().map(|m| m.failed).sum();
    let cards = [
        ("executing", num(total(|q| q.executing))),
        ("available", num(total(|q| q.available))),
        ("scheduled", num(total(|q| q.scheduled))),
        ("awaiting", num(total(|q| q.awaiting))),
        (
            "finished",
            format!(
                "{}{}",
                if o.finished.estimated { "≈ " } else { "" },
                num(o.finished.count)
            ),
        ),
        ("live nodes", num(o.nodes.len() as i64)),
        (
            "steps / min (last minute)",
            num(last.map_or(0, |m| m.started)),
        ),
        (
            "failure rate (last hour)",
            if hour_started == 0 {
                "–".to_owned()
            } else {
                format!("{:.1} %", 100.0 * hour_failed as f64 / hour_started as f64)
            },
        ),
    ];
    for (label, value) in cards {
        let _ = write!(
            m,
            "<div class=\"card\"><b>{value}</b><span>{label}</span></div>"
        );
    }
    m.push_str("</div><h2>Steps per minute, last hour</h2>");
    m.push_str(&chart(o));
    m.push_str(
        "<h2>Queues</h2><table id=\"queues\"><tr><th>queue</th><th class=\"n\">scheduled</th>\
         <th class=\"n\">available</th><th class=\"n\">executing</th><th class=\"n\">awaiting</th>\
         <th>state</th>",
    );
    if app.allow_actions {
        m.push_str("<th></th>");
    }
    m.push_str("</tr>");
    for q in &o.queues {
        let link = |status: &str, n: i64| {
            format!(
                "<td class=\"n\"><a href=\"/instances?queue={}&amp;status={status}\">{}</a></td>",
                url_part(&q.queue),
                num(n)
            )
        };
        let _ = write!(
            m,
            "<tr><td><a href=\"/instances?queue={}\">{}</a></td>{}{}{}{}<td>{}</td>",
            url_part(&q.queue),
            esc(&q.queue),
            link("scheduled", q.scheduled),
            link("available", q.available),
            link("executing", q.executing),
            link("awaiting", q.awaiting),
            match q.paused_since {
                Some(t) => format!(
                    "<span class=\"badge s-discarded\">paused</span> {}",
                    when(o.now, t)
                ),
                None => "running".to_owned(),
            }
        );
        if app.allow_actions {
            let (verb, label) = match q.paused_since {
                Some(_) => ("resume", "Resume"),
                None => ("pause", "Pause"),
            };
            let _ = write!(
                m,
                "<td><form class=\"inline\" method=\"post\" action=\"/actions/queue\">{}\
                 <input type=\"hidden\" name=\"queue\" value=\"{}\">\
                 <button name=\"action\" value=\"{verb}\">{label}</button></form></td>",
                token_field(&app.token),
                esc(&q.queue)
            );
        }
        m.push_str("</tr>");
    }
    if o.queues.is_empty() {
        m.push_str("<tr><td colspan=\"7\" class=\"muted\">no queues: nothing waits and no node runs</td></tr>");
    }
    m.push_str(
        "</table><h2>Live nodes</h2><table id=\"nodes\"><tr><th>node</th><th>host</th>\
         <th class=\"n\">pid</th><th>queues (concurrency)</th><th class=\"n\">executing</th>\
         <th>heartbeat</th><th>started</th></tr>",
    );
    for n in &o.nodes {
        let queues = n
            .queues
            .as_object()
            .map(|q| {
                q.iter()
                    .map(|(name, c)| format!("{} ({c})", esc(name)))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let _ = write!(
            m,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{queues}</td>\
             <td class=\"n\"><a href=\"/instances?status=executing\">{}</a></td><td>{}</td><td>{}</td></tr>",
            esc(&n.id),
            esc(&n.hostname),
            n.pid,
            num(n.executing),
            when(o.now, n.heartbeat_at),
            when(o.now, n.started_at)
        );
    }
    if o.nodes.is_empty() {
        m.push_str("<tr><td colspan=\"7\" class=\"muted\">no live node</td></tr>");
    }
    m.push_str("</table>");
    m
}

/// The last hour as bars, one a minute: steps started, the failed ones in
/// red on top. Inline SVG: no script, no library.
fn chart(o: &Overview) -> String {
    const W: i64 = 60;
    let (width, height, left) = (900.0, 140.0, 48.0);
    let bar_w = (width - left) / W as f64;
    let start = o.now - chrono::Duration::minutes(W);
    let slot = |m: &Minute| (m.minute - start).num_minutes();
    let peak = o
        .throughput
        .iter()
        .map(|m| m.started.max(m.failed))
        .max()
        .unwrap_or(0)
        .max(1);
    let mut s = format!(
        "<svg id=\"chart\" viewBox=\"0 0 {width} {}\" width=\"100%\" role=\"img\" \
         aria-label=\"steps started and failed per minute over the last hour\" \
         style=\"background:#fff;border:1px solid #e2e5ea;max-height:220px\">",
        height + 20.0
    );
    let _ = write!(
        s,
        "<text x=\"4\" y=\"12\">{}</text><text x=\"4\" y=\"{height}\">0</text>\
         <text x=\"{left}\" y=\"{}\">−60 min</text><text x=\"{}\" y=\"{}\">now</text>",
        num(peak),
        height + 14.0,
        width - 24.0,
        height + 14.0
    );
    for m in &o.throughput {
        let i = slot(m);
        if !(0..=W).contains(&i) {
            continue;
        }
        let x = left + (i.min(W - 1)) as f64 * bar_w;
        let h = |n: i64| (n as f64 / peak as f64) * (height - 16.0);
        let _ = write!(
            s,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#3b82f6\">\
             <title>{}: {} started, {} failed, {} completed</title></rect>",
            height - h(m.started),
            bar_w * 0.8,
            h(m.started),
            m.minute.format("%H:%M"),
            m.started,
            m.failed,
            m.completed
        );
        if m.failed > 0 {
            let _ = write!(
                s,
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#dc2626\"/>",
                height - h(m.failed),
                bar_w * 0.8,
                h(m.failed)
            );
        }
    }
    s.push_str("</svg>");
    s
}
