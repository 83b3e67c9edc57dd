//! Metrics in the Prometheus text format (version 0.0.4): this engine's
//! counters and histograms, and what the database says of queues and gates;
//! and a small listener that serves them on `GET /metrics`.

use super::Engine;
use crate::error::Result;
use crate::stats::Histogram;
use sqlx::Row;
use std::fmt::Write;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The histograms' bucket bounds, in seconds.
const BOUNDS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The longest request head the listener reads.
const MAX_REQUEST: usize = 8 * 1024;

impl Engine {
    /// Every metric, as a Prometheus scrape reads them: this engine's own
    /// (steps, claims, rate-limit denials, rescues, repairs, latencies;
    /// labelled with its node id), the cluster's from the database
    /// (instances waiting or running per queue and status, gate slots in use
    /// per gate name) and the bulkheads given to
    /// [`EngineBuilder::bulkhead`](crate::EngineBuilder::bulkhead) (per name).
    pub async fn metrics(&self) -> Result<String> {
        let (sql, pool) = (&self.ctx.store.sql, self.ctx.db());
        let instances = sqlx::query(&sql.active_counts).fetch_all(pool).await?;
        let gates = sqlx::query(&sql.metrics_gates).fetch_all(pool).await?;
        let node = escape(&self.ctx.cfg.node_id);
        let s = self.ctx.stats.snapshot();
        let mut out = String::new();
        let counters = [
            (
                "steps_started",
                "Steps started on this node.",
                s.steps_started,
            ),
            (
                "steps_completed",
                "Steps whose outcome completed their instance.",
                s.steps_completed,
            ),
            (
                "steps_failed",
                "Steps whose outcome recorded an error.",
                s.steps_failed,
            ),
            ("claimed", "Rows claimed by this node.", s.claimed),
            ("picks", "Pick statements run.", s.picks),
            ("outcomes", "Outcomes written.", s.outcomes),
            (
                "fenced",
                "Outcomes dropped: the row had been rescued.",
                s.fenced,
            ),
            (
                "rescued",
                "Rows of dead nodes this node's reaper made runnable again.",
                s.rescued,
            ),
            (
                "repaired",
                "Gate counters the reconciler repaired.",
                s.repaired,
            ),
            (
                "unparked",
                "Parked rows put back where a pick sees them.",
                s.unparked,
            ),
            (
                "rate_limited",
                "Runnable rows this node's claims found under a rate limit that allowed no start now, and parked.",
                s.rate_limited,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(out, "# HELP gendurable_{name}_total {help}");
            let _ = writeln!(out, "# TYPE gendurable_{name}_total counter");
            let _ = writeln!(out, "gendurable_{name}_total{{node=\"{node}\"}} {v}");
        }
        histogram(
            &mut out,
            "gendurable_step_duration_seconds",
            "How long steps ran on this node.",
            &node,
            &self.ctx.stats.step_time,
        );
        histogram(
            &mut out,
            "gendurable_claim_duration_seconds",
            "How long this node's claiming calls (picks and handoffs) took.",
            &node,
            &self.ctx.stats.pick_time,
        );
        let _ = writeln!(
            out,
            "# HELP gendurable_instances Instances waiting or running, per queue and status."
        );
        let _ = writeln!(out, "# TYPE gendurable_instances gauge");
        for r in &instances {
            let (q, st, n): (String, String, i64) = (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
            let _ = writeln!(
                out,
                "gendurable_instances{{queue=\"{}\",status=\"{st}\"}} {n}",
                escape(&q)
            );
        }
        let _ = writeln!(
            out,
            "# HELP gendurable_gate_in_flight Gate slots in use, per gate name."
        );
        let _ = writeln!(out, "# TYPE gendurable_gate_in_flight gauge");
        let _ = writeln!(
            out,
            "# HELP gendurable_gate_limit The limit of one key of the gate (as this node configures it)."
        );
        let _ = writeln!(out, "# TYPE gendurable_gate_limit gauge");
        let _ = writeln!(
            out,
            "# HELP gendurable_gate_keys Keys of the gate with counters."
        );
        let _ = writeln!(out, "# TYPE gendurable_gate_keys gauge");
        for r in &gates {
            let (name, in_flight, keys): (String, i64, i64) = (
                r.try_get("name")?,
                r.try_get("in_flight")?,
                r.try_get("keys")?,
            );
            let gate = escape(&name);
            let _ = writeln!(
                out,
                "gendurable_gate_in_flight{{gate=\"{gate}\"}} {in_flight}"
            );
            let _ = writeln!(out, "gendurable_gate_keys{{gate=\"{gate}\"}} {keys}");
            if let Some(g) = self.ctx.cfg.gates.get(&name) {
                let _ = writeln!(out, "gendurable_gate_limit{{gate=\"{gate}\"}} {}", g.limit);
            }
        }
        let bulkheads = &self.ctx.cfg.bulkheads;
        if !bulkheads.is_empty() {
            out.push_str(&crate::bulkhead::prometheus(
                bulkheads.iter().map(|(name, b)| (name.as_str(), &**b)),
            ));
        }
        Ok(out)
    }
}

/// A histogram's buckets (cumulative), sum and count.
fn histogram(out: &mut String, name: &str, help: &str, node: &str, h: &Histogram) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for le in BOUNDS {
        let n = h.at_most(Duration::from_secs_f64(le));
        let _ = writeln!(out, "{name}_bucket{{node=\"{node}\",le=\"{le}\"}} {n}");
    }
    let count = h.count();
    let _ = writeln!(out, "{name}_bucket{{node=\"{node}\",le=\"+Inf\"}} {count}");
    let _ = writeln!(
        out,
        "{name}_sum{{node=\"{node}\"}} {}",
        h.sum().as_secs_f64()
    );
    let _ = writeln!(out, "{name}_count{{node=\"{node}\"}} {count}");
}

/// A label value: backslash, double quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The running listener.
pub(crate) struct MetricsListener {
    pub addr: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl MetricsListener {
    /// Listen on `addr` (port 0: any free port; see `addr`).
    pub async fn start(engine: Engine, addr: SocketAddr) -> Result<MetricsListener> {
        let listener = TcpListener::bind(addr).await.map_err(|e| {
            crate::error::Error::config(format!("metrics_listen {addr}: cannot listen: {e}"))
        })?;
        let addr = listener.local_addr().unwrap_or(addr);
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve(engine, listener, stop.clone()));
        Ok(MetricsListener { addr, stop, task })
    }

    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

async fn serve(engine: Engine, listener: TcpListener, stop: CancellationToken) {
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = stop.cancelled() => return,
        };
        match conn {
            Ok((stream, _)) => {
                let engine = engine.clone();
                tokio::spawn(async move {
                    if let Err(e) = answer(&engine, stream).await {
                        tracing::debug!(error = %e, "metrics request failed");
                    }
                });
            }
            Err(e) => tracing::debug!(error = %e, "metrics listener: accept failed"),
        }
    }
}

/// One request: `GET /metrics` gets the metrics; anything else a 404.
async fn answer(engine: &Engine, mut stream: TcpStream) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let line = line.lines().next().unwrap_or("");
    let (status, body) = if line.starts_with("GET /metrics ") || line == "GET /metrics" {
        match engine.metrics().await {
            Ok(text) => ("200 OK", text),
            Err(e) => ("503 Service Unavailable", format!("# {e}\n")),
        }
    } else {
        (
            "404 Not Found",
            "only GET /metrics is served here\n".to_owned(),
        )
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.shutdown().await
}
