//! The atomics and locks the slot protocol is written against.
//!
//! Under `--cfg gendurable_loom` they come from `loom`, so the model checker
//! explores the very code that runs in production; otherwise they are the
//! standard library's. The slot stack, the waiter queue and the sweep go
//! through this shim; the reaper thread, timers and wake-ups use std and tokio
//! directly and are not part of the model.

#[cfg(gendurable_loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64};
#[cfg(gendurable_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(gendurable_loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64};
#[cfg(not(gendurable_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

pub(crate) use std::sync::atomic::Ordering;

/// Locks `m`, ignoring poisoning: every critical section of the bulkhead
/// leaves its data consistent at each step, so a panic elsewhere (in a hook)
/// while it was held does not matter.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
