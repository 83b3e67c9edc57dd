//! The slot protocol: admission, release, hand-off, reclaim and reset.
//!
//! # Slots and tokens
//!
//! Each slot is one `AtomicU64` token: the deadline (in clock ticks) in the
//! high 40 bits and a generation in the low 24. A deadline of 0 means the slot
//! is not held. A non-zero deadline means it is held, until that deadline.
//!
//! Every claim increments the generation, and release, reclaim and reset keep
//! it, so two holders of the same slot never hold the same token, even when
//! they claimed it in the same tick (reset, then a new acquire). Release,
//! reclaim and reset are compare-and-exchanges against an exact token, so
//! exactly one of them frees a given holding, and a holder whose slot was
//! reclaimed or reset changes nothing when it releases. (For a stale token to
//! come back, the same slot would have to be claimed 2^24 times within one
//! clock tick: impossible at tens of nanoseconds per claim and a 1 ms tick.)
//!
//! # The free stack
//!
//! Free slots form a stack (Treiber's), linked through the slots: each free
//! slot's `link` holds the index of the slot below it and how many free slots
//! there are from it down. The `head` word holds the index of the top slot,
//! two flags and a 41-bit tag that every change increments:
//!
//! - **Acquire** pops the top slot with one compare-and-exchange on `head`,
//!   then writes its token into the slot it now owns. An empty stack is a
//!   refusal, recognised by one load whatever the limit.
//! - **Release** clears the token with a compare-and-exchange (so a stale
//!   holder frees nothing), then pushes the slot with a compare-and-exchange
//!   on `head`. An acquire and a release are three atomic read-modify-writes
//!   in all, and the slot a thread releases is the one it takes next, still
//!   in its cache.
//!
//! The tag makes a pop that read a stale `link` fail: the head word only
//! repeats after 2^41 changes, which no pop stays preempted long enough to
//! see. Held slots are `limit` minus the free count of the top slot, so the
//! count needs no counter of its own.
//!
//! # Waiters
//!
//! The `WAITERS` flag in `head` is set while any caller waits, and then the
//! stack is empty: a waiter only registers when it finds no free slot (the
//! flag is set by a compare-and-exchange from an empty head), and while the
//! flag is set a freed slot is not pushed but handed, under the queue's lock,
//! to the oldest waiter. A release learns about waiters from the very word it
//! must modify to push, so it cannot miss one; a newcomer finds the stack
//! empty and queues behind. See `waiters`.
//!
//! # Expiry: the alarm and the sweep
//!
//! Nothing on the acquire, release or refusal path looks for expired holders.
//! The `ARMED` flag in `head` says that an alarm is set for this bulkhead,
//! at `alarm_at`, no later than the deadline of any held slot. The pop that
//! finds it clear sets it in the same compare-and-exchange, and so knows it is
//! the only holder: it sets the alarm at its own deadline, with the reaper
//! thread (`reaper.rs`). When the alarm goes off, the reaper sweeps the slots:
//! it reclaims every held slot whose deadline has passed (clears its token,
//! then frees it like a release: to a waiter, or onto the stack) and sets the
//! alarm again at the smallest remaining deadline. A sweep that finds nothing
//! held clears `ARMED` with a compare-and-exchange that only succeeds if the
//! stack is still entirely free, so a pop that raced it either sees `ARMED`
//! clear (and sets the alarm) or makes the sweep keep it.
//!
//! `in_flight` sweeps too when the alarm is due, so it never counts a holder
//! past its deadline. Sweeps are serialised by their own lock, and are the
//! only scans over `limit`: at most one per alarm, off the callers' path.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::clock::Clock;
use super::sync::{lock, AtomicU64, Mutex, MutexGuard, Ordering::*};
use super::waiters::{Queue, Waiter, Wake};
use super::{reaper, BulkheadHooks};

const GEN_BITS: u32 = 24;
const GEN_MASK: u64 = (1 << GEN_BITS) - 1;
/// Largest deadline (in ticks) that fits in a token.
pub(crate) const MAX_TICKS: u64 = u64::MAX >> GEN_BITS;

/// Bits of a slot index in `head` and `link`: enough for `MAX_LIMIT` slots
/// and the `NONE` marker.
const INDEX_BITS: u32 = 21;
const INDEX: u64 = (1 << INDEX_BITS) - 1;
/// "No slot": the empty stack, the bottom of the stack.
const NONE: u64 = INDEX;
/// In `head`: someone waits (and the stack is empty).
const WAITERS: u64 = 1 << INDEX_BITS;
/// In `head`: an alarm is set no later than every held slot's deadline.
const ARMED: u64 = 1 << (INDEX_BITS + 1);
/// In `head`: one unit of the tag, which occupies the bits above the flags.
const TAG_ONE: u64 = 1 << (INDEX_BITS + 2);

#[inline]
fn deadline_of(token: u64) -> u64 {
    token >> GEN_BITS
}

/// The token a claim writes over `prev`: a new deadline and the next generation.
#[inline]
fn next_token(deadline: u64, prev: u64) -> u64 {
    (deadline << GEN_BITS) | (prev.wrapping_add(1) & GEN_MASK)
}

/// The deadline of a claim made at `now`: saturating, and never beyond what a
/// token holds (a deadline that would not fit is never reached, which only
/// ever delays a reclaim).
#[inline]
pub(crate) fn deadline(now: u64, reclaim_ticks: u64) -> u64 {
    now.saturating_add(reclaim_ticks).min(MAX_TICKS)
}

/// `h` with top slot `top` and the tag incremented.
#[inline]
fn with_top(h: u64, top: u64) -> u64 {
    (h & !INDEX).wrapping_add(TAG_ONE) | top
}

/// `h` with `flag` set or cleared and the tag incremented.
#[inline]
fn with_flag(h: u64, flag: u64, set: bool) -> u64 {
    let h = if set { h | flag } else { h & !flag };
    h.wrapping_add(TAG_ONE)
}

/// A free slot's link: the slot below it and the free slots from it down.
#[inline]
fn link(below: u64, free: u64) -> u64 {
    below | free << INDEX_BITS
}

/// One slot on its own cache line. Without the padding, holders on different
/// cores write to the same line on every acquire and release.
#[repr(align(64))]
struct Slot {
    token: AtomicU64,
    /// While free: see `link`. Only written by whoever pushes the slot.
    link: AtomicU64,
}

/// The word every acquire, release and refusal reads, on its own cache line.
#[repr(align(128))]
struct Head(AtomicU64);

/// What a bulkhead counts for its metrics (see `metrics.rs`), on a cache
/// line of its own: a counted refusal writes it, which must not disturb the
/// words every acquire reads. Plain std atomics, outside the loom model:
/// nothing in the protocol reads them.
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct Counts {
    /// Whether refusals are counted (set once, never cleared).
    pub(crate) counting: std::sync::atomic::AtomicBool,
    /// Acquires refused with `Saturated` while counting.
    pub(crate) saturated: std::sync::atomic::AtomicU64,
    /// Holders whose slot was taken back past their deadline.
    pub(crate) reclaimed: std::sync::atomic::AtomicU64,
}

impl Counts {
    /// A refusal: one load of the flag while not counting.
    #[inline]
    pub(crate) fn refused(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.counting.load(Relaxed) {
            self.saturated.fetch_add(1, Relaxed);
        }
    }
}

/// A slot won by an acquire or handed to a waiter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim {
    pub(crate) slot: u32,
    pub(crate) token: u64,
}

/// What joining the queue gave.
pub(crate) enum Enqueued {
    /// A slot was free after all.
    Claimed(Claim),
    /// Waiting: the waiter is granted a slot, or gives up.
    Waiting(Arc<Waiter>),
}

/// Everything a bulkhead shares with its permits and the reaper thread.
pub(crate) struct Core {
    head: Head,
    slots: Box<[Slot]>,
    reclaim_ticks: u64,
    clock: Clock,
    pub(crate) hooks: Option<Arc<dyn BulkheadHooks>>,
    pub(crate) wait: Option<Duration>,
    pub(crate) reclaim_after: Duration,
    pub(crate) counts: Counts,
    queue: Mutex<Queue>,
    /// When the alarm goes off, in ticks (meaningful while `ARMED`).
    alarm_at: AtomicU64,
    /// Held while sweeping.
    sweeping: Mutex<()>,
    /// For the reaper, which must not keep a bulkhead alive.
    me: Weak<Core>,
}

impl Core {
    /// `limit` must be in `1..=MAX_LIMIT` and `reclaim_ticks` at least 1; the
    /// public constructor checks both.
    pub(crate) fn new(
        limit: usize,
        reclaim_ticks: u64,
        clock: Clock,
        wait: Option<Duration>,
        reclaim_after: Duration,
        hooks: Option<Arc<dyn BulkheadHooks>>,
    ) -> Arc<Core> {
        debug_assert!(limit >= 1 && (limit as u64) < NONE);
        debug_assert!(reclaim_ticks >= 1);
        let n = limit as u64;
        Arc::new_cyclic(|me| Core {
            // All free, slot 0 on top: a lightly used bulkhead stays on the
            // first few slots.
            head: Head(AtomicU64::new(0)),
            slots: (0..n)
                .map(|i| Slot {
                    token: AtomicU64::new(0),
                    link: AtomicU64::new(link(if i + 1 < n { i + 1 } else { NONE }, n - i)),
                })
                .collect(),
            reclaim_ticks,
            clock,
            hooks,
            wait,
            reclaim_after,
            counts: Counts::default(),
            queue: Mutex::new(Queue::default()),
            alarm_at: AtomicU64::new(0),
            sweeping: Mutex::new(()),
            me: me.clone(),
        })
    }

    #[cfg(gendurable_loom)]
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    pub(crate) fn limit(&self) -> usize {
        self.slots.len()
    }

    #[inline]
    fn link_of(&self, i: u64) -> u64 {
        self.slots[i as usize].link.load(Relaxed)
    }

    /// Free slots on the stack whose head is `h` (`h` may be stale).
    #[inline]
    fn free_under(&self, h: u64) -> u64 {
        match h & INDEX {
            NONE => 0,
            top => self.link_of(top) >> INDEX_BITS,
        }
    }

    // ------------------------------------------------------------ acquire

    /// Claims a free slot, or says there is none. One load when there is none.
    #[inline]
    pub(crate) fn try_claim(&self) -> Option<Claim> {
        let h = self.head.0.load(Acquire);
        let top = h & INDEX;
        if top == NONE {
            return None;
        }
        let now = self.clock.now();
        let next = self.link_of(top) & INDEX;
        // Acquire, also on failure: pairs with the Release of the push that
        // put the top slot there (through the release sequence of later
        // changes to `head`), so that slot's cleared token and its link are
        // visible. A link read after a Relaxed failure could be stale, and
        // the next compare-and-exchange would then succeed with it.
        match self
            .head
            .0
            .compare_exchange(h, with_top(h, next) | ARMED, Acquire, Acquire)
        {
            Ok(_) => Some(self.fill(top as usize, now, h & ARMED != 0)),
            Err(actual) => self.try_claim_slow(actual),
        }
    }

    /// [`try_claim`](Self::try_claim) after its compare-and-exchange lost a
    /// race; `h` was read with Acquire.
    #[inline(never)]
    fn try_claim_slow(&self, mut h: u64) -> Option<Claim> {
        loop {
            let top = h & INDEX;
            if top == NONE {
                return None;
            }
            let next = self.link_of(top) & INDEX;
            match self
                .head
                .0
                .compare_exchange_weak(h, with_top(h, next) | ARMED, Acquire, Acquire)
            {
                Ok(_) => return Some(self.fill(top as usize, self.clock.now(), h & ARMED != 0)),
                Err(actual) => h = actual,
            }
        }
    }

    /// Writes a fresh token into slot `i`, which the caller owns (it popped
    /// it, or hands it to a waiter), and sets the alarm unless `armed`.
    #[inline]
    fn fill(&self, i: usize, now: u64, armed: bool) -> Claim {
        let word = &self.slots[i].token;
        let deadline = deadline(now, self.reclaim_ticks);
        // Nobody else writes a slot that is off the stack and holds no
        // deadline (release, reclaim and reset only act on a deadline), so a
        // plain store is enough.
        let token = next_token(deadline, word.load(Relaxed));
        word.store(token, Release);
        if !armed {
            self.arm(deadline);
        }
        Claim {
            slot: i as u32,
            token,
        }
    }

    /// Sets the alarm: called by the pop that found `ARMED` clear, and so is
    /// the only holder; its deadline is the earliest.
    #[cold]
    #[inline(never)]
    fn arm(&self, at: u64) {
        self.alarm_at.store(at, Release);
        reaper::schedule(at, self.me.clone());
    }

    // ------------------------------------------------------------ release

    /// Releases `token` from `slot`. Does nothing and returns false if the
    /// slot no longer holds that token (it was reclaimed or reset).
    #[inline]
    pub(crate) fn release(&self, slot: u32, token: u64) -> bool {
        let i = slot as usize;
        // Release: publishes the holder's work to whoever takes the slot next.
        if self.slots[i]
            .token
            .compare_exchange(token, token & GEN_MASK, Release, Relaxed)
            .is_err()
        {
            return false;
        }
        self.free(i);
        true
    }

    /// Gives slot `i`, whose token was just cleared by the caller, to the
    /// oldest waiter or back to the stack.
    #[inline]
    fn free(&self, i: usize) {
        let h = self.head.0.load(Acquire);
        if h & WAITERS == 0 {
            self.set_link(i, h);
            // Release: the pop that takes the slot sees the cleared token and
            // the link.
            if self
                .head
                .0
                .compare_exchange(h, with_top(h, i as u64), Release, Relaxed)
                .is_ok()
            {
                return;
            }
        }
        self.free_slow(i);
    }

    /// Links slot `i` above the top of `h`.
    #[inline]
    fn set_link(&self, i: usize, h: u64) {
        let link = link(h & INDEX, self.free_under(h) + 1);
        self.slots[i].link.store(link, Relaxed);
    }

    /// [`free`](Self::free) after its push lost a race, or found waiters.
    #[cold]
    #[inline(never)]
    fn free_slow(&self, i: usize) {
        let mut h = self.head.0.load(Acquire);
        while h & WAITERS == 0 {
            self.set_link(i, h);
            match self
                .head
                .0
                .compare_exchange_weak(h, with_top(h, i as u64), Release, Acquire)
            {
                Ok(_) => return,
                Err(actual) => h = actual,
            }
        }
        self.hand_off(i);
    }

    /// Gives slot `i` to the oldest waiter, or pushes it if nobody waits any
    /// more.
    fn hand_off(&self, i: usize) {
        let mut queue = self.lock_queue();
        loop {
            let h = self.head.0.load(Acquire);
            if h & WAITERS != 0 {
                if let Some(waiter) = queue.pop_oldest() {
                    // The slot was held, so `ARMED` is set and its alarm is no
                    // later than the new deadline.
                    waiter.grant(self.fill(i, self.clock.now(), true));
                    if queue.live() == 0 {
                        self.set_waiters(false);
                    }
                    drop(queue);
                    waiter.wake();
                    return;
                }
                // The flag is only set while a live waiter is queued.
                debug_assert!(false, "WAITERS set with no live waiter");
                self.set_waiters(false);
                continue;
            }
            self.set_link(i, h);
            if self
                .head
                .0
                .compare_exchange(h, with_top(h, i as u64), Release, Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    // ------------------------------------------------------------ waiting

    fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        lock(&self.queue)
    }

    /// Sets or clears `WAITERS`. Under the queue's lock, which every change of
    /// the flag holds; while it is set the stack is empty and stays so (frees
    /// go to waiters, under this lock), so only a stale push can race this,
    /// and it fails.
    fn set_waiters(&self, set: bool) {
        let mut h = self.head.0.load(Relaxed);
        loop {
            match self
                .head
                .0
                .compare_exchange_weak(h, with_flag(h, WAITERS, set), AcqRel, Relaxed)
            {
                Ok(_) => return,
                Err(actual) => h = actual,
            }
        }
    }

    /// Joins the back of the queue, unless a slot is free by now.
    pub(crate) fn enqueue(&self, wake: Wake) -> Enqueued {
        let mut queue = self.lock_queue();
        let mut h = self.head.0.load(Acquire);
        loop {
            let top = h & INDEX;
            if top != NONE {
                // A slot came free (so nobody waits): take it.
                let next = self.link_of(top) & INDEX;
                match self
                    .head
                    .0
                    .compare_exchange(h, with_top(h, next) | ARMED, Acquire, Acquire)
                {
                    Ok(_) => {
                        drop(queue);
                        let now = self.clock.now();
                        return Enqueued::Claimed(self.fill(top as usize, now, h & ARMED != 0));
                    }
                    Err(actual) => h = actual,
                }
                continue;
            }
            // Empty. Set the flag from exactly this head: a push in between
            // makes it fail, and we take that slot instead.
            if h & WAITERS == 0 {
                if let Err(actual) =
                    self.head
                        .0
                        .compare_exchange(h, with_flag(h, WAITERS, true), AcqRel, Acquire)
                {
                    h = actual;
                    continue;
                }
            }
            let waiter = Arc::new(Waiter::new(wake));
            queue.push(Arc::clone(&waiter));
            return Enqueued::Waiting(waiter);
        }
    }

    /// Leaves the queue. If a permit was granted meanwhile, returns it: the
    /// caller owns it.
    pub(crate) fn cancel(&self, waiter: &Waiter) -> Option<Claim> {
        let mut queue = self.lock_queue();
        if let Some(claim) = waiter.granted() {
            return Some(claim);
        }
        waiter.cancel();
        if queue.remove_one() {
            self.set_waiters(false);
        }
        None
    }

    /// Callers waiting right now.
    pub(crate) fn waiting(&self) -> usize {
        self.lock_queue().live()
    }

    // ------------------------------------------------------------ expiry

    /// Whether the alarm is due at `now`, so that a holder may have expired.
    #[inline]
    fn due(&self, now: u64) -> bool {
        self.head.0.load(Acquire) & ARMED != 0 && self.alarm_at.load(Acquire) <= now
    }

    /// Called by the reaper when the alarm set for `at` goes off.
    #[cfg_attr(gendurable_loom, allow(dead_code))]
    pub(crate) fn on_alarm(&self, at: u64) {
        self.sweep(Some(at));
    }

    /// If the alarm is due (and is the one set for `expected`, when given),
    /// reclaims every expired holder and sets the next alarm. Returns how many
    /// holders were reclaimed.
    pub(crate) fn sweep(&self, expected: Option<u64>) -> usize {
        let reclaimed = {
            let _sweeping = lock(&self.sweeping);
            let now = self.clock.now();
            let at = self.alarm_at.load(Acquire);
            if !self.due(now) || expected.is_some_and(|e| e != at) {
                // Stale (swept already, or disarmed) or not due yet.
                return 0;
            }
            self.sweep_locked(now)
        };
        if reclaimed > 0 {
            (self.counts.reclaimed)
                .fetch_add(reclaimed as u64, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(hooks) = &self.hooks {
            for _ in 0..reclaimed {
                hooks.on_reclaimed();
            }
        }
        reclaimed
    }

    fn sweep_locked(&self, now: u64) -> usize {
        // Claims this sweep misses (made while it runs) have deadlines of at
        // least about this.
        let mut earliest = deadline(now, self.reclaim_ticks);
        let mut reclaimed = 0;
        let mut held = false;
        for (i, slot) in self.slots.iter().enumerate() {
            let mut cur = slot.token.load(Acquire);
            loop {
                let d = deadline_of(cur);
                if d == 0 {
                    break;
                }
                if d > now {
                    held = true;
                    earliest = earliest.min(d);
                    break;
                }
                // Acquire: the expired holder's release, had it come first,
                // would have published its work; we take the slot over.
                match slot
                    .token
                    .compare_exchange(cur, cur & GEN_MASK, AcqRel, Acquire)
                {
                    Ok(_) => {
                        reclaimed += 1;
                        self.free(i);
                        break;
                    }
                    // Released, reset or reclaimed by someone else meanwhile:
                    // look at what is there now.
                    Err(actual) => cur = actual,
                }
            }
        }
        if !held && self.try_disarm() {
            return reclaimed;
        }
        // At least one tick on, and spaced by eight times what this sweep
        // took, so that sweeps of a very large bulkhead whose deadlines keep
        // passing take at most a ninth of the reaper's time.
        let done = self.clock.now();
        let spacing = done.saturating_sub(now).saturating_mul(8);
        let next = earliest.max(done.saturating_add(1).saturating_add(spacing));
        self.alarm_at.store(next, Release);
        reaper::schedule(next, self.me.clone());
        reclaimed
    }

    /// Clears `ARMED` if no slot is held (every slot is on the stack).
    /// Fails if a pop got in first: that holder needs the alarm.
    fn try_disarm(&self) -> bool {
        let limit = self.slots.len() as u64;
        let mut h = self.head.0.load(Acquire);
        loop {
            if self.free_under(h) != limit {
                return false;
            }
            match self
                .head
                .0
                .compare_exchange(h, with_flag(h, ARMED, false), AcqRel, Acquire)
            {
                Ok(_) => return true,
                Err(actual) => h = actual,
            }
        }
    }

    // ------------------------------------------------------------ the rest

    /// Held slots, after reclaiming any holder past its deadline. Exact
    /// whenever no acquire or release is under way.
    pub(crate) fn in_flight(&self) -> usize {
        if self.due(self.clock.now()) {
            self.sweep(None);
        }
        let limit = self.slots.len();
        loop {
            let h = self.head.0.load(Acquire);
            let free = self.free_under(h);
            // The link read belongs to this head only if the head is unchanged.
            if self.head.0.load(Acquire) == h {
                return limit - free as usize;
            }
        }
    }

    /// Whether `slot` still holds `token` (not released, reclaimed or reset).
    pub(crate) fn holds(&self, slot: u32, token: u64) -> bool {
        self.slots[slot as usize].token.load(Acquire) == token
    }

    /// Frees every held slot. Returns how many were held.
    pub(crate) fn reset(&self) -> usize {
        let mut freed = 0;
        for (i, slot) in self.slots.iter().enumerate() {
            let mut cur = slot.token.load(Acquire);
            while deadline_of(cur) != 0 {
                // Clear the deadline, keep the generation: the next claim
                // bumps it, so the reset holder's token can never match again.
                match slot
                    .token
                    .compare_exchange(cur, cur & GEN_MASK, AcqRel, Acquire)
                {
                    Ok(_) => {
                        freed += 1;
                        self.free(i);
                        break;
                    }
                    Err(actual) => cur = actual,
                }
            }
        }
        freed
    }

    /// Whether an alarm is set, for the loom model.
    #[cfg(gendurable_loom)]
    pub(crate) fn armed(&self) -> bool {
        self.head.0.load(Acquire) & ARMED != 0
    }
}

#[cfg(all(test, not(gendurable_loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    fn core(limit: usize, reclaim_ticks: u64) -> Arc<Core> {
        Core::new(
            limit,
            reclaim_ticks,
            Clock::new(),
            None,
            Duration::from_secs(1),
            None,
        )
    }

    #[test]
    fn every_slot_is_handed_out_once_then_the_stack_is_empty() {
        for limit in [1, 2, 3, 64, 1000] {
            let c = core(limit, 1_000_000);
            let claims: Vec<_> = (0..limit).map(|_| c.try_claim().unwrap()).collect();
            assert_eq!(c.in_flight(), limit);
            assert!(c.try_claim().is_none());
            let mut slots: Vec<_> = claims.iter().map(|c| c.slot).collect();
            slots.sort();
            slots.dedup();
            assert_eq!(slots.len(), limit);
            for claim in claims {
                assert!(c.release(claim.slot, claim.token));
            }
            assert_eq!(c.in_flight(), 0);
            assert!(!c.release(0, 0));
        }
    }

    #[test]
    fn the_slot_released_last_is_taken_first() {
        let c = core(8, 1_000_000);
        let a = c.try_claim().unwrap();
        let b = c.try_claim().unwrap();
        c.release(a.slot, a.token);
        assert_eq!(c.try_claim().unwrap().slot, a.slot);
        c.release(b.slot, b.token);
        assert_eq!(c.try_claim().unwrap().slot, b.slot);
    }

    #[test]
    fn tokens_differ_across_claims_in_the_same_tick() {
        let a = next_token(42, 0);
        let b = next_token(42, a & GEN_MASK);
        assert_ne!(a, b);
        assert_eq!(deadline_of(a), 42);
        assert_eq!(deadline_of(a & GEN_MASK), 0);
    }

    #[test]
    fn generation_wraps_without_touching_the_deadline() {
        let t = next_token(7, GEN_MASK);
        assert_eq!(deadline_of(t), 7);
        assert_eq!(t & GEN_MASK, 0);
    }

    #[test]
    fn deadlines_saturate_instead_of_overflowing() {
        assert_eq!(deadline(u64::MAX - 1, 10), MAX_TICKS);
        assert_eq!(deadline(MAX_TICKS - 5, 10), MAX_TICKS);
        assert_eq!(deadline(5, 10), 15);
        assert_eq!(deadline_of(next_token(MAX_TICKS, 0)), MAX_TICKS);
    }

    #[test]
    fn the_tag_wraps_without_touching_index_or_flags() {
        let h = !INDEX | 5;
        let n = with_top(h, 7);
        assert_eq!(n & INDEX, 7);
        assert_eq!(n & (WAITERS | ARMED), WAITERS | ARMED);
        assert_eq!(n >> (INDEX_BITS + 2), 0);
        let f = with_flag(n, WAITERS, false);
        assert_eq!(f & (WAITERS | ARMED | INDEX), ARMED | 7);
    }

    #[test]
    fn the_first_pop_arms_and_a_sweep_with_nothing_held_disarms() {
        let c = core(2, 1);
        assert_eq!(c.head.0.load(Relaxed) & ARMED, 0);
        let a = c.try_claim().unwrap();
        assert_ne!(c.head.0.load(Relaxed) & ARMED, 0);
        c.release(a.slot, a.token);
        // Still armed until a sweep finds nothing held.
        assert_ne!(c.head.0.load(Relaxed) & ARMED, 0);
        let give_up = std::time::Instant::now() + Duration::from_secs(20);
        while c.head.0.load(Relaxed) & ARMED != 0 {
            c.sweep(None);
            assert!(std::time::Instant::now() < give_up, "never disarmed");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(c.in_flight(), 0);
    }
}
