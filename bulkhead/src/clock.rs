//! The monotonic clock behind slot deadlines.
//!
//! Deadlines are kept in ticks of 2^20 ns (about 1.05 ms): plenty for a
//! reclaim timeout that is normally seconds, and small enough that 40 bits
//! cover 36 years of uptime, which leaves the other 24 bits of a slot word for
//! the generation.
//!
//! On Linux the ticks come from `CLOCK_MONOTONIC_COARSE`, which the vDSO
//! answers from a value the kernel updates once per timer interrupt, without
//! reading the hardware clock: about 4 ns, against about 30 ns for
//! `CLOCK_MONOTONIC` on the KVM guest the benchmarks ran on. The vDSO's
//! function is called directly: the C library's wrapper around it cost
//! another 3 ns.
//!
//! The clock is read once per acquire, at its start. A reading lags real
//! time by less than the clock's granularity (`clock_getres`, one kernel
//! tick: 1 to 10 ms), and a tick boundary can fall just after it, so both are
//! added to every deadline ([`reclaim_ticks`]). A slot is therefore never
//! reclaimed before `reclaim_after` has really elapsed since the acquire
//! began; it becomes reclaimable at most two granularities plus two ticks
//! later than that (about 10 ms with a 250 Hz kernel tick). The one caveat is
//! a kernel that falls behind its own tick (its timekeeping CPU held up, as a
//! virtual machine's CPU can be by its host): a reading then lags by more.

use std::time::Duration;

/// log2 of the tick length in nanoseconds.
pub(crate) const TICK_SHIFT: u32 = 20;
/// Tick length in nanoseconds.
pub(crate) const TICK_NANOS: u64 = 1 << TICK_SHIFT;

/// Number of ticks to add to "now" so that a deadline is at least
/// `reclaim_after` away in real time.
///
/// The clock reading can lag real time by up to `granularity`, and a tick
/// boundary can fall just after the reading, hence both are added.
pub(crate) fn reclaim_ticks(reclaim_after: Duration, granularity: Duration) -> u64 {
    let nanos = reclaim_after.as_nanos() + granularity.as_nanos();
    let ticks = nanos.div_ceil(TICK_NANOS as u128);
    u64::try_from(ticks).unwrap_or(u64::MAX).saturating_add(1)
}

/// Converts a number of ticks into a duration (saturating).
#[cfg_attr(gendurable_loom, allow(dead_code))]
pub(crate) fn ticks_to_duration(ticks: u64) -> Duration {
    Duration::from_nanos(ticks.saturating_mul(TICK_NANOS))
}

#[cfg(not(gendurable_loom))]
pub(crate) use real::Clock;

#[cfg(not(gendurable_loom))]
mod real {
    use std::time::Duration;

    /// The process-wide coarse monotonic clock, behind a handle so that the
    /// loom build can swap in a clock the model controls. It carries the
    /// function that reads the clock, so an acquire need not look it up.
    #[derive(Debug)]
    pub(crate) struct Clock {
        read: imp::Reader,
    }

    impl Clock {
        pub(crate) fn new() -> Self {
            Clock {
                read: imp::reader(),
            }
        }

        /// Current time in ticks. Always at least 1, so that a deadline is
        /// never 0 (0 marks a released slot).
        #[inline]
        pub(crate) fn now(&self) -> u64 {
            imp::now_nanos(self.read) >> super::TICK_SHIFT
        }

        /// How far a reading may lag real time.
        pub(crate) fn granularity(&self) -> Duration {
            imp::granularity()
        }
    }

    #[cfg(target_os = "linux")]
    mod imp {
        use std::ffi::CStr;
        use std::sync::OnceLock;
        use std::time::Duration;

        pub(super) type Reader =
            unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> libc::c_int;

        /// The vDSO's own `clock_gettime`, to be called directly: the C
        /// library's wrapper around it costs about 3 ns per call, as much as
        /// the vDSO's work for the coarse clock. Where the vDSO's function
        /// cannot be found (another C library, an architecture not listed),
        /// the wrapper.
        pub(super) fn reader() -> Reader {
            static FOUND: OnceLock<Reader> = OnceLock::new();
            *FOUND.get_or_init(|| vdso_clock_gettime().unwrap_or(libc::clock_gettime))
        }

        #[cfg(target_arch = "x86_64")]
        const SYMBOL: Option<&CStr> = Some(c"__vdso_clock_gettime");
        #[cfg(target_arch = "aarch64")]
        const SYMBOL: Option<&CStr> = Some(c"__kernel_clock_gettime");
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        const SYMBOL: Option<&CStr> = None;

        fn vdso_clock_gettime() -> Option<Reader> {
            let symbol = SYMBOL?;
            // SAFETY: RTLD_NOLOAD only looks up the vDSO that the dynamic
            // loader has already mapped (never unmapped), and the kernel
            // exports its `clock_gettime` with exactly the C signature of
            // `Reader`.
            unsafe {
                let vdso = libc::dlopen(
                    c"linux-vdso.so.1".as_ptr(),
                    libc::RTLD_NOW | libc::RTLD_NOLOAD,
                );
                if vdso.is_null() {
                    return None;
                }
                let f = libc::dlsym(vdso, symbol.as_ptr());
                (!f.is_null()).then(|| std::mem::transmute::<*mut libc::c_void, Reader>(f))
            }
        }

        #[inline]
        pub(super) fn now_nanos(read: Reader) -> u64 {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC_COARSE
            // exists on every Linux since 2.6.32, so the call cannot fail.
            unsafe { read(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
            (ts.tv_sec as u64)
                .wrapping_mul(1_000_000_000)
                .wrapping_add(ts.tv_nsec as u64)
        }

        pub(super) fn granularity() -> Duration {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: as above.
            let rc = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
            if rc != 0 {
                // Be pessimistic: the slowest kernel tick rate is 100 Hz.
                return Duration::from_millis(10);
            }
            Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
        }
    }

    #[cfg(not(target_os = "linux"))]
    mod imp {
        use std::sync::OnceLock;
        use std::time::{Duration, Instant};

        static EPOCH: OnceLock<Instant> = OnceLock::new();

        pub(super) type Reader = ();

        pub(super) fn reader() -> Reader {}

        #[inline]
        pub(super) fn now_nanos(_: Reader) -> u64 {
            let epoch = *EPOCH.get_or_init(Instant::now);
            // Start one tick in, so that `now()` is never 0.
            epoch.elapsed().as_nanos() as u64 + super::super::TICK_NANOS
        }

        pub(super) fn granularity() -> Duration {
            Duration::ZERO
        }
    }
}

#[cfg(gendurable_loom)]
pub(crate) use model::Clock;

#[cfg(gendurable_loom)]
mod model {
    use loom::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    /// A clock that only moves when the model test says so, so that expiry is
    /// an explored event rather than wall-clock luck.
    #[derive(Debug)]
    pub(crate) struct Clock {
        now: AtomicU64,
    }

    impl Clock {
        pub(crate) fn new() -> Self {
            Clock {
                now: AtomicU64::new(1),
            }
        }

        #[inline]
        pub(crate) fn now(&self) -> u64 {
            self.now.load(Ordering::Acquire)
        }

        pub(crate) fn granularity(&self) -> Duration {
            Duration::ZERO
        }

        pub(crate) fn advance(&self, ticks: u64) {
            self.now.fetch_add(ticks, Ordering::AcqRel);
        }
    }
}

#[cfg(all(test, not(gendurable_loom)))]
mod tests {
    use super::*;

    #[test]
    fn reclaim_ticks_cover_the_timeout_and_the_granularity() {
        let t = reclaim_ticks(Duration::from_millis(50), Duration::from_millis(4));
        // Any reading lags by less than a tick plus the granularity, so the
        // real time between a deadline's computation and its passing is at
        // least (ticks - 1) ticks minus the granularity.
        let min_real = ticks_to_duration(t - 1).saturating_sub(Duration::from_millis(4));
        assert!(min_real >= Duration::from_millis(50), "{min_real:?}");
        assert_eq!(reclaim_ticks(Duration::from_nanos(1), Duration::ZERO), 2);
    }

    #[test]
    fn clock_is_monotonic_and_never_zero() {
        let c = Clock::new();
        let a = c.now();
        let b = c.now();
        assert!(a >= 1);
        assert!(b >= a);
    }
}
