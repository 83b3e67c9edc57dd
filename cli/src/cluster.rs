//! A workload on several node processes. The first process (a node itself)
//! starts the others, this binary again as `workload <w> --node-of SCHEMA`,
//! and drives them over their stdin and stdout, one line each way:
//!
//! - a node says `ready` once its engine is built;
//! - `go`: start claiming;
//! - `count`: say `count` and the node's counters (space-separated);
//! - `mark`: remember the claim latencies so far;
//! - `end`: stop, write its records, and say `p99 <before mark> <after mark>`
//!   (milliseconds), `held <bucket counts>` (the claim latencies after
//!   `mark`) and `share <outcomes written>`.

use crate::workload::{write_records, Node, Records};
use anyhow::{bail, Context, Result};
use gendurable::{Engine, Latencies};
use std::path::{Path, PathBuf};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// One of the other node processes, seen from the first.
pub(crate) struct Extra {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    record: Option<PathBuf>,
}

/// What a node said as it ended.
pub(crate) struct Ended {
    /// Claim latency p99 before and after `mark`, in milliseconds.
    pub p99: (f64, f64),
    /// Claim latencies after `mark`.
    pub held: Latencies,
    /// Outcomes it wrote.
    pub outcomes: u64,
}

impl Extra {
    /// Start node process `i` of `workload` on `schema`; it records to a
    /// file beside `record`, if given.
    pub async fn spawn(
        workload: &str,
        schema: &str,
        node: &Node,
        record: Option<&Path>,
        i: u32,
    ) -> Result<Extra> {
        let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
        cmd.args(["workload", workload, "--node-of", schema])
            .args(["--concurrency", &node.concurrency.to_string()])
            .env("DATABASE_URL", &node.url)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(p) = node.prefetch {
            cmd.args(["--prefetch", &p.to_string()]);
        }
        let record = record.map(|r| sibling(r, i));
        if let Some(r) = &record {
            cmd.arg("--record").arg(r);
        }
        let mut child = cmd.spawn().context("starting a node process")?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            bail!("a node process without pipes");
        };
        let mut extra = Extra {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            record,
        };
        extra.expect("ready").await?;
        Ok(extra)
    }

    pub async fn send(&mut self, line: &str) -> Result<()> {
        self.stdin.write_all(format!("{line}\n").as_bytes()).await?;
        Ok(self.stdin.flush().await?)
    }

    /// Its counters now.
    pub async fn count(&mut self) -> Result<Vec<u64>> {
        self.send("count").await?;
        Ok(self
            .expect("count")
            .await?
            .into_iter()
            .map(|v| v as u64)
            .collect())
    }

    /// Stop it; its records are appended to `all`.
    pub async fn end(mut self, all: Option<&Path>) -> Result<Ended> {
        self.send("end").await?;
        let p = self.expect("p99").await?;
        let held = self.expect("held").await?;
        let share = self.expect("share").await?;
        self.child.wait().await?;
        if let (Some(all), Some(mine)) = (all, &self.record) {
            append(all, mine)?;
        }
        Ok(Ended {
            p99: (
                p.first().copied().unwrap_or(0.0),
                p.get(1).copied().unwrap_or(0.0),
            ),
            held: Latencies::from_counts(held.into_iter().map(|c| c as u64).collect()),
            outcomes: share.first().copied().unwrap_or(0.0) as u64,
        })
    }

    /// The next line, which must start with `word`; its other fields.
    async fn expect(&mut self, word: &str) -> Result<Vec<f64>> {
        let line = self
            .lines
            .next_line()
            .await?
            .with_context(|| format!("a node process ended before saying {word:?}"))?;
        let mut fields = line.split_whitespace();
        if fields.next() != Some(word) {
            bail!("a node process said {line:?}, expected {word:?}");
        }
        Ok(fields.filter_map(|f| f.parse().ok()).collect())
    }
}

/// Run as one of the other node processes: `engine` (built, not started)
/// answers the first process until it says `end`; `counts` are what `count`
/// reports.
pub(crate) async fn serve(
    engine: Engine,
    counts: impl Fn() -> Vec<u64>,
    rec: &Records,
    record: &Option<PathBuf>,
) -> Result<()> {
    say("ready".into()).await?;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut mark = None;
    while let Some(line) = lines.next_line().await? {
        match line.trim() {
            "go" => engine.start().await?,
            "count" => {
                let c: Vec<String> = counts().iter().map(u64::to_string).collect();
                say(format!("count {}", c.join(" "))).await?;
            }
            "mark" => mark = Some(engine.stats().pick_latencies()),
            "end" => break,
            other => bail!("unknown request {other:?}"),
        }
    }
    let now = engine.stats().pick_latencies();
    let (before, after) = p99s(&now, mark.as_ref());
    let held = mark.map_or_else(|| Latencies::from_counts(Vec::new()), |m| now.since(&m));
    engine.shutdown().await?;
    write_records(record, rec)?;
    say(format!("p99 {before} {after}")).await?;
    let counts: Vec<String> = held.counts().iter().map(u64::to_string).collect();
    say(format!("held {}", counts.join(" "))).await?;
    say(format!("share {}", engine.stats().snapshot().outcomes)).await?;
    Ok(())
}

/// One line to the first process.
async fn say(line: String) -> std::io::Result<()> {
    let mut out = tokio::io::stdout();
    out.write_all(format!("{line}\n").as_bytes()).await?;
    out.flush().await
}

/// The p99 of claiming calls until `mark` and after it, in milliseconds.
pub(crate) fn p99s(now: &Latencies, mark: Option<&Latencies>) -> (f64, f64) {
    let ms = |l: &Latencies| l.quantile(0.99).as_secs_f64() * 1e3;
    match mark {
        Some(m) => (ms(m), ms(&now.since(m))),
        None => (ms(now), 0.0),
    }
}

/// The record file of node process `i`, beside the first one's.
fn sibling(record: &Path, i: u32) -> PathBuf {
    let mut name = record.as_os_str().to_owned();
    name.push(format!(".node{i}"));
    PathBuf::from(name)
}

fn append(all: &Path, part: &Path) -> Result<()> {
    let text = std::fs::read(part).with_context(|| format!("reading {}", part.display()))?;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(all)?;
    std::io::Write::write_all(&mut f, &text)?;
    std::fs::remove_file(part)?;
    Ok(())
}
