//! The controller: owns Postgres, the proxy and the node processes; inserts
//! the load, injects the faults, drains the run and hands it to the
//! observer.

use crate::faults::{self, Counts, Fault, Fleet};
use crate::load::{self, Load};
use crate::observer::{self, FinalRow, GateRow, Inputs, Report};
use crate::proxy::{End, Proxy};
use crate::record::{now, Record, Recorder};
use crate::settings::{self, LEASE, SCHEMA};
use anyhow::{bail, Context};
use gendurable_testing::{TempPostgres, TempPostgresOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;

/// Probability that the proxy drops a committed response.
const COMMIT_CUT: f64 = 0.01;
/// Mean time between cuts anywhere.
const MID_CUT_MEAN: Duration = Duration::from_millis(1000);
/// Mean time between stalled connections.
const STALL_MEAN: Duration = Duration::from_millis(3000);
/// How often progress is shown.
const PROGRESS: Duration = Duration::from_secs(5);
/// How often the controller looks for nodes that exited on their own.
const TICK: Duration = Duration::from_millis(200);

pub struct Options {
    pub seed: u64,
    pub duration: Duration,
    pub nodes: usize,
    pub instances: Option<usize>,
    pub poison: Option<u64>,
    pub keep: bool,
}

impl Options {
    /// Poison pills: as asked, or one per 30 s of run.
    fn poison(&self) -> u64 {
        self.poison
            .unwrap_or_else(|| (self.duration.as_secs() / 30).max(1))
    }
}

/// Tasks aborted when the run ends, however it ends.
#[derive(Default)]
struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// What the progress line shows.
struct Shared {
    load: Arc<Load>,
    fleet: Arc<Mutex<Fleet>>,
    proxy: Arc<Proxy>,
    counts: Arc<Counts>,
    total: usize,
    started: Instant,
}

impl Shared {
    async fn progress(&self, phase: &str) {
        // Postgres may be down: the line is not held up for it.
        let unfinished = tokio::time::timeout(Duration::from_secs(1), self.load.unfinished())
            .await
            .ok()
            .and_then(Result::ok);
        let inserted = self.load.inserted.load(Relaxed);
        let fin = match unfinished {
            Some(u) => (inserted as i64 - u).max(0).to_string(),
            None => "?".into(),
        };
        let (mid, commit, stalls) = self.proxy.cuts();
        let c = &self.counts;
        println!(
            "[{:>6.1}s] {phase}: final {fin}/{} (inserted {inserted}); kills {}, stops {}, cut-offs {}, terms {}, node exits {}, postgres crashes {}, cuts {mid} anywhere + {commit} after commit, stalls {stalls}",
            self.started.elapsed().as_secs_f64(),
            self.total,
            c.kills.load(Relaxed),
            c.stops.load(Relaxed),
            c.cut_offs.load(Relaxed),
            c.terms.load(Relaxed),
            c.exits.load(Relaxed),
            c.crashes.load(Relaxed),
        );
    }

    /// Nodes that exited on their own are restarted; unless the exit was a
    /// planned crash, it is a finding.
    async fn restart_exited(&self, problems: &mut Vec<String>) -> anyhow::Result<()> {
        for (node, status) in self.fleet.lock().await.restart_exited()? {
            if status.code() == Some(crate::node::PLANNED_CRASH) {
                self.counts.exits.fetch_add(1, Relaxed);
            } else {
                let msg = format!(
                    "node {node} exited on its own ({status}) at {:.3} s; restarted",
                    self.started.elapsed().as_secs_f64()
                );
                eprintln!("{msg}");
                problems.push(msg);
            }
        }
        Ok(())
    }
}

pub async fn run(opts: Options) -> anyhow::Result<bool> {
    let seed = opts.seed;
    let total = opts
        .instances
        .unwrap_or_else(|| (opts.duration.as_secs() as usize * 8).clamp(100, 20_000));
    println!(
        "gendurable-chaos: seed {seed}, duration {}, {} nodes, {total} instances and {} poison pills",
        crate::show_duration(opts.duration),
        opts.nodes,
        opts.poison()
    );
    let dir = std::env::temp_dir().join(format!("gendurable-chaos-{seed}-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("nodes"))
        .with_context(|| format!("creating {}", dir.display()))?;
    println!("records in {}", dir.display());
    let result = run_in(&opts, total, &dir).await;
    let keep = opts.keep || !matches!(result, Ok(true));
    if keep {
        println!("records kept in {}", dir.display());
    } else if let Err(e) = std::fs::remove_dir_all(&dir) {
        eprintln!("could not remove {}: {e}", dir.display());
    }
    result
}

async fn run_in(opts: &Options, total: usize, dir: &std::path::Path) -> anyhow::Result<bool> {
    let rec = Arc::new(
        Recorder::open(&dir.join("controller.log")).context("opening the controller's log")?,
    );
    // Every seeded decision is drawn here, before anything runs.
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let waves = load::waves(&mut rng, total, opts.poison(), opts.duration);
    let total: usize = waves.iter().map(|w| w.plans.len()).sum();
    let schedule = faults::schedule(&mut rng, opts.duration, opts.nodes);
    let proxy_seed: u64 = rng.gen();
    let cut_rng = StdRng::seed_from_u64(rng.gen());
    let mut signal_rng = StdRng::seed_from_u64(rng.gen());
    let stall_rng = StdRng::seed_from_u64(rng.gen());
    std::fs::write(
        dir.join("faults.txt"),
        schedule
            .iter()
            .map(|(at, f)| format!("{:>8.3}s {f:?}\n", at.as_secs_f64()))
            .collect::<String>(),
    )?;

    // The server acknowledges commits before their WAL is written, as some
    // are set up to: each crash would lose the last ones, had the engine not
    // raised `synchronous_commit` on its own connections.
    let pg = TempPostgres::start_with(TempPostgresOptions {
        extra_settings: vec![("synchronous_commit".into(), "off".into())],
        ..Default::default()
    })
    .await
    .context("starting a throwaway PostgreSQL")?;
    let (pg_url, pg_port) = (pg.url(), pg.port());
    let pg = Arc::new(Mutex::new(pg));
    let client = settings::builder(&pg_url)
        .build()
        .await
        .context("connecting the controller's client and migrating the schema")?;
    let proxy = Arc::new(
        Proxy::start(pg_port, rec.clone(), proxy_seed, COMMIT_CUT)
            .await
            .context("starting the proxy")?,
    );
    let fleet = Arc::new(Mutex::new(Fleet::new(
        dir.join("nodes"),
        rec.clone(),
        proxy.clone(),
        opts.nodes,
    )?));
    for i in 0..opts.nodes {
        fleet.lock().await.spawn(i, true)?;
    }
    let load = Arc::new(Load::new(client.clone(), pg.clone()));
    let counts = Arc::new(Counts::default());
    // Times in the report, the progress lines and faults.txt count from here.
    rec.write(&Record::Begin {
        t: now(),
        seed: opts.seed,
    });
    let shared = Shared {
        load: load.clone(),
        fleet: fleet.clone(),
        proxy: proxy.clone(),
        counts: counts.clone(),
        total,
        started: Instant::now(),
    };
    let (quiet_tx, quiet) = watch::channel(false);
    let mut tasks = Tasks::default();
    let (fatal_tx, mut fatal) = tokio::sync::mpsc::unbounded_channel::<String>();

    // Inserts, in waves; on quiescence the rest at once.
    let inserter = {
        let (load, mut quiet, fatal_tx) = (load.clone(), quiet.clone(), fatal_tx.clone());
        let started = shared.started;
        tokio::spawn(async move {
            for wave in waves {
                tokio::select! {
                    _ = tokio::time::sleep_until((started + wave.at).into()) => {}
                    _ = quiet.wait_for(|q| *q) => {}
                }
                if let Err(e) = load.insert(wave.plans).await {
                    let _ = fatal_tx.send(format!("{e:#}"));
                    return;
                }
            }
        })
    };
    // Signals at random times.
    tasks.0.push({
        let load = load.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(signal_rng.gen_range(100..600))).await;
                load.signal(&mut signal_rng).await;
            }
        })
    });
    // Cuts anywhere, and stalls.
    tasks.0.push(tokio::spawn(faults::end_loop(
        proxy.clone(),
        cut_rng,
        MID_CUT_MEAN,
        End::Cut,
    )));
    tasks.0.push(tokio::spawn(faults::end_loop(
        proxy.clone(),
        stall_rng,
        STALL_MEAN,
        End::Stall,
    )));
    // The fault schedule.
    let injector = {
        let (fleet, pg, rec, counts, mut quiet) = (
            fleet.clone(),
            pg.clone(),
            rec.clone(),
            counts.clone(),
            quiet.clone(),
        );
        let started = shared.started;
        let fatal_tx = fatal_tx.clone();
        tokio::spawn(async move {
            for (at, fault) in schedule {
                tokio::select! {
                    _ = tokio::time::sleep_until((started + at).into()) => {}
                    _ = quiet.wait_for(|q| *q) => return,
                }
                if let Err(e) = inject(&fleet, &pg, &rec, &counts, &fatal_tx, fault).await {
                    let _ = fatal_tx.send(format!("{e:#}"));
                    return;
                }
            }
        })
    };

    let mut problems = Vec::new();
    // The run proper.
    let deadline = shared.started + opts.duration;
    let mut next_progress = shared.started + PROGRESS;
    while Instant::now() < deadline {
        tokio::select! {
            _ = tokio::time::sleep(TICK.min(deadline.saturating_duration_since(Instant::now()))) => {}
            Some(e) = fatal.recv() => bail!("the run broke down: {e}"),
        }
        if Instant::now() >= next_progress {
            next_progress = Instant::now() + PROGRESS;
            shared.progress("running").await;
        }
        shared.restart_exited(&mut problems).await?;
    }

    // Quiescence: no more faults, every node running, every wave in.
    println!("quiescence: faults stop, every node runs, the last waves go in");
    quiet_tx.send_replace(true);
    proxy.set_cutting(false);
    injector.await.context("the fault injector panicked")?;
    {
        let mut pg = pg.lock().await;
        if !pg.is_running() {
            pg.start_again().await.context("starting Postgres again")?;
            rec.write(&Record::PgUp { t: now() });
        }
    }
    fleet.lock().await.revive()?;
    inserter.await.context("the inserter panicked")?;
    if let Ok(e) = fatal.try_recv() {
        bail!("the run broke down: {e}");
    }
    drop(tasks);

    // Drain: every instance final, signals sent as needed.
    let limit = Duration::from_secs(60) + opts.duration / 4;
    let drain_start = Instant::now();
    let mut next_progress = Instant::now() + PROGRESS;
    let mut drained = false;
    while drain_start.elapsed() < limit {
        if let Ok(0) = load.unfinished().await {
            drained = true;
            break;
        }
        let _ = load.wake_all().await;
        shared.restart_exited(&mut problems).await?;
        if Instant::now() >= next_progress {
            next_progress = Instant::now() + PROGRESS;
            shared.progress("draining").await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    shared
        .progress(if drained { "drained" } else { "not drained" })
        .await;
    let mut stuck = Vec::new();
    if !drained {
        stuck = unfinished_rows(&client).await.unwrap_or_default();
    }

    // Let the reconciler repair the gate counters (bounded).
    let gate_wait = Instant::now();
    let mut gates = read_gates(&client).await?;
    while gates.iter().any(|g| g.available != g.capacity) && gate_wait.elapsed() < LEASE * 5 {
        tokio::time::sleep(settings::GC).await;
        gates = read_gates(&client).await?;
    }
    let (finals, strangers, executing) = read_finals(&client, &load).await?;
    fleet.lock().await.terminate(Duration::from_secs(10)).await;

    println!("checking the records");
    let plans = load.plans();
    let mut report = observer::check(Inputs {
        dir,
        plans: &plans,
        finals,
        strangers,
        gates,
        executing,
    })?;
    report.violations.extend(problems);
    if !drained {
        let mut msg = format!(
            "the run did not drain within {}: {} instances not final",
            crate::show_duration(limit),
            stuck.len()
        );
        for s in stuck.iter().take(30) {
            msg.push_str("\n    ");
            msg.push_str(s);
        }
        report.violations.insert(0, msg);
    }
    print_report(&report, opts, &counts, &proxy, dir)?;
    if opts.keep || !report.passed() {
        keep_database(&pg, dir).await;
    }
    Ok(report.passed())
}

/// Stop Postgres and copy its data directory and log into the run's directory.
async fn keep_database(pg: &Mutex<TempPostgres>, dir: &std::path::Path) {
    let mut pg = pg.lock().await;
    if let Err(e) = pg.stop().await {
        eprintln!("stopping Postgres to copy its data failed: {e}");
        return;
    }
    let copy = |from: &std::path::Path, to: &str| {
        let ok = std::process::Command::new("cp")
            .arg("-a")
            .arg(from)
            .arg(dir.join(to))
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("could not copy {} into {}", from.display(), dir.display());
        }
    };
    copy(pg.data_dir(), "pgdata");
    copy(&pg.log_file(), "postgres.log");
}

/// Inject one fault. Kills and stops are undone later by a task of their own.
async fn inject(
    fleet: &Arc<Mutex<Fleet>>,
    pg: &Arc<Mutex<TempPostgres>>,
    rec: &Arc<Recorder>,
    counts: &Arc<Counts>,
    fatal: &tokio::sync::mpsc::UnboundedSender<String>,
    fault: Fault,
) -> anyhow::Result<()> {
    match fault {
        Fault::Kill {
            node,
            same_id,
            down,
        } => {
            let mut f = fleet.lock().await;
            let Some(i) = pick(&f.running(), node, f.len()) else {
                return Ok(());
            };
            if f.kill(i).await {
                counts.kills.fetch_add(1, Relaxed);
                if same_id {
                    counts.same_id.fetch_add(1, Relaxed);
                }
                let fleet = fleet.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(down).await;
                    let mut f = fleet.lock().await;
                    if f.is_dead(i) {
                        if let Err(e) = f.spawn(i, same_id) {
                            eprintln!("restarting a node failed: {e:#}");
                        }
                    }
                });
            }
        }
        Fault::Stop { node, hold } => {
            let mut f = fleet.lock().await;
            let Some(i) = pick(&f.running(), node, f.len()) else {
                return Ok(());
            };
            if let Some(no) = f.stop(i).await {
                counts.stops.fetch_add(1, Relaxed);
                let fleet = fleet.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(hold).await;
                    fleet.lock().await.cont(i, no);
                });
            }
        }
        Fault::CutOff { node, hold } => {
            let f = fleet.lock().await;
            let Some(i) = pick(&f.running(), node, f.len()) else {
                return Ok(());
            };
            let id = f.cut_off(i);
            counts.cut_offs.fetch_add(1, Relaxed);
            let fleet = fleet.clone();
            tokio::spawn(async move {
                tokio::time::sleep(hold).await;
                fleet.lock().await.reconnect(&id);
            });
        }
        Fault::Term { node, down } => {
            let mut f = fleet.lock().await;
            let Some(i) = pick(&f.running(), node, f.len()) else {
                return Ok(());
            };
            if f.term(i, Duration::from_secs(10)).await {
                counts.terms.fetch_add(1, Relaxed);
                let fleet = fleet.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(down).await;
                    let mut f = fleet.lock().await;
                    if f.is_dead(i) {
                        if let Err(e) = f.spawn(i, true) {
                            eprintln!("restarting a node failed: {e:#}");
                        }
                    }
                });
            }
        }
        Fault::Freeze { outage } => {
            let (pg, rec, counts, fatal) = (pg.clone(), rec.clone(), counts.clone(), fatal.clone());
            tokio::spawn(async move {
                if let Err(e) = faults::freeze_postgres(&pg, &rec, outage, &counts).await {
                    let _ = fatal.send(format!("{e:#}"));
                }
            });
        }
        Fault::Crash { outage } => {
            // Its own task: the schedule goes on during the outage.
            let (pg, rec, counts, fatal) = (pg.clone(), rec.clone(), counts.clone(), fatal.clone());
            tokio::spawn(async move {
                if let Err(e) = faults::crash_postgres(&pg, &rec, outage, &counts).await {
                    let _ = fatal.send(format!("{e:#}"));
                }
            });
        }
    }
    Ok(())
}

/// The planned node if it runs, else the next running one.
fn pick(running: &[usize], want: usize, n: usize) -> Option<usize> {
    (0..n).map(|k| (want + k) % n).find(|i| running.contains(i))
}

async fn read_gates(client: &gendurable::Engine) -> anyhow::Result<Vec<GateRow>> {
    let rows: Vec<(String, i32, i32, i32)> = sqlx::query_as(&format!(
        "SELECT key, shard, capacity, available FROM \"{SCHEMA}\".gate_slots ORDER BY key, shard"
    ))
    .fetch_all(client.pool())
    .await
    .context("reading the gate counters")?;
    Ok(rows
        .into_iter()
        .map(|(key, shard, capacity, available)| GateRow {
            key,
            shard,
            capacity,
            available,
        })
        .collect())
}

type Finals = (std::collections::BTreeMap<i64, FinalRow>, Vec<i64>, i64);

async fn read_finals(client: &gendurable::Engine, load: &Load) -> anyhow::Result<Finals> {
    let rows: Vec<(i64, String, String, Value, Value)> = sqlx::query_as(&format!(
        "SELECT id, status, step, state, errors FROM \"{SCHEMA}\".instances ORDER BY id"
    ))
    .fetch_all(client.pool())
    .await
    .context("reading the final states")?;
    let plans = load.plans();
    let mut finals = std::collections::BTreeMap::new();
    let mut strangers = Vec::new();
    let mut executing = 0;
    for (id, status, step, state, errors) in rows {
        if status == "executing" {
            executing += 1;
        }
        if !plans.contains_key(&id) {
            strangers.push(id);
        }
        finals.insert(
            id,
            FinalRow {
                status,
                step,
                state,
                errors,
            },
        );
    }
    Ok((finals, strangers, executing))
}

/// Instances not final, described (for a run that did not drain).
async fn unfinished_rows(client: &gendurable::Engine) -> anyhow::Result<Vec<String>> {
    Ok(sqlx::query_scalar(&format!(
        "SELECT format('instance %s: %s at %s in queue %s, key %s, node %s, attempt %s, %s errors%s',
                id, status, step, queue, coalesce(concurrency_key, '-'), coalesce(node, '-'),
                attempt, jsonb_array_length(errors),
                coalesce(', the last: ' || (errors -> -1)::text, ''))
         FROM \"{SCHEMA}\".instances
         WHERE status NOT IN ('completed', 'cancelled', 'discarded') ORDER BY id"
    ))
    .fetch_all(client.pool())
    .await?)
}

fn print_report(
    r: &Report,
    opts: &Options,
    counts: &Counts,
    proxy: &Proxy,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    let all: String = r
        .violations
        .iter()
        .map(|v| format!("VIOLATION {v}\n"))
        .collect();
    std::fs::write(dir.join("violations.txt"), &all)?;
    const SHOWN: usize = 40;
    for v in r.violations.iter().take(SHOWN) {
        println!("VIOLATION {v}");
    }
    if r.violations.len() > SHOWN {
        println!(
            "... {} more in {}",
            r.violations.len() - SHOWN,
            dir.join("violations.txt").display()
        );
    }
    for n in &r.notes {
        println!("note: {n}");
    }
    let reruns: Vec<String> = r
        .reruns
        .iter()
        .map(|(cause, n)| format!("{n} {cause}"))
        .collect();
    let (mid, commit, stalls) = proxy.cuts();
    let apart_max = r.apart.iter().copied().fold(0.0, f64::max);
    println!("== summary (seed {})", opts.seed);
    println!(
        "instances     {} inserted, {} completed as planned, {} discarded as every attempt of a step ended in an error or a death, one at least in a death",
        r.instances, r.completed_as_planned, r.discarded_by_deaths
    );
    println!(
        "steps run     {} executions; re-run: {}",
        r.executions,
        if reruns.is_empty() {
            "none".into()
        } else {
            reruns.join(", ")
        }
    );
    println!(
        "faults        sigkill {} ({} restarted under the same id), sigstop {} (past the lease), cut off from postgres {} (past the lease), sigterm {}, planned node crashes {}, postgres crashes {} ({} down past the lease, longest {:.1} s), postgres frozen {} (past the lease), proxy cuts {mid} anywhere + {commit} after commit, {stalls} stalled connections",
        counts.kills.load(Relaxed),
        counts.same_id.load(Relaxed),
        counts.stops.load(Relaxed),
        counts.cut_offs.load(Relaxed),
        counts.terms.load(Relaxed),
        counts.exits.load(Relaxed),
        counts.crashes.load(Relaxed),
        counts.long_crashes.load(Relaxed),
        counts.longest_outage_ms.load(Relaxed) as f64 / 1e3,
        counts.freezes.load(Relaxed),
    );
    println!(
        "overlaps      {} / counted apart {} (max {:.3} s)",
        r.overlaps,
        r.apart.len(),
        apart_max
    );
    println!(
        "outcomes      lost {}, double outcomes {}, re-runs without cause {}, wrong steps {}, unended steps {}, crash loops {}",
        r.lost, r.double_outcomes, r.unexplained_reruns, r.wrong_steps, r.unended, r.crash_loops
    );
    println!(
        "limits        rate-window violations {} (most starts in a {:.1} s window {}, bound {}; in a full {:.1} s window {}), queue overruns {}",
        r.rate_violations,
        (settings::RATE_PERIOD.as_nanos() as u64 - observer::RATE_LAG_NS) as f64 / 1e9,
        r.rate_max,
        r.rate_bound,
        settings::RATE_PERIOD.as_secs_f64(),
        r.rate_max_full,
        r.queue_overruns
    );
    println!("gate counters mismatches {}", r.gate_mismatches);
    if r.passed() {
        println!("PASS");
    } else {
        println!(
            "FAIL: {} violations; reproduce with: gendurable-chaos --seed {} --duration {} --nodes {}{}",
            r.violations.len(),
            opts.seed,
            crate::show_duration(opts.duration),
            opts.nodes,
            opts.instances
                .map(|n| format!(" --instances {n}"))
                .unwrap_or_default()
                + &opts
                    .poison
                    .map(|n| format!(" --poison {n}"))
                    .unwrap_or_default()
        );
    }
    Ok(())
}
