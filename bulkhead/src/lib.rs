//! An in-process bulkhead: a cap on how many calls to one service run at once.
//!
//! A [`Bulkhead`] hands out at most `limit` [`Permit`]s. A call that finds all
//! of them taken is refused with [`Saturated`] straight away, or after waiting
//! at most the configured [`Wait`] budget for a permit to come back. That
//! refusal is backpressure, not a failure of the service: it tells the caller
//! that the service already has all the concurrent work it was given, and the
//! caller should shed, retry later or degrade, rather than pile up more
//! requests behind a slow dependency and exhaust its own threads, connections
//! and memory. One slow service then cannot take the rest of the process
//! down with it, which is where the name comes from.
//!
//! ```
//! use std::time::Duration;
//! use gendurable_bulkhead::{Bulkhead, BulkheadConfig, Saturated, Wait};
//!
//! let payments = Bulkhead::new(
//!     BulkheadConfig::new(8, Duration::from_secs(30))
//!         .with_wait(Wait::Bounded(Duration::from_millis(100))),
//! )?;
//!
//! match payments.call(|| "charged") {
//!     Ok(outcome) => println!("{outcome}"),
//!     Err(Saturated) => println!("payments busy, try later"),
//! }
//! # Ok::<(), gendurable_bulkhead::BulkheadError>(())
//! ```
//!
//! # Permits expire: `reclaim_after`
//!
//! A permit is returned when it is dropped: on return, on error, on panic, and
//! when a future holding it is cancelled. Some holders never get there: a
//! thread blocked forever in a driver, a future leaked with `mem::forget`, a
//! task stuck behind a dead lock. So every permit also carries a deadline,
//! `reclaim_after` from when it was taken. Once that deadline has passed, the
//! holder no longer counts: its slot is taken back (a *reclaim*, reported to
//! [`BulkheadHooks::on_reclaimed`]) and goes to the oldest waiter or back to
//! the free slots. A process-wide background thread, the reaper, does this
//! when the earliest deadline of a bulkhead passes, so no acquire, release or
//! refusal ever looks for expired holders; [`Bulkhead::in_flight`] does it too
//! when a deadline is due, so it never counts an expired holder. Deadlines are
//! kept on the kernel's coarse monotonic clock, rounded up: a slot never comes
//! back before `reclaim_after` has passed since the acquire, and comes back
//! up to two kernel ticks plus about 2 ms later (about 10 ms with the common
//! 250 Hz tick).
//!
//! That is a deliberate trade-off. A call that is merely slow, still running
//! after `reclaim_after`, loses its slot and the service sees one call more
//! than `limit` until it finishes: a slow call can be over-admitted, once per
//! expiry. In exchange a call that was killed or wedged can never hold the
//! limit down for longer than `reclaim_after`. Choose `reclaim_after`
//! comfortably above the slowest call you expect to finish (above the
//! client's own timeout, if it has one).
//!
//! The late release of a reclaimed permit is harmless: each slot holds a token
//! (deadline plus generation) and a release only frees the slot if it still
//! holds the releasing permit's token. [`Permit::is_current`] tells a holder
//! whether it still owns its slot.
//!
//! # Waiting
//!
//! With [`Wait::Bounded`], [`Bulkhead::acquire`] (async) and
//! [`Bulkhead::acquire_blocking`] (threads) wait up to that long. Waiting is
//! first come, first served: waiters form one queue, and a released (or
//! reclaimed) slot goes straight to the oldest of them, before any newcomer
//! can take it; a caller that finds others waiting queues behind them, and
//! [`Bulkhead::try_acquire`] is refused. Waiters hold no slot while they
//! wait. A waiter that times out or whose future is dropped leaves nothing
//! behind (a permit granted to it at that moment goes to the next waiter). An
//! unbounded wait cannot be configured: a bulkhead that queues without limit
//! is a queue, and hides the overload it is there to expose.
//!
//! # Cost
//!
//! Free slots form a lock-free stack. An acquire pops one, a release pushes it
//! back: three atomic read-modify-writes in all plus one read of the kernel's
//! coarse clock, with no lock, no allocation and no search, whatever the limit
//! and however many permits are held. A refusal is one load, plus an atomic
//! add once refusals are counted for metrics ([`Bulkhead::count_saturated`]).
//! Nothing about waiters, expiry or hooks is touched unless someone waits, a
//! bulkhead goes from idle to busy, or hooks are set. `docs/bulkhead.md` has the benchmark
//! figures and the protocol in detail; the implementation notes are in the
//! `slots` module.
//!
//! # This bulkhead or a concurrency key?
//!
//! This bulkhead counts calls made by *this process*. Ten workers with a
//! bulkhead of 8 each may send 80 concurrent calls to the service, and the
//! count is lost when the process exits. When the limit must hold across the
//! whole cluster, or must survive restarts (a partner API that allows 5
//! concurrent sessions per account, a batch job that must never run twice at
//! once), use the engine's `concurrency_key` gates instead: they are enforced
//! by the database, cluster-wide and durably, at the price of a database
//! round trip per admission. The two combine well: a concurrency key for the
//! global, durable rule and a bulkhead in each process to keep a single
//! worker from flooding a slow dependency.
//!
//! # Metrics
//!
//! [`Bulkhead::saturated`] and [`Bulkhead::reclaimed`] count refusals (once
//! asked to) and reclaims; [`prometheus`] writes the Prometheus text of a set
//! of bulkheads. The engine's `EngineBuilder::bulkhead` shows a bulkhead in
//! its `/metrics`.
//!
//! # Registry
//!
//! Bindings in other languages address bulkheads by service name:
//! [`Bulkhead::configure`], [`Bulkhead::named`], [`Bulkhead::in_flight_of`],
//! [`Bulkhead::limit_of`], [`Bulkhead::reset_named`].

mod clock;
mod metrics;
mod reaper;
mod registry;
mod slots;
mod sync;
mod waiters;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use metrics::prometheus;
use slots::{Claim, Core, Enqueued};
use waiters::{Waiting, Wake};

/// The largest `limit` a bulkhead accepts.
pub const MAX_LIMIT: usize = 1 << 20;

/// The largest `reclaim_after` a bulkhead accepts.
pub const MAX_RECLAIM_AFTER: Duration = Duration::from_secs(365 * 24 * 3600);

/// The largest [`Wait::Bounded`] budget a bulkhead accepts. Anything longer
/// is refused rather than clamped: it is unbounded in all but name.
pub const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The bulkhead had no permit to give within the caller's budget.
///
/// This is backpressure: the service already runs as many calls from this
/// process as it was allowed. Shed the call, retry later or degrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("bulkhead saturated: every permit is in use")]
pub struct Saturated;

/// A bulkhead configuration that was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BulkheadError {
    /// The configuration breaks one of the rules of [`BulkheadConfig`]; the
    /// message says which.
    #[error("invalid bulkhead configuration: {0}")]
    InvalidConfig(String),
}

/// No bulkhead is registered under this name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no bulkhead named {0:?}")]
pub struct NotFound(pub String);

/// How long an acquire may wait for a permit when the bulkhead is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wait {
    /// Do not wait: refuse with [`Saturated`] at once (shed load).
    #[default]
    None,
    /// Wait at most this long (at most [`MAX_WAIT`]). `Bounded(Duration::ZERO)`
    /// is the same as `None`.
    Bounded(Duration),
    /// Wait as long as it takes. Always refused by [`Bulkhead::new`]; it exists
    /// so that bindings can pass a caller's "no timeout" through and get a
    /// clear error back.
    Unbounded,
}

/// Callbacks for metrics. Every method has an empty default.
///
/// Keep them short and do not block or panic in them. All but
/// `on_reclaimed` run on the caller's thread, inside acquire.
pub trait BulkheadHooks: Send + Sync {
    /// A permit was handed out (after waiting or not).
    fn on_acquired(&self) {}
    /// An acquire was refused with [`Saturated`] (after waiting or not).
    fn on_saturated(&self) {}
    /// An acquire had to wait, for this long, whatever its outcome.
    fn on_waited(&self, _waited: Duration) {}
    /// A holder outlived `reclaim_after` without releasing, and its slot was
    /// taken back. Runs on the reaper thread, or in an `in_flight` call that
    /// found the deadline due.
    fn on_reclaimed(&self) {}
}

/// What to build a [`Bulkhead`] from.
///
/// Rules, checked by [`Bulkhead::new`]: `limit` in `1..=MAX_LIMIT`,
/// `reclaim_after` in `(0, MAX_RECLAIM_AFTER]`, and `wait` not
/// [`Wait::Unbounded`] nor longer than [`MAX_WAIT`].
#[derive(Clone)]
pub struct BulkheadConfig {
    /// How many permits may be held at once.
    pub limit: usize,
    /// How long a permit counts as held if it is never released.
    pub reclaim_after: Duration,
    /// How long an acquire may wait for a permit.
    pub wait: Wait,
    /// Metrics callbacks.
    pub hooks: Option<Arc<dyn BulkheadHooks>>,
}

impl BulkheadConfig {
    /// A configuration that sheds immediately when full and has no hooks.
    pub fn new(limit: usize, reclaim_after: Duration) -> Self {
        BulkheadConfig {
            limit,
            reclaim_after,
            wait: Wait::None,
            hooks: None,
        }
    }

    /// Sets how long an acquire may wait.
    pub fn with_wait(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }

    /// Sets the metrics callbacks.
    pub fn with_hooks(mut self, hooks: Arc<dyn BulkheadHooks>) -> Self {
        self.hooks = Some(hooks);
        self
    }
}

impl fmt::Debug for BulkheadConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadConfig")
            .field("limit", &self.limit)
            .field("reclaim_after", &self.reclaim_after)
            .field("wait", &self.wait)
            .field("hooks", &self.hooks.is_some())
            .finish()
    }
}

fn invalid(msg: impl Into<String>) -> BulkheadError {
    BulkheadError::InvalidConfig(msg.into())
}

/// A per-service concurrency limit. See the [module documentation](self).
pub struct Bulkhead {
    core: Arc<Core>,
}

impl Bulkhead {
    /// Builds a bulkhead, or says which rule `config` breaks.
    pub fn new(config: BulkheadConfig) -> Result<Bulkhead, BulkheadError> {
        let BulkheadConfig {
            limit,
            reclaim_after,
            wait,
            hooks,
        } = config;
        if limit == 0 {
            return Err(invalid("limit must be at least 1"));
        }
        if limit > MAX_LIMIT {
            return Err(invalid(format!(
                "limit must be at most {MAX_LIMIT}, got {limit}"
            )));
        }
        if reclaim_after.is_zero() {
            return Err(invalid(
                "reclaim_after must be greater than zero: it bounds how long a permit that is \
                 never released keeps its slot",
            ));
        }
        if reclaim_after > MAX_RECLAIM_AFTER {
            return Err(invalid(format!(
                "reclaim_after must be at most {MAX_RECLAIM_AFTER:?}, got {reclaim_after:?}"
            )));
        }
        let wait = match wait {
            Wait::None => None,
            Wait::Bounded(d) if d.is_zero() => None,
            Wait::Bounded(d) if d <= MAX_WAIT => Some(d),
            Wait::Bounded(d) => {
                return Err(invalid(format!(
                    "wait must be at most {MAX_WAIT:?}, got {d:?}: a longer wait is effectively \
                     unbounded; give a finite budget"
                )))
            }
            Wait::Unbounded => {
                return Err(invalid(
                    "an unbounded wait is not allowed: give a bounded wait, or none to shed \
                     immediately",
                ))
            }
        };
        let clock = clock::Clock::new();
        let ticks = clock::reclaim_ticks(reclaim_after, clock.granularity());
        Ok(Bulkhead {
            core: Core::new(limit, ticks, clock, wait, reclaim_after, hooks),
        })
    }

    /// Takes a permit if one is free, without waiting. Refused while others
    /// wait, even if a slot is being released at that moment: it goes to them.
    #[inline]
    pub fn try_acquire(&self) -> Result<Permit<'_>, Saturated> {
        match self.core.try_claim() {
            Some(claim) => Ok(self.granted(claim)),
            None => Err(self.refused()),
        }
    }

    /// Takes a permit, waiting up to the configured [`Wait`] budget if the
    /// bulkhead is full, behind the callers already waiting.
    ///
    /// Waiting needs a Tokio runtime with the time driver enabled. Dropping
    /// the future while it waits leaves no permit behind.
    pub async fn acquire(&self) -> Result<Permit<'_>, Saturated> {
        if let Some(claim) = self.core.try_claim() {
            return Ok(self.granted(claim));
        }
        let Some(budget) = self.core.wait else {
            return Err(self.refused());
        };
        let started = Instant::now();
        let claim = match self.core.enqueue(Wake::task()) {
            Enqueued::Claimed(claim) => Some(claim),
            Enqueued::Waiting(waiter) => {
                let waiting = Waiting::new(&self.core, waiter);
                let give_up = tokio::time::Instant::from_std(give_up_at(started, budget));
                match tokio::time::timeout_at(give_up, waiting.waiter.until_granted()).await {
                    Ok(claim) => Some(waiting.keep(claim)),
                    Err(_) => waiting.give_up(),
                }
            }
        };
        self.after_wait(started, claim)
    }

    /// Takes a permit, blocking the thread up to the configured [`Wait`]
    /// budget if the bulkhead is full, behind the callers already waiting.
    /// For callers outside an async runtime; inside one, use
    /// [`acquire`](Bulkhead::acquire).
    pub fn acquire_blocking(&self) -> Result<Permit<'_>, Saturated> {
        if let Some(claim) = self.core.try_claim() {
            return Ok(self.granted(claim));
        }
        let Some(budget) = self.core.wait else {
            return Err(self.refused());
        };
        let started = Instant::now();
        let claim = match self.core.enqueue(Wake::this_thread()) {
            Enqueued::Claimed(claim) => Some(claim),
            Enqueued::Waiting(waiter) => {
                let waiting = Waiting::new(&self.core, waiter);
                let give_up = give_up_at(started, budget);
                loop {
                    if let Some(claim) = waiting.waiter.granted() {
                        break Some(waiting.keep(claim));
                    }
                    let now = Instant::now();
                    if now >= give_up {
                        break waiting.give_up();
                    }
                    // Unparked by the grant; spurious wake-ups just look again.
                    std::thread::park_timeout(give_up - now);
                }
            }
        };
        self.after_wait(started, claim)
    }

    /// Takes a permit that owns a reference to the bulkhead, for holders that
    /// cannot borrow it (bindings, spawned tasks). See
    /// [`try_acquire`](Bulkhead::try_acquire).
    pub fn try_acquire_owned(self: &Arc<Self>) -> Result<OwnedPermit, Saturated> {
        self.try_acquire().map(|p| p.into_owned(Arc::clone(self)))
    }

    /// Owned version of [`acquire`](Bulkhead::acquire).
    pub async fn acquire_owned(self: &Arc<Self>) -> Result<OwnedPermit, Saturated> {
        let permit = self.acquire().await?;
        Ok(permit.into_owned(Arc::clone(self)))
    }

    /// Owned version of [`acquire_blocking`](Bulkhead::acquire_blocking).
    pub fn acquire_blocking_owned(self: &Arc<Self>) -> Result<OwnedPermit, Saturated> {
        self.acquire_blocking()
            .map(|p| p.into_owned(Arc::clone(self)))
    }

    /// Runs `f` under a permit, taken with
    /// [`acquire_blocking`](Bulkhead::acquire_blocking). The permit is
    /// released when `f` returns or panics.
    pub fn call<T>(&self, f: impl FnOnce() -> T) -> Result<T, Saturated> {
        let _permit = self.acquire_blocking()?;
        Ok(f())
    }

    /// Runs `fut` under a permit, taken with [`acquire`](Bulkhead::acquire).
    /// The permit is released when `fut` completes or panics, or when the
    /// returned future is dropped.
    pub async fn call_async<F: Future>(&self, fut: F) -> Result<F::Output, Saturated> {
        let _permit = self.acquire().await?;
        Ok(fut.await)
    }

    /// Permits held right now by live holders. A holder past its deadline is
    /// not counted: if one is due, it is reclaimed first (which scans the
    /// slots, so this is O(`limit`) at most once per passing deadline, and
    /// O(1) otherwise).
    pub fn in_flight(&self) -> usize {
        self.core.in_flight()
    }

    /// How many permits may be held at once.
    pub fn limit(&self) -> usize {
        self.core.limit()
    }

    /// Callers currently waiting for a permit.
    pub fn waiting(&self) -> usize {
        self.core.waiting()
    }

    /// The configured wait budget (`None`: shed immediately).
    pub fn wait(&self) -> Option<Duration> {
        self.core.wait
    }

    /// The configured `reclaim_after`.
    pub fn reclaim_after(&self) -> Duration {
        self.core.reclaim_after
    }

    /// Frees every slot, as if all current holders had released (waiters get
    /// the slots first, oldest first). Their later releases do nothing, and
    /// [`Permit::is_current`] turns false for them. Meant for operators and
    /// tests, after an incident left the count wrong; the service may briefly
    /// see up to twice `limit` calls.
    pub fn reset(&self) {
        self.core.reset();
    }

    #[inline]
    fn granted(&self, claim: Claim) -> Permit<'_> {
        if let Some(hooks) = &self.core.hooks {
            hooks.on_acquired();
        }
        Permit {
            bulkhead: self,
            slot: claim.slot,
            token: claim.token,
        }
    }

    #[inline]
    fn refused(&self) -> Saturated {
        self.core.counts.refused();
        if let Some(hooks) = &self.core.hooks {
            hooks.on_saturated();
        }
        Saturated
    }

    fn after_wait(&self, started: Instant, claim: Option<Claim>) -> Result<Permit<'_>, Saturated> {
        if let Some(hooks) = &self.core.hooks {
            hooks.on_waited(started.elapsed());
        }
        match claim {
            Some(claim) => Ok(self.granted(claim)),
            None => Err(self.refused()),
        }
    }

    /// Moves the model clock past `reclaim_after`, so that loom tests can make
    /// deadlines pass.
    #[cfg(gendurable_loom)]
    #[doc(hidden)]
    pub fn model_advance_clock(&self) {
        let ticks = clock::reclaim_ticks(self.core.reclaim_after, Duration::ZERO);
        self.core.clock().advance(ticks + 1);
    }

    /// Runs the reaper's sweep now, for the loom model; returns how many
    /// holders it reclaimed.
    #[cfg(gendurable_loom)]
    #[doc(hidden)]
    pub fn model_sweep(&self) -> usize {
        self.core.sweep(None)
    }

    /// Whether an alarm is set, for the loom model.
    #[cfg(gendurable_loom)]
    #[doc(hidden)]
    pub fn model_armed(&self) -> bool {
        self.core.armed()
    }

    /// Joins the queue without waiting, for the loom model of hand-offs.
    #[cfg(gendurable_loom)]
    #[doc(hidden)]
    pub fn model_enqueue(self: &Arc<Self>) -> ModelWait {
        match self.core.enqueue(Wake::Nobody) {
            Enqueued::Claimed(claim) => {
                ModelWait::Claimed(self.granted(claim).into_owned(Arc::clone(self)))
            }
            Enqueued::Waiting(waiter) => ModelWait::Waiting(ModelWaiter {
                bulkhead: Arc::clone(self),
                waiter,
            }),
        }
    }
}

/// When a wait that started at `started` gives up. `budget` is at most
/// `MAX_WAIT`, so this cannot overflow; were it to, the waiter gives up at once
/// rather than panic.
fn give_up_at(started: Instant, budget: Duration) -> Instant {
    started.checked_add(budget).unwrap_or(started)
}

impl fmt::Debug for Bulkhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bulkhead")
            .field("limit", &self.limit())
            .field("in_flight", &self.in_flight())
            .field("waiting", &self.waiting())
            .field("wait", &self.wait())
            .field("reclaim_after", &self.reclaim_after())
            .finish()
    }
}

/// What [`Bulkhead::model_enqueue`] gave.
#[cfg(gendurable_loom)]
#[doc(hidden)]
pub enum ModelWait {
    /// A slot was free.
    Claimed(OwnedPermit),
    /// Queued.
    Waiting(ModelWaiter),
}

/// A queued waiter in the loom model.
#[cfg(gendurable_loom)]
#[doc(hidden)]
pub struct ModelWaiter {
    bulkhead: Arc<Bulkhead>,
    waiter: Arc<waiters::Waiter>,
}

#[cfg(gendurable_loom)]
impl ModelWaiter {
    /// Whether a permit was handed to this waiter.
    pub fn is_granted(&self) -> bool {
        self.waiter.granted().is_some()
    }

    /// Takes the permit handed to this waiter, or leaves the queue.
    pub fn finish(self) -> Option<OwnedPermit> {
        let claim = self.bulkhead.core.cancel(&self.waiter)?;
        Some(
            self.bulkhead
                .granted(claim)
                .into_owned(Arc::clone(&self.bulkhead)),
        )
    }
}

/// A held slot of a [`Bulkhead`]; dropping it releases the slot.
#[must_use = "the permit is released as soon as it is dropped"]
pub struct Permit<'a> {
    bulkhead: &'a Bulkhead,
    slot: u32,
    token: u64,
}

impl Permit<'_> {
    /// Whether this permit still owns its slot: false once the slot was
    /// reclaimed (the permit outlived `reclaim_after`) or reset.
    pub fn is_current(&self) -> bool {
        self.bulkhead.core.holds(self.slot, self.token)
    }

    fn into_owned(self, bulkhead: Arc<Bulkhead>) -> OwnedPermit {
        let owned = OwnedPermit {
            bulkhead,
            slot: self.slot,
            token: self.token,
        };
        std::mem::forget(self);
        owned
    }
}

impl Drop for Permit<'_> {
    #[inline]
    fn drop(&mut self) {
        self.bulkhead.core.release(self.slot, self.token);
    }
}

impl fmt::Debug for Permit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit").field("slot", &self.slot).finish()
    }
}

/// A [`Permit`] that keeps its [`Bulkhead`] alive; dropping it releases the
/// slot.
#[must_use = "the permit is released as soon as it is dropped"]
pub struct OwnedPermit {
    bulkhead: Arc<Bulkhead>,
    slot: u32,
    token: u64,
}

impl OwnedPermit {
    /// See [`Permit::is_current`].
    pub fn is_current(&self) -> bool {
        self.bulkhead.core.holds(self.slot, self.token)
    }

    /// The bulkhead this permit belongs to.
    pub fn bulkhead(&self) -> &Arc<Bulkhead> {
        &self.bulkhead
    }
}

impl Drop for OwnedPermit {
    fn drop(&mut self) {
        self.bulkhead.core.release(self.slot, self.token);
    }
}

impl fmt::Debug for OwnedPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedPermit")
            .field("slot", &self.slot)
            .finish()
    }
}

#[cfg(all(test, not(gendurable_loom)))]
mod tests {
    use super::*;

    #[test]
    fn permits_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Bulkhead>();
        check::<Permit<'static>>();
        check::<OwnedPermit>();
    }

    #[test]
    fn owned_permit_releases_into_its_bulkhead() {
        let b = Arc::new(Bulkhead::new(BulkheadConfig::new(1, Duration::from_secs(60))).unwrap());
        let p = b.try_acquire_owned().unwrap();
        assert_eq!(b.in_flight(), 1);
        assert!(p.is_current());
        assert!(b.try_acquire().is_err());
        drop(p);
        assert_eq!(b.in_flight(), 0);
    }
}
