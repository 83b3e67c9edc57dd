//! The bulkhead's rules, one test each, plus a stress test across OS threads
//! and tokio tasks. Tests assert outcomes (counts, orders), not timings: where
//! time passing is the condition (a deadline), they sleep past it or poll
//! until it happens.
#![cfg(not(gendurable_loom))]

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use gendurable_bulkhead::{
    Bulkhead, BulkheadConfig, BulkheadError, BulkheadHooks, NotFound, Saturated, Wait, MAX_LIMIT,
    MAX_RECLAIM_AFTER, MAX_WAIT,
};

const LONG: Duration = Duration::from_secs(600);
/// A wait budget that is never reached when things work, and turns a lost
/// wake-up into a failure (rather than a hang) when they do not.
const PATIENCE: Duration = Duration::from_secs(20);

fn bulkhead(limit: usize) -> Bulkhead {
    bulkhead_with(limit, LONG)
}

fn bulkhead_with(limit: usize, reclaim_after: Duration) -> Bulkhead {
    Bulkhead::new(BulkheadConfig::new(limit, reclaim_after)).unwrap()
}

fn waiting(limit: usize, wait: Duration) -> Arc<Bulkhead> {
    Arc::new(
        Bulkhead::new(BulkheadConfig::new(limit, LONG).with_wait(Wait::Bounded(wait))).unwrap(),
    )
}

/// Polls `cond` until it holds; panics after a generous bound so a broken
/// build fails instead of hanging.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < give_up, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A wake-up takes microseconds. Were one lost, a waiter would still get its
/// permit, but only from the last look it takes when its budget runs out:
/// so anything slower than half the budget means a lost wake-up.
async fn woken<T>(fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE / 2, fut)
        .await
        .expect("the waiter was not woken; only its budget running out would have freed it")
}

/// [`woken`] for a blocking waiter, run on its own thread.
fn woken_blocking<T: Send + 'static>(waiter: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(waiter()).unwrap());
    rx.recv_timeout(PATIENCE / 2)
        .expect("the waiter was not woken; only its budget running out would have freed it")
}

async fn eventually_async(what: &str, mut cond: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < give_up, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[derive(Default)]
struct Counting {
    acquired: AtomicUsize,
    saturated: AtomicUsize,
    waited: AtomicUsize,
    reclaimed: AtomicUsize,
}

impl BulkheadHooks for Counting {
    fn on_acquired(&self) {
        self.acquired.fetch_add(1, SeqCst);
    }
    fn on_saturated(&self) {
        self.saturated.fetch_add(1, SeqCst);
    }
    fn on_waited(&self, _waited: Duration) {
        self.waited.fetch_add(1, SeqCst);
    }
    fn on_reclaimed(&self) {
        self.reclaimed.fetch_add(1, SeqCst);
    }
}

// ---------------------------------------------------------------- config

#[test]
fn invalid_configs_are_refused_with_a_reason() {
    let refused = |config: BulkheadConfig, mentions: &str| match Bulkhead::new(config) {
        Err(BulkheadError::InvalidConfig(msg)) => {
            assert!(
                msg.contains(mentions),
                "{msg:?} should mention {mentions:?}"
            )
        }
        Ok(_) => panic!("accepted, expected a complaint about {mentions}"),
    };
    refused(BulkheadConfig::new(0, LONG), "limit");
    refused(BulkheadConfig::new(MAX_LIMIT + 1, LONG), "limit");
    refused(BulkheadConfig::new(1, Duration::ZERO), "reclaim_after");
    refused(
        BulkheadConfig::new(1, Duration::from_secs(u64::MAX)),
        "reclaim_after",
    );
    refused(
        BulkheadConfig::new(1, LONG).with_wait(Wait::Unbounded),
        "unbounded",
    );
    refused(
        BulkheadConfig::new(1, LONG).with_wait(Wait::Bounded(Duration::MAX)),
        "unbounded",
    );
}

fn refused_because(config: BulkheadConfig, mentions: &str) {
    match Bulkhead::new(config) {
        Err(BulkheadError::InvalidConfig(msg)) => assert!(
            msg.contains(mentions),
            "{msg:?} should mention {mentions:?}"
        ),
        Ok(_) => panic!("accepted, expected a complaint about {mentions}"),
    }
}

/// The longest duration that can still be added to the current `Instant`.
fn just_below_instant_overflow() -> Duration {
    let now = Instant::now();
    let (mut lo, mut hi) = (0u64, u64::MAX);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if now.checked_add(Duration::from_secs(mid)).is_some() {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Duration::from_secs(lo)
}

#[test]
fn huge_waits_are_refused_with_a_reason_never_a_panic() {
    let near_overflow = just_below_instant_overflow();
    assert!(Instant::now().checked_add(near_overflow).is_some());
    for wait in [
        near_overflow,
        near_overflow / 2,
        Duration::from_secs(u64::MAX),
        Duration::MAX,
        MAX_WAIT + Duration::from_nanos(1),
    ] {
        refused_because(
            BulkheadConfig::new(1, LONG).with_wait(Wait::Bounded(wait)),
            "wait must be at most",
        );
    }
    for reclaim_after in [
        near_overflow,
        Duration::MAX,
        MAX_RECLAIM_AFTER + Duration::from_nanos(1),
    ] {
        refused_because(BulkheadConfig::new(1, reclaim_after), "reclaim_after");
    }
}

#[tokio::test]
async fn the_longest_accepted_wait_works() {
    let b = waiting(1, MAX_WAIT);
    assert_eq!(b.wait(), Some(MAX_WAIT));
    let held = b.try_acquire_owned().unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.acquire_owned().await }
    });
    eventually_async("the waiter registers", || b.waiting() == 1).await;
    drop(held);
    assert!(woken(waiter).await.unwrap().unwrap().is_current());

    // Blocking, and given up from the outside.
    let held = b.try_acquire_owned().unwrap();
    let blocked = {
        let b = b.clone();
        std::thread::spawn(move || b.acquire_blocking_owned())
    };
    eventually_async("the blocking waiter registers", || b.waiting() == 1).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(20), b.acquire())
            .await
            .is_err(),
        "queued behind the blocked thread"
    );
    assert_eq!(b.waiting(), 1);
    drop(held);
    assert!(blocked.join().unwrap().unwrap().is_current());
    assert_eq!(b.waiting(), 0);
}

#[test]
fn the_longest_accepted_reclaim_after_works() {
    let b = Arc::new(bulkhead_with(2, MAX_RECLAIM_AFTER));
    let p = b.try_acquire_owned().unwrap();
    let q = b.try_acquire().unwrap();
    assert_eq!(b.in_flight(), 2);
    assert!(p.is_current() && q.is_current());
    assert!(b.try_acquire().is_err());
    drop((p, q));
    assert_eq!(b.in_flight(), 0);
}

#[test]
fn valid_configs_are_kept() {
    let b = Bulkhead::new(
        BulkheadConfig::new(3, Duration::from_secs(5))
            .with_wait(Wait::Bounded(Duration::from_millis(7))),
    )
    .unwrap();
    assert_eq!(b.limit(), 3);
    assert_eq!(b.reclaim_after(), Duration::from_secs(5));
    assert_eq!(b.wait(), Some(Duration::from_millis(7)));
    // A zero budget is no wait at all.
    let b = Bulkhead::new(BulkheadConfig::new(1, LONG).with_wait(Wait::Bounded(Duration::ZERO)))
        .unwrap();
    assert_eq!(b.wait(), None);
}

// ---------------------------------------------------------------- admission

#[test]
fn a_full_bulkhead_answers_saturated() {
    for limit in [1, 2, 63, 64, 100] {
        let b = bulkhead(limit);
        let held: Vec<_> = (0..limit).map(|_| b.try_acquire().unwrap()).collect();
        assert_eq!(b.in_flight(), limit);
        assert_eq!(b.try_acquire().unwrap_err(), Saturated);
        assert_eq!(b.acquire_blocking().unwrap_err(), Saturated);
        drop(held);
        assert_eq!(b.in_flight(), 0);
        assert!(b.try_acquire().is_ok());
    }
}

#[test]
fn at_1023_of_1024_held_the_last_permit_still_comes_and_goes() {
    let b = bulkhead(1024);
    let held: Vec<_> = (0..1023).map(|_| b.try_acquire().unwrap()).collect();
    assert_eq!(b.in_flight(), 1023);
    for _ in 0..10_000 {
        let last = b.try_acquire().expect("one permit is left");
        assert_eq!(b.in_flight(), 1024);
        assert_eq!(b.try_acquire().unwrap_err(), Saturated);
        drop(last);
        assert_eq!(b.in_flight(), 1023);
    }
    // Release every other one, take them all back, then release everything.
    let (kept, released): (Vec<_>, Vec<_>) =
        held.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
    drop(released);
    assert_eq!(b.in_flight(), 512);
    let again: Vec<_> = (0..512).map(|_| b.try_acquire().unwrap()).collect();
    assert_eq!(b.in_flight(), 1024);
    assert!(b.try_acquire().is_err());
    drop((kept, again));
    assert_eq!(b.in_flight(), 0);
    let all: Vec<_> = (0..1024).map(|_| b.try_acquire().unwrap()).collect();
    assert!(b.try_acquire().is_err());
    drop(all);
    assert_eq!(b.in_flight(), 0);
}

#[test]
fn at_1023_of_1024_held_threads_racing_for_the_last_permit_never_exceed_the_limit() {
    let b = Arc::new(bulkhead(1024));
    let held: Vec<_> = (0..1023).map(|_| b.try_acquire().unwrap()).collect();
    let census = Arc::new(Census::default());
    let granted = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (b, census, granted) = (b.clone(), census.clone(), granted.clone());
            std::thread::spawn(move || {
                for _ in 0..20_000 {
                    if let Ok(p) = b.try_acquire() {
                        census.enter();
                        granted.fetch_add(1, SeqCst);
                        census.leave();
                        drop(p);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(census.max.load(SeqCst), 1, "two holders of the last permit");
    assert!(granted.load(SeqCst) > 0);
    assert_eq!(b.in_flight(), 1023);
    drop(held);
    assert_eq!(b.in_flight(), 0);
}

#[test]
fn call_runs_the_closure_under_a_permit() {
    let b = bulkhead(1);
    assert_eq!(b.call(|| b.in_flight()), Ok(1));
    assert_eq!(b.in_flight(), 0);
    let _held = b.try_acquire().unwrap();
    let mut ran = false;
    assert_eq!(b.call(|| ran = true), Err(Saturated));
    assert!(!ran);
}

#[tokio::test]
async fn call_async_runs_the_future_under_a_permit() {
    let b = bulkhead(1);
    assert_eq!(b.call_async(async { b.in_flight() }).await, Ok(1));
    assert_eq!(b.in_flight(), 0);
    let _held = b.try_acquire().unwrap();
    assert_eq!(b.call_async(async { unreachable!() }).await, Err(Saturated));
}

// ---------------------------------------------------------------- waiting

#[tokio::test]
async fn a_waiter_gets_a_slot_released_within_its_budget() {
    let b = waiting(1, PATIENCE);
    let held = b.try_acquire_owned().unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.acquire_owned().await }
    });
    eventually_async("the waiter registers", || b.waiting() == 1).await;
    assert_eq!(b.in_flight(), 1, "a waiter holds no slot");
    drop(held);
    let permit = woken(waiter)
        .await
        .unwrap()
        .expect("released slot handed to the waiter");
    assert!(permit.is_current());
    assert_eq!(b.in_flight(), 1);
    assert_eq!(b.waiting(), 0);
}

#[tokio::test]
async fn a_waiter_gives_up_with_saturated_when_nothing_is_released() {
    let hooks = Arc::new(Counting::default());
    let b = Bulkhead::new(
        BulkheadConfig::new(1, LONG)
            .with_wait(Wait::Bounded(Duration::from_millis(30)))
            .with_hooks(hooks.clone()),
    )
    .unwrap();
    let _held = b.try_acquire().unwrap();
    assert_eq!(b.acquire().await.unwrap_err(), Saturated);
    assert_eq!(b.waiting(), 0);
    assert_eq!(b.in_flight(), 1);
    assert_eq!(hooks.waited.load(SeqCst), 1);
    assert_eq!(hooks.saturated.load(SeqCst), 1);
}

#[test]
fn a_blocking_waiter_gets_a_slot_released_within_its_budget() {
    let b = waiting(1, PATIENCE);
    let held = b.try_acquire_owned().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn({
        let b = b.clone();
        move || tx.send(b.acquire_blocking_owned()).unwrap()
    });
    eventually("the waiter registers", || b.waiting() == 1);
    drop(held);
    let permit = rx
        .recv_timeout(PATIENCE / 2)
        .expect("the waiter was not woken")
        .expect("released slot handed to the waiter");
    assert!(permit.is_current());
    assert_eq!(b.in_flight(), 1);
}

#[test]
fn a_blocking_waiter_gives_up_with_saturated_when_nothing_is_released() {
    let b = waiting(1, Duration::from_millis(30));
    let _held = b.try_acquire().unwrap();
    assert_eq!(b.acquire_blocking().unwrap_err(), Saturated);
    assert_eq!(b.call(|| ()), Err(Saturated));
    assert_eq!(b.waiting(), 0);
    assert_eq!(b.in_flight(), 1);
}

#[test]
fn each_release_wakes_a_blocking_waiter() {
    let b = waiting(2, PATIENCE);
    let held: Vec<_> = (0..2).map(|_| b.try_acquire_owned().unwrap()).collect();
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..4 {
        let (b, tx) = (b.clone(), tx.clone());
        std::thread::spawn(move || {
            let p = b.acquire_blocking_owned();
            std::thread::sleep(Duration::from_millis(1));
            tx.send(p.is_ok()).unwrap();
        });
    }
    eventually("all four wait", || b.waiting() == 4);
    drop(held);
    for _ in 0..4 {
        let got = rx
            .recv_timeout(PATIENCE / 2)
            .expect("a waiter was not woken");
        assert!(got);
    }
    eventually("all released", || b.in_flight() == 0);
}

#[tokio::test]
async fn a_cancelled_waiter_leaves_no_permit_behind() {
    let b = waiting(1, PATIENCE);
    let held = b.try_acquire_owned().unwrap();
    // Start waiting, then give up from the outside (drop mid-await).
    let outcome = tokio::time::timeout(Duration::from_millis(20), b.acquire()).await;
    assert!(outcome.is_err(), "could not have got a permit");
    assert_eq!(b.waiting(), 0);
    assert_eq!(b.in_flight(), 1);
    drop(held);
    assert_eq!(b.in_flight(), 0);
    assert!(b.try_acquire().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wakeup_for_a_cancelled_waiter_passes_to_the_next() {
    for _ in 0..50 {
        let b = waiting(1, PATIENCE);
        let held = b.try_acquire_owned().unwrap();
        let first = tokio::spawn({
            let b = b.clone();
            async move { b.acquire_owned().await }
        });
        eventually_async("the first waiter registers", || b.waiting() == 1).await;
        let second = tokio::spawn({
            let b = b.clone();
            async move { b.acquire_owned().await }
        });
        eventually_async("the second waiter registers", || b.waiting() == 2).await;
        // Release and cancel the first waiter at about the same time.
        drop(held);
        first.abort();
        let first = first.await;
        match first {
            // It got the slot before it was cancelled: the second must wait.
            Ok(Ok(p)) => {
                assert_eq!(b.in_flight(), 1);
                drop(p);
                assert!(woken(second).await.unwrap().is_ok());
            }
            Ok(Err(Saturated)) => panic!("the first waiter was never woken"),
            // Cancelled: the release must reach the second waiter anyway.
            Err(_) => assert!(woken(second).await.unwrap().is_ok()),
        }
        assert_eq!(b.in_flight(), 0);
        assert_eq!(b.waiting(), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_arrival_order_and_newcomers_queue_behind() {
    let b = waiting(1, PATIENCE);
    let held = b.try_acquire_owned().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // Async tasks and blocked threads in one queue, registered one by one.
    for i in 0..6 {
        let (waiter, tx) = (b.clone(), tx.clone());
        if i % 2 == 0 {
            tokio::spawn(async move {
                let p = waiter.acquire_owned().await.expect("served");
                tx.send((i, p)).unwrap();
            });
        } else {
            std::thread::spawn(move || {
                let p = waiter.acquire_blocking_owned().expect("served");
                tx.send((i, p)).unwrap();
            });
        }
        eventually_async("the waiter registers", || b.waiting() == i + 1).await;
    }
    drop(held);
    for expected in 0..6 {
        let (i, p) = woken(rx.recv()).await.unwrap();
        assert_eq!(i, expected, "served out of order");
        assert_eq!(b.in_flight(), 1);
        // A newcomer does not overtake the waiters, even as the slot is released.
        assert_eq!(b.try_acquire().unwrap_err(), Saturated);
        drop(p);
        if expected < 5 {
            assert_eq!(b.try_acquire().unwrap_err(), Saturated, "overtook a waiter");
        }
    }
    eventually_async("the last permit is back", || b.in_flight() == 0).await;
    assert_eq!(b.waiting(), 0);
    assert!(b.try_acquire().is_ok());
}

/// How `fair_shares` holds each permit.
#[derive(Clone, Copy)]
enum Hold {
    Sleep,
    Yield,
}

/// `tasks` tasks loop acquire / hold / release on `b` (limit 2) until
/// `grants` permits were handed out in all; returns how many each task got.
/// Both permits are held until every task waits, so that all of them compete
/// from the first grant on.
async fn fair_shares(b: Arc<Bulkhead>, tasks: usize, grants: usize, hold: Hold) -> Vec<usize> {
    let gate = (
        b.try_acquire_owned().unwrap(),
        b.try_acquire_owned().unwrap(),
    );
    let total = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (b, total) = (b.clone(), total.clone());
            tokio::spawn(async move {
                let mut mine = 0;
                loop {
                    let p = b.acquire().await.expect("waited past the budget");
                    if total.fetch_add(1, SeqCst) >= grants {
                        return mine;
                    }
                    mine += 1;
                    match hold {
                        Hold::Sleep => tokio::time::sleep(Duration::from_millis(1)).await,
                        Hold::Yield => tokio::task::yield_now().await,
                    }
                    drop(p);
                }
            })
        })
        .collect();
    eventually_async("every task waits", || b.waiting() == tasks).await;
    drop(gate);
    let mut counts = Vec::new();
    for h in handles {
        counts.push(h.await.unwrap());
    }
    counts
}

/// Every caller got between three quarters and five quarters of an equal share.
fn assert_fair(counts: &[usize], grants: usize) {
    assert_eq!(counts.iter().sum::<usize>(), grants);
    let share = grants / counts.len();
    for &n in counts {
        assert!(
            n * 4 >= share * 3 && n * 4 <= share * 5,
            "unfair shares {counts:?}, an equal share is {share}"
        );
    }
}

/// The case of the issue: limit 2, 12 tasks looping acquire / sleep 1 ms /
/// release. Without first come, first served, a task that releases takes
/// the slot straight back and two tasks get nearly every grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_waiters_get_fair_shares() {
    let b = waiting(2, PATIENCE);
    let counts = fair_shares(b.clone(), 12, 12 * 40, Hold::Sleep).await;
    assert_fair(&counts, 12 * 40);
    eventually_async("all released", || b.in_flight() == 0).await;
    assert_eq!(b.waiting(), 0);
}

/// The same on one thread, where the scheduler runs tasks in turn, also with
/// tasks that only yield while they hold the permit (which a task that
/// releases and asks again at once would win without a queue).
#[tokio::test]
async fn async_waiters_get_fair_shares_on_one_thread() {
    for hold in [Hold::Sleep, Hold::Yield] {
        let b = waiting(2, PATIENCE);
        let counts = fair_shares(b.clone(), 12, 12 * 40, hold).await;
        assert_fair(&counts, 12 * 40);
        assert_eq!(b.in_flight(), 0);
    }
}

#[test]
fn blocking_waiters_get_fair_shares() {
    let b = waiting(2, PATIENCE);
    let (threads, grants) = (12, 12 * 30);
    let gate = (
        b.try_acquire_owned().unwrap(),
        b.try_acquire_owned().unwrap(),
    );
    let total = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (b, total) = (b.clone(), total.clone());
            std::thread::spawn(move || {
                let mut mine = 0;
                loop {
                    let p = b.acquire_blocking().expect("waited past the budget");
                    if total.fetch_add(1, SeqCst) >= grants {
                        return mine;
                    }
                    mine += 1;
                    std::thread::sleep(Duration::from_millis(1));
                    drop(p);
                }
            })
        })
        .collect();
    eventually("every thread waits", || b.waiting() == threads);
    drop(gate);
    let counts: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_fair(&counts, grants);
    assert_eq!(b.in_flight(), 0);
    assert_eq!(b.waiting(), 0);
}

// ---------------------------------------------------------------- release

#[test]
fn a_panic_releases_the_permit() {
    let b = bulkhead(1);
    let outcome = catch_unwind(AssertUnwindSafe(|| b.call(|| panic!("boom"))));
    assert!(outcome.is_err());
    assert_eq!(b.in_flight(), 0);

    let b = Arc::new(bulkhead(1));
    let t = std::thread::spawn({
        let b = b.clone();
        move || {
            let _p = b.try_acquire().unwrap();
            panic!("holder dies");
        }
    });
    assert!(t.join().is_err());
    assert_eq!(b.in_flight(), 0);
}

#[tokio::test]
async fn a_cancelled_future_releases_its_permit() {
    let b = Arc::new(bulkhead(1));
    // Dropped mid-await while holding the permit.
    let outcome = tokio::time::timeout(
        Duration::from_millis(20),
        b.call_async(std::future::pending::<()>()),
    )
    .await;
    assert!(outcome.is_err());
    assert_eq!(b.in_flight(), 0);

    // An aborted task holding an owned permit.
    let task = tokio::spawn({
        let b = b.clone();
        async move {
            let _p = b.try_acquire_owned().unwrap();
            std::future::pending::<()>().await
        }
    });
    eventually_async("the task holds the permit", || b.in_flight() == 1).await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert_eq!(b.in_flight(), 0);
}

#[test]
fn a_future_polled_once_then_dropped_releases_its_permit() {
    let b = bulkhead(1);
    let mut fut = Box::pin(b.call_async(std::future::pending::<()>()));
    let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    assert_eq!(b.in_flight(), 1);
    drop(fut);
    assert_eq!(b.in_flight(), 0);
}

// ---------------------------------------------------------------- reclaim

/// Takes a permit from `b`, polling until the deadline of the permit that is
/// in the way has passed.
fn acquire_once_expired(b: &Bulkhead) -> gendurable_bulkhead::Permit<'_> {
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(p) = b.try_acquire() {
            return p;
        }
        assert!(
            Instant::now() < give_up,
            "the expired slot was never reclaimed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn expired_slots_are_reclaimed_and_late_releases_are_ignored() {
    for limit in [1, 2, 64, 65] {
        let hooks = Arc::new(Counting::default());
        let b = Bulkhead::new(
            BulkheadConfig::new(limit, Duration::from_millis(200)).with_hooks(hooks.clone()),
        )
        .unwrap();
        b.count_saturated();
        let held: Vec<_> = (0..limit).map(|_| b.try_acquire().unwrap()).collect();
        // Not before the deadline: the limit holds.
        assert_eq!(b.try_acquire().unwrap_err(), Saturated);

        // Nobody releases; only refused callers come by.
        let new = acquire_once_expired(&b);
        eventually("every expired holder is reclaimed", || {
            held.iter().all(|p| !p.is_current()) && hooks.reclaimed.load(SeqCst) == limit
        });
        assert_eq!(b.in_flight(), 1, "expired holders are not counted");
        assert!(new.is_current());

        // The holders that lost their slots release late: nothing changes.
        drop(held);
        assert_eq!(b.in_flight(), 1, "a late release freed someone else's slot");
        assert!(new.is_current());
        drop(new);
        assert_eq!(b.in_flight(), 0);
        assert_eq!(hooks.reclaimed.load(SeqCst), limit);
        // The bulkhead's own counters, for metrics, agree with the hooks.
        assert_eq!(b.reclaimed(), limit as u64);
        assert_eq!(b.saturated(), Some(hooks.saturated.load(SeqCst) as u64));
        assert!(b.saturated() >= Some(1));
    }
}

/// `in_flight` counts live holders only: once the deadline of some holders
/// has passed it no longer counts them, whether or not anything reclaimed
/// them yet. Holders taken later, still within their deadline, still count.
#[test]
fn in_flight_counts_only_live_holders() {
    let reclaim_after = Duration::from_millis(1000);
    let gap = Duration::from_millis(500);
    // A machine stalled for longer than `gap` at the wrong moment makes a
    // round inconclusive (the young holders expired too); try again.
    for _ in 0..3 {
        let b = bulkhead_with(1024, reclaim_after);
        let t0 = Instant::now();
        let old: Vec<_> = (0..1000).map(|_| b.try_acquire().unwrap()).collect();
        std::thread::sleep(gap);
        let young: Vec<_> = (0..23).map(|_| b.try_acquire().unwrap()).collect();
        assert_eq!(b.in_flight(), 1023);
        // Past the old holders' deadline (plus the clock's granularity).
        std::thread::sleep(
            (t0 + reclaim_after + Duration::from_millis(50))
                .saturating_duration_since(Instant::now()),
        );
        let live = b.in_flight();
        if !young.iter().all(|p| p.is_current()) {
            continue;
        }
        assert_eq!(live, 23, "holders past their deadline were counted");
        assert!(old.iter().all(|p| !p.is_current()));
        // The freed capacity is usable, up to the limit.
        let more: Vec<_> = (0..1001).map(|_| b.try_acquire().unwrap()).collect();
        assert_eq!(b.in_flight(), 1024);
        assert!(b.try_acquire().is_err());
        drop((old, more));
        assert_eq!(b.in_flight(), 23);
        return;
    }
    panic!("the machine was too slow for the young holders to stay within their deadline");
}

#[test]
fn a_holder_within_its_deadline_is_not_reclaimed() {
    let hooks = Arc::new(Counting::default());
    let b = Bulkhead::new(BulkheadConfig::new(1, LONG).with_hooks(hooks.clone())).unwrap();
    let p = b.try_acquire().unwrap();
    for _ in 0..1000 {
        assert!(b.try_acquire().is_err());
    }
    assert!(p.is_current());
    assert_eq!(hooks.reclaimed.load(SeqCst), 0);
}

/// The bulkhead reads a coarse clock (one kernel tick of granularity) in
/// units of about a millisecond. Whatever the rounding, the slot comes back
/// no sooner than `reclaim_after` after the acquire, as the fine-grained
/// monotonic clock measures it. Acquires start at different points within a
/// kernel tick (a reclaim is found just after a tick, so the previous round
/// leaves the next one in phase with the clock), and the reclaim is watched
/// for by spinning, so that one a tick early would be caught. Only the lower
/// bound is asserted: a busy machine can make the reclaim later, never
/// earlier.
#[test]
fn a_slot_is_never_reclaimed_before_reclaim_after() {
    for reclaim_after in [
        Duration::from_micros(1),
        Duration::from_millis(3),
        Duration::from_millis(25),
    ] {
        for phase in 0..8 {
            let b = Bulkhead::new(BulkheadConfig::new(1, reclaim_after)).unwrap();
            std::thread::sleep(Duration::from_micros(450 * phase));
            let acquired = Instant::now();
            std::mem::forget(b.try_acquire().unwrap());
            let give_up = acquired + Duration::from_secs(20);
            let reclaimed = loop {
                if b.try_acquire().is_ok() {
                    break Instant::now();
                }
                assert!(Instant::now() < give_up, "the slot was never reclaimed");
                std::thread::yield_now();
            };
            assert!(
                reclaimed - acquired >= reclaim_after,
                "reclaimed {:?} after the acquire, before reclaim_after = {reclaim_after:?}",
                reclaimed - acquired
            );
        }
    }
}

#[tokio::test]
async fn a_waiter_wakes_for_a_reclaim_without_any_release() {
    let b = Bulkhead::new(
        BulkheadConfig::new(1, Duration::from_millis(50)).with_wait(Wait::Bounded(PATIENCE)),
    )
    .unwrap();
    // A holder that will never release.
    std::mem::forget(b.try_acquire().unwrap());
    let p = woken(b.acquire())
        .await
        .expect("reclaimed once the deadline passed");
    assert!(p.is_current());
    assert_eq!(b.in_flight(), 1);
}

#[test]
fn a_blocking_waiter_wakes_for_a_reclaim_without_any_release() {
    let b = Arc::new(
        Bulkhead::new(
            BulkheadConfig::new(1, Duration::from_millis(50)).with_wait(Wait::Bounded(PATIENCE)),
        )
        .unwrap(),
    );
    std::mem::forget(b.try_acquire().unwrap());
    let p = woken_blocking({
        let b = b.clone();
        move || b.acquire_blocking_owned()
    })
    .expect("reclaimed once the deadline passed");
    assert!(p.is_current());
}

/// A fork copies only the forking thread: holders on other threads never
/// release in the child, and the reaper thread is gone too. The child starts
/// its own reaper, which reclaims them once their deadline passes.
#[cfg(unix)]
#[test]
fn a_forked_child_reclaims_holders_that_did_not_survive_the_fork() {
    let b = Arc::new(bulkhead_with(2, Duration::from_millis(100)));
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn({
        let b = b.clone();
        move || {
            let held = (
                b.try_acquire_owned().unwrap(),
                b.try_acquire_owned().unwrap(),
            );
            held_tx.send(()).unwrap();
            done_rx.recv().unwrap();
            drop(held);
        }
    });
    held_rx.recv().unwrap();
    assert!(b.try_acquire().is_err());
    // SAFETY: the child only uses the bulkhead, sleeps and exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let give_up = Instant::now() + Duration::from_secs(10);
        let code = loop {
            if b.try_acquire().is_ok() {
                break 0;
            }
            if Instant::now() > give_up {
                break 1;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    done_tx.send(()).unwrap();
    holder.join().unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child never got a permit: status {status}"
    );
    assert_eq!(b.in_flight(), 0);
}

// ---------------------------------------------------------------- reset

#[test]
fn reset_frees_every_slot_and_old_releases_do_nothing() {
    for limit in [2, 70] {
        let b = bulkhead(limit);
        let old: Vec<_> = (0..limit).map(|_| b.try_acquire().unwrap()).collect();
        b.reset();
        assert_eq!(b.in_flight(), 0);
        assert!(old.iter().all(|p| !p.is_current()));
        let new = b.try_acquire().unwrap();
        drop(old);
        assert_eq!(b.in_flight(), 1);
        assert!(new.is_current());
        drop(new);
        assert_eq!(b.in_flight(), 0);
    }
}

#[test]
fn reset_then_acquire_in_the_same_tick_keeps_the_new_holder() {
    // Done many times in a row, nearly every round runs within one clock
    // tick, so the new token differs from the old only by its generation.
    let b = bulkhead(1);
    for _ in 0..10_000 {
        let old = b.try_acquire().unwrap();
        b.reset();
        let new = b.try_acquire().unwrap();
        drop(old);
        assert!(new.is_current());
        assert_eq!(b.in_flight(), 1);
        assert!(b.try_acquire().is_err());
        drop(new);
        assert_eq!(b.in_flight(), 0);
    }
}

#[test]
fn reset_wakes_waiters() {
    let b = waiting(1, PATIENCE);
    let _held = b.try_acquire_owned().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn({
        let b = b.clone();
        move || tx.send(b.acquire_blocking_owned().is_ok()).unwrap()
    });
    eventually("the waiter registers", || b.waiting() == 1);
    b.reset();
    assert!(rx
        .recv_timeout(PATIENCE / 2)
        .expect("the waiter was not woken"));
}

// ---------------------------------------------------------------- counting

#[test]
fn in_flight_is_exact_under_concurrency() {
    for limit in [8, 100] {
        let threads = 8;
        let b = Arc::new(bulkhead(limit));
        let barrier = Arc::new(Barrier::new(threads + 1));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (b, barrier) = (b.clone(), barrier.clone());
                std::thread::spawn(move || {
                    // Churn, then hold one permit each while the count is checked.
                    for _ in 0..20_000 {
                        drop(b.try_acquire());
                    }
                    let p = b.try_acquire().unwrap();
                    barrier.wait();
                    barrier.wait();
                    drop(p);
                    for _ in 0..20_000 {
                        drop(b.try_acquire());
                    }
                })
            })
            .collect();
        barrier.wait();
        assert_eq!(b.in_flight(), threads);
        barrier.wait();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(b.in_flight(), 0);
    }
}

#[test]
fn hooks_see_every_outcome() {
    let hooks = Arc::new(Counting::default());
    let b = Bulkhead::new(
        BulkheadConfig::new(1, LONG)
            .with_wait(Wait::Bounded(Duration::from_millis(10)))
            .with_hooks(hooks.clone()),
    )
    .unwrap();
    let p = b.try_acquire().unwrap();
    assert!(b.try_acquire().is_err());
    assert!(b.acquire_blocking().is_err());
    drop(p);
    assert!(b.acquire_blocking().is_ok());
    assert_eq!(hooks.acquired.load(SeqCst), 2);
    assert_eq!(hooks.saturated.load(SeqCst), 2);
    assert_eq!(
        hooks.waited.load(SeqCst),
        1,
        "only the blocked acquire waited"
    );
    assert_eq!(hooks.reclaimed.load(SeqCst), 0);
}

// ---------------------------------------------------------------- registry

#[test]
fn the_registry_finds_bulkheads_by_name() {
    let name = "registry-test-payments";
    assert!(Bulkhead::named(name).is_none());
    assert_eq!(Bulkhead::in_flight_of(name), 0);
    assert_eq!(Bulkhead::limit_of(name), None);
    assert_eq!(Bulkhead::reset_named(name), Err(NotFound(name.into())));

    let b = Bulkhead::configure(name, BulkheadConfig::new(3, LONG)).unwrap();
    assert_eq!(Bulkhead::limit_of(name), Some(3));
    let p = Bulkhead::named(name).unwrap().try_acquire_owned().unwrap();
    assert_eq!(Bulkhead::in_flight_of(name), 1);
    assert!(Arc::ptr_eq(&b, p.bulkhead()));
    Bulkhead::reset_named(name).unwrap();
    assert_eq!(Bulkhead::in_flight_of(name), 0);
    assert!(!p.is_current());

    // Reconfiguring replaces the entry; the old one lives on for its holders.
    let q = b.try_acquire_owned().unwrap();
    Bulkhead::configure(name, BulkheadConfig::new(5, LONG)).unwrap();
    assert_eq!(Bulkhead::limit_of(name), Some(5));
    assert_eq!(Bulkhead::in_flight_of(name), 0);
    assert_eq!(b.in_flight(), 1);
    drop(q);
    assert_eq!(b.in_flight(), 0);

    assert!(Bulkhead::configure("registry-test-bad", BulkheadConfig::new(0, LONG)).is_err());
    assert!(Bulkhead::named("registry-test-bad").is_none());

    assert!(Bulkhead::unregister(name).is_some());
    assert!(Bulkhead::named(name).is_none());
}

// ---------------------------------------------------------------- stress

/// Counts holders with its own atomic, incremented right after a permit is
/// granted and decremented right before it is released, and records the
/// highest count seen.
#[derive(Default)]
struct Census {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl Census {
    fn enter(&self) {
        let n = self.now.fetch_add(1, SeqCst) + 1;
        self.max.fetch_max(n, SeqCst);
    }
    fn leave(&self) {
        self.now.fetch_sub(1, SeqCst);
    }
}

#[test]
fn stress_threads_and_tasks_never_exceed_the_limit() {
    for limit in [1, 4, 70] {
        let b = waiting(limit, Duration::from_millis(5));
        let census = Arc::new(Census::default());
        let granted = Arc::new(AtomicUsize::new(0));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();

        let tasks: Vec<_> = (0..limit * 2 + 32)
            .map(|i| {
                let (b, census, granted) = (b.clone(), census.clone(), granted.clone());
                rt.spawn(async move {
                    for j in 0..300 {
                        let permit = if (i + j) % 2 == 0 {
                            b.try_acquire()
                        } else {
                            b.acquire().await
                        };
                        if let Ok(p) = permit {
                            census.enter();
                            granted.fetch_add(1, SeqCst);
                            tokio::task::yield_now().await;
                            census.leave();
                            drop(p);
                        }
                    }
                })
            })
            .collect();

        let threads: Vec<_> = (0..limit + 16)
            .map(|i| {
                let (b, census, granted) = (b.clone(), census.clone(), granted.clone());
                std::thread::spawn(move || {
                    for j in 0..2_000 {
                        let permit = if (i + j) % 3 == 0 {
                            b.acquire_blocking()
                        } else {
                            b.try_acquire()
                        };
                        if let Ok(p) = permit {
                            census.enter();
                            granted.fetch_add(1, SeqCst);
                            std::thread::yield_now();
                            census.leave();
                            drop(p);
                        }
                    }
                })
            })
            .collect();

        for t in threads {
            t.join().unwrap();
        }
        rt.block_on(async {
            for t in tasks {
                t.await.unwrap();
            }
        });
        let max = census.max.load(SeqCst);
        assert!(
            max <= limit,
            "{max} holders at once with a limit of {limit}"
        );
        assert!(granted.load(SeqCst) > 0);
        assert_eq!(b.in_flight(), 0);
        assert_eq!(b.waiting(), 0);
    }
}
