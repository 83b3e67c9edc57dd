//! `gendurable workload`: one workload of the cross-system benchmark
//! (`benchmarks/`), on DATABASE_URL or a throwaway Postgres. Prints one JSON
//! line on stdout; W2 and W3 also write `key,start_ns,end_ns` per job to
//! `--record` for the harness to check overlap.

use crate::cluster;
use anyhow::{bail, Context, Result};
use gendurable::{Engine, GateConfig, NewInstance, Transition};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(clap::Args)]
pub struct Args {
    /// w1 (no-op), w2 (100 K = 1 keys, 5 ms), w3 (one gate of 10, 20 ms),
    /// w4 (insert-to-start latency at 50/s), w5 (unrelated no-op jobs behind
    /// blocked backlogs), soak (a steady rate for --minutes on a pruned
    /// history), raw (a plain SKIP LOCKED loop) or commit (one-row updates,
    /// each committed alone: the latency floor of any call that commits).
    workload: String,
    /// Steps at once (for raw: claim loops at once).
    #[arg(long, default_value_t = 20)]
    concurrency: u32,
    /// Jobs; the workload's own default when omitted.
    #[arg(long)]
    jobs: Option<usize>,
    /// w1: steps per job (every step but the last moves its job on to the
    /// next); rates count jobs, `steps_per_s` steps.
    #[arg(long, default_value_t = 1)]
    steps: u32,
    /// Where W2 and W3 write `key,start_ns,end_ns` per job.
    #[arg(long)]
    record: Option<std::path::PathBuf>,
    /// Rows claimed ahead per queue (the engine's default when omitted).
    #[arg(long)]
    prefetch: Option<u32>,
    /// raw: rows claimed per statement.
    #[arg(long, default_value_t = 100)]
    batch: i64,
    /// w5: rows in each blocked backlog (the gate's and the K = 1 key's; the
    /// rate-limited one has a tenth).
    #[arg(long, default_value_t = 1_000_000)]
    backlog: usize,
    /// w5: seconds the nodes go on running the blocked backlogs after the
    /// unrelated jobs are done, to measure them at their limits.
    #[arg(long, default_value_t = 20.0)]
    hold: f64,
    /// w1, w2, w3, w5: node processes (this one and `nodes - 1` more), each
    /// with `concurrency` steps at once.
    #[arg(long, default_value_t = 1)]
    nodes: u32,
    /// w1, w2, w3 on several nodes: the other nodes start claiming only once
    /// the first has finished this fraction of the jobs (a node joining a
    /// busy cluster); the result adds each node's share of the jobs after.
    #[arg(long, default_value_t = 0.0)]
    join_at: f64,
    /// soak: minutes to run.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// soak: jobs inserted per second (benchmarks/soak takes 70 % of a W1
    /// run's rate).
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    /// soak: finished rows in the table at the start (the retention is set
    /// to what `rate` leaves in it, so the table stays at that size if
    /// pruning keeps up).
    #[arg(long, default_value_t = 10_000_000)]
    history: u64,
    /// Run as one of the other node processes, on this schema (driven by
    /// the first over stdin and stdout: see cluster.rs).
    #[arg(long, hide = true)]
    node_of: Option<String>,
}

/// Start and end of each job, in wall-clock nanoseconds.
pub(crate) type Records = Arc<Mutex<Vec<(String, u128, u128)>>>;

pub async fn run(args: Args) -> Result<()> {
    let (url, _pg) = crate::database(true).await?;
    let node = Node {
        url,
        concurrency: args.concurrency,
        prefetch: args.prefetch,
    };
    if let Some(schema) = &args.node_of {
        return match args.workload.as_str() {
            "w5" => crate::w5::extra_node(&node, schema, &args.record).await,
            w => {
                let rec = Records::default();
                let (gate, pause) = shape(w)?;
                let engine = engine(&node, schema, gate, pause, &rec).await?;
                let counted = engine.clone();
                let counts = move || vec![counted.stats().snapshot().outcomes];
                cluster::serve(engine, counts, &rec, &args.record).await
            }
        };
    }
    let fleet = Fleet {
        nodes: args.nodes.max(1),
        join_at: args.join_at,
    };
    if fleet.nodes > 1 && !matches!(args.workload.as_str(), "w1" | "w2" | "w3" | "w5") {
        bail!("--nodes is for w1, w2, w3 and w5, not {}", args.workload);
    }
    if !(0.0..1.0).contains(&fleet.join_at) {
        bail!(
            "--join-at is a fraction of the jobs, at least 0 and below 1, not {}",
            fleet.join_at
        );
    }
    if fleet.join_at > 0.0 && !matches!(args.workload.as_str(), "w1" | "w2" | "w3") {
        bail!("--join-at is for w1, w2 and w3, not {}", args.workload);
    }
    let out = workload(&args, &node, &fleet).await;
    drop_scratch(&node.url).await;
    println!("{}", out?);
    Ok(())
}

/// The node processes of a run.
struct Fleet {
    /// This one and `nodes - 1` more.
    nodes: u32,
    /// The fraction of the jobs the first node finishes before the others
    /// start claiming.
    join_at: f64,
}

/// Run the workload `args` names with the first of the fleet's nodes here.
async fn workload(args: &Args, node: &Node, fleet: &Fleet) -> Result<serde_json::Value> {
    Ok(match args.workload.as_str() {
        "w1" => w1(node, args.jobs.unwrap_or(20_000), args.steps.max(1), fleet).await?,
        "w2" => {
            let n = args.jobs.unwrap_or(10_000);
            let make = |i| NewInstance::new("Job", json!({})).concurrency_key(("acct", i % 100));
            timed_run(node, "w2", n, fleet, &args.record, make).await?
        }
        "w3" => {
            let n = args.jobs.unwrap_or(2_000);
            let make = |_| NewInstance::new("Job", json!({})).concurrency_key("api:1");
            timed_run(node, "w3", n, fleet, &args.record, make).await?
        }
        "w4" => w4(node, args.jobs.unwrap_or(500)).await?,
        "soak" => {
            let shape = crate::soak::Shape {
                minutes: args.minutes,
                rate: args.rate,
                history: args.history,
            };
            crate::soak::run(node, &shape).await?
        }
        "w5" => {
            let shape = crate::w5::Shape {
                jobs: args.jobs.unwrap_or(20_000),
                backlog: args.backlog,
                hold: Duration::from_secs_f64(args.hold.max(0.0)),
                nodes: args.nodes.max(1),
            };
            crate::w5::run(node, &shape, &args.record).await?
        }
        "raw" => {
            let n = args.jobs.unwrap_or(20_000);
            raw(&node.url, args.concurrency, n, args.batch).await?
        }
        "commit" => commit(&node.url, args.jobs.unwrap_or(1_000)).await?,
        other => {
            bail!("unknown workload {other:?}: expected w1, w2, w3, w4, w5, soak, raw or commit")
        }
    })
}

/// A precise sleep for the benchmark's steps: tokio's timer rounds up to the
/// next millisecond, which alone would cost a 5 ms step a fifth of its ideal
/// rate. What is measured is the engine's overhead, not the timer's. One
/// thread keeps every pending deadline and wakes each step at its own; a
/// blocking thread per sleeping step cost the node two thread switches a
/// step, on the cores the database needs too.
pub(crate) async fn sleep_exactly(d: Duration) {
    let until = Instant::now() + d;
    let (wake, woken) = tokio::sync::oneshot::channel();
    let timer = TIMER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("step timer".into())
            .spawn(move || wake_at_deadlines(rx))
            .map(|_| tx)
            .ok()
    });
    let sent = timer
        .as_ref()
        .is_some_and(|t| t.send((until, wake)).is_ok());
    if !sent || woken.await.is_err() {
        tokio::time::sleep_until(until.into()).await;
    }
}

type Wake = (Instant, tokio::sync::oneshot::Sender<()>);

/// The timer thread's inbox (`None`: it could not be started).
static TIMER: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Wake>>> =
    std::sync::OnceLock::new();

/// A pending pause, ordered by its deadline alone.
struct Due {
    at: Instant,
    wake: tokio::sync::oneshot::Sender<()>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.at.cmp(&other.at)
    }
}

/// The timer thread: waits for the next deadline or a new one, whichever
/// comes first, and wakes the steps whose deadline has passed.
fn wake_at_deadlines(rx: std::sync::mpsc::Receiver<Wake>) {
    use std::cmp::Reverse;
    use std::sync::mpsc::RecvTimeoutError;
    let mut due: std::collections::BinaryHeap<Reverse<Due>> = Default::default();
    loop {
        let now = Instant::now();
        while due.peek().is_some_and(|d| d.0.at <= now) {
            if let Some(Reverse(Due { wake, .. })) = due.pop() {
                let _ = wake.send(());
            }
        }
        let next = match due.peek() {
            Some(d) => match rx.recv_timeout(d.0.at.saturating_duration_since(now)) {
                Ok(w) => Some(w),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            },
            None => match rx.recv() {
                Ok(w) => Some(w),
                Err(_) => return,
            },
        };
        if let Some((at, wake)) = next {
            due.push(Reverse(Due { at, wake }));
        }
    }
}

pub(crate) fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// The schemas (and the raw loop's table) this run created, dropped as it
/// ends so that runs against a database of one's own leave nothing behind.
static SCRATCH: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A fresh name for a run's schema, or the raw loop's table.
pub(crate) fn schema() -> String {
    let name = format!("workload_{:08x}", rand::random::<u32>());
    SCRATCH
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(name.clone());
    name
}

/// Drop what this run created (a failure is only reported: the run's
/// result stands).
async fn drop_scratch(url: &str) {
    let names = std::mem::take(&mut *SCRATCH.lock().unwrap_or_else(|p| p.into_inner()));
    if names.is_empty() {
        return;
    }
    let dropped = async {
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(url).await?;
        for name in &names {
            sqlx::raw_sql(&format!(
                "DROP SCHEMA IF EXISTS \"{name}\" CASCADE; DROP TABLE IF EXISTS \"{name}\""
            ))
            .execute(&mut conn)
            .await?;
        }
        Ok::<_, sqlx::Error>(())
    };
    if let Err(e) = dropped.await {
        eprintln!("could not drop the run's schemas {names:?}: {e}");
    }
}

pub(crate) fn bar(what: &str, n: usize) -> Result<ProgressBar> {
    let bar = ProgressBar::new(n as u64);
    bar.set_style(ProgressStyle::with_template(&format!(
        "{what:<8} {{bar:30}} {{pos}}/{{len}} {{per_sec}}"
    ))?);
    Ok(bar)
}

/// Where and how the measured node runs.
pub(crate) struct Node {
    pub url: String,
    pub concurrency: u32,
    pub prefetch: Option<u32>,
}

impl Node {
    pub fn builder_in(&self, schema: &str) -> gendurable::EngineBuilder {
        let b = Engine::builder()
            .url(&self.url)
            .schema(schema)
            .queue("default", self.concurrency);
        match self.prefetch {
            Some(p) => b.prefetch(p),
            None => b,
        }
    }
}

/// W1, W2, W3's node: the gate it configures and how long a step sleeps.
fn shape(workload: &str) -> Result<(Option<(&'static str, GateConfig)>, Duration)> {
    Ok(match workload {
        "w1" => (None, Duration::ZERO),
        "w2" => (None, Duration::from_millis(5)),
        "w3" => (
            Some(("api", GateConfig::new(10))),
            Duration::from_millis(20),
        ),
        other => bail!("workload {other:?} does not run on several nodes (w1, w2, w3, w5 do)"),
    })
}

/// An engine on `schema` whose one workflow sleeps `pause` and records its
/// start and end. A job whose state holds `left` steps moves on to its next
/// step until none is left (the count travels with the job, so every node of
/// a fleet runs it alike).
async fn engine(
    node: &Node,
    schema: &str,
    gate: Option<(&str, GateConfig)>,
    pause: Duration,
    rec: &Records,
) -> Result<Engine> {
    let rec = rec.clone();
    let mut b = node
        .builder_in(schema)
        .workflow_fn("Job", move |_step, state, ctx| {
            let rec = rec.clone();
            async move {
                let start = now_ns();
                if !pause.is_zero() {
                    sleep_exactly(pause).await;
                }
                let key = ctx.concurrency_key.unwrap_or_default();
                rec.lock().unwrap().push((key, start, now_ns()));
                Ok(match state.get("left").and_then(|l| l.as_u64()) {
                    Some(left) if left > 0 => {
                        Transition::next("again", json!({ "left": left - 1 }))
                    }
                    _ => Transition::done(state),
                })
            }
        });
    if let Some((name, g)) = gate {
        b = b.concurrency_limit(name, g);
    }
    Ok(b.build().await?)
}

/// Start the node and wait, with a progress bar, until `n` outcomes are
/// written; shuts the node down and returns the time and its counters.
pub(crate) async fn drain(
    engine: &Engine,
    what: &str,
    n: usize,
) -> Result<(Duration, gendurable::StatsSnapshot)> {
    let bar = bar(what, n)?;
    let t = Instant::now();
    engine.start().await?;
    loop {
        let done = engine.stats().snapshot().outcomes;
        bar.set_position(done);
        if done >= n as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = t.elapsed();
    bar.finish_and_clear();
    engine.shutdown().await?;
    Ok((elapsed, engine.stats().snapshot()))
}

/// Node counters: how well the round trips were amortised.
pub(crate) fn amortised(s: &gendurable::StatsSnapshot) -> String {
    format!(
        "{:.1} claims/pick, {:.1} outcomes/call, {:.0} % handed over",
        (s.claimed - s.handed_over) as f64 / s.picks.max(1) as f64,
        s.outcomes as f64 / s.outcome_batches.max(1) as f64,
        100.0 * s.handed_over as f64 / s.claimed.max(1) as f64
    )
}

pub(crate) fn result(
    workload: &str,
    n: usize,
    secs: f64,
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut v = json!({
        "system": "gendurable",
        "workload": workload,
        "jobs": n,
        "seconds": secs,
        "jobs_per_s": n as f64 / secs,
    });
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    v
}

async fn w1(node: &Node, n: usize, steps: u32, fleet: &Fleet) -> Result<serde_json::Value> {
    let (schema, rec) = (schema(), Records::default());
    let engine = engine(node, &schema, None, Duration::ZERO, &rec).await?;
    let state = match steps {
        1 => json!({}),
        _ => json!({ "left": steps - 1 }),
    };
    let t = Instant::now();
    engine
        .insert_many(
            (0..n)
                .map(|_| NewInstance::new("Job", state.clone()))
                .collect(),
        )
        .await?;
    let insert = t.elapsed().as_secs_f64();
    let total = n * steps as usize;
    let mut out = on_nodes(node, &engine, "w1", &schema, total, fleet, &None, &rec).await?;
    out["insert_per_s"] = json!(n as f64 / insert);
    if steps > 1 {
        // on_nodes counted steps: its rates are steps a second.
        out["steps"] = json!(steps);
        out["steps_per_s"] = out["jobs_per_s"].clone();
        out["jobs"] = json!(n);
        for rate in ["jobs_per_s", "steady_jobs_per_s"] {
            if let Some(r) = out[rate].as_f64() {
                out[rate] = json!(r / steps as f64);
            }
        }
    }
    Ok(out)
}

/// Insert `n` jobs, run them, and write each job's start and end to `record`.
async fn timed_run(
    node: &Node,
    what: &str,
    n: usize,
    fleet: &Fleet,
    record: &Option<std::path::PathBuf>,
    make: impl Fn(usize) -> NewInstance,
) -> Result<serde_json::Value> {
    let (schema, rec) = (schema(), Records::default());
    let (gate, pause) = shape(what)?;
    let engine = engine(node, &schema, gate, pause, &rec).await?;
    engine.insert_many((0..n).map(make).collect()).await?;
    on_nodes(node, &engine, what, &schema, n, fleet, record, &rec).await
}

/// Run the `n` inserted jobs on `engine` and the fleet's other node
/// processes, from the first `go` until all are done; each node's share of
/// the outcomes (and of those after the others joined, if they joined late),
/// and the claim p99 over all.
#[allow(clippy::too_many_arguments)]
async fn on_nodes(
    node: &Node,
    engine: &Engine,
    what: &str,
    schema: &str,
    n: usize,
    fleet: &Fleet,
    record: &Option<std::path::PathBuf>,
    rec: &Records,
) -> Result<serde_json::Value> {
    // Fresh statistics after the bulk insert, as PostgreSQL advises after a
    // bulk load (every peer's runner does the same for its own table).
    sqlx::query(&format!("ANALYZE \"{schema}\".instances"))
        .execute(engine.pool())
        .await?;
    let mut extras = Vec::new();
    for i in 1..fleet.nodes {
        extras.push(cluster::Extra::spawn(what, schema, node, record.as_deref(), i).await?);
    }
    let progress = bar(what, n)?;
    let t = Instant::now();
    let join_at = (fleet.join_at * n as f64) as u64;
    // The first node's outcomes when the others joined.
    let mut joined = None;
    if join_at == 0 {
        for e in &mut extras {
            e.send("go").await?;
        }
        joined = Some(0);
    }
    engine.start().await?;
    let mut pace = Pace::new(n as u64);
    loop {
        let mut done = engine.stats().snapshot().outcomes;
        if joined.is_none() && done >= join_at {
            for e in &mut extras {
                e.send("go").await?;
            }
            joined = Some(done);
        }
        for e in &mut extras {
            done += e.count().await?.first().copied().unwrap_or(0);
        }
        progress.set_position(done);
        pace.at(t.elapsed(), done);
        if done >= n as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let secs = t.elapsed().as_secs_f64();
    progress.finish_and_clear();
    engine.shutdown().await?;
    let s = engine.stats().snapshot();
    eprintln!(
        "{what}: {}, {} pick conflicts, {} fenced",
        amortised(&s),
        s.pick_conflicts,
        s.fenced
    );
    write_records(record, rec)?;
    let mut p99 = engine.stats().pick_latency(0.99).as_secs_f64() * 1e3;
    let mut outcomes = vec![s.outcomes];
    for e in extras {
        let ended = e.end(record.as_deref()).await?;
        p99 = p99.max(ended.p99.0);
        outcomes.push(ended.outcomes);
    }
    let mut out = result(
        what,
        n,
        secs,
        json!({ "nodes": fleet.nodes, "shares": shares(&outcomes), "pick_p99_ms": p99 }),
    );
    if let Some((steady, ramp)) = pace.steady() {
        out["steady_jobs_per_s"] = json!(steady);
        out["ramp_ms"] = json!(ramp.as_secs_f64() * 1e3);
    }
    if fleet.join_at > 0.0 {
        let first = joined.unwrap_or(0);
        outcomes[0] = outcomes[0].saturating_sub(first);
        out["joined_after"] = json!(first);
        out["shares_after_join"] = json!(shares(&outcomes));
    }
    Ok(out)
}

/// When a run's outcomes crossed a tenth and nine tenths of its jobs: the
/// rate between the two is its steady state, and what the start cost is the
/// time to the first tenth beyond what the steady rate would have taken.
struct Pace {
    n: u64,
    tenth: Option<Duration>,
    nine_tenths: Option<Duration>,
}

impl Pace {
    fn new(n: u64) -> Pace {
        Pace {
            n,
            tenth: None,
            nine_tenths: None,
        }
    }

    /// `done` outcomes were counted at `elapsed`.
    fn at(&mut self, elapsed: Duration, done: u64) {
        if self.tenth.is_none() && done * 10 >= self.n {
            self.tenth = Some(elapsed);
        }
        if self.nine_tenths.is_none() && done * 10 >= self.n * 9 {
            self.nine_tenths = Some(elapsed);
        }
    }

    /// The steady rate (jobs/s) and the start-up ramp; `None` for runs too
    /// short to tell (both marks in one sample).
    fn steady(&self) -> Option<(f64, Duration)> {
        let (a, b) = (self.tenth?, self.nine_tenths?);
        let span = b.checked_sub(a).filter(|d| !d.is_zero())?;
        let rate = 0.8 * self.n as f64 / span.as_secs_f64();
        let ideal = Duration::from_secs_f64(0.1 * self.n as f64 / rate);
        Some((rate, a.saturating_sub(ideal)))
    }
}

/// Each count's fraction of their sum.
fn shares(counts: &[u64]) -> Vec<f64> {
    let total = counts.iter().sum::<u64>().max(1) as f64;
    counts.iter().map(|&c| c as f64 / total).collect()
}

pub(crate) fn write_records(path: &Option<std::path::PathBuf>, rec: &Records) -> Result<()> {
    let Some(path) = path else { return Ok(()) };
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    for (key, start, end) in rec.lock().unwrap().iter() {
        writeln!(f, "{key},{start},{end}")?;
    }
    Ok(f.flush()?)
}

/// The value at quantile `q` (0 to 1) of `values`, the largest for 1; 0 when
/// there are none.
fn quantiles(mut values: Vec<f64>) -> impl Fn(f64) -> f64 {
    values.sort_by(f64::total_cmp);
    move |q| {
        let last = values.len().saturating_sub(1);
        values
            .get(((values.len() as f64 * q) as usize).min(last))
            .copied()
            .unwrap_or(0.0)
    }
}

/// Insert one job every 20 ms into a running, idle node; latency is from just
/// before the insert call to the step's start.
async fn w4(node: &Node, n: usize) -> Result<serde_json::Value> {
    let starts: Arc<Mutex<HashMap<u64, u128>>> = Arc::default();
    let s2 = starts.clone();
    let engine = node
        .builder_in(&schema())
        .workflow_fn("Job", move |_step, state, _ctx| {
            let at = now_ns();
            let i = state["i"].as_u64().unwrap_or(0);
            s2.lock().unwrap().insert(i, at);
            async move { Ok(Transition::done(state)) }
        })
        .build()
        .await?;
    engine.start().await?;
    let bar = bar("w4", n)?;
    let mut inserted = Vec::with_capacity(n);
    let mut returned = Vec::with_capacity(n);
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let t = Instant::now();
    for i in 0..n {
        tick.tick().await;
        inserted.push(now_ns());
        engine
            .insert(NewInstance::new("Job", json!({ "i": i })))
            .await?;
        returned.push(now_ns());
        bar.set_position(i as u64 + 1);
    }
    while engine.stats().snapshot().outcomes < n as u64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = t.elapsed().as_secs_f64();
    bar.finish_and_clear();
    engine.shutdown().await?;
    let starts = starts.lock().unwrap();
    // Milliseconds from each insert's `from` instant to its step's start.
    let since = |from: &[u128]| {
        let lat: Vec<f64> = from
            .iter()
            .enumerate()
            .filter_map(|(i, &at)| {
                starts
                    .get(&(i as u64))
                    .map(|&s| s.saturating_sub(at) as f64 / 1e6)
            })
            .collect();
        quantiles(lat)
    };
    let (total, after_commit) = (since(&inserted), since(&returned));
    Ok(result(
        "w4",
        n,
        secs,
        json!({
            "p50_ms": total(0.50),
            "p99_ms": total(0.99),
            "after_insert_p50_ms": after_commit(0.50),
            "after_insert_p99_ms": after_commit(0.99),
        }),
    ))
}

/// The physical reference: `loops` connections each claim `batch` rows with
/// `FOR UPDATE SKIP LOCKED` and mark them done, one commit per statement.
async fn raw(url: &str, loops: u32, n: usize, batch: i64) -> Result<serde_json::Value> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(loops + 1)
        .connect(url)
        .await?;
    let table = schema();
    sqlx::raw_sql(&format!(
        "CREATE TABLE {table} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             status text NOT NULL DEFAULT 'queued', payload jsonb NOT NULL DEFAULT '{{}}');
         CREATE INDEX ON {table} (id) WHERE status = 'queued';
         INSERT INTO {table} (payload) SELECT '{{}}' FROM generate_series(1, {n});"
    ))
    .execute(&pool)
    .await?;
    let claim = format!(
        "UPDATE {table} SET status = 'running' WHERE id IN (
             SELECT id FROM {table} WHERE status = 'queued' ORDER BY id LIMIT $1
             FOR UPDATE SKIP LOCKED) RETURNING id"
    );
    let done = format!("UPDATE {table} SET status = 'done' WHERE id = ANY($1)");
    let bar = bar("raw", n)?;
    let t = Instant::now();
    let tasks: Vec<_> = (0..loops)
        .map(|_| {
            let (pool, claim, done, bar) = (pool.clone(), claim.clone(), done.clone(), bar.clone());
            tokio::spawn(async move {
                loop {
                    let ids: Vec<i64> = sqlx::query_scalar(&claim)
                        .bind(batch)
                        .fetch_all(&pool)
                        .await?;
                    if ids.is_empty() {
                        return Ok::<_, sqlx::Error>(());
                    }
                    sqlx::query(&done).bind(&ids).execute(&pool).await?;
                    bar.inc(ids.len() as u64);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    let secs = t.elapsed().as_secs_f64();
    bar.finish_and_clear();
    sqlx::raw_sql(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await?;
    let mut v = result("raw", n, secs, json!({ "batch": batch }));
    v["system"] = json!(format!("raw SKIP LOCKED, batch {batch}"));
    Ok(v)
}

/// The server's commit floor: `n` one-row updates, each its own
/// transaction, one at a time. A claiming call commits, so its latency
/// can be no lower than this on the same server: with `fsync` on, that is
/// the disk's flush (a few milliseconds on some virtual disks).
async fn commit(url: &str, n: usize) -> Result<serde_json::Value> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let table = schema();
    sqlx::raw_sql(&format!(
        "CREATE TABLE \"{table}\" (id int PRIMARY KEY, v bigint NOT NULL);
         INSERT INTO \"{table}\" VALUES (1, 0)"
    ))
    .execute(&mut conn)
    .await?;
    let update = format!("UPDATE \"{table}\" SET v = v + 1 WHERE id = 1");
    let bar = bar("commit", n)?;
    let mut took = Vec::with_capacity(n);
    let t = Instant::now();
    for _ in 0..n {
        let one = Instant::now();
        sqlx::query(&update).execute(&mut conn).await?;
        took.push(one.elapsed());
        bar.inc(1);
    }
    let secs = t.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let ms = quantiles(took.iter().map(|d| d.as_secs_f64() * 1e3).collect());
    let mut v = result(
        "commit",
        n,
        secs,
        json!({ "commit_p50_ms": ms(0.5), "commit_p99_ms": ms(0.99), "commit_max_ms": ms(1.0) }),
    );
    v["system"] = json!("one-row update, committed alone");
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_pick_by_rank_and_are_zero_for_nothing() {
        let q = quantiles(vec![3.0, 1.0, 4.0, 2.0]);
        assert_eq!((q(0.0), q(0.5), q(0.99), q(1.0)), (1.0, 3.0, 4.0, 4.0));
        assert_eq!(quantiles(Vec::new())(0.99), 0.0);
    }

    #[tokio::test]
    async fn every_step_sleeps_at_least_its_pause() {
        // Many at once, in no order: each one waits out its own deadline.
        let sleeps: Vec<_> = (0..200u64)
            .map(|i| {
                tokio::spawn(async move {
                    let d = Duration::from_micros((i * 7919) % 5_000);
                    let t = Instant::now();
                    sleep_exactly(d).await;
                    (d, t.elapsed())
                })
            })
            .collect();
        for s in sleeps {
            let (d, slept) = s.await.unwrap();
            assert!(slept >= d, "slept {slept:?} of {d:?}");
        }
    }

    #[test]
    fn the_steady_rate_leaves_out_the_start_and_the_end() {
        let mut p = Pace::new(1_000);
        // 300 ms before the first outcome, then 1,000 jobs a second.
        for ms in (0..=1_300u64).step_by(10) {
            let done = ms.saturating_sub(300);
            p.at(Duration::from_millis(ms), done.min(1_000));
        }
        let (rate, ramp) = p.steady().expect("both marks crossed");
        assert!((rate - 1_000.0).abs() < 1e-6, "rate {rate}");
        assert_eq!(ramp, Duration::from_millis(300));
    }

    #[test]
    fn a_run_over_in_one_sample_has_no_steady_rate() {
        let mut p = Pace::new(100);
        p.at(Duration::from_millis(5), 100);
        assert!(p.steady().is_none());
    }
}
