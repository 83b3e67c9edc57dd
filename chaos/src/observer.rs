//! The outside observer: checks the run from its own records (the nodes'
//! step logs and the controller's fault log, on one clock), using the
//! database only for the final states and the gate counters.

use crate::plan::Plan;
use crate::record::{self, Record};
use crate::settings::{self, GATE_LIMIT, LEASE, RATE_BURST, RATE_LIMIT, RATE_PERIOD};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write;
use std::path::Path;

/// What the database says at the end.
#[derive(Clone)]
pub struct FinalRow {
    pub status: String,
    pub step: String,
    pub state: Value,
    pub errors: Value,
}

/// One gate counter row.
pub struct GateRow {
    pub key: String,
    pub shard: i32,
    pub capacity: i32,
    pub available: i32,
}

/// Everything the checks read.
pub struct Inputs<'a> {
    pub dir: &'a Path,
    pub plans: &'a BTreeMap<i64, Plan>,
    pub finals: BTreeMap<i64, FinalRow>,
    /// Rows of the instances table that the controller did not insert.
    pub strangers: Vec<i64>,
    pub gates: Vec<GateRow>,
    /// Rows still executing after quiescence.
    pub executing: i64,
}

/// A step that starts this soon after its process was continued from a
/// stop past the lease counts as stopped during it.
pub const STOP_GRACE_NS: u64 = 100_000_000;

/// How far the starts of a rate-limit key may lag their claims and still be
/// checked against the documented bound: a claimed row waits on its node for
/// a running slot (at most about one step) plus the claim's round trip.
pub const RATE_LAG_NS: u64 = (settings::MAX_SLEEP_MS + 100) * 1_000_000;

/// The verdict.
#[derive(Default)]
pub struct Report {
    pub instances: usize,
    pub completed_as_planned: usize,
    pub executions: usize,
    /// Re-executions of a step (same instance, same `n`) by cause.
    pub reruns: BTreeMap<&'static str, usize>,
    /// Over-limit incidents that fail the run.
    pub overlaps: usize,
    /// Over-limit incidents involving a node stopped past its lease during
    /// its step: their durations in seconds.
    pub apart: Vec<f64>,
    pub queue_overruns: usize,
    pub lost: usize,
    pub double_outcomes: usize,
    pub unexplained_reruns: usize,
    pub rate_violations: usize,
    /// The most starts seen in a checked window, and the bound.
    pub rate_max: usize,
    pub rate_bound: usize,
    /// The most starts seen in any window of one full period.
    pub rate_max_full: usize,
    pub gate_mismatches: usize,
    pub wrong_steps: usize,
    pub unended: usize,
    pub crash_loops: usize,
    /// Instances discarded because every attempt of a step died with its
    /// process (allowed; see `discarded_by_deaths`).
    pub discarded_by_deaths: usize,
    pub bad_lines: usize,
    /// Every violation, described.
    pub violations: Vec<String>,
    /// Notes (not failures).
    pub notes: Vec<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// One step execution, as the node recorded it.
#[derive(Debug, Clone)]
struct Exec {
    run: String,
    proc: u32,
    pid: u32,
    node: String,
    id: i64,
    step: String,
    n: i64,
    attempt: i32,
    queue: String,
    key: Option<String>,
    rate: Option<String>,
    parent: Option<String>,
    start: u64,
    end: u64,
    /// The end record's kind; `killed` when the process died first,
    /// `unended` when it did not.
    kind: String,
}

/// A node process, from the controller's records.
#[derive(Default)]
struct Proc {
    node: String,
    pid: u32,
    queues: Vec<String>,
    /// When it was SIGKILLed, or ended itself in a planned crash.
    killed_at: Option<u64>,
    gone_at: Option<u64>,
    /// (stopped, continued) intervals.
    stops: Vec<(u64, u64)>,
    /// A graceful shutdown: (SIGTERM sent, gone).
    term: Option<(u64, u64)>,
}

struct World {
    t0: u64,
    end: u64,
    execs: Vec<Exec>,
    procs: HashMap<u32, Proc>,
    outages: Vec<(u64, u64)>,
    /// Postgres frozen (SIGSTOP), from freeze to thaw.
    freezes: Vec<(u64, u64)>,
    cuts: Vec<(u64, String, String)>,
    /// (node, cut off, reconnected).
    cut_offs: Vec<(String, u64, u64)>,
}

impl World {
    fn secs(&self, t: u64) -> String {
        format!("{:.3}", (t as f64 - self.t0 as f64) / 1e9)
    }

    fn describe(&self, e: &Exec) -> String {
        format!(
            "run {} instance {} {} n={} attempt {} queue {} key {} rate {} on {} (pid {}, proc {}): {}-{} s, ended {}",
            e.run,
            e.id,
            e.step,
            e.n,
            e.attempt,
            e.queue,
            e.key.as_deref().unwrap_or("-"),
            e.rate.as_deref().unwrap_or("-"),
            e.node,
            e.pid,
            e.proc,
            self.secs(e.start),
            self.secs(e.end),
            e.kind
        )
    }

    /// A stop of this execution's process, longer than the lease, that
    /// overlaps [from, to], where `from` is a step's start: a stop that ended
    /// up to `STOP_GRACE_NS` before it counts too, since it may have landed
    /// between the engine's decision to start the step and its first line.
    fn stopped_past_lease(&self, proc: u32, from: u64, to: u64) -> Option<(u64, u64)> {
        let from = from.saturating_sub(STOP_GRACE_NS);
        let p = self.procs.get(&proc)?;
        p.stops
            .iter()
            .copied()
            .find(|&(a, b)| b.saturating_sub(a) > LEASE.as_nanos() as u64 && a <= to && b >= from)
    }

    /// A time this execution's node was cut off from Postgres for longer
    /// than the lease, overlapping [from, to].
    fn cut_off_past_lease(&self, proc: u32, from: u64, to: u64) -> Option<(u64, u64)> {
        let node = &self.procs.get(&proc)?.node;
        self.cut_offs
            .iter()
            .filter(|(n, _, _)| n == node)
            .map(|&(_, a, b)| (a, b))
            .find(|&(a, b)| b.saturating_sub(a) > LEASE.as_nanos() as u64 && a <= to && b >= from)
    }

    /// Whether the node of an execution that ended without a death of its
    /// own may have been presumed dead before its outcome was written: its
    /// process stopped past the lease, its node cut off from Postgres past
    /// the lease, or Postgres down past the lease, from its start to a lease
    /// after its end (the outcome may still have been on its way).
    /// Whether a process of `node` was killed, stopped or cut off from
    /// Postgres at some time in the run.
    fn node_went_down(&self, node: &str) -> bool {
        self.procs
            .values()
            .any(|p| p.node == node && (p.killed_at.is_some() || !p.stops.is_empty()))
            || self.cut_offs.iter().any(|(n, _, _)| n == node)
    }

    fn presumed_dead(&self, e: &Exec) -> bool {
        let to = e.end.saturating_add(LEASE.as_nanos() as u64);
        self.stopped_past_lease(e.proc, e.start, to).is_some()
            || self.cut_off_past_lease(e.proc, e.start, to).is_some()
            || self.long_outage(e.start, to).is_some()
    }

    /// A Postgres outage (down or frozen) longer than the lease that
    /// overlaps [from, to].
    fn long_outage(&self, from: u64, to: u64) -> Option<(u64, u64)> {
        self.unavailable()
            .find(|&(a, b)| b.saturating_sub(a) > LEASE.as_nanos() as u64 && a <= to && b >= from)
    }

    /// When Postgres was down or frozen.
    fn unavailable(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.outages.iter().chain(&self.freezes).copied()
    }

    /// Whether Postgres was down, or a connection of the process's node was
    /// cut, or the node cut off, within [from, to].
    fn unreachable(&self, proc: u32, from: u64, to: u64) -> bool {
        let node = self.procs.get(&proc).map(|p| p.node.as_str());
        self.unavailable().any(|(x, y)| x <= to && y >= from)
            || self
                .cut_offs
                .iter()
                .any(|(n, x, y)| Some(n.as_str()) == node && *x <= to && *y >= from)
            || self
                .cuts
                .iter()
                .any(|(t, _, n)| Some(n.as_str()) == node && *t >= from && *t <= to)
    }

    /// What the controller did to a process and to Postgres around
    /// [from, to], for a violation's context.
    fn context(&self, procs: &[u32], from: u64, to: u64) -> String {
        let margin = 5 * LEASE.as_nanos() as u64;
        let (lo, hi) = (from.saturating_sub(margin), to + margin);
        let mut out = String::new();
        let mut seen = BTreeSet::new();
        for &proc in procs {
            if !seen.insert(proc) {
                continue;
            }
            let Some(p) = self.procs.get(&proc) else {
                continue;
            };
            for &(a, b) in &p.stops {
                if a <= hi && b >= lo {
                    let _ = write!(
                        out,
                        "\n      {} (proc {}) SIGSTOP {}-{} s ({:.1} s)",
                        p.node,
                        proc,
                        self.secs(a),
                        self.secs(b),
                        b.saturating_sub(a) as f64 / 1e9
                    );
                }
            }
            if let Some(k) = p.killed_at.filter(|&k| k >= lo && k <= hi) {
                let _ = write!(
                    out,
                    "\n      {} (proc {}) SIGKILL or planned crash at {} s",
                    p.node,
                    proc,
                    self.secs(k)
                );
            }
            if let Some((a, b)) = p.term.filter(|&(a, _)| a >= lo && a <= hi) {
                let _ = write!(
                    out,
                    "\n      {} (proc {}) SIGTERM at {} s, gone at {} s",
                    p.node,
                    proc,
                    self.secs(a),
                    self.secs(b)
                );
            }
            for (_, a, b) in self
                .cut_offs
                .iter()
                .filter(|(n, a, b)| *n == p.node && *a <= hi && *b >= lo)
            {
                let _ = write!(
                    out,
                    "\n      {} cut off from Postgres {}-{} s ({:.1} s)",
                    p.node,
                    self.secs(*a),
                    self.secs(*b),
                    b.saturating_sub(*a) as f64 / 1e9
                );
            }
            let cuts: Vec<&(u64, String, String)> = self
                .cuts
                .iter()
                .filter(|(t, _, node)| *node == p.node && *t >= lo && *t <= hi)
                .collect();
            if !cuts.is_empty() {
                let list: Vec<String> = cuts
                    .iter()
                    .map(|(t, kind, _)| format!("{kind}@{}", self.secs(*t)))
                    .collect();
                let _ = write!(
                    out,
                    "\n      {} connections cut: {}",
                    p.node,
                    list.join(", ")
                );
            }
        }
        for (what, spans) in [("down", &self.outages), ("frozen", &self.freezes)] {
            for &(a, b) in spans.iter().filter(|&&(a, b)| a <= hi && b >= lo) {
                let _ = write!(
                    out,
                    "\n      Postgres {what} {}-{} s ({:.1} s)",
                    self.secs(a),
                    self.secs(b),
                    b.saturating_sub(a) as f64 / 1e9
                );
            }
        }
        out
    }
}

/// Read the logs into executions, processes and outages.
fn read_world(dir: &Path, report: &mut Report) -> anyhow::Result<World> {
    let (ctl, bad) = record::read(&dir.join("controller.log"))?;
    report.bad_lines += bad;
    let mut w = World {
        t0: 0,
        end: record::now(),
        execs: Vec::new(),
        procs: HashMap::new(),
        outages: Vec::new(),
        freezes: Vec::new(),
        cuts: Vec::new(),
        cut_offs: Vec::new(),
    };
    let mut open_stops: HashMap<u32, u64> = HashMap::new();
    let mut open_cut_offs: HashMap<String, u64> = HashMap::new();
    let mut down: Option<u64> = None;
    let mut frozen: Option<u64> = None;
    for r in ctl {
        match r {
            Record::Begin { t, .. } => w.t0 = t,
            Record::Spawn {
                proc,
                pid,
                node,
                queues,
                ..
            } => {
                let p = w.procs.entry(proc).or_default();
                p.node = node;
                p.pid = pid;
                p.queues = queues;
            }
            Record::Exit { t, proc, .. } => {
                let p = w.procs.entry(proc).or_default();
                p.gone_at = Some(p.gone_at.map_or(t, |g| g.min(t)));
            }
            Record::Kill { proc, dead, .. } => {
                let p = w.procs.entry(proc).or_default();
                p.killed_at = Some(dead);
                p.gone_at = Some(dead);
            }
            Record::Term { t, proc, dead, .. } => {
                let p = w.procs.entry(proc).or_default();
                p.gone_at = Some(dead);
                p.term = Some((t, dead));
            }
            Record::Stop { t, proc, .. } => {
                open_stops.insert(proc, t);
            }
            Record::Cont { t, proc, .. } => {
                if let Some(a) = open_stops.remove(&proc) {
                    w.procs.entry(proc).or_default().stops.push((a, t));
                }
            }
            Record::PgDown { t } => down = Some(t),
            Record::PgUp { t } => {
                if let Some(a) = down.take() {
                    w.outages.push((a, t));
                }
            }
            Record::PgFreeze { t } => frozen = Some(t),
            Record::PgThaw { t } => {
                if let Some(a) = frozen.take() {
                    w.freezes.push((a, t));
                }
            }
            Record::Cut { t, kind, node } => w.cuts.push((t, kind, node)),
            // As the proxy applies them: cutting off a node already cut off
            // changes nothing, and the first reconnect ends the cut-off.
            Record::CutOff { t, node } => {
                open_cut_offs.entry(node).or_insert(t);
            }
            Record::Reconnect { t, node } => {
                if let Some(a) = open_cut_offs.remove(&node) {
                    w.cut_offs.push((node, a, t));
                }
            }
            _ => {}
        }
    }
    // A stop never continued lasts until the process was gone.
    for (proc, a) in open_stops {
        let p = w.procs.entry(proc).or_default();
        let b = p.gone_at.unwrap_or(w.end);
        p.stops.push((a, b));
    }
    if let Some(a) = down {
        w.outages.push((a, w.end));
    }
    if let Some(a) = frozen {
        w.freezes.push((a, w.end));
    }
    for (node, a) in open_cut_offs {
        w.cut_offs.push((node, a, w.end));
    }

    let mut starts: HashMap<String, Exec> = HashMap::new();
    let mut ends: HashMap<String, (u64, String)> = HashMap::new();
    for entry in std::fs::read_dir(dir.join("nodes"))? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("log") {
            continue;
        }
        let (recs, bad) = record::read(&path)?;
        report.bad_lines += bad;
        for r in recs {
            match r {
                Record::Start {
                    t,
                    run,
                    proc,
                    pid,
                    node,
                    id,
                    step,
                    n,
                    attempt,
                    queue,
                    key,
                    rate,
                    parent,
                    ..
                } => {
                    starts.insert(
                        run.clone(),
                        Exec {
                            run,
                            proc,
                            pid,
                            node,
                            id,
                            step,
                            n,
                            attempt,
                            queue,
                            key,
                            rate,
                            parent,
                            start: t,
                            end: 0,
                            kind: String::new(),
                        },
                    );
                }
                Record::End {
                    t, run, kind, proc, ..
                } => {
                    if kind == "crash" {
                        // The process ends itself right after this record.
                        let p = w.procs.entry(proc).or_default();
                        p.killed_at = Some(p.killed_at.map_or(t, |k| k.min(t)));
                    }
                    ends.insert(run, (t, kind));
                }
                _ => {}
            }
        }
    }
    for (run, mut e) in starts {
        match ends.remove(&run) {
            Some((t, kind)) => {
                e.end = t;
                e.kind = kind;
            }
            None => {
                let p = w.procs.get(&e.proc);
                match p.and_then(|p| p.killed_at) {
                    Some(k) => {
                        e.end = k;
                        e.kind = "killed".into();
                    }
                    None => {
                        e.end = p.and_then(|p| p.gone_at).unwrap_or(w.end);
                        e.kind = "unended".into();
                    }
                }
            }
        }
        w.execs.push(e);
    }
    if !ends.is_empty() {
        report
            .notes
            .push(format!("{} end records without a start record", ends.len()));
    }
    w.execs
        .sort_by(|a, b| (a.start, &a.run).cmp(&(b.start, &b.run)));
    Ok(w)
}

pub fn check(inputs: Inputs<'_>) -> anyhow::Result<Report> {
    let mut report = Report::default();
    let w = read_world(inputs.dir, &mut report)?;
    report.instances = inputs.plans.len();
    report.executions = w.execs.len();

    check_steps(&w, inputs.plans, &mut report);
    check_limits(&w, inputs.plans, &mut report);
    check_queues(&w, &mut report);
    check_rates(&w, inputs.plans, &mut report);
    check_outcomes(&w, &inputs, &mut report);
    check_reruns(&w, &mut report);
    check_crash_loops(&w, inputs.plans, &mut report);
    check_gates(&inputs, &mut report);
    if report.bad_lines > 0 {
        report
            .notes
            .push(format!("{} log lines could not be read", report.bad_lines));
    }
    Ok(report)
}

/// The plan's step for an execution, if the instance and `n` exist.
fn planned<'p>(plans: &'p BTreeMap<i64, Plan>, e: &Exec) -> Option<&'p crate::plan::Step> {
    plans
        .get(&e.id)
        .and_then(|p| usize::try_from(e.n).ok().and_then(|n| p.steps.get(n)))
}

/// Every execution ran the step its state says comes next, in the queue,
/// under the key and rate-limit key the plan says, and ended.
fn check_steps(w: &World, plans: &BTreeMap<i64, Plan>, r: &mut Report) {
    for e in &w.execs {
        let mut wrong = Vec::new();
        match (plans.get(&e.id), planned(plans, e)) {
            (None, _) => wrong.push("an instance the controller never inserted".to_owned()),
            (Some(_), None) => wrong.push(format!("n = {} is past the plan's end", e.n)),
            (Some(p), Some(s)) => {
                let served = w.procs.get(&e.proc).map(|p| &p.queues);
                if served.is_some_and(|q| !q.contains(&e.queue)) {
                    wrong.push(format!(
                        "its node serves only {}",
                        served.map(|q| q.join(", ")).unwrap_or_default()
                    ));
                }
                if s.name != e.step {
                    wrong.push(format!("the plan's step {} is {}", e.n, s.name));
                }
                if p.queue != e.queue {
                    wrong.push(format!("the instance's queue is {}", p.queue));
                }
                if s.key != e.key {
                    wrong.push(format!(
                        "the plan holds key {}",
                        s.key.as_deref().unwrap_or("none")
                    ));
                }
                if s.rate != e.rate {
                    wrong.push(format!(
                        "the plan's rate-limit key is {}",
                        s.rate.as_deref().unwrap_or("none")
                    ));
                }
            }
        }
        if e.kind == "mismatch" && wrong.is_empty() {
            wrong.push("the step found its state inconsistent".into());
        }
        if !wrong.is_empty() {
            r.wrong_steps += 1;
            r.violations.push(format!(
                "wrong step: {}\n    {}",
                w.describe(e),
                wrong.join("; ")
            ));
        }
        if e.kind == "unended" {
            r.unended += 1;
            r.violations.push(format!(
                "step never ended while its process lived: {}",
                w.describe(e)
            ));
        }
    }
}

/// Sweep one set of intervals against a limit. `apart(e)` tells whether an
/// execution may exceed it (its node was stopped past the lease during it).
/// Returns incidents: (from, to, involved, fails).
fn sweep(
    execs: &[&Exec],
    limit: usize,
    apart: impl Fn(&Exec) -> bool,
) -> Vec<(u64, u64, Vec<usize>, bool)> {
    // Ends sort before starts at the same instant.
    let mut events: Vec<(u64, u8, usize)> = Vec::with_capacity(execs.len() * 2);
    for (i, e) in execs.iter().enumerate() {
        events.push((e.start, 1, i));
        // A process can record a start after the crash record that ends it.
        events.push((e.end.max(e.start + 1), 0, i));
    }
    events.sort_unstable();
    let mut active: BTreeSet<usize> = BTreeSet::new();
    let mut clean = 0usize;
    let mut incidents = Vec::new();
    let mut cur: Option<(u64, BTreeSet<usize>, bool)> = None;
    for (t, kind, i) in events {
        let counts = !apart(execs[i]);
        if kind == 1 {
            active.insert(i);
            clean += usize::from(counts);
            if active.len() > limit {
                let c = cur.get_or_insert_with(|| (t, BTreeSet::new(), false));
                c.1.extend(active.iter().copied());
                c.2 |= clean > limit;
            }
        } else {
            if active.remove(&i) {
                clean -= usize::from(counts);
            }
            if active.len() <= limit {
                if let Some((from, inv, fails)) = cur.take() {
                    incidents.push((from, t, inv.into_iter().collect(), fails));
                }
            }
        }
    }
    incidents
}

/// At most one step of a K = 1 key, at most the gate's limit of a gated
/// key, running at any moment.
fn check_limits(w: &World, plans: &BTreeMap<i64, Plan>, r: &mut Report) {
    let mut by_key: BTreeMap<String, Vec<&Exec>> = BTreeMap::new();
    for e in &w.execs {
        if let Some(k) = planned(plans, e).and_then(|s| s.key.clone()) {
            by_key.entry(k).or_default().push(e);
        }
    }
    for (key, execs) in by_key {
        let limit = settings::key_limit(&key) as usize;
        let apart = |e: &Exec| w.stopped_past_lease(e.proc, e.start, e.end).is_some();
        for (from, to, involved, fails) in sweep(&execs, limit, apart) {
            let secs = (to - from) as f64 / 1e9;
            if !fails {
                r.apart.push(secs);
                continue;
            }
            r.overlaps += 1;
            let mut msg = format!(
                "overlap on {key} (limit {limit}): more than {limit} running for {secs:.3} s from {} s",
                w.secs(from)
            );
            for &i in &involved {
                let _ = write!(msg, "\n    {}", w.describe(execs[i]));
            }
            let procs: Vec<u32> = involved.iter().map(|&i| execs[i].proc).collect();
            msg.push_str(&w.context(&procs, from, to));
            r.violations.push(msg);
        }
    }
}

/// No node runs more steps of a queue at once than its concurrency.
fn check_queues(w: &World, r: &mut Report) {
    let mut by: BTreeMap<(u32, String), Vec<&Exec>> = BTreeMap::new();
    for e in &w.execs {
        by.entry((e.proc, e.queue.clone())).or_default().push(e);
    }
    for ((proc, queue), execs) in by {
        let Some(limit) = settings::queue_limit(&queue) else {
            continue;
        };
        for (from, to, involved, _) in sweep(&execs, limit as usize, |_| false) {
            r.queue_overruns += 1;
            let mut msg = format!(
                "queue {queue} over its concurrency {limit} on proc {proc} for {:.3} s from {} s",
                (to - from) as f64 / 1e9,
                w.secs(from)
            );
            for &i in &involved {
                let _ = write!(msg, "\n    {}", w.describe(execs[i]));
            }
            r.violations.push(msg);
        }
    }
}

/// Rate limits: the documented bound is at most `limit + burst - 1` starts
/// of one key in any window of one period (GCRA, checked in the claim).
/// The observer sees starts, which lag their claims by up to
/// `RATE_LAG_NS`, so it checks the bound over every window of one period
/// minus that lag: starts in such a window were claimed within one period.
fn check_rates(w: &World, plans: &BTreeMap<i64, Plan>, r: &mut Report) {
    let bound = (RATE_LIMIT + RATE_BURST - 1) as usize;
    let period = RATE_PERIOD.as_nanos() as u64;
    let window = period - RATE_LAG_NS;
    r.rate_bound = bound;
    let mut by_key: BTreeMap<String, Vec<&Exec>> = BTreeMap::new();
    for e in &w.execs {
        if let Some(k) = planned(plans, e).and_then(|s| s.rate.clone()) {
            by_key.entry(k).or_default().push(e);
        }
    }
    for (key, execs) in by_key {
        let starts: Vec<u64> = execs.iter().map(|e| e.start).collect();
        let (mut j, mut jf) = (0, 0);
        let mut reported_until = 0u64;
        for i in 0..starts.len() {
            while j < starts.len() && starts[j] < starts[i] + window {
                j += 1;
            }
            while jf < starts.len() && starts[jf] < starts[i] + period {
                jf += 1;
            }
            r.rate_max_full = r.rate_max_full.max(jf - i);
            let count = j - i;
            r.rate_max = r.rate_max.max(count);
            if count > bound && starts[i] >= reported_until {
                reported_until = starts[i] + window;
                r.rate_violations += 1;
                let mut msg = format!(
                    "rate limit {key}: {count} starts in {:.3} s from {} s (bound {bound} per {:.1} s)",
                    window as f64 / 1e9,
                    w.secs(starts[i]),
                    period as f64 / 1e9
                );
                for e in &execs[i..j] {
                    let _ = write!(msg, "\n    {}", w.describe(e));
                }
                r.violations.push(msg);
            }
        }
    }
}

/// Every instance completed exactly as planned, and no step's outcome was
/// applied twice: the runs each state names, and the parents the steps saw,
/// leave one applied execution per step.
fn check_outcomes(w: &World, inputs: &Inputs<'_>, r: &mut Report) {
    let by_run: HashMap<&str, &Exec> = w.execs.iter().map(|e| (e.run.as_str(), e)).collect();
    // The applied executions of each (instance, n) that later records show.
    let mut applied: BTreeMap<(i64, i64), BTreeSet<String>> = BTreeMap::new();
    for e in &w.execs {
        if let Some(p) = &e.parent {
            applied
                .entry((e.id, e.n - 1))
                .or_default()
                .insert(p.clone());
        }
    }
    for (&id, plan) in inputs.plans {
        let Some(row) = inputs.finals.get(&id) else {
            r.lost += 1;
            r.violations
                .push(format!("lost: instance {id} ({}) has no row", plan.uid));
            continue;
        };
        let names: Vec<&str> = row.state["path"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let runs: Vec<&str> = row.state["runs"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let n = row.state["n"].as_i64().unwrap_or(-1);
        for (i, run) in runs.iter().enumerate() {
            applied
                .entry((id, i as i64))
                .or_default()
                .insert((*run).to_owned());
        }
        let (status, want) = plan.expected();
        let as_planned = row.status == status
            && names == want
            && n == want.len() as i64
            && runs.len() == want.len();
        if as_planned {
            r.completed_as_planned += 1;
            continue;
        }
        if discarded_by_deaths(w, id, plan, row, &names, &want) {
            r.discarded_by_deaths += 1;
            continue;
        }
        let twice = {
            let mut seen = BTreeSet::new();
            !names.iter().all(|s| seen.insert(*s))
        };
        let what = if twice || names.len() > want.len() {
            r.double_outcomes += 1;
            "outcome applied twice"
        } else {
            r.lost += 1;
            "lost"
        };
        let last_error = row
            .errors
            .as_array()
            .and_then(|a| a.last())
            .map(|e| e.to_string())
            .unwrap_or_default();
        r.violations.push(format!(
            "{what}: instance {id} ({}) is {} at step {} with path {:?} (n = {n}), planned {status} with {:?}; {} errors recorded{}",
            plan.uid,
            row.status,
            row.step,
            names,
            want,
            row.errors.as_array().map_or(0, Vec::len),
            if last_error.is_empty() { String::new() } else { format!(", the last: {last_error}") }
        ));
    }
    for ((id, n), runs) in applied {
        let mut bad = Vec::new();
        for run in &runs {
            match by_run.get(run.as_str()) {
                None => bad.push(format!("run {run} is in no log")),
                Some(e) if e.id != id || e.n != n => {
                    bad.push(format!("run {run} executed instance {} n={}", e.id, e.n))
                }
                Some(e) if !matches!(e.kind.as_str(), "next" | "await" | "done") => {
                    bad.push(format!("run {run} ended {}, not with a transition", e.kind))
                }
                Some(_) => {}
            }
        }
        if runs.len() > 1 || !bad.is_empty() {
            r.double_outcomes += 1;
            let mut msg = format!(
                "outcomes of instance {id} step n={n}: applied {} time(s) ({})",
                runs.len(),
                runs.iter().cloned().collect::<Vec<_>>().join(", ")
            );
            for b in bad {
                let _ = write!(msg, "\n    {b}");
            }
            for run in &runs {
                if let Some(e) = by_run.get(run.as_str()) {
                    let _ = write!(msg, "\n    {}", w.describe(e));
                }
            }
            r.violations.push(msg);
        }
    }
    if !inputs.strangers.is_empty() {
        r.violations.push(format!(
            "rows nobody inserted: {:?}",
            &inputs.strangers[..inputs.strangers.len().min(20)]
        ));
    }
}

/// An attempt lost to its node's death counts (that is what ends a crash
/// loop), so a step that shared its process with a poison pill, or with
/// kills, or ran as Postgres went down past the lease, `max_attempts` times
/// in a row (error outcomes count too) is discarded: allowed when the
/// instance followed its plan up to that step and each of the step's last
/// `max_attempts` executions ended with an error outcome or with its node
/// presumed dead, one at least with a death.
fn discarded_by_deaths(
    w: &World,
    id: i64,
    plan: &Plan,
    row: &FinalRow,
    names: &[&str],
    want: &[&str],
) -> bool {
    let max = plan
        .max_attempts
        .unwrap_or(gendurable::DEFAULT_MAX_ATTEMPTS) as usize;
    let n = names.len();
    if row.status != "discarded" || n >= want.len() || names != &want[..n] {
        return false;
    }
    if row.step != want[n] || row.state["n"].as_i64() != Some(n as i64) {
        return false;
    }
    let runs: Vec<&Exec> = w
        .execs
        .iter()
        .filter(|e| e.id == id && e.n == n as i64)
        .collect();
    // Attempts claimed by a node that died before the step began (no start
    // record): the reaper recorded each as lost, and each used an attempt.
    let unstarted = row.errors.as_array().map_or(0, |errors| {
        errors
            .iter()
            .filter(|e| {
                e["kind"] == "lost"
                    && e["step"] == want[n]
                    && !runs
                        .iter()
                        .any(|r| e["attempt"].as_i64() == Some(r.attempt as i64))
                    && e["node"]
                        .as_str()
                        .is_some_and(|node| w.node_went_down(node))
            })
            .count()
    });
    if runs.len() + unstarted < max {
        return false;
    }
    let last = &runs[runs.len().saturating_sub(max - unstarted.min(max))..];
    let died = |e: &Exec| e.kind == "killed" || w.presumed_dead(e);
    (unstarted > 0 || last.iter().any(|e| died(e))) && last.iter().all(|e| died(e) || is_error(e))
}

/// An execution that ended with an error outcome (retried, its attempt
/// counted).
fn is_error(e: &Exec) -> bool {
    matches!(e.kind.as_str(), "error" | "err" | "panic" | "aborted")
}

/// A step (instance, n) runs again only after an error outcome or a
/// presumed death the records show: the earlier execution's process was
/// SIGKILLed, or stopped past the lease, or its node cut off from Postgres
/// past the lease, or Postgres was down longer than the lease, between the
/// two starts.
fn check_reruns(w: &World, r: &mut Report) {
    let mut by: BTreeMap<(i64, i64), Vec<&Exec>> = BTreeMap::new();
    for e in &w.execs {
        by.entry((e.id, e.n)).or_default().push(e);
    }
    for execs in by.values() {
        for pair in execs.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let cause: Option<&'static str> = if is_error(a) {
                Some("after an error outcome")
            } else if a.kind == "mismatch" {
                Some("after a wrong step (reported above)")
            } else if a.kind == "crash" {
                Some("after a planned crash of its process")
            } else if w
                .procs
                .get(&a.proc)
                .and_then(|p| p.killed_at)
                // The kill is recorded as it is sent: a step may still
                // log its start before the signal lands.
                .is_some_and(|k| k + STOP_GRACE_NS >= a.start && k <= b.start)
            {
                Some("presumed death: killed or crashed")
            } else if w.stopped_past_lease(a.proc, a.start, b.start).is_some() {
                Some("presumed death: SIGSTOP past the lease")
            } else if w.stopped_past_lease(b.proc, b.start, b.start).is_some() {
                // The later run's node was stopped past its lease as it
                // started it: the stale start no lease can prevent.
                Some("a node stopped past the lease as it started the step")
            } else if w.cut_off_past_lease(a.proc, a.start, b.start).is_some() {
                Some("presumed death: cut off from Postgres past the lease")
            } else if w.long_outage(a.start, b.start).is_some() {
                Some("presumed death: Postgres down or frozen past the lease")
            } else if w
                .procs
                .get(&a.proc)
                .and_then(|p| p.term)
                .is_some_and(|(t, gone)| {
                    t >= a.start && t <= b.start && w.unreachable(a.proc, t, gone)
                })
            {
                // Its outcome could not be written before the process went.
                Some("shut down while Postgres was out of reach")
            } else {
                None
            };
            match cause {
                Some(c) => *r.reruns.entry(c).or_default() += 1,
                None => {
                    r.unexplained_reruns += 1;
                    let mut msg = format!(
                        "step ran again without cause: instance {} n={}\n    {}\n    {}",
                        a.id,
                        a.n,
                        w.describe(a),
                        w.describe(b)
                    );
                    msg.push_str(&w.context(&[a.proc, b.proc], a.start, b.start));
                    r.violations.push(msg);
                }
            }
        }
    }
}

/// After quiescence every gate counter is full (capacity minus no executing
/// rows) or deleted as idle, and nothing executes.
fn check_gates(inputs: &Inputs<'_>, r: &mut Report) {
    let mut capacity: BTreeMap<&str, i32> = BTreeMap::new();
    for g in &inputs.gates {
        *capacity.entry(g.key.as_str()).or_default() += g.capacity;
        if g.available != g.capacity {
            r.gate_mismatches += 1;
            r.violations.push(format!(
                "gate counter {} shard {}: available {} of capacity {} with nothing executing",
                g.key, g.shard, g.available, g.capacity
            ));
        }
    }
    for (key, cap) in capacity {
        if cap != GATE_LIMIT as i32 {
            r.gate_mismatches += 1;
            r.violations.push(format!(
                "gate {key}: its counters' capacities add up to {cap}, not {GATE_LIMIT}"
            ));
        }
    }
    if inputs.executing > 0 {
        r.gate_mismatches += 1;
        r.violations.push(format!(
            "{} rows still executing after quiescence",
            inputs.executing
        ));
    }
}

/// A step that ends its process on every attempt runs at most
/// `max_attempts` times, and once more at most: every claim counts an
/// attempt, whoever gives the row back afterwards, but a successor starts
/// before the promotion that counts its attempt commits; the reservation
/// taken back from its dead node is marked cautious and starts only once
/// claimed from then on (docs/concurrency.md), so one run of a step may go
/// uncounted.
fn check_crash_loops(w: &World, plans: &BTreeMap<i64, Plan>, r: &mut Report) {
    for (&id, plan) in plans {
        let (Some(c), Some(max)) = (plan.crash_at(), plan.max_attempts) else {
            continue;
        };
        let runs: Vec<&Exec> = w
            .execs
            .iter()
            .filter(|e| e.id == id && e.n == c as i64)
            .collect();
        if runs.len() > max as usize + 1 {
            r.crash_loops += 1;
            let mut msg = format!(
                "crash loop: instance {id} ({}) ran its poison step {} times, max_attempts {max}",
                plan.uid,
                runs.len()
            );
            for e in runs.iter().take(8) {
                let _ = write!(msg, "\n    {}", w.describe(e));
            }
            r.violations.push(msg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(run: &str, proc: u32, start: u64, end: u64) -> Exec {
        Exec {
            run: run.into(),
            proc,
            pid: 1,
            node: "n1".into(),
            id: 1,
            step: "s0".into(),
            n: 0,
            attempt: 1,
            queue: "a".into(),
            key: Some("acct:1".into()),
            rate: None,
            parent: None,
            start,
            end,
            kind: "next".into(),
        }
    }

    #[test]
    fn an_overlap_is_one_incident() {
        let (a, b, c) = (
            exec("1.0", 1, 0, 10),
            exec("2.0", 2, 5, 20),
            exec("2.1", 2, 30, 40),
        );
        let incidents = sweep(&[&a, &b, &c], 1, |_| false);
        assert_eq!(incidents.len(), 1);
        let (from, to, involved, fails) = &incidents[0];
        assert_eq!((*from, *to, involved.len(), *fails), (5, 10, 2, true));
    }

    #[test]
    fn an_overlap_with_a_stopped_node_is_apart() {
        let (a, b) = (exec("1.0", 1, 0, 10), exec("2.0", 2, 5, 20));
        let incidents = sweep(&[&a, &b], 1, |e| e.proc == 1);
        assert_eq!(incidents.len(), 1);
        assert!(!incidents[0].3, "counted apart");
    }

    #[test]
    fn touching_and_empty_intervals_do_not_overlap() {
        let (a, b) = (exec("1.0", 1, 0, 10), exec("2.0", 2, 10, 20));
        // Ended before it started: its process died right after a crash record.
        let c = exec("3.0", 3, 25, 24);
        assert!(sweep(&[&a, &b, &c], 1, |_| false).is_empty());
        let incidents = sweep(&[&a, &b, &c], 0, |_| false);
        assert_eq!(incidents.len(), 3);
    }

    #[test]
    fn a_node_cut_off_past_the_lease_may_have_been_presumed_dead() {
        let lease = LEASE.as_nanos() as u64;
        let node = |name: &str| Proc {
            node: name.into(),
            ..Default::default()
        };
        let w = World {
            t0: 0,
            end: 10 * lease,
            execs: vec![],
            procs: HashMap::from([(1, node("n1")), (2, node("n2"))]),
            outages: vec![],
            freezes: vec![],
            cuts: vec![],
            cut_offs: vec![("n1".into(), lease, 2 * lease + 1)],
        };
        assert!(w.presumed_dead(&exec("1.0", 1, lease / 2, lease)));
        assert!(
            !w.presumed_dead(&exec("2.0", 2, lease / 2, lease)),
            "another node"
        );
        let long_after = exec("1.1", 1, 5 * lease, 5 * lease + 1);
        assert!(
            !w.presumed_dead(&long_after),
            "after it reached Postgres again"
        );
    }

    /// A node cut off again while cut off stays so from the first cut to
    /// the first reconnect (the proxy keeps one set of cut-off nodes); the
    /// second cut-off's own reconnect finds it reconnected.
    #[test]
    fn a_second_cut_off_of_a_node_keeps_the_first_ones_start() {
        let dir = std::env::temp_dir().join(format!("chaos-cut-offs-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("nodes")).unwrap();
        let _ = std::fs::remove_file(dir.join("controller.log"));
        let rec = crate::record::Recorder::open(&dir.join("controller.log")).unwrap();
        let node = || "n2".to_string();
        for (t, cut) in [(10, true), (20, true), (30, false), (40, false)] {
            rec.write(&match cut {
                true => Record::CutOff { t, node: node() },
                false => Record::Reconnect { t, node: node() },
            });
        }
        let w = read_world(&dir, &mut Report::default()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(w.cut_offs, vec![(node(), 10, 30)]);
    }

    #[test]
    fn gates_allow_their_limit() {
        let runs: Vec<Exec> = (0..4).map(|i| exec(&format!("1.{i}"), 1, i, 100)).collect();
        let refs: Vec<&Exec> = runs.iter().collect();
        let incidents = sweep(&refs[..3], 3, |_| false);
        assert!(incidents.is_empty());
        let incidents = sweep(&refs, 3, |_| false);
        assert_eq!(incidents.len(), 1);
        assert_eq!(incidents[0].2.len(), 4);
    }

    #[test]
    fn a_step_whose_every_attempt_died_with_its_process_may_be_discarded() {
        use rand::SeedableRng;
        let mut plan = Plan::poison(&mut rand::rngs::StdRng::seed_from_u64(1), "p".into(), "r");
        while plan.steps.len() < 3 {
            let mut extra = plan.steps[0].clone();
            extra.name = format!("s{}", plan.steps.len());
            plan.steps.insert(0, extra);
        }
        for (i, s) in plan.steps.iter_mut().enumerate() {
            s.name = format!("s{i}");
        }
        let (_, want) = plan.expected();
        assert_eq!(want, ["s0", "s1"]);
        let row = FinalRow {
            status: "discarded".into(),
            step: "s1".into(),
            state: serde_json::json!({"path": ["s0"], "n": 1}),
            errors: serde_json::json!([]),
        };
        let world = |kinds: &[&str]| World {
            t0: 0,
            end: 100,
            execs: kinds
                .iter()
                .enumerate()
                .map(|(i, k)| Exec {
                    id: 1,
                    n: 1,
                    attempt: i as i32 + 1,
                    kind: (*k).into(),
                    ..exec(&format!("{i}.0"), i as u32, i as u64, i as u64 + 1)
                })
                .collect(),
            procs: HashMap::new(),
            outages: vec![],
            freezes: vec![],
            cuts: vec![],
            cut_offs: vec![],
        };
        let allowed =
            |kinds: &[&str]| discarded_by_deaths(&world(kinds), 1, &plan, &row, &["s0"], &want);
        assert!(allowed(&["killed", "killed", "killed"]));
        assert!(allowed(&["error", "killed", "killed", "killed"]));
        assert!(!allowed(&["killed", "killed"]), "attempts left");
        assert!(
            allowed(&["killed", "error", "killed"]),
            "an error outcome uses an attempt too"
        );
        assert!(!allowed(&["error", "error", "error"]), "no death");
        assert!(
            !allowed(&["next", "killed", "killed"]),
            "an outcome not lost"
        );
        // The last attempt claimed by a node killed before the step began
        // (seed 353): no start record, the reaper's lost error.
        let unstarted = FinalRow {
            errors: serde_json::json!([{"kind": "lost", "step": "s1", "attempt": 3, "node": "n1"}]),
            ..row.clone()
        };
        let mut w = world(&["error", "error"]);
        let check = |w: &World| discarded_by_deaths(w, 1, &plan, &unstarted, &["s0"], &want);
        assert!(!check(&w), "no process of n1 went down");
        w.procs.insert(
            7,
            Proc {
                node: "n1".into(),
                killed_at: Some(50),
                ..Default::default()
            },
        );
        assert!(check(&w));
        let second = FinalRow {
            errors: serde_json::json!([{"kind": "lost", "step": "s1", "attempt": 2, "node": "n1"}]),
            ..row.clone()
        };
        assert!(
            !discarded_by_deaths(&w, 1, &plan, &second, &["s0"], &want),
            "attempt 2 ran (its error outcome is recorded): an attempt left"
        );
        // The last ended, but Postgres went down past the lease before its
        // outcome was written (seed 229): its node was presumed dead.
        let mut w = world(&["error", "error", "next"]);
        w.outages = vec![(2, 2 + 2 * LEASE.as_nanos() as u64)];
        assert!(discarded_by_deaths(&w, 1, &plan, &row, &["s0"], &want));
        w.outages = vec![(2, 3)];
        assert!(
            !discarded_by_deaths(&w, 1, &plan, &row, &["s0"], &want),
            "an outage shorter than the lease"
        );
        assert!(!discarded_by_deaths(
            &world(&["killed"; 3]),
            1,
            &plan,
            &row,
            &[],
            &want
        ));
    }
}
