//! The reaper: one thread per process that reclaims expired holders.
//!
//! A refusal reads one word and reads no clock, so no caller notices when a
//! holder's deadline passes. Each bulkhead with held slots instead keeps an
//! alarm set no later than their earliest deadline (see `slots.rs`), and this
//! thread sleeps until the earliest alarm of all bulkheads, then sweeps that
//! bulkhead: it reclaims the expired holders (giving their slots to waiters or
//! back to the stack) and sets the next alarm. It is started by the first
//! alarm and sleeps without a timeout while no bulkhead has one. It holds only
//! weak references, so a dropped bulkhead's alarms are discarded.
//!
//! A process forked while the reaper runs has no reaper (only the forking
//! thread survives a fork), yet may inherit full bulkheads whose holders are
//! gone. A `pthread_atfork` handler therefore starts a new reaper in the
//! child, which takes over the inherited alarms.

#[cfg(not(gendurable_loom))]
pub(crate) use imp::schedule;

#[cfg(gendurable_loom)]
pub(crate) fn schedule(_at: u64, _core: std::sync::Weak<super::slots::Core>) {
    // The loom models sweep explicitly.
}

#[cfg(not(gendurable_loom))]
mod imp {
    use std::cmp::Ordering;
    use std::collections::BinaryHeap;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::{Condvar, Mutex, MutexGuard, PoisonError, Weak};

    use super::super::clock::{ticks_to_duration, Clock};
    use super::super::slots::Core;

    struct Alarm {
        at: u64,
        core: Weak<Core>,
    }

    // Ordered by time only, earliest first out of the max-heap.
    impl Ord for Alarm {
        fn cmp(&self, other: &Self) -> Ordering {
            other.at.cmp(&self.at)
        }
    }

    impl PartialOrd for Alarm {
        fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
            Some(self.cmp(other))
        }
    }

    impl PartialEq for Alarm {
        fn eq(&self, other: &Self) -> bool {
            self.at == other.at
        }
    }

    impl Eq for Alarm {}

    struct State {
        alarms: BinaryHeap<Alarm>,
        running: bool,
        #[cfg(unix)]
        fork_handlers: bool,
    }

    static STATE: Mutex<State> = Mutex::new(State {
        alarms: BinaryHeap::new(),
        running: false,
        #[cfg(unix)]
        fork_handlers: false,
    });
    static WAKE: Condvar = Condvar::new();

    fn state() -> MutexGuard<'static, State> {
        // Every update is a single push or pop, never left half done.
        STATE.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sweeps `core` once the clock reaches `at` (in ticks).
    pub(crate) fn schedule(at: u64, core: Weak<Core>) {
        let mut st = state();
        let sooner = st.alarms.peek().is_none_or(|first| at < first.at);
        st.alarms.push(Alarm { at, core });
        if !st.running {
            start(&mut st);
        } else if sooner {
            WAKE.notify_one();
        }
    }

    fn start(st: &mut State) {
        #[cfg(unix)]
        if !st.fork_handlers {
            // SAFETY: the handlers are `extern "C"` functions without
            // arguments that never unwind, as `pthread_atfork` requires.
            let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
            st.fork_handlers = rc == 0;
        }
        // If no thread can be started, the next alarm tries again; until
        // then, expired holders are reclaimed by `in_flight` only.
        st.running = std::thread::Builder::new()
            .name("gendurable-bulkhead-reaper".into())
            .spawn(run)
            .is_ok();
    }

    fn run() {
        let clock = Clock::new();
        let mut st = state();
        loop {
            let Some(at) = st.alarms.peek().map(|a| a.at) else {
                st = WAKE.wait(st).unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            let now = clock.now();
            if at > now {
                // Past the tick boundary and the clock's lag behind it.
                let sleep = ticks_to_duration(at - now).saturating_add(clock.granularity());
                st = WAKE
                    .wait_timeout(st, sleep)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                continue;
            }
            let alarm = st.alarms.pop().expect("peeked");
            drop(st);
            if let Some(core) = alarm.core.upgrade() {
                // A panicking hook must not stop reclaims for everyone.
                let _ = catch_unwind(AssertUnwindSafe(|| core.on_alarm(alarm.at)));
            }
            st = state();
        }
    }

    #[cfg(unix)]
    std::thread_local! {
        static FORKING: std::cell::RefCell<Option<MutexGuard<'static, State>>> =
            const { std::cell::RefCell::new(None) };
    }

    /// Before `fork`: hold the state lock, so that the child gets it in a
    /// consistent state and unlocked by the same (its only) thread.
    #[cfg(unix)]
    extern "C" fn prepare() {
        let st = state();
        FORKING.with(|f| *f.borrow_mut() = Some(st));
    }

    #[cfg(unix)]
    extern "C" fn parent() {
        FORKING.with(|f| drop(f.borrow_mut().take()));
    }

    /// In the child: the reaper did not survive the fork; start another if
    /// there are alarms to serve.
    #[cfg(unix)]
    extern "C" fn child() {
        FORKING.with(|f| {
            if let Some(mut st) = f.borrow_mut().take() {
                st.running = false;
                if !st.alarms.is_empty() {
                    start(&mut st);
                }
            }
        });
    }
}
