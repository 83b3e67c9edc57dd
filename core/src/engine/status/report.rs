//! The text of `gendurable status` (and `mix gendurable.status`).

use super::{ClusterStatus, KeyLimit, NoNode, Parked};
use std::fmt::{self, Display, Formatter};

impl Display for ClusterStatus {
    fn fmt(&self, o: &mut Formatter<'_>) -> fmt::Result {
        writeln!(o, "instances (queue / status / count)")?;
        none_if_empty(o, self.counts.is_empty())?;
        for c in &self.counts {
            writeln!(o, "  {:<20} {:<10} {:>10}", c.queue, c.status, c.count)?;
        }
        if !self.paused.is_empty() {
            writeln!(o, "\npaused queues (no node claims from them)")?;
            for (q, since) in &self.paused {
                writeln!(o, "  {q:<20} since {since}")?;
            }
        }
        writeln!(o, "\nlive nodes")?;
        none_if_empty(o, self.nodes.is_empty())?;
        for n in &self.nodes {
            writeln!(
                o,
                "  {}  host {} pid {}  queues {}  executing {}  heartbeat {}",
                n.id, n.hostname, n.pid, n.queues, n.executing, n.heartbeat_at
            )?;
            if let Some(w) = &n.workflows {
                writeln!(o, "    workflows {}", w.join(", "))?;
            }
        }
        self.fmt_waiting(o)?;
        writeln!(o, "\ngates (key / in flight / limit / free slots / shards)")?;
        none_if_empty(o, self.gates.is_empty())?;
        for g in &self.gates {
            writeln!(
                o,
                "  {:<30} {:>6} {:>6} {:>6} {:>4}",
                g.key, g.in_flight, g.limit, g.available, g.shards
            )?;
        }
        writeln!(
            o,
            "\nexecuting K = 1 keys ({} shown)",
            self.executing_keys.len()
        )?;
        for k in &self.executing_keys {
            writeln!(o, "  {k}")?;
        }
        self.fmt_parked(o)?;
        writeln!(o, "\nrate limits (key / next start no sooner than)")?;
        none_if_empty(o, self.rates.is_empty())?;
        for r in &self.rates {
            writeln!(o, "  {:<30} {}", r.key, r.tat)?;
        }
        Ok(())
    }
}

impl ClusterStatus {
    /// Waiting rows per workflow and queue, those no live node will run first.
    fn fmt_waiting(&self, o: &mut Formatter<'_>) -> fmt::Result {
        writeln!(
            o,
            "\nwaiting rows (workflow / queue / rows / earliest scheduled / run by a live node?)"
        )?;
        none_if_empty(o, self.waiting.is_empty())?;
        for w in &self.waiting {
            let who = match w.no_node {
                None => "yes".to_owned(),
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
        let stuck = self.waiting.iter().filter(|w| w.no_node.is_some()).count();
        if stuck > 0 {
            writeln!(
                o,
                "  {stuck} of these wait for a node that serves their queue and runs their \
                 workflow: they run once one starts"
            )?;
        }
        Ok(())
    }

    /// Keys with parked rows: backlogs waiting out of the pick's sight.
    fn fmt_parked(&self, o: &mut Formatter<'_>) -> fmt::Result {
        writeln!(
            o,
            "\nparked rows (key / waiting for / parked / unparked heads; {} keys shown, most \
             parked first)",
            self.parked.len()
        )?;
        none_if_empty(o, self.parked.is_empty())?;
        for p in &self.parked {
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
}

fn none_if_empty(o: &mut Formatter<'_>, empty: bool) -> fmt::Result {
    if empty {
        writeln!(o, "  none")?;
    }
    Ok(())
}

impl KeyLimit {
    /// One line of `gendurable status --key`: the effective K of `key`.
    pub fn describe(&self, key: &str) -> String {
        match &self.gate {
            Some(g) => format!(
                "{key}: K = {} (captured by gate {g:?}, {} shards)",
                self.k, self.shards
            ),
            None => format!("{key}: K = 1 (no gate captures it: mutual exclusion)"),
        }
    }
}
