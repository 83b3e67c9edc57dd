//! The atomics the slot protocol is written against.
//!
//! Under `--cfg gendurable_loom` they come from `loom`, so the model checker
//! explores the very code that runs in production; otherwise they are the
//! standard library's. Only the slot protocol (`slots.rs`) goes through this
//! shim: waiting, hooks and the registry use std and tokio directly and are not
//! part of the model.

#[cfg(gendurable_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64};
#[cfg(not(gendurable_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64};

pub(crate) use std::sync::atomic::Ordering;

/// Gives other threads a chance to finish what we are waiting for (a
/// reservation that has not claimed its slot yet). Loom needs this to see
/// that the loop makes progress.
#[inline]
pub(crate) fn yield_now() {
    #[cfg(gendurable_loom)]
    loom::thread::yield_now();
    #[cfg(not(gendurable_loom))]
    std::thread::yield_now();
}

#[cfg(not(gendurable_loom))]
mod hint {
    use std::cell::Cell;

    thread_local! {
        // Where this thread found a free counted slot (past the bitmap) last
        // time. It most likely released that slot since, so starting there
        // avoids the slots other threads are competing for and touches a line
        // that is probably still in this core's cache.
        static HINT: Cell<u32> = const { Cell::new(0) };
    }

    #[inline]
    pub(crate) fn get(len: usize) -> usize {
        let h = HINT.with(Cell::get) as usize;
        if h < len {
            h
        } else {
            0
        }
    }

    #[inline]
    pub(crate) fn set(i: usize) {
        HINT.with(|h| h.set(i as u32));
    }
}

#[cfg(gendurable_loom)]
mod hint {
    // A thread-local would carry state from one explored execution into the
    // next, which makes the model non-deterministic: always start at 0.
    #[inline]
    pub(crate) fn get(_len: usize) -> usize {
        0
    }

    #[inline]
    pub(crate) fn set(_i: usize) {}
}

pub(crate) use hint::{get as hint, set as set_hint};
