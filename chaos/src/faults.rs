//! Faults: node processes SIGKILLed and restarted (sometimes under the same
//! node id), SIGSTOPped past the lease and continued, nodes cut off from
//! Postgres past the lease (the proxy stalls their connections) while the
//! others reach it, Postgres crashed (immediate stop) and started again,
//! connections cut by the proxy. The
//! schedule is drawn from the seed; every fault is recorded on the shared
//! clock in the controller's log.

use crate::proxy::{End, Proxy};
use crate::record::{now, Record, Recorder};
use crate::settings::LEASE;
use anyhow::Context;
use gendurable_testing::{StopMode, TempPostgres};
use rand::rngs::StdRng;
use rand::Rng;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

/// Faults injected so far.
#[derive(Default)]
pub struct Counts {
    pub kills: AtomicU32,
    /// Kills whose node came back under the same node id.
    pub same_id: AtomicU32,
    pub stops: AtomicU32,
    pub cut_offs: AtomicU32,
    pub terms: AtomicU32,
    /// Node processes that exited on their own (planned crashes, or not).
    pub exits: AtomicU32,
    pub crashes: AtomicU32,
    /// Crashes with Postgres down longer than the lease.
    pub long_crashes: AtomicU32,
    pub longest_outage_ms: AtomicU64,
    /// Postgres frozen (SIGSTOP) past the lease.
    pub freezes: AtomicU32,
}

/// One planned fault.
#[derive(Debug, Clone)]
pub enum Fault {
    Kill {
        node: usize,
        same_id: bool,
        down: Duration,
    },
    Stop {
        node: usize,
        hold: Duration,
    },
    /// The node's connections stall, and so does every one it opens, for
    /// `hold` (past the lease): its host cut off from Postgres, the other
    /// nodes not.
    CutOff {
        node: usize,
        hold: Duration,
    },
    Crash {
        outage: Duration,
    },
    /// Every Postgres process SIGSTOPped for `outage` (past the lease), then
    /// continued: the server does not restart, so nothing holds the reaper
    /// back once it answers again.
    Freeze {
        outage: Duration,
    },
    /// SIGTERM: a graceful shutdown (running steps past the shutdown
    /// timeout are aborted), then a restart under the same id.
    Term {
        node: usize,
        down: Duration,
    },
}

/// The faults of a run, at offsets from its start: one every 2.5 to 5 s, and
/// at least one kill restarted under the same id, one stop, one node cut
/// off, one crash with an outage longer than the lease and one freeze.
pub fn schedule(rng: &mut StdRng, duration: Duration, nodes: usize) -> Vec<(Duration, Fault)> {
    let mut out = Vec::new();
    let end = duration.as_secs_f64() - 4.0;
    let mut t = rng.gen_range(2.0..4.0);
    while t < end {
        let node = rng.gen_range(0..nodes);
        let coin = rng.gen_bool(0.5);
        let fault = match rng.gen_range(0..100) {
            0..=34 => kill(rng, node, coin),
            35..=52 => stop(rng, node),
            53..=59 => cut_off(rng, node),
            60..=69 => Fault::Term {
                node,
                down: Duration::from_millis(rng.gen_range(100..1000)),
            },
            70..=94 => crash(rng, coin),
            _ => freeze(rng),
        };
        out.push((Duration::from_secs_f64(t), fault));
        t += rng.gen_range(2.5..5.0);
    }
    // The faults every run must have, added at random times when missing.
    let (a, b) = (rng.gen_range(0..nodes), rng.gen_range(0..nodes));
    let kill_same = kill(rng, a, true);
    let stop_one = stop(rng, b);
    let long_crash = crash(rng, true);
    let cut_one = cut_off(rng, a);
    let freeze_one = freeze(rng);
    for must in [kill_same, stop_one, long_crash, cut_one, freeze_one] {
        let present = out.iter().any(|(_, f)| match (&must, f) {
            (Fault::Kill { .. }, Fault::Kill { same_id, .. }) => *same_id,
            (Fault::Stop { .. }, Fault::Stop { .. }) => true,
            (Fault::CutOff { .. }, Fault::CutOff { .. }) => true,
            (Fault::Freeze { .. }, Fault::Freeze { .. }) => true,
            (Fault::Crash { .. }, Fault::Crash { outage }) => *outage > LEASE,
            _ => false,
        });
        if !present {
            let at = rng.gen_range(2.0..end.max(3.0));
            out.push((Duration::from_secs_f64(at), must));
        }
    }
    out.sort_by_key(|(at, _)| *at);
    out
}

fn kill(rng: &mut StdRng, node: usize, same_id: bool) -> Fault {
    Fault::Kill {
        node,
        same_id,
        down: Duration::from_millis(rng.gen_range(200..1500)),
    }
}

fn stop(rng: &mut StdRng, node: usize) -> Fault {
    Fault::Stop {
        node,
        hold: LEASE + Duration::from_millis(rng.gen_range(1000..3000)),
    }
}

fn cut_off(rng: &mut StdRng, node: usize) -> Fault {
    Fault::CutOff {
        node,
        hold: LEASE + Duration::from_millis(rng.gen_range(1000..3000)),
    }
}

fn freeze(rng: &mut StdRng) -> Fault {
    Fault::Freeze {
        outage: LEASE + Duration::from_millis(rng.gen_range(1000..2000)),
    }
}

fn crash(rng: &mut StdRng, long: bool) -> Fault {
    let outage = if long {
        LEASE + Duration::from_millis(rng.gen_range(1000..2000))
    } else {
        Duration::from_millis(rng.gen_range(200..600))
    };
    Fault::Crash { outage }
}

/// The node processes.
pub struct Fleet {
    exe: PathBuf,
    dir: PathBuf,
    rec: Arc<Recorder>,
    proxy: Arc<Proxy>,
    slots: Vec<Slot>,
    procs: u32,
}

struct Slot {
    base: String,
    id: String,
    queues: Vec<&'static str>,
    restarts: u32,
    state: State,
}

enum State {
    Running(Proc),
    Stopped(Proc),
    Dead,
}

struct Proc {
    no: u32,
    pid: u32,
    child: Child,
}

impl Fleet {
    pub fn new(
        dir: PathBuf,
        rec: Arc<Recorder>,
        proxy: Arc<Proxy>,
        nodes: usize,
    ) -> anyhow::Result<Fleet> {
        let exe = std::env::current_exe().context("finding this program's path")?;
        let slots = (1..=nodes)
            .map(|i| Slot {
                base: format!("n{i}"),
                id: format!("n{i}"),
                queues: crate::settings::node_queues(i - 1),
                restarts: 0,
                state: State::Dead,
            })
            .collect();
        Ok(Fleet {
            exe,
            dir,
            rec,
            proxy,
            slots,
            procs: 0,
        })
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Start node `i`, under its current id or a new one.
    pub fn spawn(&mut self, i: usize, same_id: bool) -> anyhow::Result<()> {
        let slot = &mut self.slots[i];
        if !same_id {
            slot.restarts += 1;
            slot.id = format!("{}r{}", slot.base, slot.restarts);
        }
        self.procs += 1;
        let no = self.procs;
        let log = self.dir.join(format!("{no:03}-{}.log", slot.id));
        let err = self.dir.join(format!("{no:03}-{}.err", slot.id));
        let out =
            std::fs::File::create(&err).with_context(|| format!("creating {}", err.display()))?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("node")
            .args(["--url", &self.proxy.url(&slot.id)])
            .args(["--schema", crate::settings::SCHEMA])
            .args(["--node-id", &slot.id])
            .arg("--log")
            .arg(&log)
            .args(["--proc", &no.to_string()])
            .args(["--queues", &slot.queues.join(",")])
            // Every other node answers its steps as the bindings do.
            .args((i % 2 == 1).then_some("--hand-over"))
            .stdin(Stdio::piped())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe; nothing else runs in the child
        // before exec.
        unsafe {
            cmd.pre_exec(|| {
                // Die with the controller (the thread that spawned us: a
                // runtime worker, alive as long as the controller).
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().context("starting a node process")?;
        let pid = child.id().unwrap_or(0);
        self.rec.write(&Record::Spawn {
            t: now(),
            proc: no,
            pid,
            node: slot.id.clone(),
            queues: slot.queues.iter().map(|q| q.to_string()).collect(),
            log: log.display().to_string(),
        });
        slot.state = State::Running(Proc { no, pid, child });
        Ok(())
    }

    /// The nodes running now (not stopped, not dead).
    pub fn running(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| matches!(self.slots[i].state, State::Running(_)))
            .collect()
    }

    /// SIGKILL node `i`; returns once the process is gone.
    pub async fn kill(&mut self, i: usize) -> bool {
        let slot = &mut self.slots[i];
        let State::Running(mut p) = std::mem::replace(&mut slot.state, State::Dead) else {
            return false;
        };
        let t = now();
        signal(p.pid, libc::SIGKILL);
        let _ = p.child.wait().await;
        self.rec.write(&Record::Kill {
            t,
            proc: p.no,
            pid: p.pid,
            node: slot.id.clone(),
            dead: now(),
        });
        true
    }

    /// SIGSTOP node `i`; returns the process number once it is stopped.
    pub async fn stop(&mut self, i: usize) -> Option<u32> {
        let slot = &mut self.slots[i];
        let State::Running(p) = std::mem::replace(&mut slot.state, State::Dead) else {
            // Not running: leave it as it was.
            return None;
        };
        signal(p.pid, libc::SIGSTOP);
        for _ in 0..500 {
            if is_stopped(p.pid) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        self.rec.write(&Record::Stop {
            t: now(),
            proc: p.no,
            pid: p.pid,
            node: slot.id.clone(),
        });
        let no = p.no;
        slot.state = State::Stopped(p);
        Some(no)
    }

    /// SIGCONT node `i` if it is still process `no`, stopped.
    pub fn cont(&mut self, i: usize, no: u32) {
        let slot = &mut self.slots[i];
        if !matches!(&slot.state, State::Stopped(p) if p.no == no) {
            return;
        }
        let State::Stopped(p) = std::mem::replace(&mut slot.state, State::Dead) else {
            return;
        };
        self.rec.write(&Record::Cont {
            t: now(),
            proc: p.no,
            pid: p.pid,
            node: slot.id.clone(),
        });
        signal(p.pid, libc::SIGCONT);
        slot.state = State::Running(p);
    }

    /// SIGTERM node `i` (continued first if stopped) and wait for it to go,
    /// SIGKILL after `grace`.
    pub async fn term(&mut self, i: usize, grace: Duration) -> bool {
        let slot = &mut self.slots[i];
        let mut p = match std::mem::replace(&mut slot.state, State::Dead) {
            State::Running(p) => p,
            State::Stopped(p) => {
                self.rec.write(&Record::Cont {
                    t: now(),
                    proc: p.no,
                    pid: p.pid,
                    node: slot.id.clone(),
                });
                signal(p.pid, libc::SIGCONT);
                p
            }
            State::Dead => return false,
        };
        // `wait` closes the child's stdin, which a node takes as the
        // controller gone (it exits at once): kept open until it is gone.
        let stdin = p.child.stdin.take();
        let t = now();
        signal(p.pid, libc::SIGTERM);
        let graceful = tokio::time::timeout(grace, p.child.wait()).await.is_ok();
        drop(stdin);
        if !graceful {
            // It did not shut down in time: a kill, on the record as one.
            eprintln!(
                "node {} did not shut down within {grace:?}; killed",
                slot.id
            );
            let t = now();
            signal(p.pid, libc::SIGKILL);
            let _ = p.child.wait().await;
            self.rec.write(&Record::Kill {
                t,
                proc: p.no,
                pid: p.pid,
                node: slot.id.clone(),
                dead: now(),
            });
            return true;
        }
        self.rec.write(&Record::Term {
            t,
            proc: p.no,
            pid: p.pid,
            node: slot.id.clone(),
            dead: now(),
        });
        true
    }

    /// Cut node `i` off from Postgres; returns its node id.
    pub fn cut_off(&self, i: usize) -> String {
        let node = self.slots[i].id.clone();
        self.proxy.cut_off(&node);
        self.rec.write(&Record::CutOff {
            t: now(),
            node: node.clone(),
        });
        node
    }

    /// Let `node` reach Postgres again.
    pub fn reconnect(&self, node: &str) {
        self.proxy.reconnect(node);
        self.rec.write(&Record::Reconnect {
            t: now(),
            node: node.to_owned(),
        });
    }

    /// Whether node `i` is dead (killed, not restarted yet).
    pub fn is_dead(&self, i: usize) -> bool {
        matches!(self.slots[i].state, State::Dead)
    }

    /// Every node running: stopped ones continued, dead ones restarted.
    pub fn revive(&mut self) -> anyhow::Result<()> {
        for i in 0..self.slots.len() {
            match &self.slots[i].state {
                State::Stopped(p) => {
                    let no = p.no;
                    self.cont(i, no);
                }
                State::Dead => self.spawn(i, true)?,
                State::Running(_) => {}
            }
        }
        Ok(())
    }

    /// Restart nodes that exited on their own (a crash, not a fault of
    /// ours) under the same id; returns (node id, exit status) of each.
    pub fn restart_exited(&mut self) -> anyhow::Result<Vec<(String, std::process::ExitStatus)>> {
        let mut out = Vec::new();
        for i in 0..self.slots.len() {
            let slot = &mut self.slots[i];
            if let State::Running(p) = &mut slot.state {
                if let Ok(Some(status)) = p.child.try_wait() {
                    self.rec.write(&Record::Exit {
                        t: now(),
                        proc: p.no,
                        pid: p.pid,
                        node: slot.id.clone(),
                        status: status.to_string(),
                    });
                    out.push((slot.id.clone(), status));
                    slot.state = State::Dead;
                    self.spawn(i, true)?;
                }
            }
        }
        Ok(out)
    }

    /// Shut every node down (SIGTERM: a graceful shutdown), SIGKILL after
    /// `grace`.
    pub async fn terminate(&mut self, grace: Duration) {
        for i in 0..self.slots.len() {
            self.term(i, grace).await;
        }
    }

    /// SIGKILL every node now (the way out on errors and Ctrl-C).
    pub fn kill_all_now(&mut self) {
        for slot in &mut self.slots {
            if let State::Running(p) | State::Stopped(p) = &mut slot.state {
                signal(p.pid, libc::SIGKILL);
                let _ = p.child.start_kill();
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.kill_all_now();
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        if pid > 0 {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(pid, sig) };
        }
    }
}

/// Whether the process is in the stopped state (`T` in /proc/PID/stat).
fn is_stopped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
        .is_some_and(|c| c == 'T' || c == 't')
}

/// Crash Postgres (immediate stop), leave it down for `outage`, start it
/// again. Inserts wait meanwhile (they hold the same lock).
pub async fn crash_postgres(
    pg: &Mutex<TempPostgres>,
    rec: &Recorder,
    outage: Duration,
    counts: &Counts,
) -> anyhow::Result<()> {
    let mut pg = pg.lock().await;
    let t = now();
    rec.write(&Record::PgDown { t });
    pg.stop_with(StopMode::Immediate)
        .await
        .context("stopping Postgres (immediate mode)")?;
    tokio::time::sleep(outage).await;
    let mut tries = 0;
    loop {
        match pg.start_again().await {
            Ok(()) => break,
            Err(e) if tries < 5 => {
                tries += 1;
                eprintln!("starting Postgres again failed ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e).context("starting Postgres again after a crash"),
        }
    }
    let up = now();
    rec.write(&Record::PgUp { t: up });
    counts.crashes.fetch_add(1, Relaxed);
    let down = Duration::from_nanos(up - t);
    if down > LEASE {
        counts.long_crashes.fetch_add(1, Relaxed);
    }
    counts
        .longest_outage_ms
        .fetch_max(down.as_millis() as u64, Relaxed);
    Ok(())
}

/// End a random connection as `end` says every so often (exponential gaps
/// of mean `mean`).
pub async fn end_loop(proxy: Arc<Proxy>, mut rng: StdRng, mean: Duration, end: End) {
    loop {
        let u: f64 = rng.gen_range(1e-6..1.0);
        tokio::time::sleep(mean.mul_f64(-u.ln()).min(mean * 5)).await;
        proxy.end_one(&mut rng, end);
    }
}

/// Freeze Postgres for `outage`: its postmaster (first, so that it forks no
/// new backend) and every process it started get SIGSTOP, then SIGCONT.
/// Inserts wait meanwhile (they hold the same lock).
pub async fn freeze_postgres(
    pg: &Mutex<TempPostgres>,
    rec: &Recorder,
    outage: Duration,
    counts: &Counts,
) -> anyhow::Result<()> {
    let pg = pg.lock().await;
    let Some(postmaster) = pg.postmaster_pid() else {
        return Ok(());
    };
    signal(postmaster, libc::SIGSTOP);
    let children = children_of(postmaster);
    for &pid in &children {
        signal(pid, libc::SIGSTOP);
    }
    rec.write(&Record::PgFreeze { t: now() });
    tokio::time::sleep(outage).await;
    for &pid in &children {
        signal(pid, libc::SIGCONT);
    }
    signal(postmaster, libc::SIGCONT);
    rec.write(&Record::PgThaw { t: now() });
    counts.freezes.fetch_add(1, Relaxed);
    Ok(())
}

/// The processes whose parent is `parent` (from /proc).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let rest = stat.rsplit_once(')')?.1;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}
