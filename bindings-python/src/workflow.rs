//! Python step functions run by the core's node.
//!
//! Sync steps run on the threads of [`Pool`] (at most one step at a time
//! each; the queues' concurrency bounds how many run at once), each taking
//! the GIL only while Python code runs, and running short steps back to
//! back under one acquisition. Those threads keep their Python thread state
//! between steps (`pin_thread_state`). Async steps are submitted to the
//! engine's asyncio loop thread by the same threads; the node's task waits
//! for their result without holding a thread or the GIL.

use crate::lock;
use crate::values::{to_json, to_py};
use gendurable::{
    AwaitOn, ConcurrencyKey, EngineBuilder, KeyChange, NextOptions, StepContext, StepResult,
    Transition, Wake, Workflow,
};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};
use std::cell::Cell;
use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// A step function: `(fn, is_async, takes_step)`.
pub(crate) struct PyStep {
    // In an Arc so that the node's task can take a reference without the GIL.
    f: Arc<Py<PyAny>>,
    is_async: bool,
    takes_step: bool,
}

impl<'a, 'py> FromPyObject<'a, 'py> for PyStep {
    type Error = PyErr;
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let (f, is_async, takes_step): (Bound<'py, PyAny>, bool, bool) = obj.extract()?;
        Ok(PyStep {
            f: Arc::new(f.unbind()),
            is_async,
            takes_step,
        })
    }
}

/// The package's step runners, the asyncio loop async steps run on and the
/// switch that stops running steps at once: shared by every workflow of an
/// engine. The loop and the switch are new each time the node starts.
pub(crate) struct Hooks {
    /// `_invoke(fn, takes_step, step, state, ctx) -> encoded transition`
    invoke: Py<PyAny>,
    /// `_invoke_async(fn, takes_step, step, state, ctx, loop, done) -> concurrent future`
    invoke_async: Py<PyAny>,
    event_loop: Mutex<Option<Py<PyAny>>>,
    force: Mutex<Arc<Force>>,
}

impl Hooks {
    /// The runners of `gendurable._runner`.
    pub fn new(py: Python<'_>) -> PyResult<Hooks> {
        let runner = py.import("gendurable._runner")?;
        Ok(Hooks {
            invoke: runner.getattr("invoke")?.unbind(),
            invoke_async: runner.getattr("invoke_async")?.unbind(),
            event_loop: Mutex::new(None),
            force: Mutex::new(Arc::new(Force::default())),
        })
    }

    /// The node starts: async steps run on `event_loop`, and a new switch
    /// stops them.
    pub fn begin(&self, event_loop: Py<PyAny>) {
        // The previous loop is released after the lock.
        let previous = lock(&self.event_loop).replace(event_loop);
        *lock(&self.force) = Arc::new(Force::default());
        drop(previous);
    }

    /// Stop the running steps at once.
    pub fn fire(&self) {
        lock(&self.force).fire();
    }

    fn force(&self) -> Arc<Force> {
        lock(&self.force).clone()
    }

    fn event_loop<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        lock(&self.event_loop).as_ref().map(|l| l.bind(py).clone())
    }
}

/// Stops the running steps of a worker at once, each recorded as an error
/// (the worker was interrupted a second time while shutting down). A `def`
/// step's thread runs on until its function returns (Python threads cannot
/// be stopped), but its result is no longer waited for; an `async def` step's
/// task is cancelled.
pub(crate) struct Force(tokio::sync::watch::Sender<bool>);

impl Default for Force {
    fn default() -> Self {
        Force(tokio::sync::watch::channel(false).0)
    }
}

impl Force {
    pub fn fire(&self) {
        self.0.send_replace(true);
    }

    async fn fired(&self) {
        let _ = self.0.subscribe().wait_for(|fired| *fired).await;
    }
}

/// `def` steps whose function is running now, in this process (also those
/// no longer waited for after a shutdown timeout or a second interrupt).
static SYNC_STEPS: AtomicUsize = AtomicUsize::new(0);

/// Counts a running `def` step while alive.
struct SyncStep;

impl SyncStep {
    fn enter() -> SyncStep {
        SYNC_STEPS.fetch_add(1, Ordering::SeqCst);
        SyncStep
    }
}

impl Drop for SyncStep {
    fn drop(&mut self) {
        SYNC_STEPS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How many `def` steps are running in this process. A process should not
/// end its interpreter while one runs: the thread would be torn down under
/// the step (`gendurable worker` then leaves with `os._exit`).
#[pyfunction]
pub(crate) fn running_sync_steps() -> usize {
    SYNC_STEPS.load(Ordering::SeqCst)
}

/// The error a step stopped by [`Force`] records.
const FORCED: &str = "stopped: the worker was interrupted again while shutting down";

pub(crate) struct PyWorkflow {
    steps: HashMap<String, PyStep>,
    fallback: Option<PyStep>,
    hooks: Arc<Hooks>,
}

/// A workflow as the Python layer registers it: `(name, {step: step fn},
/// catch-all step fn, {step: declared rate-limit key})`.
pub(crate) struct WorkflowTable {
    name: String,
    steps: HashMap<String, PyStep>,
    fallback: Option<PyStep>,
    rate_limits: HashMap<String, String>,
}

impl<'a, 'py> FromPyObject<'a, 'py> for WorkflowTable {
    type Error = PyErr;
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let (name, steps, fallback, rate_limits) = obj.extract()?;
        Ok(WorkflowTable {
            name,
            steps,
            fallback,
            rate_limits,
        })
    }
}

/// Register `workflows` with the builder, their declared rate-limit keys
/// with it too (the core checks them and applies them).
pub(crate) fn register(
    mut b: EngineBuilder,
    workflows: Vec<WorkflowTable>,
    hooks: &Arc<Hooks>,
) -> EngineBuilder {
    for w in workflows {
        for (step, key) in w.rate_limits {
            b = b.step_rate_limit(&w.name, step, key);
        }
        let workflow = PyWorkflow {
            steps: w.steps,
            fallback: w.fallback,
            hooks: hooks.clone(),
        };
        b = b.workflow(w.name, workflow);
    }
    b
}

fn ctx_to_py<'py>(py: Python<'py>, ctx: &StepContext) -> PyResult<Bound<'py, PyTuple>> {
    let wake = match &ctx.wake {
        None => py.None().into_bound(py),
        Some(Wake::Signal { name, payload }) => ("signal", name.as_str(), to_py(py, payload)?)
            .into_pyobject(py)?
            .into_any(),
        Some(Wake::Timeout) => ("timeout",).into_pyobject(py)?.into_any(),
        #[allow(unreachable_patterns)]
        Some(_) => py.None().into_bound(py),
    };
    (
        ctx.id,
        ctx.workflow.as_str(),
        ctx.queue.as_str(),
        ctx.attempt,
        ctx.max_attempts,
        ctx.concurrency_key.as_deref(),
        ctx.rate_limit.as_deref(),
        wake,
    )
        .into_pyobject(py)
}

fn secs(what: &str, s: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| format!("{what} must be a finite number of seconds, zero or more; got {s}"))
}

/// Decode the tuple `_invoke` returns (see `gendurable/_runner.py`).
fn decode(t: &Bound<'_, PyAny>) -> Transition {
    match try_decode(t) {
        Ok(tr) => tr,
        Err(reason) => Transition::Error {
            reason: format!("the step returned an unusable transition: {reason}"),
            detail: None,
        },
    }
}

fn try_decode(t: &Bound<'_, PyAny>) -> Result<Transition, String> {
    let t = t.cast::<PyTuple>().map_err(|e| e.to_string())?;
    let kind: String = t
        .get_item(0)
        .and_then(|k| k.extract())
        .map_err(|e| e.to_string())?;
    let item = |i: usize| t.get_item(i).map_err(|e| e.to_string());
    let s = |i: usize| -> Result<String, String> {
        item(i)?.extract().map_err(|e: PyErr| e.to_string())
    };
    let os = |i: usize| -> Result<Option<String>, String> {
        item(i)?.extract().map_err(|e: PyErr| e.to_string())
    };
    let of = |i: usize| -> Result<Option<f64>, String> {
        item(i)?.extract().map_err(|e: PyErr| e.to_string())
    };
    let state = |i: usize| -> Result<serde_json::Value, String> {
        to_json("state", &item(i)?).map_err(|e| Python::attach(|py| e.value(py).to_string()))
    };
    Ok(match kind.as_str() {
        "next" => {
            let mode: u8 = item(3)?.extract().map_err(|e: PyErr| e.to_string())?;
            let concurrency_key = match mode {
                0 => KeyChange::Keep,
                1 => KeyChange::Release,
                _ => KeyChange::Set(ConcurrencyKey::from(s(4)?)),
            };
            let delay = of(6)?.map(|d| secs("delay", d)).transpose()?;
            Transition::next_with(
                s(1)?,
                state(2)?,
                NextOptions {
                    concurrency_key,
                    rate_limit: os(5)?,
                    delay,
                },
            )
        }
        "done" => Transition::done(state(1)?),
        "await" => {
            let until = match of(5)? {
                Some(t) => Some(
                    crate::values::timestamp("until", t)
                        .map_err(|e| Python::attach(|py| e.value(py).to_string()))?,
                ),
                None => None,
            };
            Transition::await_on(
                s(1)?,
                state(2)?,
                AwaitOn {
                    signal: os(3)?,
                    timeout: of(4)?.map(|d| secs("timeout", d)).transpose()?,
                    until,
                },
            )
        }
        "snooze" => Transition::snooze(secs("snooze", of(1)?.unwrap_or(0.0))?),
        "error" => Transition::Error {
            reason: s(1)?,
            detail: os(2)?,
        },
        "discard" => Transition::discard(s(1)?),
        "cancel" => Transition::cancel(s(1)?),
        other => return Err(format!("unknown kind {other:?}")),
    })
}

/// Give this thread a Python thread state for the rest of its life. On a
/// thread Python did not start, every `Python::attach` otherwise creates a
/// thread state and destroys it again, with its frame stack (an mmap, page
/// faults and a munmap): a fifth of the binding's CPU on no-op steps, a
/// quarter of their throughput. An outer attach that is never released keeps
/// the state; the thread then detaches, and later attaches reuse the state.
/// The runtime never ends these threads (see `configure_runtime`).
fn pin_thread_state() {
    thread_local!(static PINNED: Cell<bool> = const { Cell::new(false) });
    PINNED.with(|pinned| {
        if pinned.replace(true) {
            return;
        }
        // SAFETY: the interpreter is running (an engine is, and it was
        // started from Python); this thread is not attached, so the ensure
        // attaches it and the save detaches it again, keeping the state.
        unsafe {
            if pyo3::ffi::Py_IsInitialized() != 0 {
                pyo3::ffi::PyGILState_Ensure();
                pyo3::ffi::PyEval_SaveThread();
            }
        }
    });
}

/// The callback a concurrent future calls when an async step finishes.
#[pyclass(frozen)]
struct Done {
    tx: Mutex<Option<oneshot::Sender<Transition>>>,
}

#[pymethods]
impl Done {
    fn __call__(&self, fut: &Bound<'_, PyAny>) {
        let tr = match fut.call_method0("result") {
            Ok(t) => decode(&t),
            Err(e) => Transition::Error {
                reason: format!("the step's task failed: {}", e.value(fut.py())),
                detail: None,
            },
        };
        if let Some(tx) = lock(&self.tx).take() {
            Answer(tx, tr).give(fut.py());
        }
    }
}

/// Cancels the asyncio task if the node abandons the step: the core drops
/// the step's future at its timeout, when its instance is cancelled, or at
/// the shutdown timeout. Cancelling the concurrent future of
/// `run_coroutine_threadsafe` cancels its task on the loop
/// (`asyncio.CancelledError` at the step's next `await`); the task's end is
/// then reported to a `Done` whose receiver is gone, and ignored.
struct CancelOnDrop(Option<Py<PyAny>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(fut) = self.0.take() {
            Python::attach(|py| {
                let _ = fut.bind(py).call_method0("cancel");
            });
        }
    }
}

#[gendurable::async_trait]
impl Workflow for PyWorkflow {
    /// Answers come on the step threads and the event loop's (`Answer`).
    fn hands_over(&self) -> bool {
        true
    }

    async fn step(&self, step: &str, state: serde_json::Value, ctx: StepContext) -> StepResult {
        let force = self.hooks.force();
        tokio::select! {
            biased;
            out = self.run(step, state, ctx) => out,
            () = force.fired() => Ok(Transition::error(FORCED)),
        }
    }
}

impl PyWorkflow {
    async fn run(&self, step: &str, state: serde_json::Value, ctx: StepContext) -> StepResult {
        let Some(s) = self.steps.get(step).or(self.fallback.as_ref()) else {
            return Ok(Transition::error(format!(
                "workflow {:?} has no step {step:?}",
                ctx.workflow
            )));
        };
        let call = Call {
            hooks: self.hooks.clone(),
            f: s.f.clone(),
            takes_step: s.takes_step,
            step: step.to_owned(),
            state,
            ctx,
        };
        let (tx, rx) = oneshot::channel();
        if !s.is_async {
            POOL.submit(Job::Sync(call, tx));
            // Dropped (a timeout, a cancellation, the shutdown), the step's
            // job is skipped if it has not started; a started one runs on.
            return Ok(rx.await.unwrap_or_else(|_| {
                Transition::error("the step's thread ended before the step did")
            }));
        }
        let (submitted_tx, submitted) = oneshot::channel();
        POOL.submit(Job::Async(call, tx, submitted_tx));
        let fut = match submitted.await {
            Ok(Ok(fut)) => fut,
            Ok(Err(reason)) => {
                return Ok(Transition::Error {
                    reason: format!("could not start the async step: {reason}"),
                    detail: None,
                })
            }
            Err(_) => {
                return Ok(Transition::error(
                    "the async step was dropped before it started",
                ))
            }
        };
        let mut guard = CancelOnDrop(Some(fut));
        let tr = rx.await;
        // Finished: nothing to cancel (the reference is released later, when
        // some thread holds the GIL).
        guard.0 = None;
        Ok(tr
            .unwrap_or_else(|_| Transition::error("the async step was dropped before it finished")))
    }
}

/// One step call, as the pool's threads make it.
struct Call {
    hooks: Arc<Hooks>,
    f: Arc<Py<PyAny>>,
    takes_step: bool,
    step: String,
    state: serde_json::Value,
    ctx: StepContext,
}

impl Call {
    /// The `(fn, takes_step, step, state, ctx)` the runners take.
    fn args<'py>(&self, py: Python<'py>) -> PyResult<[Bound<'py, PyAny>; 5]> {
        Ok([
            self.f.bind(py).clone(),
            pyo3::types::PyBool::new(py, self.takes_step)
                .to_owned()
                .into_any(),
            PyString::new(py, &self.step).into_any(),
            to_py(py, &self.state)?,
            ctx_to_py(py, &self.ctx)?.into_any(),
        ])
    }
}

/// What the pool's threads run: a `def` step (its transition goes back on
/// the channel), or the submission of an `async def` step to the engine's
/// event loop (the concurrent future goes back on the second channel, the
/// transition later, from the future's `Done`).
enum Job {
    Sync(Call, oneshot::Sender<Transition>),
    Async(
        Call,
        oneshot::Sender<Transition>,
        oneshot::Sender<Result<Py<PyAny>, String>>,
    ),
}

impl Job {
    /// Whether nobody waits for it any more (its step was stopped before
    /// it started): then it is not run.
    fn abandoned(&self) -> bool {
        match self {
            Job::Sync(_, tx) => tx.is_closed(),
            Job::Async(_, _, submitted) => submitted.is_closed(),
        }
    }

    /// Runs the job; a `def` step's answer is returned, to be given once
    /// the thread is between steps (see `answer`).
    fn run(self, py: Python<'_>) -> Option<Answer> {
        match self {
            Job::Sync(call, tx) => {
                let _running = SyncStep::enter();
                let out = call
                    .args(py)
                    .and_then(|args| call.hooks.invoke.bind(py).call1(PyTuple::new(py, args)?))
                    .map(|out| decode(&out))
                    .unwrap_or_else(|e| Transition::Error {
                        reason: format!("calling the step failed: {}", e.value(py)),
                        detail: None,
                    });
                Some(Answer(tx, out))
            }
            Job::Async(call, tx, submitted) => {
                let fut = (|| -> PyResult<Py<PyAny>> {
                    let event_loop = call.hooks.event_loop(py).ok_or_else(|| {
                        crate::errors::internal("the engine's event loop is not running")
                    })?;
                    let done = Py::new(
                        py,
                        Done {
                            tx: Mutex::new(Some(tx)),
                        },
                    )?;
                    let [f, takes_step, step, state, ctx] = call.args(py)?;
                    let args = (f, takes_step, step, state, ctx, event_loop, done);
                    Ok(call.hooks.invoke_async.bind(py).call1(args)?.unbind())
                })();
                let _ = submitted.send(fut.map_err(|e| e.value(py).to_string()));
                None
            }
        }
    }
}

/// A `def` step's transition, for the core.
struct Answer(oneshot::Sender<Transition>, Transition);

impl Answer {
    /// Answers in the core's hand-over, without the GIL: the step's end and
    /// the start of the next one it lets in run on this thread (no runtime
    /// thread woken for it), the next one queued for this thread to take.
    fn give(self, py: Python<'_>) {
        let Answer(tx, out) = self;
        py.detach(|| gendurable::handover(|| tx.send(out).is_ok()));
    }
}

/// The threads that run `def` steps and submit `async def` ones.
///
/// A thread that finishes a step takes the next waiting one while it still
/// holds the GIL, so that a run of short steps is one GIL acquisition and
/// no thread switch per step (a thread per step, as tokio's blocking pool
/// ran them, cost two and a half context switches a step: two thirds of the
/// binding's CPU on no-op steps). A step that blocks must not hold up the
/// ones behind it, though, and which steps block is not known beforehand:
/// so whenever steps wait and no thread is between steps or on its way to
/// the queue, one more thread is woken (or started) to look. While a thread
/// runs short steps back to back, the one woken waits for the GIL and
/// takes over at Python's switch interval; while steps block, each waiting
/// step wakes a thread of its own.
///
/// Threads are never ended: each keeps its Python thread state (see
/// `pin_thread_state`). There are never more of them than steps ran at
/// once (plus steps abandoned while running, which run on).
struct Pool {
    state: Mutex<PoolState>,
    wake: Condvar,
}

struct PoolState {
    queue: VecDeque<Job>,
    /// Threads waiting for a wake-up.
    idle: usize,
    /// Wake-ups sent and not yet taken.
    wakeups: usize,
    /// Threads woken or started and not yet running a step (wake-ups not
    /// yet taken included).
    searching: usize,
    /// Threads holding the GIL between two steps.
    between: usize,
}

static POOL: Pool = Pool {
    state: Mutex::new(PoolState {
        queue: VecDeque::new(),
        idle: 0,
        wakeups: 0,
        searching: 0,
        between: 0,
    }),
    wake: Condvar::new(),
};

impl Pool {
    fn submit(&'static self, job: Job) {
        let start = {
            let mut st = lock(&self.state);
            st.queue.push_back(job);
            self.look(&mut st)
        };
        if start {
            self.start_thread();
        }
    }

    /// Make sure a thread will look at the queue: unless one is between
    /// steps or on its way, wake one, or say that one must be started.
    fn look(&self, st: &mut PoolState) -> bool {
        if st.searching > 0 || st.between > 0 {
            return false;
        }
        st.searching += 1;
        if st.idle > st.wakeups {
            st.wakeups += 1;
            self.wake.notify_one();
            false
        } else {
            true
        }
    }

    fn start_thread(&'static self) {
        let spawned = std::thread::Builder::new()
            .name("gendurable-step".into())
            .spawn(move || self.thread());
        if spawned.is_err() {
            // No thread: the steps wait for a running one (a step ending, a
            // later submission).
            lock(&self.state).searching -= 1;
        }
    }

    /// A thread of the pool: born searching.
    fn thread(&'static self) {
        pin_thread_state();
        loop {
            let mut start = false;
            Python::attach(|py| {
                let mut st = lock(&self.state);
                let mut searching = true;
                loop {
                    let Some(job) = st.queue.pop_front() else {
                        break;
                    };
                    if job.abandoned() {
                        drop(st);
                        drop(job);
                        st = lock(&self.state);
                        continue;
                    }
                    if searching {
                        st.searching -= 1;
                        searching = false;
                    } else {
                        st.between -= 1;
                    }
                    if !st.queue.is_empty() {
                        start |= self.look(&mut st);
                    }
                    drop(st);
                    if std::mem::take(&mut start) {
                        self.start_thread();
                    }
                    let answer = job.run(py);
                    st = lock(&self.state);
                    st.between += 1;
                    if let Some(answer) = answer {
                        drop(st);
                        answer.give(py);
                        st = lock(&self.state);
                    }
                }
                if searching {
                    st.searching -= 1;
                } else {
                    st.between -= 1;
                }
                st.idle += 1;
            });
            let mut st = lock(&self.state);
            while st.wakeups == 0 {
                st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            st.wakeups -= 1;
            st.idle -= 1;
        }
    }
}
