//! The slot protocol: admission, release, reclaim and reset on plain atomics.
//!
//! # Words
//!
//! Each slot is one `AtomicU64` token: the deadline (in clock ticks) in the
//! high 40 bits and a generation in the low 24. A deadline of 0 means the slot
//! was released (or reset) and is free. A non-zero deadline in the future
//! means the slot is held; one in the past means the holder outlived
//! `reclaim_after` without releasing, and the slot may be reclaimed.
//!
//! Every claim (fresh or reclaim) increments the generation, and release and
//! reset keep it, so two holders of the same slot never hold the same token,
//! even when they claimed it in the same tick (reset, then a new acquire).
//! Release is a compare-and-exchange against exactly the holder's token, so a
//! holder whose slot was reclaimed or reset changes nothing when it releases.
//! (For a stale token to come back, the same slot would have to be claimed
//! 2^24 times within one clock tick: impossible at tens of nanoseconds per
//! claim and a 1 ms tick.)
//!
//! # The count
//!
//! A separate `state` word counts the held slots in its low 32 bits (and the
//! waiters in its high 32 bits, so that a release learns whether to wake
//! anyone from the same atomic operation). Admission first *reserves* by
//! incrementing the count if it is below the limit, then claims a released
//! slot. Releases and resets free the slot before decrementing the count, so
//! the number of claimed slots never exceeds the count, and a reservation
//! always has a released slot to find. A full bulkhead is therefore detected
//! from the count alone, in O(1), whatever the limit.
//!
//! A reclaim moves a slot (and its unit of the count) from the expired holder
//! to the new one: the count does not change, and the old holder's release
//! fails its compare-and-exchange and so does not decrement.
//!
//! # Discovering expired slots
//!
//! Expired slots are only looked for when the count says the bulkhead is full
//! (otherwise a released slot is available anyway). `earliest` holds a lower
//! bound on the deadlines of the held slots, refreshed by each scan; while the
//! clock is before it, a full bulkhead answers "saturated" after one clock
//! read and one load. Once it has passed, one caller at a time scans all
//! slots, reclaims the first expired one it finds and stores the smallest
//! remaining deadline. A scan therefore either reclaims a slot or moves
//! `earliest` past the current time, so scans are bounded by the number of
//! deadlines that pass, not by the number of rejected calls.
//!
//! Claims that a scan misses (made while it runs) can have a deadline below
//! the stored bound; the bound is then at most "scan time + reclaim_after",
//! so such a slot is found at most the scan's own duration later than its
//! deadline. `earliest` only ever delays a reclaim, it never causes one.

use super::clock::Clock;
use super::sync::{self, AtomicBool, AtomicU64, Ordering::*};

const GEN_BITS: u32 = 24;
const GEN_MASK: u64 = (1 << GEN_BITS) - 1;
/// Largest deadline (in ticks) that fits in a token.
pub(crate) const MAX_TICKS: u64 = u64::MAX >> GEN_BITS;

const HELD_MASK: u64 = u32::MAX as u64;
const ONE_WAITER: u64 = 1 << 32;

#[inline]
fn deadline_of(token: u64) -> u64 {
    token >> GEN_BITS
}

/// The token a claim writes over `prev`: a new deadline and the next generation.
#[inline]
fn next_token(deadline: u64, prev: u64) -> u64 {
    (deadline << GEN_BITS) | (prev.wrapping_add(1) & GEN_MASK)
}

/// One slot on its own cache line. Without the padding, holders on different
/// cores write to the same line on every acquire and release; the benchmark
/// for two contending threads shows the difference.
#[repr(align(64))]
struct Slot(AtomicU64);

/// The words every acquire and release touches, on their own cache line so
/// they do not share one with the read-mostly configuration.
#[repr(align(128))]
struct Header {
    /// Held slots (low 32 bits) and registered waiters (high 32 bits).
    state: AtomicU64,
    /// Lower bound on the deadline of every held slot (see module docs).
    earliest: AtomicU64,
    /// Set while one caller scans for expired slots.
    scanning: AtomicBool,
}

/// A slot won by [`Slots::try_claim`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim {
    pub(crate) slot: u32,
    pub(crate) token: u64,
    /// The slot was taken over from a holder that outlived its deadline.
    pub(crate) reclaimed: bool,
}

/// What a release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// The slot was freed; nobody is waiting.
    Freed,
    /// The slot was freed and waiters are registered: wake one.
    FreedWithWaiters,
    /// The slot had been reclaimed or reset; nothing changed.
    Stale,
}

pub(crate) struct Slots {
    header: Header,
    slots: Box<[Slot]>,
    limit: u64,
    reclaim_ticks: u64,
    clock: Clock,
    #[cfg(all(test, not(gendurable_loom)))]
    pub(crate) scans: std::sync::atomic::AtomicUsize,
}

impl Slots {
    /// `limit` must be in `1..=u32::MAX` and `reclaim_ticks` at least 1; the
    /// public constructor checks both.
    pub(crate) fn new(limit: usize, reclaim_ticks: u64, clock: Clock) -> Self {
        debug_assert!(limit >= 1 && limit as u64 <= HELD_MASK);
        debug_assert!(reclaim_ticks >= 1);
        Slots {
            header: Header {
                state: AtomicU64::new(0),
                earliest: AtomicU64::new(0),
                scanning: AtomicBool::new(false),
            },
            slots: (0..limit).map(|_| Slot(AtomicU64::new(0))).collect(),
            limit: limit as u64,
            reclaim_ticks,
            clock,
            #[cfg(all(test, not(gendurable_loom)))]
            scans: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Claims a slot if one is free or expired.
    #[inline]
    pub(crate) fn try_claim(&self) -> Option<Claim> {
        let state = &self.header.state;
        let mut s = state.load(Relaxed);
        loop {
            if s & HELD_MASK >= self.limit {
                return self.try_reclaim();
            }
            // Acquire: pairs with the Release decrement of whoever freed the
            // capacity, which makes the slot they freed visible to the search.
            match state.compare_exchange_weak(s, s + 1, Acquire, Relaxed) {
                Ok(_) => return Some(self.claim_released()),
                Err(actual) => s = actual,
            }
        }
    }

    /// Finds and claims a released slot for a reservation already counted.
    #[inline]
    fn claim_released(&self) -> Claim {
        let deadline = self.clock.now() + self.reclaim_ticks;
        let len = self.slots.len();
        let mut i = sync::hint(len);
        let mut seen = 0;
        loop {
            let slot = &self.slots[i].0;
            let cur = slot.load(Relaxed);
            // Acquire on success: pairs with the previous holder's Release, so
            // its work under the permit happens before ours.
            if deadline_of(cur) == 0
                && slot
                    .compare_exchange(cur, next_token(deadline, cur), Acquire, Relaxed)
                    .is_ok()
            {
                sync::set_hint(i);
                return Claim {
                    slot: i as u32,
                    token: next_token(deadline, cur),
                    reclaimed: false,
                };
            }
            i += 1;
            if i == len {
                i = 0;
            }
            seen += 1;
            if seen == len {
                // A released slot exists (the count guarantees it) but other
                // reservations keep winning it; let them finish.
                seen = 0;
                sync::yield_now();
            }
        }
    }

    /// The full-bulkhead path: O(1) unless the earliest deadline has passed.
    #[cold]
    #[inline(never)]
    fn try_reclaim(&self) -> Option<Claim> {
        let now = self.clock.now();
        if now < self.header.earliest.load(Acquire) {
            return None;
        }
        // One scanner at a time: the others would find the same slots.
        if self.header.scanning.swap(true, Acquire) {
            return None;
        }
        let claim = self.scan(now);
        self.header.scanning.store(false, Release);
        claim
    }

    fn scan(&self, now: u64) -> Option<Claim> {
        #[cfg(all(test, not(gendurable_loom)))]
        self.scans.fetch_add(1, Relaxed);
        let deadline = now + self.reclaim_ticks;
        let mut claim = None;
        // Claims this scan misses get deadlines of at most about `deadline`.
        let mut earliest = deadline;
        for (i, slot) in self.slots.iter().enumerate() {
            let mut cur = slot.0.load(Acquire);
            if claim.is_none() && deadline_of(cur) != 0 && deadline_of(cur) <= now {
                match slot
                    .0
                    .compare_exchange(cur, next_token(deadline, cur), Acquire, Acquire)
                {
                    Ok(_) => {
                        claim = Some(Claim {
                            slot: i as u32,
                            token: next_token(deadline, cur),
                            reclaimed: true,
                        });
                        continue;
                    }
                    // Released, reset or taken meanwhile: account for what is there now.
                    Err(actual) => cur = actual,
                }
            }
            let d = deadline_of(cur);
            if d != 0 {
                earliest = earliest.min(d);
            }
        }
        self.header.earliest.store(earliest, Release);
        claim
    }

    /// Releases `token` from `slot`. Does nothing if the slot no longer holds
    /// that token (it was reclaimed or reset).
    #[inline]
    pub(crate) fn release(&self, slot: u32, token: u64) -> Released {
        let s = &self.slots[slot as usize].0;
        // Release: publishes the holder's work to the next holder of the slot.
        if s.compare_exchange(token, token & GEN_MASK, Release, Relaxed)
            .is_err()
        {
            return Released::Stale;
        }
        // AcqRel: Release for the next reservation (see `try_claim`), Acquire
        // so that a waiter registered just before is fully visible.
        let prev = self.header.state.fetch_sub(1, AcqRel);
        if prev >= ONE_WAITER {
            Released::FreedWithWaiters
        } else {
            Released::Freed
        }
    }

    /// Whether `slot` still holds `token` (not released, reclaimed or reset).
    pub(crate) fn holds(&self, slot: u32, token: u64) -> bool {
        self.slots[slot as usize].0.load(Acquire) == token
    }

    /// Frees every slot. Returns how many were held.
    pub(crate) fn reset(&self) -> usize {
        let mut freed = 0;
        for slot in self.slots.iter() {
            // Clear the deadline, keep the generation: the next claim bumps
            // it, so the reset holders' tokens can never match again.
            let old = slot.0.fetch_and(GEN_MASK, AcqRel);
            if deadline_of(old) != 0 {
                // Slot first, count second: the count never drops below the
                // number of claimed slots.
                self.header.state.fetch_sub(1, AcqRel);
                freed += 1;
            }
        }
        freed
    }

    /// Held slots, counting holders past their deadline that have not been
    /// reclaimed yet.
    pub(crate) fn in_flight(&self) -> usize {
        (self.header.state.load(Acquire) & HELD_MASK) as usize
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit as usize
    }

    /// Registered waiters.
    pub(crate) fn waiters(&self) -> usize {
        (self.header.state.load(Acquire) >> 32) as usize
    }

    /// Registers a waiter. From then on every release that frees a slot reports
    /// [`Released::FreedWithWaiters`]; the waiter must try again to claim
    /// *after* registering, or it could miss the release it waits for.
    pub(crate) fn add_waiter(&self) {
        self.header.state.fetch_add(ONE_WAITER, AcqRel);
    }

    pub(crate) fn remove_waiter(&self) {
        self.header.state.fetch_sub(ONE_WAITER, AcqRel);
    }

    /// Ticks until a held slot may expire, as far as the last scan knows:
    /// how long a waiter may sleep before it should look for a reclaim.
    pub(crate) fn ticks_until_expiry(&self) -> u64 {
        let earliest = self.header.earliest.load(Acquire);
        earliest.saturating_sub(self.clock.now()).max(1)
    }
}

#[cfg(all(test, not(gendurable_loom)))]
mod tests {
    use super::*;

    fn slots(limit: usize) -> Slots {
        Slots::new(limit, 1_000_000, Clock::new())
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
    fn full_bulkhead_does_not_rescan_before_the_earliest_deadline() {
        let s = slots(64);
        let claims: Vec<_> = (0..64).map(|_| s.try_claim().unwrap()).collect();
        assert!(s.try_claim().is_none());
        let after_first = s.scans.load(Relaxed);
        assert!(after_first <= 1);
        for _ in 0..1000 {
            assert!(s.try_claim().is_none());
        }
        assert_eq!(s.scans.load(Relaxed), after_first, "rejections scanned");
        for c in claims {
            assert_eq!(s.release(c.slot, c.token), Released::Freed);
        }
        assert_eq!(s.in_flight(), 0);
    }

    #[test]
    fn waiters_are_reported_by_release() {
        let s = slots(1);
        let c = s.try_claim().unwrap();
        s.add_waiter();
        assert_eq!(s.waiters(), 1);
        assert_eq!(s.release(c.slot, c.token), Released::FreedWithWaiters);
        s.remove_waiter();
        let c = s.try_claim().unwrap();
        assert_eq!(s.release(c.slot, c.token), Released::Freed);
        assert_eq!(s.release(c.slot, c.token), Released::Stale);
    }
}
