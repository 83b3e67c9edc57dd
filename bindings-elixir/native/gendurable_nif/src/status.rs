//! `mix gendurable.status` and `mix gendurable.migrate`: what the Rust
//! CLI's `gendurable status` and `gendurable migrate` print, read through the
//! core. Status is read-only: a schema that does not exist is reported, not
//! created.

use crate::{atoms, core_error, error_term, reply, spawn_reply, Reply};
use gendurable::{ClusterStatus, Engine, GateConfig, NoNode, Parked};
use rustler::{Encoder, Env, Term};
use std::fmt::Write;
use std::time::Duration;

/// `NAME=LIMIT` or `NAME=LIMIT/SHARDS`, as `gendurable status --gate`.
fn parse_gate(s: &str) -> Result<(String, GateConfig), String> {
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=LIMIT or NAME=LIMIT/SHARDS"))?;
    let (limit, shards) = rest.split_once('/').unwrap_or((rest, "1"));
    let limit = limit.parse().map_err(|_| format!("{s:?}: bad limit"))?;
    let shards = shards
        .parse()
        .map_err(|_| format!("{s:?}: bad shard count"))?;
    Ok((name.to_owned(), GateConfig::new(limit).shards(shards)))
}

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
    let gates: Vec<(String, GateConfig)> = match gates.iter().map(|g| parse_gate(g)).collect() {
        Ok(g) => g,
        Err(e) => return error_term(env, atoms::invalid_input(), Some("gate"), e),
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
        let mut out = text(&st);
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
            effective_k(&mut out, &local, &keys);
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

// The text below is `gendurable status`'s (cli/src/status.rs), line for line.

fn text(st: &ClusterStatus) -> String {
    let mut o = String::new();
    let _ = write_status(&mut o, st);
    o
}

fn write_status(o: &mut String, st: &ClusterStatus) -> std::fmt::Result {
    writeln!(o, "instances (queue / status / count)")?;
    if st.counts.is_empty() {
        writeln!(o, "  none")?;
    }
    for c in &st.counts {
        writeln!(o, "  {:<20} {:<10} {:>10}", c.queue, c.status, c.count)?;
    }
    writeln!(o, "\nlive nodes")?;
    if st.nodes.is_empty() {
        writeln!(o, "  none")?;
    }
    for n in &st.nodes {
        writeln!(
            o,
            "  {}  host {} pid {}  queues {}  executing {}  heartbeat {}",
            n.id, n.hostname, n.pid, n.queues, n.executing, n.heartbeat_at
        )?;
        if let Some(w) = &n.workflows {
            writeln!(o, "    workflows {}", w.join(", "))?;
        }
    }
    waiting(o, st)?;
    writeln!(o, "\ngates (key / in flight / limit / free slots / shards)")?;
    if st.gates.is_empty() {
        writeln!(o, "  none")?;
    }
    for g in &st.gates {
        writeln!(
            o,
            "  {:<30} {:>6} {:>6} {:>6} {:>4}",
            g.key, g.in_flight, g.limit, g.available, g.shards
        )?;
    }
    writeln!(
        o,
        "\nexecuting K = 1 keys ({} shown)",
        st.executing_keys.len()
    )?;
    for k in &st.executing_keys {
        writeln!(o, "  {k}")?;
    }
    parked(o, st)?;
    writeln!(o, "\nrate limits (key / next start no sooner than)")?;
    if st.rates.is_empty() {
        writeln!(o, "  none")?;
    }
    for r in &st.rates {
        writeln!(o, "  {:<30} {}", r.key, r.tat)?;
    }
    Ok(())
}

/// Keys with parked rows, as the CLI prints them.
fn parked(o: &mut String, st: &ClusterStatus) -> std::fmt::Result {
    writeln!(
        o,
        "\nparked rows (key / waiting for / parked / unparked heads; {} keys shown, most parked first)",
        st.parked.len()
    )?;
    if st.parked.is_empty() {
        writeln!(o, "  none")?;
    }
    for p in &st.parked {
        let what = match p.waits_for {
            Parked::Key => "room",
            _ => "rate",
        };
        writeln!(
            o,
            "  {:<30} {:<5} {:>10} {:>6}",
            p.key, what, p.rows, p.heads
        )?;
    }
    Ok(())
}

fn effective_k(o: &mut String, local: &Engine, keys: &[String]) {
    let _ = writeln!(o, "\neffective K");
    for k in keys {
        let l = local.key_limit(k);
        let _ = match l.gate {
            Some(g) => writeln!(
                o,
                "  {k}: K = {} (captured by gate {g:?}, {} shards)",
                l.k, l.shards
            ),
            None => writeln!(o, "  {k}: K = 1 (no gate captures it: mutual exclusion)"),
        };
    }
}

/// Waiting rows per workflow and queue, those no live node will run first.
fn waiting(o: &mut String, st: &ClusterStatus) -> std::fmt::Result {
    let stuck = st.waiting.iter().filter(|w| w.no_node.is_some()).count();
    writeln!(
        o,
        "\nwaiting rows (workflow / queue / rows / earliest scheduled / run by a live node?)"
    )?;
    if st.waiting.is_empty() {
        writeln!(o, "  none")?;
    }
    for w in &st.waiting {
        let who = match w.no_node {
            None if st.workflows_recorded => "yes".to_owned(),
            // Nodes do not say which workflows they run: only the queue is known served.
            None => "its queue is served".to_owned(),
            Some(NoNode::Queue) => format!("NO: no live node serves queue {:?}", w.queue),
            Some(_) => format!(
                "NO: no live node serving {:?} runs workflow {:?}",
                w.queue, w.workflow
            ),
        };
        writeln!(
            o,
            "  {:<30} {:<20} {:>8}  {}  {}",
            w.workflow,
            w.queue,
            w.count,
            w.oldest.format("%Y-%m-%d %H:%M:%S UTC"),
            who
        )?;
    }
    if stuck > 0 {
        writeln!(
            o,
            "  {stuck} of these wait for a node that serves their queue and runs their workflow: \
             they run once one starts"
        )?;
    }
    if !st.workflows_recorded {
        writeln!(
            o,
            "  (the nodes do not record which workflows they run: rows of a workflow no node \
             runs show only as waiting, in a served queue)"
        )?;
    }
    Ok(())
}
