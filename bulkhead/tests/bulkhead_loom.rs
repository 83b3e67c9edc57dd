//! Model checks of the bulkhead's slot protocol with loom.
//!
//! The bulkhead's atomics and locks come from loom under
//! `--cfg gendurable_loom` (see `bulkhead/src/sync.rs`), so these models
//! explore every interleaving of the real acquire, release, hand-off, sweep
//! and reset code, under the C11 memory model as loom implements it. The
//! clock is a model clock that only moves when a test says so, and the
//! reaper's sweep is called by the tests themselves.
//!
//! ```text
//! RUSTFLAGS="--cfg gendurable_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p gendurable-bulkhead --release --test bulkhead_loom
//! ```
//!
//! (Plain `--cfg loom` cannot be used: tokio changes shape under it and the
//! crate no longer builds.) A separate target directory keeps the
//! loom build from evicting the normal one.
#![cfg(gendurable_loom)]

use std::sync::Arc;
use std::time::Duration;

use gendurable_bulkhead::{Bulkhead, BulkheadConfig, ModelWait, ModelWaiter, OwnedPermit, Wait};
use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use loom::thread;

fn bulkhead(limit: usize) -> Arc<Bulkhead> {
    let config = BulkheadConfig::new(limit, Duration::from_secs(1))
        .with_wait(Wait::Bounded(Duration::from_secs(1)));
    Arc::new(Bulkhead::new(config).unwrap())
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

/// Runs `f` under loom with at most `preemptions` forced context switches
/// per execution, which keeps models with three parties tractable (bugs that
/// need more preemptions than that are rare in practice).
fn model_bounded(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemptions);
    builder.check(f);
}

/// Queues a waiter, which must have to wait.
fn queue(b: &Arc<Bulkhead>) -> ModelWaiter {
    match b.model_enqueue() {
        ModelWait::Waiting(w) => w,
        ModelWait::Claimed(_) => panic!("a slot was free"),
    }
}

#[test]
fn concurrent_acquires_never_exceed_the_limit() {
    for limit in [1, 2] {
        loom::model(move || {
            let b = bulkhead(limit);
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
    for limit in [1, 2] {
        model_bounded(2, move || {
            let b = bulkhead(limit);
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
    loom::model(|| {
        let b = bulkhead(2);
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

/// Two holders release and take a slot again at the same time: pushes and
/// pops race on the stack's head. Afterwards both hold distinct slots.
#[test]
fn releases_and_acquires_racing_keep_the_stack_intact() {
    model_bounded(3, || {
        let b = bulkhead(2);
        let held = [
            b.try_acquire_owned().unwrap(),
            b.try_acquire_owned().unwrap(),
        ];
        let threads: Vec<_> = held
            .into_iter()
            .map(|p| {
                thread::spawn(move || {
                    let b = p.bulkhead().clone();
                    drop(p);
                    b.try_acquire_owned().ok()
                })
            })
            .collect();
        let permits: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let got = permits.iter().flatten().count();
        assert_eq!(b.in_flight(), got);
        assert!(permits.iter().flatten().all(|p| p.is_current()));
        // Whatever was not taken again is free.
        let rest: Vec<_> = (got..2).map(|_| b.try_acquire_owned().unwrap()).collect();
        assert!(b.try_acquire().is_err());
        drop((permits, rest));
        assert_eq!(b.in_flight(), 0);
    });
}

/// An expired holder releases late while the reaper sweeps: whichever comes
/// first frees the slot, exactly once.
#[test]
fn late_release_races_the_sweep() {
    loom::model(|| {
        let b = bulkhead(1);
        let old = b.try_acquire_owned().unwrap();
        b.model_advance_clock();

        let late = thread::spawn(move || drop(old));
        let reaper = {
            let b = b.clone();
            thread::spawn(move || b.model_sweep())
        };
        late.join().unwrap();
        let reclaimed = reaper.join().unwrap();
        assert!(reclaimed <= 1);

        assert_eq!(b.in_flight(), 0);
        let p = b.try_acquire().expect("freed once");
        assert!(b.try_acquire().is_err(), "freed twice");
        drop(p);
    });
}

/// The reaper reclaims an expired slot and a caller takes it while the old
/// holder releases late: the late release does not free the new holder's slot.
#[test]
fn a_late_release_never_frees_the_new_holders_slot() {
    loom::model(|| {
        let b = bulkhead(1);
        let old = b.try_acquire_owned().unwrap();
        b.model_advance_clock();

        let late = thread::spawn(move || drop(old));
        let taker = {
            let b = b.clone();
            thread::spawn(move || {
                b.model_sweep();
                b.try_acquire_owned().ok()
            })
        };
        late.join().unwrap();
        let new: Option<OwnedPermit> = taker.join().unwrap();
        // Reclaimed before the late release, or released before the taker
        // looked: either way the taker owns the slot and the late release
        // did not free it. (The taker may also have come while the late
        // release was half done, token cleared but slot not yet pushed, and
        // been refused; the release then completes and leaves the slot free.)
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

/// Two sweeps (the reaper and an `in_flight` call) race over one dead holder:
/// it is reclaimed once.
#[test]
fn sweeps_race_each_other() {
    loom::model(|| {
        let b = bulkhead(1);
        std::mem::forget(b.try_acquire_owned().unwrap()); // a holder that died
        b.model_advance_clock();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let b = b.clone();
                thread::spawn(move || b.model_sweep())
            })
            .collect();
        let reclaimed: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(reclaimed, 1);
        assert_eq!(b.in_flight(), 0);
        let p = b.try_acquire().unwrap();
        assert!(b.try_acquire().is_err());
        drop(p);
    });
}

/// The sweep that finds nothing held disarms the alarm, while a caller
/// acquires: either the sweep sees the holder and keeps the alarm, or the
/// acquire sees it disarmed and sets it. Either way the holder is reclaimed
/// once its deadline passes.
#[test]
fn an_acquire_racing_a_disarming_sweep_is_still_covered() {
    loom::model(|| {
        let b = bulkhead(1);
        drop(b.try_acquire().unwrap()); // armed, nothing held
        b.model_advance_clock();

        let sweeper = {
            let b = b.clone();
            thread::spawn(move || b.model_sweep())
        };
        let taker = {
            let b = b.clone();
            thread::spawn(move || b.try_acquire_owned().ok())
        };
        assert_eq!(sweeper.join().unwrap(), 0);
        let held = taker.join().unwrap().expect("the slot was free");
        assert!(b.model_armed(), "a holder without an alarm");

        // The holder dies; its deadline passes; the next sweep reclaims it.
        std::mem::forget(held);
        b.model_advance_clock();
        assert_eq!(b.model_sweep(), 1, "the holder was never reclaimed");
        assert_eq!(b.in_flight(), 0);
    });
}

/// Reset races the holder's release and a new acquire. Afterwards the count
/// matches the permits that are still current, and everything drains to 0.
#[test]
fn reset_races_release_and_acquire() {
    loom::model(|| {
        let b = bulkhead(1);
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

/// The same-tick case spelled out: reset, acquire at once, then the reset
/// holder drops. Its token differs from the new one by generation alone.
#[test]
fn stale_release_after_reset_keeps_the_new_holder() {
    loom::model(|| {
        let b = bulkhead(1);
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

/// No lost hand-off: a caller joins the queue while the holder releases.
/// Either it finds the slot free, or the release hands the slot to it.
#[test]
fn a_release_reaches_a_waiter_joining_at_the_same_time() {
    loom::model(|| {
        let b = bulkhead(1);
        let held = b.try_acquire_owned().unwrap();
        let releaser = thread::spawn(move || drop(held));
        let outcome = b.model_enqueue();
        releaser.join().unwrap();
        let permit = match outcome {
            ModelWait::Claimed(p) => p,
            ModelWait::Waiting(w) => {
                assert!(w.is_granted(), "the waiter would sleep through the release");
                w.finish().unwrap()
            }
        };
        assert!(permit.is_current());
        assert_eq!(b.in_flight(), 1);
        assert_eq!(b.waiting(), 0);
        drop(permit);
        assert_eq!(b.in_flight(), 0);
    });
}

/// A release goes to the waiter, not to a newcomer arriving at that moment.
#[test]
fn a_newcomer_never_overtakes_a_waiter() {
    loom::model(|| {
        let b = bulkhead(1);
        let held = b.try_acquire_owned().unwrap();
        let waiter = queue(&b);
        let releaser = thread::spawn(move || drop(held));
        let newcomer = {
            let b = b.clone();
            thread::spawn(move || b.try_acquire_owned().is_ok())
        };
        releaser.join().unwrap();
        assert!(
            !newcomer.join().unwrap(),
            "the newcomer overtook the waiter"
        );
        assert!(waiter.is_granted());
        let p = waiter.finish().unwrap();
        assert_eq!(b.in_flight(), 1);
        drop(p);
        assert_eq!(b.in_flight(), 0);
        assert!(b.try_acquire().is_ok());
    });
}

/// Two waiters, one release: the older one is served.
#[test]
fn waiters_are_served_oldest_first() {
    loom::model(|| {
        let b = bulkhead(1);
        let held = b.try_acquire_owned().unwrap();
        let first = queue(&b);
        let second = queue(&b);
        let releaser = thread::spawn(move || drop(held));
        releaser.join().unwrap();
        assert!(first.is_granted());
        assert!(!second.is_granted());
        assert_eq!(b.waiting(), 1);
        // The second gives up while the first releases: the slot ends up
        // either with the second or free, never lost.
        let p = first.finish().unwrap();
        let releaser = thread::spawn(move || drop(p));
        let got = second.finish();
        releaser.join().unwrap();
        assert_eq!(b.in_flight(), usize::from(got.is_some()));
        assert_eq!(b.waiting(), 0);
        drop(got);
        assert!(b.try_acquire().is_ok());
    });
}

/// The reaper reclaims a dead holder's slot while a caller waits: the waiter
/// gets it.
#[test]
fn a_reclaimed_slot_goes_to_the_waiter() {
    loom::model(|| {
        let b = bulkhead(1);
        std::mem::forget(b.try_acquire_owned().unwrap()); // a holder that died
        let waiter = queue(&b);
        b.model_advance_clock();
        let reaper = {
            let b = b.clone();
            thread::spawn(move || b.model_sweep())
        };
        let newcomer = {
            let b = b.clone();
            thread::spawn(move || b.try_acquire_owned().is_ok())
        };
        assert_eq!(reaper.join().unwrap(), 1);
        assert!(
            !newcomer.join().unwrap(),
            "the newcomer overtook the waiter"
        );
        assert!(waiter.is_granted());
        drop(waiter.finish().unwrap());
        assert_eq!(b.in_flight(), 0);
    });
}
