//! Callers waiting for a permit, first come, first served.
//!
//! A caller that finds no free slot and has a wait budget joins the back of
//! one queue (async tasks and blocked threads alike). While anyone waits, a
//! freed slot never goes back to the free stack: the release that frees it
//! gives it, with a fresh token, to the waiter at the front, under the queue's
//! lock, and then wakes that waiter. A newcomer meanwhile finds the stack
//! empty and queues behind the others, so nobody can overtake a waiter.
//!
//! The lock is only taken on this slow path: to join, to give up, and by a
//! release that finds the "someone waits" flag in the stack's head word. The
//! flag is set and cleared under the lock, and is set if and only if the queue
//! holds a live waiter (see `Core::enqueue` and `Core::cancel`).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::slots::{Claim, Core};
use super::sync::{AtomicU32, AtomicU64, Ordering::*};

const WAITING: u32 = 0;
const GRANTED: u32 = 1;
const CANCELLED: u32 = 2;

/// How a granted waiter is woken.
pub(crate) enum Wake {
    /// An async task, woken through its waker.
    Task(futures::task::AtomicWaker),
    /// A blocked thread, unparked.
    Thread(std::thread::Thread),
    /// Nobody: the loom model checks the state itself.
    #[cfg(gendurable_loom)]
    Nobody,
}

impl Wake {
    pub(crate) fn task() -> Self {
        Wake::Task(futures::task::AtomicWaker::new())
    }

    pub(crate) fn this_thread() -> Self {
        Wake::Thread(std::thread::current())
    }
}

/// One waiting caller. Its state only changes under the queue's lock; the
/// caller reads it without the lock to see whether it was granted.
pub(crate) struct Waiter {
    state: AtomicU32,
    slot: AtomicU32,
    token: AtomicU64,
    wake: Wake,
}

impl Waiter {
    pub(crate) fn new(wake: Wake) -> Self {
        Waiter {
            state: AtomicU32::new(WAITING),
            slot: AtomicU32::new(0),
            token: AtomicU64::new(0),
            wake,
        }
    }

    /// The permit handed to this waiter, if any.
    pub(crate) fn granted(&self) -> Option<Claim> {
        // Acquire: pairs with the Release in `grant`, after the slot and
        // token were written.
        (self.state.load(Acquire) == GRANTED).then(|| Claim {
            slot: self.slot.load(Relaxed),
            token: self.token.load(Relaxed),
        })
    }

    fn is_waiting(&self) -> bool {
        self.state.load(Relaxed) == WAITING
    }

    /// Hands `claim` to this waiter. Under the queue's lock.
    pub(crate) fn grant(&self, claim: Claim) {
        self.slot.store(claim.slot, Relaxed);
        self.token.store(claim.token, Relaxed);
        self.state.store(GRANTED, Release);
    }

    /// Marks this waiter as gone. Under the queue's lock, and only if it was
    /// not granted.
    pub(crate) fn cancel(&self) {
        self.state.store(CANCELLED, Relaxed);
    }

    /// Wakes the caller after a grant. Called without the queue's lock.
    pub(crate) fn wake(&self) {
        match &self.wake {
            Wake::Task(waker) => waker.wake(),
            Wake::Thread(thread) => thread.unpark(),
            #[cfg(gendurable_loom)]
            Wake::Nobody => {}
        }
    }

    /// Resolves once a permit was granted to this waiter.
    pub(crate) fn until_granted(&self) -> UntilGranted<'_> {
        UntilGranted(self)
    }
}

/// The future returned by [`Waiter::until_granted`].
pub(crate) struct UntilGranted<'a>(&'a Waiter);

impl Future for UntilGranted<'_> {
    type Output = Claim;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Claim> {
        let waiter = self.0;
        if let Some(claim) = waiter.granted() {
            return Poll::Ready(claim);
        }
        if let Wake::Task(waker) = &waiter.wake {
            waker.register(cx.waker());
        }
        // Look again after registering: a grant in between woke the old waker.
        match waiter.granted() {
            Some(claim) => Poll::Ready(claim),
            None => Poll::Pending,
        }
    }
}

/// The queue of waiters, behind `Core`'s lock.
#[derive(Default)]
pub(crate) struct Queue {
    /// Oldest first. May hold cancelled waiters, which are skipped.
    entries: VecDeque<Arc<Waiter>>,
    /// Waiters in `entries` that are still waiting.
    live: usize,
}

impl Queue {
    pub(crate) fn push(&mut self, waiter: Arc<Waiter>) {
        self.entries.push_back(waiter);
        self.live += 1;
    }

    /// Takes the oldest waiter that is still waiting.
    pub(crate) fn pop_oldest(&mut self) -> Option<Arc<Waiter>> {
        while let Some(waiter) = self.entries.pop_front() {
            if waiter.is_waiting() {
                self.live -= 1;
                return Some(waiter);
            }
        }
        None
    }

    /// Counts a waiter that gave up; returns whether none is left.
    pub(crate) fn remove_one(&mut self) -> bool {
        self.live -= 1;
        if self.live == 0 {
            self.entries.clear();
        } else if self.entries.len() > 2 * self.live + 16 {
            // Waiters that gave up stay in place until they reach the front;
            // when they outnumber the live ones, drop them, so that the queue
            // stays proportional to the callers actually waiting.
            self.entries.retain(|w| w.is_waiting());
        }
        self.live == 0
    }

    pub(crate) fn live(&self) -> usize {
        self.live
    }
}

/// A caller's place in the queue. Dropping it (the waiting future was
/// cancelled, the thread unwound) leaves the queue, and gives back a permit
/// granted in the meantime.
pub(crate) struct Waiting<'a> {
    core: &'a Core,
    pub(crate) waiter: Arc<Waiter>,
    done: bool,
}

impl<'a> Waiting<'a> {
    pub(crate) fn new(core: &'a Core, waiter: Arc<Waiter>) -> Self {
        Waiting {
            core,
            waiter,
            done: false,
        }
    }

    /// The permit was granted and the caller keeps it.
    pub(crate) fn keep(mut self, claim: Claim) -> Claim {
        self.done = true;
        claim
    }

    /// The budget ran out: leave the queue, unless a permit was granted
    /// meanwhile, which the caller then keeps.
    pub(crate) fn give_up(mut self) -> Option<Claim> {
        self.done = true;
        self.core.cancel(&self.waiter)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.done {
            if let Some(claim) = self.core.cancel(&self.waiter) {
                self.core.release(claim.slot, claim.token);
            }
        }
    }
}
