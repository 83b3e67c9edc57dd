//! A running worker node: pickers per queue, step tasks, the outcome writer,
//! the LISTEN task, the heartbeat and the maintenance loop (stager, reaper,
//! gate reconciler, pruning).

use crate::engine::Inner;
use crate::error::Result;
use crate::liveness::Liveness;
use crate::outcome::{Claimed, OutcomeRow, Promotion};
use crate::prefetch::{Prefetch, Smoothed};
use crate::stats::Stats;
use crate::successors::Successors;
use crate::transition::{Transition, Wake};
use crate::workflow::StepContext;
use sqlx::postgres::PgListener;
use sqlx::Row;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, Notify, OwnedSemaphorePermit, RwLock, Semaphore};
use tokio::task::{AbortHandle, JoinHandle};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Largest number of outcomes written by one statement.
const MAX_OUTCOME_BATCH: usize = 2000;
/// Outcome transactions in flight at once.
const WRITERS: usize = 2;
/// A call starts beside one in flight only with at least this many outcomes:
/// two concurrent calls let the database use both cores for large batches,
/// but small ones contend for the same rows and pages and gain nothing, so
/// they wait for the call in flight and grow meanwhile.
const PARALLEL_BATCH: usize = 64;
/// A pick locks a window of this many candidates per row wanted (plus 8):
/// rows one limit turns away leave room for the next ones.
const WINDOW_FACTOR: f64 = 1.0;
/// Rows the stager moves per statement.
const STAGE_BATCH: i64 = 10_000;
/// Finished rows pruned per maintenance pass.
const PRUNE_BATCH: i64 = 10_000;
/// Gate keys the reconciler sweeps per maintenance pass.
const RECONCILE_BATCH: i32 = 1000;
/// Keys (and rate-limit keys) with parked rows the sweep looks at per pass.
const UNPARK_BATCH: i32 = 1000;
/// Rows at the head of a queue looked at for workflows no live node runs,
/// per batch, and batches per pass at most.
const ORPHAN_BATCH: i32 = 1000;
const ORPHAN_PASSES: usize = 10;
/// Rows parked for their workflow taken back per (queue, workflow) per pass.
const UNPARK_WORKFLOW_BATCH: i32 = 10_000;

pub(crate) struct Node {
    shared: Arc<Shared>,
    pickers: Vec<JoinHandle<()>>,
    background: Vec<JoinHandle<()>>,
    writer: JoinHandle<()>,
    writer_stop: CancellationToken,
}

pub(crate) struct Shared {
    inner: Arc<Inner>,
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
    steps: TaskTracker,
    running: StdMutex<HashMap<i64, Running>>,
    successors: StdMutex<Successors>,
    /// Wakes the writer when reserved rows are to be given back.
    writer_wake: Notify,
    /// Told of every claim of a rate-limited row (see `rate_waker`).
    rate_claimed: Notify,
    /// How long a handoff call takes, smoothed.
    call_time: Smoothed,
    pick: PickParams,
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
}

/// A step running here: its claim token, a handle to stop it, and a token
/// cancelled once it has ended.
struct Running {
    token: i64,
    abort: AbortHandle,
    ended: CancellationToken,
}

/// The pick's configuration parameters, built once.
struct PickParams {
    workflows: Vec<String>,
    gate_names: Vec<String>,
    gate_limits: Vec<i32>,
    gate_shards: Vec<i32>,
    rate_names: Vec<String>,
    rate_intervals: Vec<f64>,
    rate_tolerances: Vec<f64>,
}

impl Node {
    pub async fn start(inner: Arc<Inner>) -> Result<Node> {
        let cfg = &inner.cfg;
        let live = Liveness::new(cfg.lease.saturating_sub(cfg.heartbeat_interval));
        let sent = Instant::now();
        heartbeat(&inner, &inner.pool).await?;
        live.renewed(sent);
        // Rows still held under this node's id belong to a process that
        // ended (this one has claimed nothing yet): a crash is an attempt.
        reap(&inner, Some(&cfg.node_id)).await?;
        // Counters minted under limits configured differently take this
        // node's before it claims anything.
        if let Err(e) = reconcile_gates(&inner).await {
            tracing::warn!(error = %e, "reconciling gate counters at start failed; the next pass retries");
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let pick = PickParams {
            workflows: inner.workflows.keys().cloned().collect(),
            gate_names: cfg.gates.keys().cloned().collect(),
            gate_limits: cfg.gates.values().map(|g| g.limit as i32).collect(),
            gate_shards: cfg.gate_shard_array(),
            rate_names: cfg.rates.keys().cloned().collect(),
            rate_intervals: cfg.rates.values().map(|r| r.interval_secs()).collect(),
            rate_tolerances: cfg.rates.values().map(|r| r.tolerance_secs()).collect(),
        };
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
                .map(|(q, &n)| (q.clone(), Prefetch::new(cfg.prefetch_for(n))))
                .collect(),
            outcomes: tx,
            steps: TaskTracker::new(),
            running: StdMutex::new(HashMap::new()),
            successors: StdMutex::new(Successors::default()),
            writer_wake: Notify::new(),
            call_time: Smoothed::default(),
            pick,
            holding: StdMutex::new(HashMap::new()),
            live,
            claiming: RwLock::new(()),
            check_lost: AtomicBool::new(true),
            inner: inner.clone(),
        });
        *lock(&inner.here) = Arc::downgrade(&shared);
        warm_up(&shared).await;
        let writer_stop = CancellationToken::new();
        let writer = tokio::spawn(write_outcomes(shared.clone(), rx, writer_stop.clone()));
        let pickers = cfg
            .queues
            .keys()
            .map(|q| {
                let (sh, q) = (shared.clone(), q.clone());
                supervised("picker", move || picker(sh.clone(), q.clone()))
            })
            .collect();
        let mut background = vec![
            supervised("heartbeat", {
                let sh = shared.clone();
                move || heartbeats(sh.clone())
            }),
            supervised("listener", {
                let sh = shared.clone();
                move || listen(sh.clone())
            }),
            supervised("maintenance", {
                let sh = shared.clone();
                move || maintain(sh.clone())
            }),
        ];
        if !cfg.rates.is_empty() {
            let sh = shared.clone();
            background.push(supervised("rate waker", move || rate_waker(sh.clone())));
        }
        Ok(Node {
            shared,
            pickers,
            background,
            writer,
            writer_stop,
        })
    }

    pub async fn stop(self, inner: &Inner) -> Result<()> {
        let sh = &self.shared;
        sh.shutdown.cancel();
        for p in self.pickers {
            let _ = p.await;
        }
        sh.steps.close();
        let timeout = inner.cfg.shutdown_timeout;
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
        for b in self.background {
            b.abort();
            let _ = b.await;
        }
        // Without our node row, anything left executing here is rescued at once.
        sqlx::query(&inner.sql.forget_node)
            .bind(&inner.cfg.node_id)
            .execute(&inner.pool)
            .await?;
        Ok(())
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

    fn wake_all(&self) {
        for w in self.wakes.values() {
            w.wake();
        }
    }
}

/// A queue's wake-ups, and whether its last pick came back short with
/// nothing new since: then the writer only hands over the keys its outcomes
/// free and skips the pick, which would only walk the same blocked rows again.
#[derive(Default)]
struct QueueWake {
    notify: Notify,
    /// Counts events that may have made rows runnable (wake-ups, polls).
    events: AtomicU64,
    /// `events + 1` as of the start of the last pick that came back short; 0
    /// while the queue is not known to be dry.
    dry_at: AtomicU64,
    /// Whether the last pick came back short.
    short: AtomicBool,
}

impl QueueWake {
    fn wake(&self) {
        self.events.fetch_add(1, SeqCst);
        self.notify.notify_one();
    }

    /// Call before a pick; pass the result to `picked`.
    fn before_pick(&self) -> u64 {
        self.events.load(SeqCst)
    }

    fn picked(&self, before: u64, wanted: usize, got: usize) {
        let dry = if got < wanted { before + 1 } else { 0 };
        self.dry_at.store(dry, SeqCst);
        self.short.store(got < wanted, SeqCst);
    }

    fn is_short(&self) -> bool {
        self.short.load(SeqCst)
    }

    fn is_dry(&self) -> bool {
        self.dry_at.load(SeqCst) == self.events.load(SeqCst) + 1
    }
}

async fn picker(sh: Arc<Shared>, queue: String) {
    let slots = sh.slots[&queue].clone();
    let wake = sh.wakes[&queue].clone();
    let prefetch = &sh.prefetch[&queue];
    let mut retry = Backoff::new();
    loop {
        // A node that may have been presumed dead claims nothing until it
        // has heartbeated again.
        tokio::select! {
            _ = sh.live.wait() => {}
            _ = sh.shutdown.cancelled() => return,
        }
        // Claim while there is room and the queue has work.
        loop {
            if sh.shutdown.is_cancelled() {
                return;
            }
            let free = prefetch.demand(slots.available_permits());
            if free == 0 || !sh.live.is_live() {
                break;
            }
            let Ok(permits) = slots.clone().try_acquire_many_owned(free as u32) else {
                break;
            };
            let before = wake.before_pick();
            match pick(&sh, &queue, free).await {
                Ok(rows) => {
                    wake.picked(before, free, rows.len());
                    retry.reset();
                    let got = rows.len();
                    start_claimed(&sh, rows, permits);
                    if got < free {
                        break;
                    }
                }
                Err(e) => {
                    drop(permits);
                    tracing::warn!(queue, error = %e, "pick failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(retry.next()) => {}
                        _ = sh.shutdown.cancelled() => return,
                    }
                    break;
                }
            }
        }
        tokio::select! {
            _ = wake.notify.notified() => {}
            _ = tokio::time::sleep(sh.inner.cfg.poll_interval) => wake.wake(),
            _ = sh.shutdown.cancelled() => return,
        }
    }
}

/// Start claimed rows, one claim permit each (rows beyond the permits, which
/// a correct call never returns, and rows claimed while stopping go back).
fn start_claimed(sh: &Arc<Shared>, rows: Vec<Claimed>, mut permits: OwnedSemaphorePermit) {
    if sh.shutdown.is_cancelled() {
        hand_back(sh, rows);
        return;
    }
    let mut extra = Vec::new();
    for row in rows {
        match permits.split(1) {
            Some(permit) => spawn_step(sh, row, permit, None, None),
            None => extra.push(row),
        }
    }
    if !extra.is_empty() {
        tracing::error!(
            rows = extra.len(),
            "a call claimed more rows than it had slots for; giving them back"
        );
        hand_back(sh, extra);
    }
}

/// With rate limits configured: puts rows parked for a rate limit back
/// where a pick sees them as soon as their limit allows a start, and wakes
/// the queues, so a rate-limited backlog drains at its limit, not at one
/// start per poll. It sleeps until a limit allows a start beyond the rows
/// already waiting unparked: one sweep per start. With nothing to time, until
/// this node claims a rate-limited row (its limit may be exhausted now, and
/// the pick parks rows for it), or the poll interval: a limit exhausted by
/// another node's claims is that node's waker's to watch, and the poll covers
/// a node that died meanwhile. Short picks do not wake it: an idle node's
/// picks are all short, and it would loop.
async fn rate_waker(sh: Arc<Shared>) {
    loop {
        let wait = match rate_sweep(&sh).await {
            Ok((n, next)) => {
                if n > 0 {
                    sh.wake_all();
                }
                next
            }
            Err(e) => {
                tracing::debug!(error = %e, "unparking rate-limited rows failed");
                None
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait.unwrap_or(sh.inner.cfg.poll_interval)) => {}
            _ = sh.rate_claimed.notified(), if wait.is_none() => {}
            _ = sh.shutdown.cancelled() => return,
        }
    }
}

/// Every rate-limit key's parked rows, as far as its limit allows starts now
/// (see `rate_sweep` in the parking migration), `UNPARK_BATCH` keys a call.
/// Returns the rows unparked and how long until a limit allows a start
/// beyond the rows now waiting (None: not before a claim).
async fn rate_sweep(sh: &Shared) -> Result<(u64, Option<Duration>)> {
    let (inner, p) = (&sh.inner, &sh.pick);
    let (mut unparked, mut next, mut after) = (0, None::<f64>, None::<String>);
    loop {
        let row = sqlx::query(&inner.sql.rate_sweep)
            .bind(&after)
            .bind(UNPARK_BATCH)
            .bind(&inner.sql.channel)
            .bind(&p.rate_names)
            .bind(&p.rate_intervals)
            .bind(&p.rate_tolerances)
            .fetch_one(&inner.pool)
            .await?;
        unparked += row.try_get::<i32, _>(0)? as u64;
        if let Some(s) = row.try_get::<Option<f64>, _>(2)? {
            next = Some(next.map_or(s, |n| n.min(s)));
        }
        after = row.try_get(1)?;
        if after.is_none() || sh.shutdown.is_cancelled() {
            break;
        }
    }
    Stats::add(&inner.stats.unparked, unparked);
    Ok((
        unparked,
        next.map(|s| Duration::from_secs_f64(s.clamp(0.001, 3600.0))),
    ))
}

/// One pick on the pool; a lost K = 1 race (the unique index refusing a
/// second executing row) is retried at once, as the loser now sees the
/// winner's claim.
async fn pick(sh: &Arc<Shared>, queue: &str, demand: usize) -> Result<Vec<Claimed>> {
    let reserve = sh.wants_successors(queue);
    let want = Demand {
        queue,
        rows: demand,
        skip_pick: false,
        reserve,
    };
    for _ in 0..5 {
        match handoff(sh, &[], &[want], Vec::new()).await {
            Ok(h) => return Ok(h.claimed),
            Err(e) if is_conflict(&e) => Stats::add(&sh.inner.stats.pick_conflicts, 1),
            Err(e) => {
                Stats::add(&sh.inner.stats.pick_errors, 1);
                return Err(e.into());
            }
        }
    }
    Ok(Vec::new())
}

/// Constraints a concurrent pick can win first: the K = 1 index (another
/// pick claimed the key), and the counters of a gate or a rate limit minted
/// by another pick at the same moment.
const RACED: [&str; 3] = ["instances_k1", "gate_slots_pkey", "rate_state_pkey"];

/// A lost race, which the retry resolves: a deadlock, or a unique violation
/// of a constraint in `RACED`. Any other violation is an error to report,
/// not a race to retry.
fn is_conflict(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => is_race(db.code().as_deref(), db.constraint()),
        _ => false,
    }
}

fn is_race(code: Option<&str>, constraint: Option<&str>) -> bool {
    match code {
        Some("40P01") => true,
        Some("23505") => constraint.is_some_and(|c| RACED.contains(&c)),
        _ => false,
    }
}

/// What a handoff call is to claim for one queue.
#[derive(Clone, Copy)]
struct Demand<'a> {
    queue: &'a str,
    rows: usize,
    /// A pick would find nothing new: only promotions and reservations.
    skip_pick: bool,
    /// Reserve successors for the keyed rows claimed or promoted.
    reserve: bool,
}

/// What one handoff call did.
struct Handoff {
    /// Outcomes applied (the others were fenced: no longer executing under
    /// this claim).
    written: usize,
    /// Keys the outcomes freed that no row took over, plus reserved rows
    /// given back: either may let rows of other nodes run.
    released: usize,
    /// Rows claimed by handing freed keys and slots over (also in `claimed`).
    handed_over: usize,
    /// The keys the outcomes freed that are still free after the call.
    released_keys: Vec<String>,
    /// The successors the outcomes name that run under this node now.
    promoted: Vec<i64>,
    claimed: Vec<Claimed>,
}

/// The one statement of the claim path (`sql/functions/handoff.sql`):
/// record `outcomes` and promote the successors started in the
/// slots they free, hand the other freed keys and slots to their keys' next
/// rows, give back `unreserve`, credit what is left, claim per queue and
/// reserve successors. Atomic: it applies whole or not at all.
/// Reserved rows go to the successor bookkeeping; claimed rows are returned.
async fn handoff(
    sh: &Shared,
    outcomes: &[OutcomeRow],
    demand: &[Demand<'_>],
    unreserve: Vec<(i64, i64)>,
) -> sqlx::Result<Handoff> {
    let inner = &sh.inner;
    let picks = demand.iter().filter(|d| !d.skip_pick).count();
    Stats::add(&inner.stats.picks, picks as u64);
    // A call that may claim or reserve keeps the check for lost claims out
    // until what it claimed is on record here.
    let _claiming = match demand.is_empty() {
        true => None,
        false => Some(sh.claiming.read().await),
    };
    let t = Instant::now();
    let mark = lock(&sh.successors).mark();
    let result = call_handoff(sh, &inner.pool, outcomes, demand, &unreserve).await;
    sh.call_time.add(t.elapsed());
    if picks > 0 {
        inner.stats.pick_time.record(t.elapsed());
    }
    let rows = match result {
        Ok(rows) => rows,
        Err(e) => {
            sh.successors(|s| s.restore_dangling(unreserve));
            if !demand.is_empty() {
                sh.check_lost.store(true, SeqCst);
            }
            return Err(e);
        }
    };
    let (h, reserved) = match read_handoff(&rows) {
        Ok(read) => read,
        Err(e) => {
            // Committed, but what it claimed is unknown here.
            sh.check_lost.store(true, SeqCst);
            return Err(e);
        }
    };
    {
        // Outcomes first: the same call may claim a row it just recorded.
        let mut holding = lock(&sh.holding);
        for o in outcomes {
            if holding.get(&o.id) == Some(&o.token) {
                holding.remove(&o.id);
            }
        }
        holding.extend(h.claimed.iter().map(|r| (r.id, r.token)));
    }
    for o in outcomes {
        if let (Some(p), Some(next)) = (&o.promotion, o.next) {
            let promoted = h.promoted.contains(&next);
            Stats::add(&inner.stats.successors, promoted as u64);
            p.settle(promoted);
        }
    }
    // The claimed rows hold their keys before their successors are filed.
    sh.successors(|s| {
        for row in &h.claimed {
            s.claimed(row);
        }
        for row in reserved {
            s.reserved(row, mark);
        }
        for key in &h.released_keys {
            s.freed(key);
        }
    });
    if h.claimed.iter().any(|r| r.rate_key.is_some()) {
        // A rate limit may be exhausted now: the rate waker looks when it
        // allows the next start.
        sh.rate_claimed.notify_one();
    }
    Stats::add(&inner.stats.claimed, h.claimed.len() as u64);
    Stats::add(&inner.stats.handed_over, h.handed_over as u64);
    if !outcomes.is_empty() {
        count_written(inner, outcomes.len(), h.written);
    }
    Ok(h)
}

/// A handoff's rows: its header, the rows it claimed, and those it reserved.
fn read_handoff(rows: &[sqlx::postgres::PgRow]) -> sqlx::Result<(Handoff, Vec<Claimed>)> {
    let mut h = Handoff {
        written: 0,
        released: 0,
        handed_over: 0,
        released_keys: Vec::new(),
        promoted: Vec::new(),
        claimed: Vec::with_capacity(rows.len()),
    };
    let mut reserved = Vec::new();
    for r in rows {
        match r.try_get::<Option<bool>, _>("reserved")? {
            None => {
                h.written = r.try_get::<i32, _>("written")? as usize;
                h.released = r.try_get::<i32, _>("released")? as usize;
                h.handed_over = r.try_get::<i32, _>("handed_over")? as usize;
                h.released_keys = r.try_get("released_keys")?;
                h.promoted = r.try_get("promoted")?;
            }
            Some(false) => h.claimed.push(claimed_from_row(r)?),
            Some(true) => reserved.push(claimed_from_row(r)?),
        }
    }
    Ok((h, reserved))
}

/// The `handoff` statement itself, on `exec`.
async fn call_handoff<'e>(
    sh: &Shared,
    exec: impl sqlx::PgExecutor<'e>,
    outcomes: &[OutcomeRow],
    demand: &[Demand<'_>],
    unreserve: &[(i64, i64)],
) -> sqlx::Result<Vec<sqlx::postgres::PgRow>> {
    let inner = &sh.inner;
    let p = &sh.pick;
    let queues: Vec<&str> = demand.iter().map(|d| d.queue).collect();
    let rows: Vec<i32> = demand.iter().map(|d| d.rows as i32).collect();
    let skip_pick: Vec<bool> = demand.iter().map(|d| d.skip_pick).collect();
    let reserve: Vec<bool> = demand.iter().map(|d| d.reserve).collect();
    let (unreserve, unreserve_tokens): (Vec<i64>, Vec<i64>) = unreserve.iter().copied().unzip();
    sqlx::query(&inner.sql.handoff)
        .bind(sqlx::types::Json(outcomes))
        .bind(&inner.cfg.node_id)
        .bind(&inner.sql.channel)
        .bind(inner.others_alive.load(Relaxed))
        .bind(&queues)
        .bind(&rows)
        .bind(&skip_pick)
        .bind(&reserve)
        .bind(&unreserve)
        .bind(&unreserve_tokens)
        .bind(WINDOW_FACTOR)
        .bind(&p.workflows)
        .bind(&p.gate_names)
        .bind(&p.gate_limits)
        .bind(&p.gate_shards)
        .bind(&p.rate_names)
        .bind(&p.rate_intervals)
        .bind(&p.rate_tolerances)
        .fetch_all(exec)
        .await
}

/// Prepare the connections the claim path will use, before any work:
/// PostgreSQL compiles the functions and plans the pick on a connection's
/// first call (about 30 ms of CPU), which would otherwise stall the first
/// claim and outcome on every new connection. A call that records an outcome
/// for no row and picks from no queue does it and changes nothing.
///
/// Only what the start needs: a connection per picker and one for the
/// outcome writer. A second writer call (for large batches) or a busy moment
/// opens more, and each pays its first call when it comes. Warming two more
/// up front held every start back by their CPU (75-120 ms before the first
/// step on two cores, against about 35 ms now) and made W1, W2 and W3 slower
/// by 1-5 % in alternating runs.
async fn warm_up(sh: &Shared) {
    let pool = &sh.inner.pool;
    let n = (sh.wakes.len() + 1).min(pool.options().get_max_connections() as usize);
    // A pool shared with the application may have no connection to spare:
    // warm what can be had quickly rather than delay the start.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        match tokio::time::timeout_at(deadline, pool.acquire()).await {
            Ok(Ok(c)) => conns.push(c),
            _ => break,
        }
    }
    let nothing = OutcomeRow::release(&Claimed::none());
    let demand = [Demand {
        queue: "",
        rows: 1,
        skip_pick: false,
        reserve: false,
    }];
    let calls = conns
        .iter_mut()
        .map(|c| call_handoff(sh, &mut **c, std::slice::from_ref(&nothing), &demand, &[]));
    for r in futures::future::join_all(calls).await {
        if let Err(e) = r {
            tracing::debug!(error = %e, "warming a connection failed");
        }
    }
}

fn claimed_from_row(r: &sqlx::postgres::PgRow) -> sqlx::Result<Claimed> {
    Ok(Claimed {
        id: r.try_get("id")?,
        workflow: r.try_get("workflow")?,
        step: r.try_get("step")?,
        state: r.try_get("state")?,
        queue: r.try_get("queue")?,
        attempt: r.try_get("attempt")?,
        max_attempts: r.try_get("max_attempts")?,
        concurrency_key: r.try_get("concurrency_key")?,
        gate_shard: r.try_get("gate_shard")?,
        rate_key: r.try_get("rate_key")?,
        wake: r.try_get("wake")?,
        token: r.try_get("token")?,
    })
}

/// Claim slots for up to `n` rows an insert on this process starts at once
/// (see `Engine::insert_many`): only while `queue` has running slots idle and
/// its last pick found nothing more, so an inserted row never goes ahead of a
/// backlog this node could be running.
pub(crate) fn local_slots(sh: &Shared, queue: &str, n: usize) -> Option<OwnedSemaphorePermit> {
    if sh.shutdown.is_cancelled() || !sh.live.is_live() || !sh.wakes.get(queue)?.is_short() {
        return None;
    }
    let idle = sh.runs[queue].available_permits().min(n);
    if idle == 0 {
        return None;
    }
    sh.slots[queue]
        .clone()
        .try_acquire_many_owned(idle as u32)
        .ok()
}

/// Held by an insert that claims rows for this node until they are started
/// (see `give_back_lost`).
pub(crate) async fn claiming(sh: &Shared) -> tokio::sync::RwLockReadGuard<'_, ()> {
    sh.claiming.read().await
}

/// An insert that claimed rows for this node failed: it may have committed.
pub(crate) fn claim_failed(sh: &Shared) {
    sh.check_lost.store(true, SeqCst);
}

/// Run rows an insert claimed for this node, in the slots `local_slots` gave.
pub(crate) fn start_inserted(
    sh: &Arc<Shared>,
    rows: Vec<Claimed>,
    mut slots: HashMap<String, OwnedSemaphorePermit>,
) {
    let n = rows.len() as u64;
    Stats::add(&sh.inner.stats.claimed, n);
    Stats::add(&sh.inner.stats.started_on_insert, n);
    lock(&sh.holding).extend(rows.iter().map(|r| (r.id, r.token)));
    let mut extra = Vec::new();
    for row in rows {
        match slots.get_mut(&row.queue).and_then(|p| p.split(1)) {
            Some(claim) => spawn_step(sh, row, claim, None, None),
            None => extra.push(row),
        }
    }
    if !extra.is_empty() {
        tracing::error!(
            rows = extra.len(),
            "an insert claimed more rows than it had slots for; giving them back"
        );
        hand_back(sh, extra);
    }
}

fn hand_back(sh: &Shared, rows: Vec<Claimed>) {
    Stats::add(&sh.inner.stats.released, rows.len() as u64);
    sh.successors(|s| rows.iter().for_each(|r| s.release(r)));
    for row in rows {
        let _ = sh.outcomes.send(OutcomeRow::release(&row));
    }
}

/// Run a claimed row: wait for a running slot (unless it comes with one: a
/// successor takes its predecessor's), run the step, queue its outcome, and
/// start the key's reserved successor in the slot, if there is one.
/// `promotion`: a successor's, settled when the call recording its
/// predecessor's outcome is written; the successor starts only once
/// promoted (not promoted, it goes back unstarted).
fn spawn_step(
    sh: &Arc<Shared>,
    row: Claimed,
    claim: OwnedSemaphorePermit,
    run: Option<OwnedSemaphorePermit>,
    promotion: Option<oneshot::Receiver<bool>>,
) {
    let Some(workflow) = sh.inner.workflows.get(&row.workflow).cloned() else {
        // The pick only claims workflows this node knows.
        hand_back(sh, vec![row]);
        return;
    };
    let sh2 = sh.clone();
    let runs = sh.runs[&row.queue].clone();
    sh.steps.spawn(async move {
        let sh = sh2;
        // A prefetched row waits here for a running slot (in claim order:
        // the semaphore is fair); at shutdown, rows not started go back.
        let run = match run {
            Some(run) => Some(run),
            None => tokio::select! {
                biased;
                _ = sh.shutdown.cancelled() => None,
                run = runs.acquire_owned() => run.ok(),
            },
        };
        // A successor starts once the call recording its predecessor's
        // outcome has promoted it: before that the database does not count
        // its attempt, so a step that kills its process would never reach
        // max_attempts. Not promoted, it was never admitted.
        if let Some(p) = promotion {
            if p.await != Ok(true) {
                not_admitted(&sh, &row);
                return;
            }
        }
        // A node that may have been presumed dead starts nothing: its rows
        // may run elsewhere already.
        let Some(run) = run.filter(|_| sh.live.is_live()) else {
            drop(claim);
            hand_back(&sh, vec![row]);
            return;
        };
        // Never two runs of one instance here: a run still going on an
        // earlier claim of the row (rescued meanwhile) is stopped first.
        let prior = lock(&sh.running)
            .get(&row.id)
            .map(|r| (r.abort.clone(), r.ended.clone()));
        if let Some((abort, ended)) = prior {
            tracing::warn!(
                id = row.id,
                "stopping the run of an earlier claim of this instance before starting it again"
            );
            abort.abort();
            ended.cancelled().await;
        }
        sh.prefetch[&row.queue].started();
        let ctx = StepContext {
            id: row.id,
            workflow: row.workflow.clone(),
            queue: row.queue.clone(),
            attempt: row.attempt,
            max_attempts: row.max_attempts,
            concurrency_key: row.concurrency_key.clone(),
            rate_limit: row.rate_key.clone(),
            wake: Wake::from_json(row.wake.clone()),
        };
        let (step, state) = (row.step.clone(), row.state.clone());
        let wf = workflow.clone();
        let began = Instant::now();
        let user = tokio::spawn(async move { wf.step(&step, state, ctx).await });
        let ended = CancellationToken::new();
        lock(&sh.running).insert(
            row.id,
            Running {
                token: row.token,
                abort: user.abort_handle(),
                ended: ended.clone(),
            },
        );
        let _ended = ended.drop_guard();
        let result = user.await;
        sh.prefetch[&row.queue].ran(began.elapsed());
        forget_running(&sh, &row);
        if result.as_ref().is_err_and(|j| j.is_cancelled()) && !sh.shutdown.is_cancelled() {
            // Stopped because this claim is no longer the node's (the row
            // was rescued, or claimed here again): nothing to record.
            forget_held(&sh, &row);
            sh.successors(|s| s.release(&row));
            return;
        }
        let cfg = &sh.inner.cfg;
        let mut outcome = match result {
            Ok(Ok(t)) => OutcomeRow::from_transition(&row, cfg, Some(&*workflow), t),
            Ok(Err(e)) => OutcomeRow::from_transition(
                &row,
                cfg,
                Some(&*workflow),
                Transition::Error {
                    reason: e.to_string(),
                    detail: Some(format!("{e:?}")),
                },
            ),
            Err(j) if j.is_panic() => {
                OutcomeRow::failure(&row, cfg, "panic", format!("panic: {}", panic_message(j)))
            }
            Err(_) => OutcomeRow::failure(
                &row,
                cfg,
                "shutdown",
                "aborted: the step did not finish within the shutdown timeout".into(),
            ),
        };
        let next = if sh.shutdown.is_cancelled() || !sh.live.is_live() {
            sh.successors(|s| s.release(&row));
            None
        } else {
            // On record as held before it leaves the reservations, for
            // `give_back_lost`.
            sh.successors(|s| {
                let next = s.next(&row);
                if let Some(n) = &next {
                    lock(&sh.holding).insert(n.id, n.token);
                }
                next
            })
        };
        match next {
            Some(next) => {
                // A claim too: promoted in this outcome's call.
                Stats::add(&sh.inner.stats.claimed, 1);
                let (promotion, promoted) = Promotion::new();
                outcome.next = Some(next.id);
                outcome.ntoken = Some(next.token - 1);
                outcome.promotion = Some(Arc::new(promotion));
                spawn_step(&sh, next, claim, Some(run), Some(promoted));
            }
            None => {
                // The claim slot goes with the outcome: the call that records
                // it claims into that slot (or hands the key over).
                drop(run);
                outcome.slot = Some(Arc::new(claim));
            }
        }
        let _ = sh.outcomes.send(outcome);
    });
}

/// The claim `row` is no longer held here.
fn forget_held(sh: &Shared, row: &Claimed) {
    let mut holding = lock(&sh.holding);
    if holding.get(&row.id) == Some(&row.token) {
        holding.remove(&row.id);
    }
}

/// A step of `row` is no longer running here.
fn forget_running(sh: &Shared, row: &Claimed) {
    let mut running = lock(&sh.running);
    if running.get(&row.id).is_some_and(|r| r.token == row.token) {
        running.remove(&row.id);
    }
}

/// A successor whose promotion did not happen (its predecessor's outcome
/// was fenced: the predecessor's row was rescued or given back). It was
/// never admitted and never started; its reservation, if the node still has
/// it, goes back.
fn not_admitted(sh: &Shared, row: &Claimed) {
    Stats::add(&sh.inner.stats.not_admitted, 1);
    tracing::warn!(
        id = row.id,
        "a successor was not admitted (its predecessor's outcome was fenced); it goes back"
    );
    forget_held(sh, row);
    sh.successors(|s| {
        s.release(row);
        s.restore_dangling(vec![(row.id, row.token - 1)]);
    });
}

fn panic_message(j: tokio::task::JoinError) -> String {
    payload_message(&*j.into_panic())
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

/// Writes outcomes in batches: whatever accumulated while earlier batches
/// were in flight goes in the next transaction. Up to `WRITERS` transactions
/// run at once, so one waiting for its commit does not hold back the next
/// batch and the database can use more than one core.
async fn write_outcomes(
    sh: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<OutcomeRow>,
    stop: CancellationToken,
) {
    let mut inflight = tokio::task::JoinSet::new();
    loop {
        if inflight.len() >= WRITERS {
            inflight.join_next().await;
            continue;
        }
        let first = tokio::select! {
            o = rx.recv() => o,
            Some(_) = inflight.join_next() => continue,
            _ = sh.writer_wake.notified() => None,
            _ = stop.cancelled() => None,
        };
        let mut batch = Vec::new();
        match first {
            Some(o) => batch.push(o),
            None if !stop.is_cancelled() => {} // reserved rows to give back
            None => {
                // Stopping: every step has finished; write what is left.
                // Reserved rows are given back when the node deregisters.
                while inflight.join_next().await.is_some() {}
                while let Ok(o) = rx.try_recv() {
                    batch.push(o);
                }
                for chunk in batch.chunks(MAX_OUTCOME_BATCH) {
                    write_batch(
                        &sh,
                        chunk.to_vec(),
                        // The node still heartbeats meanwhile, so nothing
                        // is rescued: a lease to reconnect (a server that
                        // just restarted) rather than re-run finished steps.
                        Some(
                            Instant::now() + sh.inner.cfg.shutdown_timeout.max(sh.inner.cfg.lease),
                        ),
                    )
                    .await;
                }
                return;
            }
        }
        // Let outcomes finishing at the same moment join the batch, unless a
        // successor waits for this call to promote it.
        if batch.iter().all(|o| o.promotion.is_none()) {
            tokio::task::yield_now().await;
        }
        while batch.len() < MAX_OUTCOME_BATCH {
            match rx.try_recv() {
                Ok(o) => batch.push(o),
                Err(_) => break,
            }
        }
        while !inflight.is_empty() && batch.len() < PARALLEL_BATCH && !stop.is_cancelled() {
            tokio::select! {
                Some(o) = rx.recv() => batch.push(o),
                _ = inflight.join_next() => {}
                _ = stop.cancelled() => {}
            }
        }
        if batch.is_empty() && !lock(&sh.successors).has_dangling() {
            continue;
        }
        let sh = sh.clone();
        inflight.spawn(async move {
            use futures::FutureExt;
            let mut batch = batch;
            let carried = carried_slots(&mut batch);
            let first = std::panic::AssertUnwindSafe(write_and_claim(&sh, &batch, carried))
                .catch_unwind()
                .await;
            match first {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "outcome and claim in one call failed; writing the outcomes alone");
                    write_batch(&sh, batch, None).await;
                }
                Err(panic) => {
                    tracing::error!(panic = %payload_message(&*panic), "writing outcomes panicked; writing them alone");
                    sh.check_lost.store(true, SeqCst);
                    write_batch(&sh, batch, None).await;
                }
            }
        });
    }
}

/// The claim slots a batch's outcomes carry, merged per queue. A slot is
/// merged only with slots of its own queue's semaphore (a slot that came
/// from another goes back to it).
fn carried_slots(batch: &mut [OutcomeRow]) -> HashMap<String, OwnedSemaphorePermit> {
    let mut carried: HashMap<String, OwnedSemaphorePermit> = HashMap::new();
    for o in batch {
        let Some(slot) = o.slot.take().and_then(|s| Arc::try_unwrap(s).ok()) else {
            continue;
        };
        match carried.get_mut(&o.queue) {
            Some(p) if Arc::ptr_eq(p.semaphore(), slot.semaphore()) => p.merge(slot),
            Some(_) => drop(slot),
            None => {
                carried.insert(o.queue.clone(), slot);
            }
        }
    }
    carried
}

/// The fast path: write a batch of outcomes and, in the same statement,
/// claim rows for the batch's queues: into the slots the outcomes carry and as
/// many free ones as the prefetch wants. Slots and keys the outcomes free go
/// to the next rows with one round trip and one commit.
async fn write_and_claim(
    sh: &Arc<Shared>,
    batch: &[OutcomeRow],
    mut carried: HashMap<String, OwnedSemaphorePermit>,
) -> Result<()> {
    struct Claim<'a> {
        want: Demand<'a>,
        wake: &'a QueueWake,
        permits: OwnedSemaphorePermit,
        before: u64,
    }
    let mut claims = Vec::new();
    if !sh.shutdown.is_cancelled() && sh.live.is_live() {
        // The queues these outcomes freed slots in.
        for (queue, slots) in sh
            .slots
            .iter()
            .filter(|(q, _)| batch.iter().any(|o| &o.queue == *q))
        {
            // The slots the outcomes carry, and as many free ones as the
            // prefetch wants on top. Even with none (a picker may hold the
            // free ones) the queue is listed: the successors promoted here
            // get their own reserved.
            let carried = carried
                .remove(queue.as_str())
                .filter(|p| Arc::ptr_eq(p.semaphore(), slots));
            let Some(mut permits) =
                carried.or_else(|| slots.clone().try_acquire_many_owned(0).ok())
            else {
                continue;
            };
            let own = permits.num_permits();
            let want = sh.prefetch[queue].demand(slots.available_permits() + own);
            if want > own {
                if let Ok(more) = slots.clone().try_acquire_many_owned((want - own) as u32) {
                    permits.merge(more);
                }
            }
            let free = permits.num_permits();
            let wake = &*sh.wakes[queue];
            // A pick can only find something new if these outcomes made a row
            // runnable, or if rate limits refilled meanwhile: the keys and
            // slots they free are handed over to their keys' next rows in the
            // call, and one left free wakes the queues after it.
            let nothing_new = sh.pick.rate_names.is_empty()
                && batch.iter().all(|o| &o.queue != queue || !o.runnable_now());
            claims.push(Claim {
                want: Demand {
                    queue,
                    rows: free,
                    skip_pick: nothing_new && wake.is_dry(),
                    reserve: sh.wants_successors(queue),
                },
                wake,
                permits,
                before: wake.before_pick(),
            });
        }
    }
    let demand: Vec<Demand> = claims.iter().map(|c| c.want).collect();
    let unreserve = sh.successors(|s| s.take_dangling());
    let mut h = handoff(sh, batch, &demand, unreserve).await?;
    let mut claimed = std::mem::take(&mut h.claimed);
    if h.released > 0 {
        // Keys or slots went free with nobody taking them over: rows of those
        // keys may wait in any queue.
        sh.wake_all();
    }
    for c in &claims {
        if !c.want.skip_pick && c.want.rows > 0 {
            let got = claimed.iter().filter(|r| r.queue == c.want.queue).count();
            c.wake.picked(c.before, c.want.rows, got);
        }
        if c.wake.before_pick() != c.before {
            // Woken while this call held the queue's free slots: the picker
            // may have found none, and this pick may have missed the rows.
            c.wake.notify.notify_one();
        }
    }
    for c in claims {
        let (mine, rest): (Vec<Claimed>, Vec<Claimed>) =
            claimed.into_iter().partition(|r| r.queue == c.want.queue);
        claimed = rest;
        start_claimed(sh, mine, c.permits);
    }
    if !claimed.is_empty() {
        tracing::error!(
            rows = claimed.len(),
            "a call claimed rows for a queue it did not ask for; giving them back"
        );
        hand_back(sh, claimed);
    }
    Ok(())
}

/// Write one batch, retrying through connection loss (until `deadline`, if
/// any). A batch the database refuses for another reason is written row by row
/// so one bad row cannot hold back the others.
async fn write_batch(sh: &Shared, batch: Vec<OutcomeRow>, deadline: Option<Instant>) {
    let wake = batch.iter().any(|o| o.hkey.is_some() || o.runnable_now());
    let mut retry = Backoff::new();
    loop {
        match write_outcome_rows(sh, &batch).await {
            Ok(()) => break,
            Err(e) if e.is_transient() => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    tracing::error!(outcomes = batch.len(), error = %e,
                        "giving up writing outcomes at shutdown; the rows will be rescued");
                    return;
                }
                tracing::warn!(error = %e, "writing outcomes failed; retrying");
                tokio::time::sleep(retry.next()).await;
            }
            Err(e) if batch.len() > 1 => {
                tracing::warn!(error = %e, "an outcome batch was refused; writing row by row");
                for o in batch {
                    Box::pin(write_batch(sh, vec![o], deadline)).await;
                }
                return;
            }
            Err(e) => {
                tracing::error!(id = batch[0].id, error = %e, "an outcome was refused; recording it as an error");
                let fallback = OutcomeRow::refused(&batch[0], &e.to_string());
                if let Err(e) = write_outcome_rows(sh, &[fallback]).await {
                    tracing::error!(id = batch[0].id, error = %e, "recording the refused outcome failed too");
                }
                break;
            }
        }
    }
    if wake {
        sh.wake_all();
    }
}

async fn write_outcome_rows(sh: &Shared, batch: &[OutcomeRow]) -> Result<()> {
    handoff(sh, batch, &[], Vec::new()).await?;
    Ok(())
}

fn count_written(inner: &Inner, sent: usize, written: usize) {
    Stats::add(&inner.stats.outcome_batches, 1);
    Stats::add(&inner.stats.outcomes, written as u64);
    Stats::add(&inner.stats.fenced, (sent - written) as u64);
}

/// LISTEN for wake-ups; after any reconnect every picker is woken, since
/// notifications sent meanwhile are lost.
async fn listen(sh: Arc<Shared>) {
    let mut retry = Backoff::new();
    loop {
        let connected = async {
            let mut l = PgListener::connect_with(&sh.inner.pool).await?;
            l.listen(&sh.inner.sql.channel).await?;
            Ok::<_, sqlx::Error>(l)
        }
        .await;
        let mut listener = match connected {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "LISTEN connection failed; polling meanwhile");
                tokio::select! {
                    _ = tokio::time::sleep(retry.next()) => continue,
                    _ = sh.shutdown.cancelled() => return,
                }
            }
        };
        retry.reset();
        sh.wake_all();
        loop {
            let received = tokio::select! {
                r = listener.try_recv() => r,
                _ = sh.shutdown.cancelled() => return,
            };
            match received {
                Ok(Some(n)) if n.payload().is_empty() => sh.wake_all(),
                Ok(Some(n)) if n.payload().starts_with('*') => {
                    if n.payload()[1..] != sh.inner.cfg.node_id {
                        sh.wake_all();
                    }
                }
                Ok(Some(n)) => {
                    if let Some(w) = sh.wakes.get(n.payload()) {
                        w.wake();
                    }
                }
                Ok(None) => sh.wake_all(),
                Err(_) => break,
            }
        }
    }
}

/// Record this node's heartbeat on `exec`. Returns how long ago its previous
/// heartbeat was recorded (None: it had none, or its row was deleted as dead).
async fn heartbeat<'e>(inner: &Inner, exec: impl sqlx::PgExecutor<'e>) -> Result<Option<f64>> {
    let queues = serde_json::to_value(&inner.cfg.queues).unwrap_or_default();
    let row = sqlx::query(&inner.sql.heartbeat)
        .bind(&inner.cfg.node_id)
        .bind(crate::config::hostname())
        .bind(std::process::id() as i32)
        .bind(queues)
        .bind(inner.cfg.lease.as_secs_f64())
        .bind(serde_json::to_value(inner.workflows.keys().collect::<Vec<_>>()).unwrap_or_default())
        .fetch_one(exec)
        .await?;
    let others: i64 = row.try_get(0)?;
    inner.others_alive.store(others > 0, Relaxed);
    Ok(row.try_get(1)?)
}

/// Heartbeats, on a connection of their own, so that nothing else the node
/// does (maintenance, a pool busy with claims, a reconnect storm) holds them
/// back. Failed ones are retried at once after a short pause. After a gap in
/// which the node may have been presumed dead, its running steps whose rows
/// were rescued meanwhile are stopped (their outcomes would be fenced anyway)
/// and lost claims are looked for.
async fn heartbeats(sh: Arc<Shared>) {
    let inner = &sh.inner;
    let cfg = &inner.cfg;
    let mut conn: Option<sqlx::PgConnection> = None;
    let mut retry = Backoff::new();
    let mut last_ok = Instant::now();
    loop {
        let sent = Instant::now();
        let beat = async {
            if conn.is_none() {
                let options = inner.pool.connect_options();
                conn = Some(sqlx::Connection::connect_with(&*options).await?);
            }
            let c = conn.as_mut().ok_or(sqlx::Error::PoolClosed)?;
            heartbeat(inner, &mut *c).await
        };
        let limit = cfg.heartbeat_interval.max(Duration::from_secs(1));
        let pause = match tokio::time::timeout(limit, beat).await {
            Ok(Ok(gap)) => {
                retry.reset();
                let was_live = sh.live.renewed(sent);
                let late = gap.map_or(true, |g| g >= cfg.lease.as_secs_f64())
                    || sent - last_ok >= cfg.lease;
                last_ok = sent;
                if !was_live || late {
                    tracing::warn!(
                        "this node was not heartbeating for a lease or more; checking which of its steps are still its own"
                    );
                    sh.check_lost.store(true, SeqCst);
                    if let Some(c) = conn.as_mut() {
                        if let Err(e) = stop_lost_steps(&sh, c).await {
                            tracing::warn!(error = %e, "checking this node's steps failed");
                            conn = None;
                        }
                    }
                }
                cfg.heartbeat_interval
            }
            failed => {
                match failed {
                    Ok(Err(e)) => tracing::warn!(error = %e, "heartbeat failed"),
                    _ => tracing::warn!("heartbeat timed out"),
                }
                conn = None;
                retry.next().min(cfg.heartbeat_interval)
            }
        };
        // Also while the node stops: its last outcomes are written under a
        // live heartbeat (`Node::stop` ends this task after the writer).
        tokio::time::sleep(pause).await;
    }
}

/// Stop the running steps whose claim the database no longer holds for this
/// node (rescued while the node was presumed dead).
async fn stop_lost_steps(sh: &Shared, conn: &mut sqlx::PgConnection) -> Result<()> {
    let rows = sqlx::query(&sh.inner.sql.held_by_node)
        .bind(&sh.inner.cfg.node_id)
        .fetch_all(&mut *conn)
        .await?;
    let mut ours = HashSet::new();
    for r in &rows {
        if r.try_get::<bool, _>("executing")? {
            ours.insert((r.try_get::<i64, _>("id")?, r.try_get::<i64, _>("token")?));
        }
    }
    let lost: Vec<(i64, AbortHandle)> = lock(&sh.running)
        .iter()
        .filter(|(id, r)| !ours.contains(&(**id, r.token)))
        .map(|(id, r)| (*id, r.abort.clone()))
        .collect();
    for (id, abort) in lost {
        tracing::warn!(
            id,
            "stopping a step whose row was rescued while this node was presumed dead"
        );
        Stats::add(&sh.inner.stats.stopped, 1);
        abort.abort();
    }
    Ok(())
}

/// Stage due rows, rescue rows of dead nodes, give back lost claims,
/// reconcile gates and prune, each on its own cadence and each bounded per
/// pass. Failures are logged and retried next time.
async fn maintain(sh: Arc<Shared>) {
    let inner = &sh.inner;
    let cfg = &inner.cfg;
    let tick = cfg.poll_interval.min(cfg.heartbeat_interval);
    let mut last_reap = Instant::now() - cfg.heartbeat_interval;
    let mut last_gc = Instant::now();
    let mut gates_after: Option<String> = None;
    let mut parked_after: Option<String> = None;
    let mut last_prune = Instant::now() - Duration::from_secs(3600);
    loop {
        let now = Instant::now();
        if let Err(e) = stage(inner).await {
            tracing::debug!(error = %e, "staging failed");
        }
        if now - last_reap >= cfg.heartbeat_interval {
            last_reap = now;
            if let Err(e) = reap(inner, None).await {
                tracing::debug!(error = %e, "reaping failed");
            }
        }
        if sh.live.is_live() {
            if let Err(e) = park_by_workflow(&sh).await {
                tracing::debug!(error = %e, "parking by workflow failed");
            }
        }
        // Parked rows whose key has room (a race, a rescue, a repaired
        // gate) or whose rate limit allows starts again.
        match unpark(&sh, parked_after.as_deref(), true).await {
            Ok((_, next)) => parked_after = next,
            Err(e) => tracing::debug!(error = %e, "unparking failed"),
        }
        if sh.check_lost.swap(false, SeqCst) {
            if let Err(e) = give_back_lost(&sh).await {
                sh.check_lost.store(true, SeqCst);
                tracing::debug!(error = %e, "checking for lost claims failed");
            }
        }
        // A sweep over many gate keys goes on at the next tick.
        if gates_after.is_some() || now - last_gc >= cfg.gc_interval {
            if gates_after.is_none() {
                last_gc = now;
            }
            match reconcile_gates_from(inner, gates_after.as_deref()).await {
                Ok((_, next)) => gates_after = next,
                Err(e) => tracing::debug!(error = %e, "gate reconciliation failed"),
            }
        }
        if now - last_prune >= Duration::from_secs(60) {
            match prune_batch(inner).await {
                // A full batch: more to prune at the next tick.
                Ok(n) if n >= PRUNE_BATCH as u64 => {}
                Ok(_) => last_prune = now,
                Err(e) => {
                    last_prune = now;
                    tracing::debug!(error = %e, "pruning failed");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = sh.shutdown.cancelled() => return,
        }
    }
}

/// Give back rows the database says this node claimed or reserved but the
/// node never heard of: a call that committed while its answer was lost (a
/// dropped connection, a server restart). Nothing else can free them while
/// this node heartbeats. Claiming calls are held off while the rows are
/// listed, so every row they claimed is known by then. A row is this node's
/// only under the token of its claim: one claimed again by a call whose
/// answer was lost is given back even if an earlier claim of it is known.
async fn give_back_lost(sh: &Shared) -> Result<()> {
    let guard = sh.claiming.write().await;
    let rows = sqlx::query(&sh.inner.sql.held_by_node)
        .bind(&sh.inner.cfg.node_id)
        .fetch_all(&sh.inner.pool)
        .await?;
    let (mut lost, mut unreserve) = (Vec::new(), Vec::new());
    {
        // In this order only (a successor goes from one to the other).
        let successors = lock(&sh.successors);
        let holding = lock(&sh.holding);
        for r in &rows {
            let row = claimed_from_row(r)?;
            if r.try_get::<bool, _>("executing")? {
                if holding.get(&row.id) != Some(&row.token) {
                    lost.push(row);
                }
            } else if !holding.contains_key(&row.id) && !successors.is_reserved(row.id, row.token) {
                unreserve.push((row.id, row.token));
            }
        }
    }
    drop(guard);
    if lost.is_empty() && unreserve.is_empty() {
        return Ok(());
    }
    tracing::warn!(
        claimed = lost.len(),
        reserved = unreserve.len(),
        "giving back rows claimed for this node whose claim never reached it"
    );
    Stats::add(&sh.inner.stats.released, lost.len() as u64);
    // As releases of rows that never started: fenced like any outcome, so a
    // row whose outcome was written meanwhile is left alone.
    for row in &lost {
        let _ = sh.outcomes.send(OutcomeRow::release(row));
    }
    sh.successors(|s| s.restore_dangling(unreserve));
    Ok(())
}

async fn stage(inner: &Inner) -> Result<u64> {
    let row = sqlx::query(&inner.sql.stage)
        .bind(STAGE_BATCH)
        .bind(&inner.sql.channel)
        .fetch_one(&inner.pool)
        .await?;
    Ok(row.try_get::<i64, _>(0)? as u64)
}

/// Rescue rows of nodes presumed dead (or, with `own`, the rows a previous
/// process of this node id left); forget long-dead nodes.
pub(crate) async fn reap(inner: &Inner, own: Option<&str>) -> Result<u64> {
    let lease = inner.cfg.lease.as_secs_f64();
    let row = sqlx::query(&inner.sql.reap)
        .bind(lease)
        .bind(&inner.sql.channel)
        .bind(own)
        .fetch_one(&inner.pool)
        .await?;
    let rescued = row.try_get::<i64, _>(0)? as u64;
    Stats::add(&inner.stats.rescued, rescued);
    if own.is_none() {
        sqlx::query(&inner.sql.forget_dead_nodes)
            .bind(lease * 3.0)
            .execute(&inner.pool)
            .await?;
    }
    Ok(rescued)
}

/// One bounded unparking pass (see `unpark_sweep` in the parking migration):
/// keys with parked rows from the one after `after` (if `keys`), then rows
/// parked for a rate limit that allows starts now. Returns the rows unparked
/// and where the key sweep goes on (None: it reached the end).
async fn unpark(sh: &Shared, after: Option<&str>, keys: bool) -> Result<(u64, Option<String>)> {
    let inner = &sh.inner;
    let p = &sh.pick;
    let row = sqlx::query(&inner.sql.unpark_sweep)
        .bind(after)
        .bind(UNPARK_BATCH)
        .bind(keys)
        .bind(&inner.sql.channel)
        .bind(&p.gate_names)
        .bind(&p.gate_limits)
        .bind(&p.rate_names)
        .bind(&p.rate_intervals)
        .bind(&p.rate_tolerances)
        .fetch_one(&inner.pool)
        .await?;
    let n = row.try_get::<i32, _>(0)? as u64;
    Stats::add(&inner.stats.unparked, n);
    Ok((n, row.try_get(1)?))
}

/// Rows a pick would step over because no live node runs their workflow:
/// park those at the head of each of this node's queues (a batch, again
/// while batches come back full, up to `ORPHAN_PASSES`), and take back the
/// rows parked for the workflows this node runs (see the workflow parking
/// migration). Returns the rows parked and unparked.
async fn park_by_workflow(sh: &Shared) -> Result<(u64, u64)> {
    let inner = &sh.inner;
    let lease = inner.cfg.lease.as_secs_f64();
    let mut parked = 0;
    for queue in inner.cfg.queues.keys() {
        for _ in 0..ORPHAN_PASSES {
            let n: i32 = sqlx::query_scalar(&inner.sql.park_orphans)
                .bind(queue)
                .bind(lease)
                .bind(ORPHAN_BATCH)
                .fetch_one(&inner.pool)
                .await?;
            parked += n as u64;
            if n < ORPHAN_BATCH {
                break;
            }
        }
    }
    let queues: Vec<&String> = inner.cfg.queues.keys().collect();
    let n: i32 = sqlx::query_scalar(&inner.sql.unpark_workflows)
        .bind(&queues)
        .bind(&sh.pick.workflows)
        .bind(UNPARK_WORKFLOW_BATCH)
        .bind(&inner.sql.channel)
        .fetch_one(&inner.pool)
        .await?;
    Stats::add(&inner.stats.unparked, n as u64);
    Ok((parked, n as u64))
}

/// One bounded reconciler pass from the gate key after `after`: repair gate
/// counters from the executing rows and delete the counters of idle keys.
/// Returns how many counters it changed and where the next pass goes on
/// (None: the sweep reached the end).
async fn reconcile_gates_from(inner: &Inner, after: Option<&str>) -> Result<(u64, Option<String>)> {
    let (names, limits) = inner.cfg.gate_arrays();
    let row = sqlx::query(&inner.sql.reconcile)
        .bind(after)
        .bind(RECONCILE_BATCH)
        .bind(names)
        .bind(limits)
        .bind(inner.cfg.gate_shard_array())
        .bind(&inner.sql.channel)
        .fetch_one(&inner.pool)
        .await?;
    let changed = row.try_get::<i32, _>(0)? as u64;
    let next: Option<String> = row.try_get(1)?;
    if next.is_none() {
        sqlx::query(&inner.sql.prune_rates)
            .execute(&inner.pool)
            .await?;
    }
    Ok((changed, next))
}

/// A whole reconciler sweep (on demand). Returns how many counters it changed.
pub(crate) async fn reconcile_gates(inner: &Inner) -> Result<u64> {
    let (mut total, mut after) = reconcile_gates_from(inner, None).await?;
    while let Some(key) = after {
        let (n, next) = reconcile_gates_from(inner, Some(&key)).await?;
        total += n;
        after = next;
    }
    Ok(total)
}

/// Prune one batch of finished rows past their retention.
async fn prune_batch(inner: &Inner) -> Result<u64> {
    let Some(retention) = inner.cfg.retention else {
        return Ok(0);
    };
    Ok(sqlx::query(&inner.sql.prune)
        .bind(retention.as_secs_f64())
        .bind(PRUNE_BATCH)
        .execute(&inner.pool)
        .await?
        .rows_affected())
}

/// Prune every finished row past its retention (on demand).
pub(crate) async fn prune(inner: &Inner) -> Result<u64> {
    let mut total = 0;
    loop {
        let done = prune_batch(inner).await?;
        total += done;
        if done < PRUNE_BATCH as u64 {
            return Ok(total);
        }
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

#[cfg(test)]
mod tests {
    use super::is_race;

    #[test]
    fn only_the_constraints_a_concurrent_pick_can_win_are_races() {
        assert!(is_race(Some("23505"), Some("instances_k1")));
        assert!(is_race(Some("23505"), Some("gate_slots_pkey")));
        assert!(is_race(Some("23505"), Some("rate_state_pkey")));
        assert!(is_race(Some("40P01"), None));
        // Anything else is an error to report, not to retry.
        assert!(!is_race(Some("23505"), Some("instances_pkey")));
        assert!(!is_race(Some("23505"), None));
        assert!(!is_race(Some("23514"), Some("gate_slots_available_check")));
        assert!(!is_race(None, None));
    }

    /// The names are PostgreSQL's for the engine's own index and keys.
    #[test]
    fn the_raced_constraints_exist_in_the_baseline() {
        let sql = include_str!("../sql/migrations/20261201000000_baseline.sql");
        assert!(sql.contains("CREATE UNIQUE INDEX instances_k1"));
        assert!(sql.contains("CREATE TABLE gate_slots ("));
        assert!(sql.contains("CREATE TABLE rate_state ("));
    }
}
