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
//! # Capacity
//!
//! Which slots are taken is tracked apart from the tokens, so that a full
//! bulkhead is recognised without looking at the slots:
//!
//! - The first 63 slots each have a bit in one `word`. Claiming one is a
//!   single compare-and-exchange that sets a clear bit; the claimer then
//!   writes its token into the slot it now owns. Release clears the token
//!   first, then the bit. So an acquire and release cost three atomic
//!   read-modify-writes in all (bit, token, bit), and "full" is one load.
//! - Slots past the 63rd are counted in `extra`: a claimer first reserves by
//!   incrementing the count if it is below their number, then claims any
//!   released one of them with a compare-and-exchange on its token (one more
//!   read-modify-write). Releases free the token before decrementing, so the
//!   claimed slots never outnumber the count and a reservation always has a
//!   released slot to find.
//!
//! The top bit of both words says "someone is waiting". It lives in the very
//! words a release modifies, so the release that frees a slot learns from the
//! same atomic operation whether to wake anyone, and there is no window in
//! which a waiter registers after that release yet misses the free slot.
//!
//! A reclaim moves a slot (and its bit or unit of count) from the expired
//! holder to the new one: nothing is counted twice, and the old holder's
//! release fails its compare-and-exchange and so gives nothing back.
//!
//! # Discovering expired slots
//!
//! Expired slots are only looked for when the bulkhead is full
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

use std::sync::{Mutex, PoisonError};

use super::clock::Clock;
use super::sync::{self, AtomicBool, AtomicU64, Ordering::*};

const GEN_BITS: u32 = 24;
const GEN_MASK: u64 = (1 << GEN_BITS) - 1;
/// Largest deadline (in ticks) that fits in a token.
pub(crate) const MAX_TICKS: u64 = u64::MAX >> GEN_BITS;

/// Set in `word` and in `extra` while anyone waits.
const WAITERS: u64 = 1 << 63;
/// The slot bits of `word`.
const WORD_MASK: u64 = !WAITERS;
/// How many slots `word` can hold.
pub(crate) const WORD_SLOTS: usize = 63;
/// The count bits of `extra`.
const COUNT_MASK: u64 = u32::MAX as u64;

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
/// cores write to the same line on every acquire and release.
#[repr(align(64))]
struct Slot(AtomicU64);

/// The words every acquire and release touches, on their own cache line so
/// they do not share one with the read-mostly configuration.
#[repr(align(128))]
struct Header {
    /// Bit i set: slot i (i < `in_word`) is claimed. Bits for slots that do not
    /// exist are set from the start, so "full" is "all slot bits set".
    word: AtomicU64,
    /// How many of the slots past `in_word` are reserved (low 32 bits).
    extra: AtomicU64,
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
    /// Slots `0..in_word` are tracked by `word`, the rest by `extra`.
    in_word: usize,
    /// `limit - in_word`.
    extra_limit: u64,
    reclaim_ticks: u64,
    clock: Clock,
    /// Registered waiters. The `WAITERS` bits mirror "this is not zero"; they
    /// are only changed under this lock, so they never disagree with it.
    waiters: Mutex<usize>,
    #[cfg(all(test, not(gendurable_loom)))]
    pub(crate) scans: std::sync::atomic::AtomicUsize,
}

impl Slots {
    /// Tracks at most `word_slots` (normally [`WORD_SLOTS`]) slots in `word`;
    /// tests use fewer to exercise the counted slots with small limits.
    /// `limit` must be at least 1 and fit in 32 bits, `reclaim_ticks` at
    /// least 1; the public constructor checks both.
    pub(crate) fn with_word_slots(
        limit: usize,
        reclaim_ticks: u64,
        clock: Clock,
        word_slots: usize,
    ) -> Self {
        debug_assert!(limit >= 1 && limit as u64 <= COUNT_MASK);
        debug_assert!(reclaim_ticks >= 1);
        let in_word = limit.min(word_slots).min(WORD_SLOTS);
        let absent = WORD_MASK & !((1u64 << in_word) - 1);
        Slots {
            header: Header {
                word: AtomicU64::new(absent),
                extra: AtomicU64::new(0),
                earliest: AtomicU64::new(0),
                scanning: AtomicBool::new(false),
            },
            slots: (0..limit).map(|_| Slot(AtomicU64::new(0))).collect(),
            in_word,
            extra_limit: (limit - in_word) as u64,
            reclaim_ticks,
            clock,
            waiters: Mutex::new(0),
            #[cfg(all(test, not(gendurable_loom)))]
            scans: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Claims a slot if one is free or expired.
    ///
    /// Only the first attempt on `word` and the refusal of a full bulkhead
    /// are inline; a lost race, the counted slots and reclaims go out of
    /// line. With them inline, the claim was returned through the stack,
    /// which cost about 0.9 ns per acquire.
    #[inline]
    pub(crate) fn try_claim(&self) -> Option<Claim> {
        // Read first: the clock is the slowest step and does not depend on
        // the atomics, so the CPU can overlap it with them (reading it after
        // the claim measured 1.5 ns slower).
        let now = self.clock.now();
        let word = &self.header.word;
        let w = word.load(Relaxed);
        let free = !w & WORD_MASK;
        if free != 0 {
            // The lowest free bit, rather than one remembered per thread:
            // claiming any bit costs the same compare-and-exchange on `word`,
            // so a per-thread starting point saves no contention here, while
            // looking it up cost about 0.8 ns per acquire. Low bits also keep
            // a lightly loaded bulkhead on the same few, cache-hot slots.
            let bit = free.trailing_zeros() as usize;
            // Acquire: pairs with the Release of whoever cleared the bit, so
            // their release of the slot (and their work) is visible.
            if word
                .compare_exchange(w, w | 1 << bit, Acquire, Relaxed)
                .is_ok()
            {
                return Some(self.fill(bit, now));
            }
        } else if self.header.extra.load(Relaxed) & COUNT_MASK >= self.extra_limit
            && now < self.header.earliest.load(Acquire)
        {
            // Full, and no deadline can have passed: the usual refusal.
            return None;
        }
        self.try_claim_slow(now)
    }

    /// [`try_claim`](Self::try_claim) after its first attempt lost the race
    /// for a bit, or found `word` full but the bulkhead maybe not.
    #[inline(never)]
    fn try_claim_slow(&self, now: u64) -> Option<Claim> {
        let word = &self.header.word;
        let mut w = word.load(Relaxed);
        loop {
            let free = !w & WORD_MASK;
            if free == 0 {
                return self.try_claim_extra(now);
            }
            let bit = free.trailing_zeros() as usize;
            match word.compare_exchange_weak(w, w | 1 << bit, Acquire, Relaxed) {
                Ok(_) => return Some(self.fill(bit, now)),
                Err(actual) => w = actual,
            }
        }
    }

    /// Writes our token into slot `i`, whose bit we just set.
    #[inline]
    fn fill(&self, i: usize, now: u64) -> Claim {
        let slot = &self.slots[i].0;
        // Nobody else writes a slot whose bit is set and which holds no
        // deadline (release, reclaim and reset all leave such a slot alone,
        // or write the same value), so a plain store is enough.
        let token = next_token(now + self.reclaim_ticks, slot.load(Relaxed));
        slot.store(token, Release);
        Claim {
            slot: i as u32,
            token,
            reclaimed: false,
        }
    }

    /// `word` is full: try the counted slots, then reclaim.
    #[inline]
    fn try_claim_extra(&self, now: u64) -> Option<Claim> {
        let extra = &self.header.extra;
        let mut e = extra.load(Relaxed);
        loop {
            if e & COUNT_MASK >= self.extra_limit {
                return self.try_reclaim(now);
            }
            // Acquire: pairs with the Release decrement of whoever freed the
            // capacity, which makes the slot they freed visible to the search.
            match extra.compare_exchange_weak(e, e + 1, Acquire, Relaxed) {
                Ok(_) => return Some(self.claim_extra_slot(now)),
                Err(actual) => e = actual,
            }
        }
    }

    /// Finds and claims a released slot past `in_word`, for a reservation
    /// already counted in `extra`.
    #[inline(never)]
    fn claim_extra_slot(&self, now: u64) -> Claim {
        let deadline = now + self.reclaim_ticks;
        let (first, len) = (self.in_word, self.slots.len());
        let mut i = sync::hint(len).max(first);
        let mut seen = 0;
        loop {
            let slot = &self.slots[i].0;
            let cur = slot.load(Relaxed);
            // Acquire on success: pairs with the previous holder's Release.
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
                i = first;
            }
            seen += 1;
            if seen == len - first {
                // A released slot exists (the count guarantees it) but other
                // reservations keep winning it; let them finish.
                seen = 0;
                sync::yield_now();
            }
        }
    }

    /// The full-bulkhead path: O(1) unless the earliest deadline has passed.
    #[inline]
    fn try_reclaim(&self, now: u64) -> Option<Claim> {
        if now < self.header.earliest.load(Acquire) {
            return None;
        }
        self.try_scan(now)
    }

    #[cold]
    #[inline(never)]
    fn try_scan(&self, now: u64) -> Option<Claim> {
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
                // The slot's bit (or unit of `extra`) stays taken: it moves
                // from the expired holder to us.
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

    /// Gives back the capacity of slot `i`, after its token was cleared.
    /// Returns whether waiters are registered.
    #[inline]
    fn uncount(&self, i: usize) -> bool {
        let counter = if i < self.in_word {
            &self.header.word
        } else {
            &self.header.extra
        };
        // The bit is set (only the one party that cleared the token gets
        // here), so subtracting clears it without a borrow. Release: pairs
        // with the next claimer's Acquire.
        counter.fetch_sub(if i < self.in_word { 1 << i } else { 1 }, Release);
        // Reading the flag back, rather than using the value the subtraction
        // returns, lets the subtraction compile to a plain `lock sub`, which is
        // measurably cheaper. It is just as safe: a load after our own write
        // to the same word sees that write or a later one, so a waiter that
        // registered before our write is seen, and one that registers after
        // it sees the slot we freed.
        counter.load(Acquire) & WAITERS != 0
    }

    /// Releases `token` from `slot`. Does nothing if the slot no longer holds
    /// that token (it was reclaimed or reset).
    #[inline]
    pub(crate) fn release(&self, slot: u32, token: u64) -> Released {
        let i = slot as usize;
        // Release: publishes the holder's work to whoever reclaims the slot.
        if self.slots[i]
            .0
            .compare_exchange(token, token & GEN_MASK, Release, Relaxed)
            .is_err()
        {
            return Released::Stale;
        }
        // Slot first, capacity second: a claimer that sees the capacity
        // also sees the slot released.
        if self.uncount(i) {
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
        for (i, slot) in self.slots.iter().enumerate() {
            // Clear the deadline, keep the generation: the next claim bumps
            // it, so the reset holders' tokens can never match again.
            let old = slot.0.fetch_and(GEN_MASK, AcqRel);
            if deadline_of(old) != 0 {
                self.uncount(i);
                freed += 1;
            }
        }
        freed
    }

    /// Held slots, counting holders past their deadline that have not been
    /// reclaimed yet. Exact whenever no acquire or release is under way.
    pub(crate) fn in_flight(&self) -> usize {
        let present = (1u64 << self.in_word) - 1;
        let word = self.header.word.load(Acquire) & present;
        let extra = self.header.extra.load(Acquire) & COUNT_MASK;
        word.count_ones() as usize + extra as usize
    }

    pub(crate) fn limit(&self) -> usize {
        self.slots.len()
    }

    /// Registered waiters.
    pub(crate) fn waiters(&self) -> usize {
        *self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a waiter. From then on every release that frees a slot reports
    /// [`Released::FreedWithWaiters`]; the waiter must try again to claim
    /// *after* registering, or it could miss the release it waits for.
    ///
    /// The flag sits in the very words releases modify, so the release that
    /// frees a slot either sees the flag or comes first, in which case the
    /// waiter's next look sees the free slot.
    pub(crate) fn add_waiter(&self) {
        let mut n = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        if *n == 0 {
            self.header.word.fetch_or(WAITERS, AcqRel);
            self.header.extra.fetch_or(WAITERS, AcqRel);
        }
        *n += 1;
    }

    pub(crate) fn remove_waiter(&self) {
        let mut n = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        *n -= 1;
        if *n == 0 {
            self.header.word.fetch_and(!WAITERS, AcqRel);
            self.header.extra.fetch_and(!WAITERS, AcqRel);
        }
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
        Slots::with_word_slots(limit, 1_000_000, Clock::new(), WORD_SLOTS)
    }

    #[test]
    fn counted_slots_take_over_when_the_word_is_full() {
        for word_slots in [0, 1, 2, 3] {
            let s = Slots::with_word_slots(3, 1_000_000, Clock::new(), word_slots);
            let claims: Vec<_> = (0..3).map(|_| s.try_claim().unwrap()).collect();
            assert_eq!(s.in_flight(), 3);
            assert!(s.try_claim().is_none());
            let mut slots: Vec<_> = claims.iter().map(|c| c.slot).collect();
            slots.sort();
            assert_eq!(slots, [0, 1, 2]);
            for c in claims {
                assert_eq!(s.release(c.slot, c.token), Released::Freed);
            }
            assert_eq!(s.in_flight(), 0);
        }
    }

    #[test]
    fn limits_past_the_word_are_exact() {
        let s = slots(200);
        let claims: Vec<_> = (0..200).map(|_| s.try_claim().unwrap()).collect();
        assert_eq!(s.in_flight(), 200);
        assert!(s.try_claim().is_none());
        for c in claims {
            s.release(c.slot, c.token);
        }
        assert_eq!(s.in_flight(), 0);
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
