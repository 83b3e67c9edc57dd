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
//! use gendurable::bulkhead::{Bulkhead, BulkheadConfig, Saturated, Wait};
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
//! # Ok::<(), gendurable::bulkhead::BulkheadError>(())
//! ```
//!
//! # Permits expire: `reclaim_after`
//!
//! A permit is returned when it is dropped: on return, on error, on panic, and
//! when a future holding it is cancelled. Some holders never get there: a
//! thread blocked forever in a driver, a future leaked with `mem::forget`, a
//! task stuck behind a dead lock. So every permit also carries a deadline,
//! `reclaim_after` from when it was taken. Past that deadline its slot counts
//! as free, and the next caller that finds the bulkhead full takes it over
//! (a *reclaim*, reported to [`BulkheadHooks::on_reclaimed`]). Deadlines are
//! kept on the kernel's coarse monotonic clock, rounded up: a slot never comes
//! back before `reclaim_after` has passed since the acquire began, and may
//! come back up to two kernel ticks plus about 2 ms later (about 10 ms with
//! the common 250 Hz tick).
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
//! [`Bulkhead::acquire_blocking`] (threads) wait up to that long. Waiters hold
//! no slot while they wait; a release wakes one of them, and they also wake
//! when the earliest held deadline passes, so a reclaim is not missed. A
//! waiter that times out or whose future is dropped leaves nothing behind.
//! Waiting is not first-come first-served: a call arriving while a slot is
//! free takes it even if others are waiting. An unbounded wait cannot be
//! configured: a bulkhead that queues without limit is a queue, and hides the
//! overload it is there to expose.
//!
//! # Cost
//!
//! An acquire and release that find a free slot cost three atomic
//! read-modify-writes in all (four once more than 63 permits are held) plus
//! one read of the kernel's coarse clock, with no lock and no allocation;
//! nothing about waiters or hooks is touched unless someone waits or hooks
//! are set. A full bulkhead is recognised from a bitmap and a counter, in
//! constant time whatever the limit. `docs/bulkhead.md` has the
//! benchmark figures and the protocol in detail; the implementation notes
//! are in the `slots` module.
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
//! # Registry
//!
//! Bindings in other languages address bulkheads by service name:
//! [`Bulkhead::configure`], [`Bulkhead::named`], [`Bulkhead::in_flight_of`],
//! [`Bulkhead::limit_of`], [`Bulkhead::reset_named`].

mod clock;
mod registry;
mod slots;
mod sync;

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use slots::{Claim, Released, Slots};

/// The largest `limit` a bulkhead accepts.
pub const MAX_LIMIT: usize = 1 << 20;

/// The largest `reclaim_after` a bulkhead accepts.
pub const MAX_RECLAIM_AFTER: Duration = Duration::from_secs(365 * 24 * 3600);

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
    /// Wait at most this long. `Bounded(Duration::ZERO)` is the same as `None`.
    Bounded(Duration),
    /// Wait as long as it takes. Always refused by [`Bulkhead::new`]; it exists
    /// so that bindings can pass a caller's "no timeout" through and get a
    /// clear error back.
    Unbounded,
}

/// Callbacks for metrics. Every method has an empty default.
///
/// They run on the caller's thread, inside acquire: keep them short and do not
/// block or panic in them.
pub trait BulkheadHooks: Send + Sync {
    /// A permit was handed out (after waiting or not, reclaimed or not).
    fn on_acquired(&self) {}
    /// An acquire was refused with [`Saturated`] (after waiting or not).
    fn on_saturated(&self) {}
    /// An acquire had to wait, for this long, whatever its outcome.
    fn on_waited(&self, _waited: Duration) {}
    /// A permit was handed out by taking over a slot whose holder outlived
    /// `reclaim_after` without releasing it.
    fn on_reclaimed(&self) {}
}

/// What to build a [`Bulkhead`] from.
///
/// Rules, checked by [`Bulkhead::new`]: `limit` in `1..=MAX_LIMIT`,
/// `reclaim_after` in `(0, MAX_RECLAIM_AFTER]`, and `wait` not
/// [`Wait::Unbounded`] (nor a duration so long it cannot be added to the
/// current time).
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
    slots: Slots,
    wait: Option<Duration>,
    reclaim_after: Duration,
    hooks: Option<Arc<dyn BulkheadHooks>>,
    waiters: Waiters,
}

/// Everything waiting needs. Only touched when the `state` word says someone
/// waits, so the uncontended path never reads it.
#[derive(Default)]
struct Waiters {
    notify: tokio::sync::Notify,
    async_waiting: AtomicUsize,
    lock: Mutex<()>,
    condvar: Condvar,
    blocking_waiting: AtomicUsize,
}

impl Bulkhead {
    /// Builds a bulkhead, or says which rule `config` breaks.
    pub fn new(config: BulkheadConfig) -> Result<Bulkhead, BulkheadError> {
        Self::build(config, slots::WORD_SLOTS)
    }

    /// As [`new`](Bulkhead::new), tracking at most `word_slots` slots in the
    /// bitmap, so that small models also exercise the counted slots.
    #[cfg(gendurable_loom)]
    #[doc(hidden)]
    pub fn new_with_word_slots(
        config: BulkheadConfig,
        word_slots: usize,
    ) -> Result<Bulkhead, BulkheadError> {
        Self::build(config, word_slots)
    }

    fn build(config: BulkheadConfig, word_slots: usize) -> Result<Bulkhead, BulkheadError> {
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
            Wait::Bounded(d) if Instant::now().checked_add(d).is_some() => Some(d),
            Wait::Bounded(d) => {
                return Err(invalid(format!(
                    "wait of {d:?} is effectively unbounded; give a finite budget"
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
        // Unreachable with MAX_RECLAIM_AFTER, but the token layout depends on it.
        if ticks >= slots::MAX_TICKS / 2 {
            return Err(invalid("reclaim_after is too large"));
        }
        Ok(Bulkhead {
            slots: Slots::with_word_slots(limit, ticks, clock, word_slots),
            wait,
            reclaim_after,
            hooks,
            waiters: Waiters::default(),
        })
    }

    /// Takes a permit if one is free (or expired), without waiting.
    #[inline]
    pub fn try_acquire(&self) -> Result<Permit<'_>, Saturated> {
        match self.slots.try_claim() {
            Some(claim) => Ok(self.granted(claim)),
            None => Err(self.refused()),
        }
    }

    /// Takes a permit, waiting up to the configured [`Wait`] budget if the
    /// bulkhead is full.
    ///
    /// Waiting needs a Tokio runtime with the time driver enabled. Dropping
    /// the future while it waits leaves no permit behind.
    pub async fn acquire(&self) -> Result<Permit<'_>, Saturated> {
        if let Some(claim) = self.slots.try_claim() {
            return Ok(self.granted(claim));
        }
        let Some(budget) = self.wait else {
            return Err(self.refused());
        };
        let started = Instant::now();
        let give_up = tokio::time::Instant::from_std(started + budget);
        let claim = {
            let _waiting = WaiterGuard::new(self, &self.waiters.async_waiting);
            loop {
                let notified = self.waiters.notify.notified();
                tokio::pin!(notified);
                // Register for wake-ups before looking, so a release between
                // the look and the await is not missed.
                notified.as_mut().enable();
                if let Some(claim) = self.slots.try_claim() {
                    break Some(claim);
                }
                let now = tokio::time::Instant::now();
                if now >= give_up {
                    break None;
                }
                let wake_at = give_up.min(now + self.until_expiry());
                // Woken, timed out or past the earliest deadline: look again.
                let _ = tokio::time::timeout_at(wake_at, notified).await;
            }
        };
        self.after_wait(started, claim)
    }

    /// Takes a permit, blocking the thread up to the configured [`Wait`]
    /// budget if the bulkhead is full. For callers outside an async runtime;
    /// inside one, use [`acquire`](Bulkhead::acquire).
    pub fn acquire_blocking(&self) -> Result<Permit<'_>, Saturated> {
        if let Some(claim) = self.slots.try_claim() {
            return Ok(self.granted(claim));
        }
        let Some(budget) = self.wait else {
            return Err(self.refused());
        };
        let started = Instant::now();
        let give_up = started + budget;
        let claim = {
            let _waiting = WaiterGuard::new(self, &self.waiters.blocking_waiting);
            // Held while looking and released atomically by the wait, so a
            // release (which takes the lock to notify) cannot slip in between.
            let mut guard = self
                .waiters
                .lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            loop {
                if let Some(claim) = self.slots.try_claim() {
                    break Some(claim);
                }
                let now = Instant::now();
                if now >= give_up {
                    break None;
                }
                let timeout = (give_up - now).min(self.until_expiry());
                guard = self
                    .waiters
                    .condvar
                    .wait_timeout(guard, timeout)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
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

    /// Permits held right now, including any whose holder has outlived
    /// `reclaim_after` but whose slot has not been taken over yet (that
    /// happens lazily, when a caller needs the slot).
    pub fn in_flight(&self) -> usize {
        self.slots.in_flight()
    }

    /// How many permits may be held at once.
    pub fn limit(&self) -> usize {
        self.slots.limit()
    }

    /// Callers currently waiting for a permit.
    pub fn waiting(&self) -> usize {
        self.slots.waiters()
    }

    /// The configured wait budget (`None`: shed immediately).
    pub fn wait(&self) -> Option<Duration> {
        self.wait
    }

    /// The configured `reclaim_after`.
    pub fn reclaim_after(&self) -> Duration {
        self.reclaim_after
    }

    /// Frees every slot, as if all current holders had released. Their later
    /// releases do nothing, and [`Permit::is_current`] turns false for them.
    /// Meant for operators and tests, after an incident left the count wrong;
    /// the service may briefly see up to twice `limit` calls.
    pub fn reset(&self) {
        if self.slots.reset() > 0 && self.slots.waiters() > 0 {
            self.waiters.notify.notify_waiters();
            // A waiter between its look and its await only sees notify_one.
            self.waiters.notify.notify_one();
            let _guard = self
                .waiters
                .lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.waiters.condvar.notify_all();
        }
    }

    #[inline]
    fn granted(&self, claim: Claim) -> Permit<'_> {
        if let Some(hooks) = &self.hooks {
            if claim.reclaimed {
                hooks.on_reclaimed();
            }
            hooks.on_acquired();
        }
        Permit {
            bulkhead: self,
            slot: claim.slot,
            token: claim.token,
        }
    }

    #[cold]
    fn refused(&self) -> Saturated {
        if let Some(hooks) = &self.hooks {
            hooks.on_saturated();
        }
        Saturated
    }

    fn after_wait(&self, started: Instant, claim: Option<Claim>) -> Result<Permit<'_>, Saturated> {
        if let Some(hooks) = &self.hooks {
            hooks.on_waited(started.elapsed());
        }
        match claim {
            Some(claim) => Ok(self.granted(claim)),
            None => Err(self.refused()),
        }
    }

    /// How long a waiter may sleep before the earliest held deadline may
    /// have passed (plus the clock's granularity, so it has surely passed).
    fn until_expiry(&self) -> Duration {
        clock::ticks_to_duration(self.slots.ticks_until_expiry()) + self.slots.clock().granularity()
    }

    #[inline]
    fn release(&self, slot: u32, token: u64) {
        if self.slots.release(slot, token) == Released::FreedWithWaiters {
            self.wake_one();
        }
    }

    #[cold]
    #[inline(never)]
    fn wake_one(&self) {
        let w = &self.waiters;
        if w.async_waiting.load(Ordering::Acquire) > 0 {
            w.notify.notify_one();
        }
        if w.blocking_waiting.load(Ordering::Acquire) > 0 {
            let _guard = w.lock.lock().unwrap_or_else(PoisonError::into_inner);
            w.condvar.notify_one();
        }
    }

    /// Registers a waiter without waiting, for the loom model of wake-ups.
    #[cfg(gendurable_loom)]
    #[doc(hidden)]
    pub fn model_add_waiter(&self) {
        self.slots.add_waiter();
    }

    /// Moves the model clock forward, so that loom tests can make deadlines pass.
    #[cfg(gendurable_loom)]
    #[doc(hidden)]
    pub fn advance_clock_past_reclaim(&self) {
        let ticks = clock::reclaim_ticks(self.reclaim_after, Duration::ZERO);
        self.slots.clock().advance(ticks + 1);
    }
}

impl fmt::Debug for Bulkhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bulkhead")
            .field("limit", &self.limit())
            .field("in_flight", &self.in_flight())
            .field("waiting", &self.waiting())
            .field("wait", &self.wait)
            .field("reclaim_after", &self.reclaim_after)
            .finish()
    }
}

/// Counts a waiter for as long as it lives, so a waiter that gives up or is
/// dropped mid-await stops being counted.
struct WaiterGuard<'a> {
    bulkhead: &'a Bulkhead,
    kind: &'a AtomicUsize,
}

impl<'a> WaiterGuard<'a> {
    fn new(bulkhead: &'a Bulkhead, kind: &'a AtomicUsize) -> Self {
        // The kind first: a release that sees the waiter in `state` (AcqRel)
        // then also sees which kind to wake.
        kind.fetch_add(1, Ordering::Release);
        bulkhead.slots.add_waiter();
        WaiterGuard { bulkhead, kind }
    }
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        self.bulkhead.slots.remove_waiter();
        self.kind.fetch_sub(1, Ordering::Release);
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
        self.bulkhead.slots.holds(self.slot, self.token)
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
        self.bulkhead.release(self.slot, self.token);
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
        self.bulkhead.slots.holds(self.slot, self.token)
    }

    /// The bulkhead this permit belongs to.
    pub fn bulkhead(&self) -> &Arc<Bulkhead> {
        &self.bulkhead
    }
}

impl OwnedPermit {
    /// Releases and reports whether the release would wake a waiter, for the
    /// loom model of wake-ups.
    #[cfg(gendurable_loom)]
    #[doc(hidden)]
    pub fn model_release(self) -> bool {
        // Dropping `self` afterwards releases again, which is a no-op: the
        // slot no longer holds this token.
        self.bulkhead.slots.release(self.slot, self.token) == Released::FreedWithWaiters
    }
}

impl Drop for OwnedPermit {
    fn drop(&mut self) {
        self.bulkhead.release(self.slot, self.token);
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
