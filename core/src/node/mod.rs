//! A running worker node: one picker per queue ([`picker`]), the steps it
//! runs ([`executor`]), the outcome writer ([`completer`]), which records
//! outcomes and claims again in one call ([`claims`]), the successors it
//! starts without a round trip ([`successors`]), the LISTEN task
//! ([`listener`]), heartbeats ([`heartbeat`]), the rate waker
//! ([`rate_waker`]) and the maintenance services ([`maintenance`]). Inserts
//! on this process start rows here through [`local`].

mod claims;
mod completer;
mod executor;
mod handover;
mod heartbeat;
mod listener;
mod liveness;
pub(crate) mod local;
pub(crate) mod maintenance;
mod picker;
mod prefetch;
mod rate_waker;
mod successors;

/// A step's run outside a node's executor (a drain in the calling task).
pub(crate) use claims::claim_connections;
pub(crate) use executor::{outcome_of, UserStep};
pub use handover::handover;

use crate::context::Context;
use crate::error::Result;
use crate::outcome::OutcomeRow;
use futures::future::AbortHandle;
use liveness::Liveness;
use picker::QueueWake;
use prefetch::{Prefetch, Smoothed};
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use successors::Successors;
use tokio::sync::{mpsc, Notify, RwLock, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(crate) struct Node {
    shared: Arc<Shared>,
    pickers: Vec<JoinHandle<()>>,
    background: Vec<JoinHandle<()>>,
    writer: JoinHandle<()>,
    writer_stop: CancellationToken,
    heartbeat: JoinHandle<()>,
    heartbeat_stop: CancellationToken,
}

pub(crate) struct Shared {
    ctx: Arc<Context>,
    shutdown: CancellationToken,
    wakes: HashMap<String, Arc<QueueWake>>,
    /// Per queue: rows this node may hold claimed (concurrency + prefetch).
    slots: HashMap<String, Arc<Semaphore>>,
    /// Per queue: steps running at once (concurrency).
    runs: HashMap<String, Arc<Semaphore>>,
    /// Per queue: how many of the claim permits beyond the free running
    /// slots to use now.
    prefetch: HashMap<String, Prefetch>,
    outcomes: mpsc::UnboundedSender<OutcomeRow>,
    /// The runtime the node's tasks run on (see `handover`).
    rt: tokio::runtime::Handle,
    steps: TaskTracker,
    running: StdMutex<HashMap<i64, Running>>,
    successors: StdMutex<Successors>,
    /// Wakes the writer when reserved rows are to be given back.
    writer_wake: Notify,
    /// Told of every claim of a rate-limited row (see `rate_waker`).
    rate_claimed: Notify,
    /// How long a handoff call takes, smoothed.
    call_time: Smoothed,
    /// Rows this node holds executing whose outcome is not written yet, by
    /// id, with the token of the claim.
    holding: StdMutex<HashMap<i64, i64>>,
    /// Whether this node may start work (its heartbeat is recent).
    live: Liveness,
    /// Calls that may claim hold it shared until their rows are in
    /// `holding`; the check for lost claims holds it alone.
    claiming: RwLock<()>,
    /// A claiming call failed (its commit may have happened without its
    /// answer reaching us), or the node just started: check for lost claims.
    check_lost: AtomicBool,
    /// The step counters as last added to `throughput`.
    throughput: tokio::sync::Mutex<maintenance::Recorded>,
}

/// A step running here: its claim token, a handle to stop it, why it was
/// stopped, and a token cancelled once it has ended.
struct Running {
    token: i64,
    abort: AbortHandle,
    stopped: Arc<StdMutex<Option<Stop>>>,
    ended: CancellationToken,
}

/// Why a running step was stopped before it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Its instance was cancelled: the outcome records the cancellation.
    Cancelled,
    /// The node's heartbeat lapsed: its rows may be rescued and run
    /// elsewhere. The outcome records an error (fenced if they were).
    Lapsed,
}

impl Running {
    /// Stop the step, saying why (the first reason given stays).
    fn stop(&self, why: Stop) {
        lock(&self.stopped).get_or_insert(why);
        self.abort.abort();
    }
}

impl Node {
    pub async fn start(ctx: Arc<Context>) -> Result<Node> {
        let cfg = &ctx.cfg;
        let live = Liveness::new(cfg.lease.saturating_sub(cfg.heartbeat_interval));
        let sent = Instant::now();
        ctx.pass()
            .call(async |c| heartbeat::beat(&ctx, c).await)
            .await?;
        live.renewed(sent);
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            rate_claimed: Notify::new(),
            shutdown: CancellationToken::new(),
            wakes: cfg
                .queues
                .keys()
                .map(|q| (q.clone(), Arc::new(QueueWake::default())))
                .collect(),
            slots: cfg
                .queues
                .iter()
                .map(|(q, &n)| {
                    let claims = n + cfg.prefetch_for(n);
                    (q.clone(), Arc::new(Semaphore::new(claims as usize)))
                })
                .collect(),
            runs: cfg
                .queues
                .iter()
                .map(|(q, &n)| (q.clone(), Arc::new(Semaphore::new(n as usize))))
                .collect(),
            prefetch: cfg
                .queues
                .iter()
                .map(|(q, &n)| (q.clone(), Prefetch::new(cfg.prefetch_for(n), n)))
                .collect(),
            outcomes: tx,
            rt: tokio::runtime::Handle::current(),
            steps: TaskTracker::new(),
            running: StdMutex::new(HashMap::new()),
            successors: StdMutex::new(Successors::default()),
            writer_wake: Notify::new(),
            throughput: Default::default(),
            call_time: Smoothed::default(),
            holding: StdMutex::new(HashMap::new()),
            live,
            claiming: RwLock::new(()),
            check_lost: AtomicBool::new(true),
            ctx: ctx.clone(),
        });
        // Warm the claim path's connections (their first call plans the
        // functions) while the start's maintenance runs: it claims nothing.
        let ((), start) = tokio::join!(claims::warm_up(&shared), async {
            // Rows still held under this node's id belong to a process that
            // ended (this one has claimed nothing yet): a crash is an attempt.
            maintenance::reap(&ctx, &mut ctx.pass(), Some(&cfg.node_id)).await?;
            // Counters minted under limits configured differently take this
            // node's before it claims anything.
            if let Err(e) = maintenance::reconcile_gates(&ctx).await {
                tracing::warn!(error = %e, "reconciling gate counters at start failed; the next pass retries");
            }
            Ok::<(), crate::Error>(())
        });
        start?;
        let writer_stop = CancellationToken::new();
        let writer = tokio::spawn(completer::write_outcomes(
            shared.clone(),
            rx,
            writer_stop.clone(),
        ));
        let pickers = cfg
            .queues
            .keys()
            .map(|q| {
                let (sh, q) = (shared.clone(), q.clone());
                supervised("picker", move || picker::picker(sh.clone(), q.clone()))
            })
            .collect();
        let heartbeat_stop = CancellationToken::new();
        let heartbeat = supervised("heartbeat", {
            let (sh, stop) = (shared.clone(), heartbeat_stop.clone());
            move || heartbeat::heartbeats(sh.clone(), stop.clone())
        });
        let mut background = vec![
            supervised("listener", {
                let sh = shared.clone();
                move || listener::listen(sh.clone())
            }),
            supervised("lapse watch", {
                let sh = shared.clone();
                move || heartbeat::stop_steps_when_lapsed(sh.clone())
            }),
            supervised("maintenance", {
                let sh = shared.clone();
                move || maintenance::maintain(sh.clone())
            }),
        ];
        if !cfg.rates.is_empty() {
            let sh = shared.clone();
            background.push(supervised("rate waker", move || {
                rate_waker::rate_waker(sh.clone())
            }));
        }
        Ok(Node {
            shared,
            pickers,
            background,
            writer,
            writer_stop,
            heartbeat,
            heartbeat_stop,
        })
    }

    /// This node's state, for inserts that start rows here (see [`local`]).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub async fn stop(self) -> Result<()> {
        let ctx = self.shared.ctx.clone();
        let sh = &self.shared;
        sh.shutdown.cancel();
        for p in self.pickers {
            let _ = p.await;
        }
        sh.steps.close();
        let timeout = ctx.cfg.shutdown_timeout;
        if tokio::time::timeout(timeout, sh.steps.wait())
            .await
            .is_err()
        {
            let running: Vec<AbortHandle> =
                lock(&sh.running).drain().map(|(_, r)| r.abort).collect();
            tracing::warn!(
                steps = running.len(),
                "shutdown timeout: aborting steps still running; they are recorded as errors"
            );
            for h in running {
                h.abort();
            }
            sh.steps.wait().await;
        }
        self.writer_stop.cancel();
        let _ = self.writer.await;
        // Between beats: a beat cut short could land after the row is gone.
        self.heartbeat_stop.cancel();
        let _ = self.heartbeat.await;
        for b in self.background {
            b.abort();
            let _ = b.await;
        }
        // The last steps' counts, on the dashboard's chart too.
        let mut recorded = sh.throughput.lock().await;
        let mut pass = ctx.pass();
        if let Err(e) = maintenance::record_throughput(&ctx, &mut pass, &mut recorded).await {
            tracing::debug!(error = %e, "recording throughput failed");
        }
        // Without our node row, anything left executing here is rescued at once.
        let node_id = &ctx.cfg.node_id;
        pass.call(async |c| ctx.store.forget_node(c, node_id).await)
            .await
    }
}

fn lock<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Run an engine task, restarting it if it panics (what it held, permits and
/// connections, went back as it unwound). It ends when `task` returns.
fn supervised<F, Fut>(name: &'static str, task: F) -> JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    use futures::FutureExt;
    tokio::spawn(async move {
        while let Err(panic) = std::panic::AssertUnwindSafe(task()).catch_unwind().await {
            tracing::error!(task = name, panic = %payload_message(&*panic), "engine task panicked; restarting it");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

impl Shared {
    /// Put a step on record as running here, if the node is live: one that
    /// may have been presumed dead starts nothing (its rows may run
    /// elsewhere already). Under the lock `stop_all_if_lapsed` takes, so no
    /// step starts after that stop without a heartbeat renewing the node.
    fn start_if_live(&self, id: i64, step: Running) -> bool {
        let mut running = lock(&self.running);
        let live = self.live.is_live();
        if live {
            running.insert(id, step);
        }
        live
    }

    /// Stop every running step if the node is not live (its heartbeat
    /// lapsed); returns how many.
    fn stop_all_if_lapsed(&self) -> usize {
        let running = lock(&self.running);
        if self.live.is_live() {
            return 0;
        }
        for r in running.values() {
            r.stop(Stop::Lapsed);
        }
        running.len()
    }

    /// An instance was cancelled: stop its step if it runs here. Its outcome,
    /// written as for any stopped step, records the cancellation.
    fn stop_cancelled(&self, id: i64) {
        if let Some(r) = lock(&self.running).get(&id) {
            tracing::debug!(id, "stopping a cancelled instance's step");
            r.stop(Stop::Cancelled);
        }
    }

    /// Update the successor bookkeeping; wakes the writer if rows are to be
    /// given back.
    fn successors<R>(&self, f: impl FnOnce(&mut Successors) -> R) -> R {
        let mut s = lock(&self.successors);
        let r = f(&mut s);
        if s.has_dangling() {
            self.writer_wake.notify_one();
        }
        r
    }

    /// Whether keyed rows claimed for `queue` should get successors reserved:
    /// the queue has idle running slots its last pick could not fill, so its
    /// keys, not the node, are the limit, and its steps last longer than a
    /// handoff call, so a slot idle for one call is worth saving.
    fn wants_successors(&self, queue: &str) -> bool {
        self.wakes[queue].is_short()
            && self.runs[queue].available_permits() > 0
            && self.prefetch[queue].step_time() > self.call_time.get()
    }

    /// The rows each queue's picker would claim now (none while the node
    /// may not start work).
    fn claim_room(&self) -> Vec<(&str, i32)> {
        if !self.live.is_live() {
            return Vec::new();
        }
        self.slots
            .iter()
            .map(|(q, slots)| {
                let free = self.prefetch[q].demand(slots.available_permits());
                (q.as_str(), free.min(i32::MAX as usize) as i32)
            })
            .collect()
    }

    fn wake_all(&self) {
        for w in self.wakes.values() {
            w.wake();
        }
    }
}

fn payload_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".into()
    }
}

/// Retry delays for a failing background statement: 50 ms doubling to 5 s.
struct Backoff(Duration);

impl Backoff {
    fn new() -> Self {
        Backoff(Duration::from_millis(50))
    }

    fn reset(&mut self) {
        self.0 = Duration::from_millis(50);
    }

    fn next(&mut self) -> Duration {
        let d = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(5));
        d
    }
}
