//! Step tasks that the thread which wakes them can run on the spot.
//!
//! A step's task is a future polled where it is woken: a wake inside a
//! [`handover`] (or inside another step task's poll) queues it on that
//! thread, to be polled before the call returns; any other wake hands it
//! to the runtime. A binding whose answers arrive on threads of its own (the
//! BEAM's schedulers, Python's step threads) answers inside `handover`: the
//! end of the step and the start of the next one it lets in run in that
//! call, rather than waking a runtime thread to end the step and then the
//! binding's thread to start the next. Everything a task does is what it
//! would do on the runtime (the same fencing, in the same order); only the
//! thread differs.

use super::{lock, payload_message};
use futures::future::BoxFuture;
use futures::task::{waker_ref, ArcWake};
use futures::FutureExt;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::task::{Context, Poll};
use tokio::runtime::Handle;

/// How many tasks one hand-over runs on a binding's thread before the rest
/// go to the runtime: a BEAM scheduler lends itself for microseconds, not
/// for a cascade of rows given back.
const ON_CALLER_AT_MOST: usize = 8;
/// And on a runtime thread, before yielding to its other tasks.
const ON_RUNTIME_AT_MOST: usize = 64;

thread_local! {
    /// The tasks woken on this thread inside a hand-over, to run before it ends.
    static HERE: RefCell<Option<VecDeque<Arc<Task>>>> = const { RefCell::new(None) };
}

/// A step's task: its future, run where it is woken.
pub(crate) struct Task {
    future: StdMutex<Option<BoxFuture<'static, ()>>>,
    /// Woken and not polled since: one queued run at a time.
    scheduled: AtomicBool,
    rt: Handle,
}

/// Starts `future` as a step task: now, if this thread is in a hand-over,
/// else on the runtime `rt`.
pub(crate) fn spawn(rt: &Handle, future: impl Future<Output = ()> + Send + 'static) {
    let task = Arc::new(Task {
        future: StdMutex::new(Some(future.boxed())),
        scheduled: AtomicBool::new(false),
        rt: rt.clone(),
    });
    ArcWake::wake(task);
}

impl ArcWake for Task {
    fn wake_by_ref(task: &Arc<Self>) {
        if task.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let queued = HERE
            .try_with(|h| match h.borrow_mut().as_mut() {
                Some(q) => {
                    q.push_back(task.clone());
                    true
                }
                None => false,
            })
            .unwrap_or(false);
        if !queued {
            task.clone().to_runtime();
        }
    }
}

impl Task {
    fn to_runtime(self: Arc<Self>) {
        let rt = self.rt.clone();
        let mut unrun = Unrun(Some(self));
        rt.spawn(async move {
            let Some(task) = unrun.0.take() else { return };
            match Scope::enter() {
                Some(scope) => scope.run(Some(task), ON_RUNTIME_AT_MOST),
                None => task.poll(),
            }
        });
    }

    /// Polls the task once (it may be woken again meanwhile: it is then
    /// queued again). A panic escaping it ends it, as it would a tokio task.
    fn poll(self: &Arc<Self>) {
        // Acquire: whatever a waker did before waking it is seen here.
        self.scheduled.swap(false, Ordering::AcqRel);
        let waker = waker_ref(self);
        let mut cx = Context::from_waker(&waker);
        let mut slot = lock(&self.future);
        let Some(future) = slot.as_mut() else {
            return;
        };
        let done = match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(&mut cx))) {
            Ok(Poll::Ready(())) => true,
            Ok(Poll::Pending) => false,
            Err(panic) => {
                tracing::error!(panic = %payload_message(&*panic), "a step task panicked");
                true
            }
        };
        if done {
            // Dropped outside the lock: what it holds may wake tasks.
            let ended = slot.take();
            drop(slot);
            drop(ended);
        }
    }
}

/// A task handed to the runtime: dropped there without running (the
/// runtime shut down), its future goes with it, as a tokio task's would.
struct Unrun(Option<Arc<Task>>);

impl Drop for Unrun {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            let ended = lock(&task.future).take();
            drop(ended);
        }
    }
}

/// This thread's hand-over: tasks woken while it lasts run here when it
/// runs them; any left (past the bound, or if it unwinds) go to the runtime.
struct Scope;

impl Scope {
    /// `None` inside another hand-over: that one runs what is woken.
    fn enter() -> Option<Scope> {
        HERE.try_with(|h| {
            let mut h = h.borrow_mut();
            if h.is_some() {
                return None;
            }
            *h = Some(VecDeque::new());
            Some(Scope)
        })
        .ok()
        .flatten()
    }

    fn next(&self) -> Option<Arc<Task>> {
        HERE.with_borrow_mut(|h| h.as_mut().and_then(VecDeque::pop_front))
    }

    /// Runs `first`, then the tasks woken meanwhile, up to `at_most` polls.
    fn run(self, first: Option<Arc<Task>>, at_most: usize) {
        let mut next = first.or_else(|| self.next());
        // Outside the runtime (a binding's thread), its context is entered
        // for the tasks' timers and spawns.
        let rt = next
            .as_ref()
            .filter(|_| Handle::try_current().is_err())
            .map(|t| t.rt.clone());
        let _entered = rt.as_ref().map(Handle::enter);
        let mut ran = 0;
        while let Some(task) = next {
            if ran == at_most {
                task.to_runtime();
                break;
            }
            task.poll();
            ran += 1;
            next = self.next();
        }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let left = HERE.with_borrow_mut(Option::take).unwrap_or_default();
        for task in left {
            task.to_runtime();
        }
    }
}

/// Runs `f`; the engine's step tasks it wakes on this thread (a step's
/// answer, and through it the end of that step and the start of the next)
/// run here before this returns, a few at most; the rest on the runtime.
/// For bindings whose steps answer from threads the runtime does not own
/// (see [`crate::Workflow::hands_over`]). Call it holding nothing a step's
/// task may wait for (Python: with the GIL released), since a task it runs
/// may be being polled on another thread at that moment, and waits for it.
pub fn handover<R>(f: impl FnOnce() -> R) -> R {
    let Some(scope) = Scope::enter() else {
        return f();
    };
    let r = f();
    scope.run(None, ON_CALLER_AT_MOST);
    r
}
