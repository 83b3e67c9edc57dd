//! Model checks of the bulkhead's slot protocol with loom.
//!
//! The bulkhead's atomics come from loom under `--cfg gendurable_loom` (see
//! `core/src/bulkhead/sync.rs`), so these models explore every interleaving
//! of the real acquire, release, reclaim and reset code, under the C11 memory
//! model as loom implements it. The clock is a model clock that only moves
//! when a test says so.
//!
//! ```text
//! RUSTFLAGS="--cfg gendurable_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p gendurable --release --test bulkhead_loom
//! ```
//!
//! (Plain `--cfg loom` cannot be used: tokio and sqlx change shape under it
//! and the crate no longer builds.) A separate target directory keeps the
//! loom build from evicting the normal one.
#![cfg(gendurable_loom)]

use std::sync::Arc;
use std::time::Duration;

use gendurable::bulkhead::{Bulkhead, BulkheadConfig, OwnedPermit};
use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use loom::thread;

/// A bulkhead of `limit` slots of which at most `word_slots` are tracked in
/// the bitmap, the rest by the counted path.
fn bulkhead(limit: usize, word_slots: usize) -> Arc<Bulkhead> {
    let config = BulkheadConfig::new(limit, Duration::from_secs(1));
    Arc::new(Bulkhead::new_with_word_slots(config, word_slots).unwrap())
}

/// Counts holders independently of the bulkhead.
#[derive(Default)]
struct Holders(AtomicUsize);

impl Holders {
    fn enter(&self, limit: usize) {
        let now = self.0.fetch_add(1, SeqCst) + 1;
        assert!(now <= limit, "{now} holders with a limit of {limit}");
    }
    fn leave(&self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// Every split of two slots between the bitmap and the counted path.
const LAYOUTS: [(usize, usize); 5] = [(1, 1), (1, 0), (2, 2), (2, 1), (2, 0)];

/// Runs `f` under loom with at most `preemptions` forced context switches
/// per execution, which keeps models with three parties tractable (bugs that
/// need more preemptions than that are rare in practice).
fn model_bounded(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemptions);
    builder.check(f);
}

#[test]
fn concurrent_acquires_never_exceed_the_limit() {
    for (limit, word_slots) in LAYOUTS {
        loom::model(move || {
            let b = bulkhead(limit, word_slots);
            let holders = Arc::new(Holders::default());
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let (b, holders) = (b.clone(), holders.clone());
                    thread::spawn(move || {
                        if let Ok(p) = b.try_acquire() {
                            holders.enter(limit);
                            holders.leave();
                            drop(p);
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(b.in_flight(), 0);
        });
    }
}

#[test]
fn three_parties_never_exceed_the_limit() {
    for (limit, word_slots) in [(1, 1), (2, 1)] {
        model_bounded(2, move || {
            let b = bulkhead(limit, word_slots);
            let holders = Arc::new(Holders::default());
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let (b, holders) = (b.clone(), holders.clone());
                    thread::spawn(move || {
                        if let Ok(p) = b.try_acquire() {
                            holders.enter(limit);
                            holders.leave();
                            drop(p);
                        }
                    })
                })
                .collect();
            // A third party acquiring and holding until the end.
            let mine = b.try_acquire_owned().ok();
            if mine.is_some() {
                holders.enter(limit);
            }
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(b.in_flight(), usize::from(mine.is_some()));
            drop(mine);
            assert_eq!(b.in_flight(), 0);
        });
    }
}

#[test]
fn with_two_slots_two_acquirers_both_succeed() {
    for word_slots in [0, 1, 2] {
        loom::model(move || {
            let b = bulkhead(2, word_slots);
            let t = {
                let b = b.clone();
                thread::spawn(move || b.try_acquire_owned().is_ok())
            };
            let mine = b.try_acquire_owned();
            // No spurious refusal: two permits, two callers.
            assert!(mine.is_ok());
            assert!(t.join().unwrap());
            drop(mine);
            assert_eq!(b.in_flight(), 0);
        });
    }
}

/// An expired holder releases late while another caller reclaims its slot:
/// whichever comes first, the reclaimer's permit stays counted and the late
/// release frees nothing that is not its own.
#[test]
fn late_release_races_reclaim() {
    for (limit, word_slots) in [(1, 1), (1, 0)] {
        loom::model(move || {
            let b = bulkhead(limit, word_slots);
            let old = b.try_acquire_owned().unwrap();
            b.advance_clock_past_reclaim();

            let late = thread::spawn(move || drop(old));
            let taker = {
                let b = b.clone();
                thread::spawn(move || b.try_acquire_owned().ok())
            };
            late.join().unwrap();
            let new: Option<OwnedPermit> = taker.join().unwrap();

            // Reclaimed before the late release, or taken after it: either
            // way the new holder owns the slot, and the late release did not
            // free it. (The taker may also have been refused while the late
            // release was half done, slot freed but capacity not yet
            // returned; the release then completes and leaves nothing behind.)
            if let Some(new) = new {
                assert!(new.is_current());
                assert_eq!(b.in_flight(), 1);
                assert!(b.try_acquire().is_err());
                drop(new);
            }
            assert_eq!(b.in_flight(), 0);
            assert!(b.try_acquire().is_ok());
        });
    }
}

/// Two callers race for one expired slot: one wins, never both.
#[test]
fn reclaims_race_each_other() {
    for word_slots in [0, 1] {
        loom::model(move || {
            let b = bulkhead(1, word_slots);
            std::mem::forget(b.try_acquire_owned().unwrap()); // a holder that died
            b.advance_clock_past_reclaim();
            let holders = Arc::new(Holders::default());
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let (b, holders) = (b.clone(), holders.clone());
                    thread::spawn(move || {
                        let p = b.try_acquire_owned().ok();
                        if p.is_some() {
                            holders.enter(1);
                        }
                        p
                    })
                })
                .collect();
            let permits: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            let won = permits.iter().flatten().count();
            assert!(won <= 1);
            assert_eq!(b.in_flight(), 1);
            drop(permits);
        });
    }
}

/// Reset races the holder's release and a new acquire. Afterwards the count
/// matches the permits that are still current, and everything drains to 0.
#[test]
fn reset_races_release_and_acquire() {
    for word_slots in [0, 1] {
        loom::model(move || {
            let b = bulkhead(1, word_slots);
            let old = b.try_acquire_owned().unwrap();

            let resetter = {
                let b = b.clone();
                thread::spawn(move || {
                    b.reset();
                    // Acquire right after the reset, in the same clock tick.
                    b.try_acquire_owned().ok()
                })
            };
            let releaser = thread::spawn(move || drop(old));
            releaser.join().unwrap();
            let new = resetter.join().unwrap();

            // Whatever the order, the old holder is gone; a new permit, if
            // granted, is counted and current.
            match &new {
                Some(p) => {
                    assert!(p.is_current());
                    assert_eq!(b.in_flight(), 1);
                }
                None => assert_eq!(b.in_flight(), 0),
            }
            drop(new);
            assert_eq!(b.in_flight(), 0);
            assert!(b.try_acquire().is_ok());
        });
    }
}

/// The same-tick case spelled out: reset, acquire at once, then the reset
/// holder drops. Its token differs from the new one by generation alone.
#[test]
fn stale_release_after_reset_keeps_the_new_holder() {
    loom::model(|| {
        let b = bulkhead(1, 1);
        let old = b.try_acquire_owned().unwrap();
        b.reset();
        let new = b.try_acquire_owned().unwrap();
        let t = thread::spawn(move || drop(old));
        assert!(b.try_acquire().is_err());
        t.join().unwrap();
        assert!(new.is_current());
        assert_eq!(b.in_flight(), 1);
        drop(new);
        assert_eq!(b.in_flight(), 0);
    });
}

/// No lost wake-up: a waiter registers and looks once more while the holder
/// releases. Either the look finds the freed slot, or the release sees the
/// waiter (and so wakes it).
#[test]
fn a_release_either_is_seen_by_the_waiter_or_sees_it() {
    for word_slots in [0, 1] {
        loom::model(move || {
            let b = bulkhead(1, word_slots);
            let held = b.try_acquire_owned().unwrap();
            let releaser = thread::spawn(move || held.model_release());
            b.model_add_waiter();
            let got = b.try_acquire_owned().ok();
            let woke = releaser.join().unwrap();
            assert!(
                got.is_some() || woke,
                "the waiter would sleep through the release"
            );
        });
    }
}
