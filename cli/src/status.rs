//! `gendurable status`.

use anyhow::{bail, Result};
use gendurable::{ClusterStatus, Engine, GateConfig, NoNode, Parked};

pub fn parse_gate(s: &str) -> Result<(String, GateConfig), String> {
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

pub async fn run(
    engine: Engine,
    keys: Vec<String>,
    gates: Vec<(String, GateConfig)>,
) -> Result<()> {
    let st = engine.status().await?;
    println!("instances (queue / status / count)");
    if st.counts.is_empty() {
        println!("  none");
    }
    for c in &st.counts {
        println!("  {:<20} {:<10} {:>10}", c.queue, c.status, c.count);
    }
    println!("\nlive nodes");
    if st.nodes.is_empty() {
        println!("  none");
    }
    for n in &st.nodes {
        println!(
            "  {}  host {} pid {}  queues {}  executing {}  heartbeat {}",
            n.id, n.hostname, n.pid, n.queues, n.executing, n.heartbeat_at
        );
        if let Some(w) = &n.workflows {
            println!("    workflows {}", w.join(", "));
        }
    }
    waiting(&st);
    println!("\ngates (key / in flight / limit / free slots / shards)");
    if st.gates.is_empty() {
        println!("  none");
    }
    for g in &st.gates {
        println!(
            "  {:<30} {:>6} {:>6} {:>6} {:>4}",
            g.key, g.in_flight, g.limit, g.available, g.shards
        );
    }
    println!("\nexecuting K = 1 keys ({} shown)", st.executing_keys.len());
    for k in &st.executing_keys {
        println!("  {k}");
    }
    parked(&st);
    println!("\nrate limits (key / next start no sooner than)");
    if st.rates.is_empty() {
        println!("  none");
    }
    for r in &st.rates {
        println!("  {:<30} {}", r.key, r.tat);
    }
    if !keys.is_empty() {
        // The nodes' gate config is not stored: take it from --gate.
        let mut b = Engine::builder().pool(engine.pool().clone()).migrate(false);
        for (name, g) in gates {
            b = b.concurrency_limit(name, g);
        }
        let local = b.build().await?;
        println!("\neffective K");
        for k in keys {
            if let Err(e) = gendurable::validate::key("key", &k) {
                bail!("{e}");
            }
            let l = local.key_limit(&k);
            match l.gate {
                Some(g) => println!(
                    "  {k}: K = {} (captured by gate {g:?}, {} shards)",
                    l.k, l.shards
                ),
                None => println!("  {k}: K = 1 (no gate captures it: mutual exclusion)"),
            }
        }
    }
    Ok(())
}

/// Keys with parked rows: backlogs waiting out of the pick's sight.
fn parked(st: &ClusterStatus) {
    println!(
        "\nparked rows (key / waiting for / parked / unparked heads; {} keys shown, most parked first)",
        st.parked.len()
    );
    if st.parked.is_empty() {
        println!("  none");
    }
    for p in &st.parked {
        let what = match p.waits_for {
            Parked::Key => "room",
            _ => "rate",
        };
        println!("  {:<30} {:<5} {:>10} {:>6}", p.key, what, p.rows, p.heads);
    }
}

/// Waiting rows per workflow and queue, those no live node will run first.
fn waiting(st: &ClusterStatus) {
    let stuck = st.waiting.iter().filter(|w| w.no_node.is_some()).count();
    println!("\nwaiting rows (workflow / queue / rows / earliest scheduled / run by a live node?)");
    if st.waiting.is_empty() {
        println!("  none");
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
        println!(
            "  {:<30} {:<20} {:>8}  {}  {}",
            w.workflow,
            w.queue,
            w.count,
            w.oldest.format("%Y-%m-%d %H:%M:%S UTC"),
            who
        );
    }
    if stuck > 0 {
        println!(
            "  {stuck} of these wait for a node that serves their queue and runs their workflow: \
             they run once one starts"
        );
    }
    if !st.workflows_recorded {
        println!(
            "  (the nodes do not record which workflows they run: rows of a workflow no node \
             runs show only as waiting, in a served queue)"
        );
    }
}
