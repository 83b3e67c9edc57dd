//! Bulkhead admission cost, side by side with `tokio::sync::Semaphore` and a
//! `Mutex<usize>` counter.
//!
//! `cargo bench -p gendurable-bulkhead --bench bulkhead -- --warm-up-time 1 --measurement-time 2`
//! (a filter that matches no benchmark, such as `-- paired-only`, prints the
//! paired tables alone)
//!
//! Groups (each for limits 1, 16, 64 and 1024):
//! - `uncontended`: one thread, acquire then release;
//! - `contended_2_threads`: two threads doing the same on one limiter at once
//!   (time per attempt and thread; at limit 1 most attempts are refused);
//! - `saturated`: every permit held, a refused attempt.
//!
//! And `nearly_full`: limit 1024 with 1,023 permits held, acquire then release
//! of the last one (the case where a search for a free slot would cost most).
//!
//! Then a paired comparison of the uncontended, nearly full and saturated
//! costs that holds up on a busy machine (see `paired_report`).

use std::hint::black_box;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, BenchmarkId, Criterion};
use gendurable_bulkhead::{Bulkhead, BulkheadConfig};
use tokio::sync::Semaphore;

const LIMITS: [usize; 4] = [1, 16, 64, 1024];
/// The limit of the nearly full case, all of whose permits but one are held.
const NEARLY_FULL: usize = 1024;

/// The common baseline: a counter behind a lock.
struct MutexCounter {
    count: Mutex<usize>,
    limit: usize,
}

struct MutexPermit<'a>(&'a MutexCounter);

impl MutexCounter {
    fn new(limit: usize) -> Self {
        MutexCounter {
            count: Mutex::new(0),
            limit,
        }
    }

    fn try_acquire(&self) -> Option<MutexPermit<'_>> {
        let mut count = self.count.lock().unwrap();
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(MutexPermit(self))
    }
}

impl Drop for MutexPermit<'_> {
    fn drop(&mut self) {
        *self.0.count.lock().unwrap() -= 1;
    }
}

/// Permits kept alive by `Limiter::fill`.
trait Held {}
impl<T> Held for T {}

/// The three limiters behind one interface, so every group runs the same
/// loop for each.
trait Limiter: Sync {
    /// Acquire and release once; true if a permit was granted.
    fn cycle(&self) -> bool;
    /// Hold `n` permits, for the nearly full and saturated cases.
    fn hold(&self, n: usize) -> Box<dyn Held + '_>;
    /// How many permits there are.
    fn limit(&self) -> usize;
    /// Hold every permit, for the saturated group.
    fn fill(&self) -> Box<dyn Held + '_> {
        self.hold(self.limit())
    }
    /// Hold all permits but one, for the nearly full group.
    fn fill_but_one(&self) -> Box<dyn Held + '_> {
        self.hold(self.limit() - 1)
    }
}

impl Limiter for Bulkhead {
    #[inline]
    fn cycle(&self) -> bool {
        // The permit is dropped at the end of the statement, as after a
        // call; the atomics cannot be optimised away, so nothing needs to
        // be hidden from the compiler except the outcome (by the caller).
        self.try_acquire().is_ok()
    }
    fn hold(&self, n: usize) -> Box<dyn Held + '_> {
        let held: Vec<_> = (0..n).map(|_| self.try_acquire().unwrap()).collect();
        Box::new(held)
    }
    fn limit(&self) -> usize {
        Bulkhead::limit(self)
    }
}

impl Limiter for Semaphore {
    #[inline]
    fn cycle(&self) -> bool {
        // The permit is dropped at the end of the statement, as after a
        // call; the atomics cannot be optimised away, so nothing needs to
        // be hidden from the compiler except the outcome (by the caller).
        self.try_acquire().is_ok()
    }
    fn hold(&self, n: usize) -> Box<dyn Held + '_> {
        Box::new(self.try_acquire_many(n as u32).unwrap())
    }
    fn limit(&self) -> usize {
        // Only ever asked before any permit is held.
        self.available_permits()
    }
}

impl Limiter for MutexCounter {
    #[inline]
    fn cycle(&self) -> bool {
        self.try_acquire().is_some()
    }
    fn hold(&self, n: usize) -> Box<dyn Held + '_> {
        let held: Vec<_> = (0..n).map(|_| self.try_acquire().unwrap()).collect();
        Box::new(held)
    }
    fn limit(&self) -> usize {
        self.limit
    }
}

fn limiters(limit: usize) -> Vec<(&'static str, Box<dyn Limiter>)> {
    let bulkhead =
        Bulkhead::new(BulkheadConfig::new(limit, Duration::from_secs(60))).expect("valid config");
    vec![
        ("bulkhead", Box::new(bulkhead)),
        ("tokio_semaphore", Box::new(Semaphore::new(limit))),
        ("mutex_counter", Box::new(MutexCounter::new(limit))),
    ]
}

fn uncontended(c: &mut Criterion) {
    let mut group = c.benchmark_group("uncontended");
    for limit in LIMITS {
        for (name, limiter) in limiters(limit) {
            group.bench_function(BenchmarkId::new(name, limit), |b| {
                b.iter(|| assert!(limiter.cycle()))
            });
        }
    }
    group.finish();
}

fn contended(c: &mut Criterion) {
    let mut group = c.benchmark_group("contended_2_threads");
    for limit in LIMITS {
        for (name, limiter) in limiters(limit) {
            let limiter = &*limiter;
            group.bench_function(BenchmarkId::new(name, limit), |b| {
                b.iter_custom(|iters| {
                    let start = Barrier::new(2);
                    std::thread::scope(|s| {
                        let other = s.spawn(|| {
                            start.wait();
                            for _ in 0..iters {
                                black_box(limiter.cycle());
                            }
                        });
                        start.wait();
                        let t = Instant::now();
                        for _ in 0..iters {
                            black_box(limiter.cycle());
                        }
                        other.join().unwrap();
                        t.elapsed()
                    })
                })
            });
        }
    }
    group.finish();
}

fn nearly_full(c: &mut Criterion) {
    let mut group = c.benchmark_group("nearly_full");
    for (name, limiter) in limiters(NEARLY_FULL) {
        let _held = limiter.fill_but_one();
        group.bench_function(BenchmarkId::new(name, "1023_of_1024"), |b| {
            b.iter(|| assert!(limiter.cycle()))
        });
    }
    group.finish();
}

fn saturated(c: &mut Criterion) {
    let mut group = c.benchmark_group("saturated");
    for limit in LIMITS {
        for (name, limiter) in limiters(limit) {
            let _held = limiter.fill();
            group.bench_function(BenchmarkId::new(name, limit), |b| {
                b.iter(|| assert!(!limiter.cycle()))
            });
        }
    }
    group.finish();
}

/// Uncontended and saturated costs measured the way a shared, noisy machine
/// allows: every limiter of every limit takes its turn for a short round
/// (100,000 attempts), 200 times over, and the fastest round of each is
/// reported. Interference from other processes only ever makes a round
/// slower, so the minimum approaches the undisturbed cost; taking turns
/// exposes all limiters to the same conditions, and spreads each one's rounds
/// over the whole measurement, so that a burst of load elsewhere cannot spoil
/// all of them. Printed after criterion's own report.
fn paired_report() {
    const ROUNDS: usize = 200;
    const CYCLES: u32 = 100_000;
    #[derive(Clone, Copy, PartialEq)]
    enum Held {
        None,
        AllButOne,
        All,
    }
    let rows: Vec<(String, usize, Held)> = LIMITS
        .iter()
        .map(|&l| (l.to_string(), l, Held::None))
        .chain([(
            format!("{NEARLY_FULL}, {} held", NEARLY_FULL - 1),
            NEARLY_FULL,
            Held::AllButOne,
        )])
        .collect();
    let tables = [
        ("uncontended acquire+release", rows),
        (
            "saturated (refused attempt)",
            LIMITS
                .iter()
                .map(|&l| (l.to_string(), l, Held::All))
                .collect(),
        ),
    ];
    for (case, rows) in tables {
        let all: Vec<_> = rows.iter().map(|&(_, limit, _)| limiters(limit)).collect();
        let _held: Vec<_> = all
            .iter()
            .zip(&rows)
            .flat_map(|(limiters, &(_, _, held))| {
                limiters.iter().filter_map(move |(_, l)| match held {
                    Held::None => None,
                    Held::AllButOne => Some(l.fill_but_one()),
                    Held::All => Some(l.fill()),
                })
            })
            .collect();
        for (limiters, &(_, _, held)) in all.iter().zip(&rows) {
            for (_, limiter) in limiters {
                assert_eq!(limiter.cycle(), held != Held::All);
            }
        }
        let mut best = vec![vec![f64::MAX; 3]; rows.len()];
        for _ in 0..ROUNDS {
            for (limiters, best) in all.iter().zip(&mut best) {
                for ((_, limiter), best) in limiters.iter().zip(best.iter_mut()) {
                    let t = Instant::now();
                    for _ in 0..CYCLES {
                        black_box(limiter.cycle());
                    }
                    let ns = t.elapsed().as_nanos() as f64 / f64::from(CYCLES);
                    *best = best.min(ns);
                }
            }
        }
        println!("\npaired {case}, fastest of {ROUNDS} interleaved rounds (ns):");
        println!(
            "{:>16} {:>10} {:>16} {:>14}",
            "limit", "bulkhead", "tokio_semaphore", "mutex_counter"
        );
        for ((label, _, _), best) in rows.iter().zip(&best) {
            println!(
                "{label:>16} {:>10.2} {:>16.2} {:>14.2}",
                best[0], best[1], best[2]
            );
        }
    }
}

criterion_group!(benches, uncontended, contended, nearly_full, saturated);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    // Skipped when criterion only lists benchmarks or runs them as tests.
    let quick = std::env::args().any(|a| a == "--list" || a == "--test");
    if !quick {
        paired_report();
    }
}
