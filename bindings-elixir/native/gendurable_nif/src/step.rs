//! Steps run by Elixir processes.
//!
//! The workflow adapter (`ElixirWorkflow`) keeps everything a step needs in
//! its handle (a `StepRes`). Steps run in a pool of long-lived processes
//! (runners) that the engine's dispatcher starts and monitors: a new step is
//! queued and an idle runner woken with `:gen_durable_step`; with none idle
//! the dispatcher, told with one `:gen_durable_steps` however many arrive
//! meanwhile, starts runners. A runner takes queued steps itself
//! (`runner_next/2`), one after another, without a message while any is
//! queued. The step's handle (a resource) is made there, on a scheduler, and
//! the runner takes the step with `step_begin/1`: the state and context
//! become terms in that process, on a dirty scheduler unless they are small.
//! Nothing the BEAM allocates is made on the runtime's threads per step but
//! the wake-up itself: memory the BEAM hands out to a thread it does not
//! manage and frees on a scheduler goes back through its aux thread, a
//! wake-up more. A step is taken once, so a step queued again (after its
//! dispatcher was replaced) still runs once. A step is answered inside the
//! core's hand-over (`answer_here`): its end, and the start of the step its
//! slot lets in, run in the answer's call on the scheduler; steps queued
//! there wake their runners after it (`Deferred`).
//!
//! * A dispatcher that dies loses nothing: queued steps wait for the next
//!   one, which also monitors the runners of the one before (they stop
//!   after their step); the adapter tells each new dispatcher of a step no
//!   process took yet (queuing it again if it was taken from the queue),
//!   until a process takes it.
//! * A step no process could take (no dispatcher for `DISPATCHER_WAIT`, the
//!   dispatcher stopped for good, the runner that took it from the queue
//!   died before beginning it) is snoozed: it runs again later and the
//!   attempt is not counted.
//! * A runner that dies without answering its step is reported by the
//!   dispatcher monitoring it (`runner_exited/3`), with the exit reason.
//! * When the core stops waiting for a step (it drops the step's future),
//!   the runner running it is killed by the dispatcher. A runner whose
//!   answer comes after that ends instead of taking another step, so the
//!   kill cannot reach a later step.

use crate::atoms;
use crate::convert::{json_is_small, json_to_term, term_is_small, term_to_json};
use crate::engine::EngineRes;
use crate::errors::internal_error;
use crate::runtime::{lock, runtime};
use gendurable::{
    AwaitOn, ConcurrencyKey, KeyChange, NextOptions, StepContext, StepResult, Transition, Wake,
    Workflow,
};
use rustler::types::tuple::get_tuple;
use rustler::{Atom, Encoder, Env, LocalPid, NifResult, OwnedEnv, ResourceArc, Term};
use serde_json::Value;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

/// How long a step waits for a dispatcher before it is snoozed.
const DISPATCHER_WAIT: Duration = Duration::from_secs(30);
/// When a step that could not be started runs again.
const RETRY_AFTER: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------
// The dispatcher slot

#[derive(Clone, Copy, PartialEq)]
enum Slot {
    /// No dispatcher yet, or one died and its successor is not registered.
    Empty,
    Up(LocalPid),
    /// The dispatcher stopped for good: the engine's tree is going away.
    Closed,
}

/// Where the engine's dispatcher is, the steps waiting for a process and the
/// idle step processes. Shared by the engine's workflows.
pub struct Dispatcher {
    slot: watch::Sender<Slot>,
    queue: Mutex<Queue>,
}

/// Steps run in a pool of long-lived processes (runners) that the dispatcher
/// starts. A new step joins the queue and an idle runner is woken with
/// `:gen_durable_step`; with none idle the dispatcher is sent
/// `:gen_durable_steps` (once while the queue has such a message
/// outstanding) to start runners. A runner takes the next queued step itself
/// (`runner_next/2`), or is recorded as idle. A runner woken for a step
/// another one took meanwhile finds the queue empty and is idle again; one
/// that dies before taking it leaves it queued (its dispatcher, told of the
/// exit, starts another).
#[derive(Default)]
struct Queue {
    steps: VecDeque<Arc<Step>>,
    /// `:gen_durable_steps` was sent and not answered yet.
    rung: bool,
    /// Runners waiting for a step, the most recently idle last.
    idle: Vec<LocalPid>,
    /// The step each runner took last: settled with the runner's exit
    /// reason should it die (`runner_exited/3`).
    current: HashMap<LocalPid, Arc<Step>>,
}

impl Dispatcher {
    pub fn new() -> Dispatcher {
        Dispatcher {
            slot: watch::Sender::new(Slot::Empty),
            queue: Mutex::new(Queue::default()),
        }
    }

    /// A new dispatcher starts its own runners. Returns the runners of the
    /// ones before: idle (for the new one to stop) and the others (which
    /// stop after their step); it monitors both, to report their exits.
    fn register(&self, pid: LocalPid) -> (Vec<LocalPid>, Vec<LocalPid>) {
        let old = {
            let mut q = lock(&self.queue);
            q.rung = false;
            let idle = std::mem::take(&mut q.idle);
            let busy = q
                .current
                .keys()
                .filter(|p| !idle.contains(p))
                .copied()
                .collect();
            (idle, busy)
        };
        self.slot.send_replace(Slot::Up(pid));
        old
    }

    fn close(&self, pid: LocalPid) {
        self.slot.send_if_modified(|s| {
            let mine = *s == Slot::Up(pid);
            if mine {
                *s = Slot::Closed;
            }
            mine
        });
    }

    /// Queues a step (once: a step queued and not taken yet stays where it
    /// is) and wakes an idle runner, or tells the dispatcher `pid` if it was
    /// not told yet. False if the dispatcher is gone. In an answer's
    /// hand-over (a scheduler thread) the wake-up waits for the hand-over's
    /// end (`wake_deferred`): the answering runner takes a step next.
    fn enqueue(self: &Arc<Self>, pid: LocalPid, step: &Arc<Step>) -> bool {
        let mut q = lock(&self.queue);
        if !step.queued.swap(true, Ordering::AcqRel) {
            q.steps.push_back(step.clone());
        }
        if Deferred::note(self, pid) {
            return true;
        }
        self.wake(q, 1, pid, |to, message| send(to, |env| message.encode(env)))
    }

    /// Wakes idle runners for `steps` queued steps; with too few idle, tells
    /// the dispatcher `pid` (once while it has not answered). False if that
    /// message could not go.
    fn wake(
        &self,
        mut q: MutexGuard<'_, Queue>,
        mut steps: usize,
        pid: LocalPid,
        send: impl Fn(LocalPid, Atom) -> bool,
    ) -> bool {
        while steps > 0 {
            let Some(runner) = q.idle.pop() else { break };
            if send(runner, atoms::gen_durable_step()) {
                steps -= 1;
            }
        }
        if steps == 0 || std::mem::replace(&mut q.rung, true) {
            return true;
        }
        drop(q);
        if send(pid, atoms::gen_durable_steps()) {
            return true;
        }
        lock(&self.queue).rung = false;
        false
    }

    /// How many runners the dispatcher should start: one per queued step.
    fn wanted(&self) -> usize {
        let mut q = lock(&self.queue);
        q.rung = false;
        q.steps.len()
    }

    /// The next queued step for the runner `pid`, or `None` after recording
    /// it as idle. `Err` if `manager` is no longer the dispatcher: the
    /// runner stops.
    fn next(&self, manager: LocalPid, pid: LocalPid) -> Result<Option<Arc<Step>>, ()> {
        if *self.slot.borrow() != Slot::Up(manager) {
            return Err(());
        }
        let mut q = lock(&self.queue);
        match q.steps.pop_front() {
            Some(h) => {
                h.queued.store(false, Ordering::Release);
                q.current.insert(pid, h.clone());
                Ok(Some(h))
            }
            None => {
                q.idle.push(pid);
                Ok(None)
            }
        }
    }

    /// The runner `pid` exited: the step it had, if any.
    fn exited(&self, pid: LocalPid) -> Option<Arc<Step>> {
        let mut q = lock(&self.queue);
        q.idle.retain(|p| *p != pid);
        q.current.remove(&pid)
    }

    /// Everything queued: the steps a stopping dispatcher snoozes.
    fn take(&self) -> Vec<Arc<Step>> {
        let mut q = lock(&self.queue);
        q.rung = false;
        let steps: Vec<_> = q.steps.drain(..).collect();
        for h in &steps {
            h.queued.store(false, Ordering::Release);
        }
        steps
    }

    /// Sends `{:gen_durable_cancel, pid}`, waiting for a dispatcher if none
    /// is registered. Gives up if none comes: the step's process is then
    /// stopped with the rest of the tree.
    fn kill(self: &Arc<Self>, pid: LocalPid) {
        let this = self.clone();
        runtime().spawn(async move {
            let mut slot = this.slot.subscribe();
            let deadline = Instant::now() + DISPATCHER_WAIT;
            loop {
                match *slot.borrow_and_update() {
                    Slot::Closed => return,
                    Slot::Up(d)
                        if send(d, |env| (atoms::gen_durable_cancel(), pid).encode(env)) =>
                    {
                        return
                    }
                    _ => {}
                }
                if tokio::time::timeout_at(deadline, slot.changed())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }
}

/// Steps queued during an answer's hand-over, by dispatcher: a scheduler
/// thread cannot send from a NIF but through the caller's environment, so
/// the runners are woken after it (`wake_deferred`).
struct Deferred {
    dispatcher: Arc<Dispatcher>,
    pid: LocalPid,
    steps: usize,
}

thread_local! {
    static DEFERRED: RefCell<Option<Vec<Deferred>>> = const { RefCell::new(None) };
}

impl Deferred {
    /// Counts a step queued on `dispatcher` if this thread defers its
    /// wake-ups; false if it does not.
    fn note(dispatcher: &Arc<Dispatcher>, pid: LocalPid) -> bool {
        DEFERRED.with_borrow_mut(|d| {
            let Some(d) = d.as_mut() else {
                return false;
            };
            match d
                .iter_mut()
                .find(|x| Arc::ptr_eq(&x.dispatcher, dispatcher))
            {
                Some(x) => {
                    x.steps += 1;
                    x.pid = pid;
                }
                None => d.push(Deferred {
                    dispatcher: dispatcher.clone(),
                    pid,
                    steps: 1,
                }),
            }
            true
        })
    }
}

/// Runs `f` (an answer) in the core's hand-over: the step's end and the
/// start of the next steps run in this call. Steps it queues wake idle
/// runners (or the dispatcher) after it, through `env`, but one: the
/// calling runner, whose step `answered` was, takes the next itself.
fn answer_here<R>(env: Env, answered: &Arc<Step>, f: impl FnOnce() -> R) -> R {
    DEFERRED.with_borrow_mut(|d| *d = Some(Vec::new()));
    let r = gendurable::handover(f);
    let deferred = DEFERRED.with_borrow_mut(Option::take).unwrap_or_default();
    for d in deferred {
        d.dispatcher.wake_deferred(env, d.pid, d.steps, answered);
    }
    r
}

impl Dispatcher {
    /// Wakes runners for `steps` steps queued in a hand-over on the calling
    /// scheduler, less the one the calling runner takes if `answered` was
    /// its step; with too few idle, tells the dispatcher `pid`.
    fn wake_deferred(&self, env: Env, pid: LocalPid, steps: usize, answered: &Arc<Step>) {
        let q = lock(&self.queue);
        let mine = q
            .current
            .get(&env.pid())
            .is_some_and(|s| Arc::ptr_eq(s, answered));
        let wanted = steps.saturating_sub(usize::from(mine)).min(q.steps.len());
        self.wake(q, wanted, pid, |to, message| env.send(&to, message).is_ok());
    }
}

/// Sends a small message from a thread the BEAM does not manage, through
/// an environment kept per thread (cleared by each send).
fn send<F>(to: LocalPid, message: F) -> bool
where
    F: for<'a> FnOnce(Env<'a>) -> Term<'a>,
{
    thread_local! {
        static ENV: RefCell<OwnedEnv> = RefCell::new(OwnedEnv::new());
    }
    ENV.with_borrow_mut(|env| env.send_and_clear(&to, message).is_ok())
}

// ---------------------------------------------------------------------------
// The step handle

/// What the process running a step gets from `step_begin/1`.
struct StepData {
    module: String,
    step: String,
    state: Value,
    ctx: StepContext,
}

impl StepData {
    fn is_small(&self) -> bool {
        json_is_small(&self.state)
            && match &self.ctx.wake {
                Some(Wake::Signal { payload, .. }) => json_is_small(payload),
                _ => true,
            }
    }
}

#[derive(Default)]
struct StepInner {
    /// The answer's way back; `None` once answered (or stopped).
    tx: Option<oneshot::Sender<Transition>>,
    /// Until a process takes the step.
    data: Option<StepData>,
    /// The process that took it.
    runner: Option<LocalPid>,
}

impl StepInner {
    fn answer(&mut self, t: Transition) -> bool {
        self.data = None;
        match self.tx.take() {
            Some(tx) => {
                let _ = tx.send(t);
                true
            }
            None => false,
        }
    }

    /// Not taken by any process yet, and not answered.
    fn unclaimed(&self) -> bool {
        self.tx.is_some() && self.data.is_some()
    }
}

/// One step run by Elixir.
pub struct Step {
    inner: Mutex<StepInner>,
    /// In the dispatcher's queue (see `Queue`).
    queued: AtomicBool,
}

/// A step's handle in Elixir: made on a scheduler, when a process takes
/// the step or a stopping dispatcher snoozes it.
pub struct StepRes(Arc<Step>);

#[rustler::resource_impl]
impl rustler::Resource for StepRes {}

fn handle(step: Arc<Step>) -> ResourceArc<StepRes> {
    ResourceArc::new(StepRes(step))
}

/// Snoozes the step if no process took it yet: it runs again later, without
/// counting an attempt. Returns whether it did.
fn snooze_unclaimed(handle: &Step) -> bool {
    let mut s = lock(&handle.inner);
    s.unclaimed() && s.answer(Transition::snooze(RETRY_AFTER))
}

// ---------------------------------------------------------------------------
// The workflow adapter

pub struct ElixirWorkflow {
    pub dispatcher: Arc<Dispatcher>,
    pub module: String,
}

#[gendurable::async_trait]
impl Workflow for ElixirWorkflow {
    /// Answers come on schedulers, inside `answer_here`.
    fn hands_over(&self) -> bool {
        true
    }

    async fn step(&self, step: &str, state: Value, ctx: StepContext) -> StepResult {
        let (tx, mut rx) = oneshot::channel();
        let handle = Arc::new(Step {
            inner: Mutex::new(StepInner {
                tx: Some(tx),
                data: Some(StepData {
                    module: self.module.clone(),
                    step: step.to_owned(),
                    state,
                    ctx,
                }),
                runner: None,
            }),
            queued: AtomicBool::new(false),
        });
        // If the core drops this future (it stops the step) before the
        // answer came, the guard has the step's process killed.
        let guard = CancelOnDrop {
            dispatcher: self.dispatcher.clone(),
            handle: Some(handle.clone()),
        };
        let mut slot = self.dispatcher.slot.subscribe();
        let mut deadline = None;
        loop {
            // Send (again) while no process took the step.
            let sent = match *slot.borrow_and_update() {
                Slot::Up(pid) => {
                    !lock(&handle.inner).unclaimed() || self.dispatcher.enqueue(pid, &handle)
                }
                Slot::Closed => {
                    snooze_unclaimed(&handle);
                    true
                }
                Slot::Empty => false,
            };
            // Without a dispatcher, wait a bounded time for one.
            deadline = if sent {
                None
            } else {
                Some(deadline.unwrap_or_else(|| Instant::now() + DISPATCHER_WAIT))
            };
            tokio::select! {
                answer = &mut rx => {
                    guard.disarm();
                    return Ok(answer.unwrap_or_else(|_| Transition::Error {
                        reason: "the Elixir step ended without an answer".into(),
                        detail: None,
                    }));
                }
                // A new dispatcher, or the slot closed.
                _ = slot.changed() => {}
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    snooze_unclaimed(&handle);
                }
            }
        }
    }
}

/// Held while a step runs in Elixir. Dropped armed (the core stopped the
/// step: shutdown timeout, claim lost, successor not admitted), it settles
/// the handle so that no process takes the step any more, and has the
/// process running it, if any, killed. A later `step_reply/2` does nothing.
struct CancelOnDrop {
    dispatcher: Arc<Dispatcher>,
    handle: Option<Arc<Step>>,
}

impl CancelOnDrop {
    fn disarm(mut self) {
        self.handle = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(handle) = self.handle.take() else {
            return;
        };
        let runner = {
            let mut s = lock(&handle.inner);
            let answered = s.tx.take().is_none();
            s.data = None;
            if answered {
                return;
            }
            s.runner
        };
        if let Some(pid) = runner {
            self.dispatcher.kill(pid);
        }
    }
}

// ---------------------------------------------------------------------------
// NIFs called by the dispatcher and the step processes

/// Registers the calling process as the engine's dispatcher. Returns the
/// runners of the dispatchers before it, `{idle, busy}`.
#[rustler::nif]
fn dispatcher_register(env: Env, res: ResourceArc<EngineRes>) -> (Vec<LocalPid>, Vec<LocalPid>) {
    res.tree.dispatcher.register(env.pid())
}

/// The calling dispatcher stops for good: steps no process took yet are
/// snoozed rather than sent.
#[rustler::nif]
fn dispatcher_close(env: Env, res: ResourceArc<EngineRes>) -> Atom {
    res.tree.dispatcher.close(env.pid());
    atoms::ok()
}

/// How many runners to start, after `:gen_durable_steps`.
#[rustler::nif]
fn dispatcher_wanted(res: ResourceArc<EngineRes>) -> usize {
    res.tree.dispatcher.wanted()
}

/// The steps no runner took: for a stopping dispatcher to snooze.
#[rustler::nif]
fn dispatcher_take(res: ResourceArc<EngineRes>) -> Vec<ResourceArc<StepRes>> {
    res.tree.dispatcher.take().into_iter().map(handle).collect()
}

/// For a runner started by the dispatcher `manager`: the next queued step's
/// handle, `:wait` (the runner is idle: it is woken with `:gen_durable_step`
/// when a step comes) or `:stop` (`manager` is no longer the dispatcher).
#[rustler::nif]
fn runner_next(env: Env, res: ResourceArc<EngineRes>, manager: LocalPid) -> Term {
    match res.tree.dispatcher.next(manager, env.pid()) {
        Ok(Some(step)) => handle(step).encode(env),
        Ok(None) => atoms::wait().encode(env),
        Err(()) => atoms::stop().encode(env),
    }
}

/// A runner exited: the step it had is settled as `step_exited/3` does.
#[rustler::nif]
fn runner_exited(res: ResourceArc<EngineRes>, pid: LocalPid, reason: String) -> Atom {
    if let Some(h) = res.tree.dispatcher.exited(pid) {
        settle_exited(&h, Some(pid), reason);
    }
    atoms::ok()
}

/// Takes a step for the calling process: `{:ok, module, step, state, ctx}`,
/// or `:skip` when another process took it or it was settled. The terms are
/// built here, in the caller's environment. Returns `:dirty` without taking
/// the step if its values are too large to convert on a normal scheduler:
/// `step_begin_dirty/1` converts them on a dirty one.
#[rustler::nif]
fn step_begin(env: Env, handle: ResourceArc<StepRes>) -> Term {
    begin(env, &handle, true)
}

/// `step_begin/1` on a dirty scheduler, for values of any size.
#[rustler::nif(schedule = "DirtyCpu")]
fn step_begin_dirty(env: Env, handle: ResourceArc<StepRes>) -> Term {
    begin(env, &handle, false)
}

fn begin<'a>(env: Env<'a>, handle: &StepRes, small_only: bool) -> Term<'a> {
    let data = {
        let mut s = lock(&handle.0.inner);
        if !s.unclaimed() {
            return atoms::skip().encode(env);
        }
        if small_only && !s.data.as_ref().is_some_and(StepData::is_small) {
            return atoms::dirty().encode(env);
        }
        s.runner = Some(env.pid());
        s.data.take().expect("unclaimed")
    };
    let module = Atom::from_str(env, &data.module)
        .map(|a| a.encode(env))
        .unwrap_or_else(|_| data.module.encode(env));
    // The step is claimed by now: should this fail, the caller does not
    // match the error, dies, and its dispatcher answers the step.
    let ctx = match context_term(env, &data.ctx) {
        Ok(ctx) => ctx,
        Err(_) => return internal_error(env, "cannot build the step's context".into()),
    };
    (
        atoms::ok(),
        module,
        data.step.as_str(),
        json_to_term(env, &data.state),
        ctx,
    )
        .encode(env)
}

/// Answers a step. An undecodable result answers it with an error outcome
/// saying why, and returns `{:error, message}`; `:already_replied` if it was
/// answered or stopped before. Returns `:dirty` without answering if the
/// result is too large to convert on a normal scheduler:
/// `step_reply_dirty/2` converts it on a dirty one.
#[rustler::nif]
fn step_reply<'a>(env: Env<'a>, handle: ResourceArc<StepRes>, result: Term<'a>) -> Term<'a> {
    if !term_is_small(result) {
        return atoms::dirty().encode(env);
    }
    answer(env, &handle, result)
}

/// `step_reply/2` on a dirty scheduler, for results of any size.
#[rustler::nif(schedule = "DirtyCpu")]
fn step_reply_dirty<'a>(env: Env<'a>, handle: ResourceArc<StepRes>, result: Term<'a>) -> Term<'a> {
    answer(env, &handle, result)
}

fn answer<'a>(env: Env<'a>, handle: &StepRes, result: Term<'a>) -> Term<'a> {
    let handle = &handle.0;
    if lock(&handle.inner).tx.is_none() {
        return atoms::already_replied().encode(env);
    }
    let (t, out) = match decode_transition(result) {
        Ok(t) => (t, atoms::ok().encode(env)),
        Err(e) => {
            let reason = format!("invalid step result: {e}");
            let t = Transition::Error {
                reason: reason.clone(),
                detail: None,
            };
            (t, (atoms::error(), reason).encode(env))
        }
    };
    if answer_here(env, handle, || lock(&handle.inner).answer(t)) {
        out
    } else {
        atoms::already_replied().encode(env)
    }
}

/// A process the dispatcher started for a step exited without answering.
/// If it had taken the step, the step is answered with an error saying
/// `reason`; if no process took the step, it is snoozed (it never ran, so
/// the attempt does not count). With `pid` nil: only the latter, for steps
/// left in a stopping dispatcher's mailbox.
#[rustler::nif]
fn step_exited(handle: ResourceArc<StepRes>, pid: Option<LocalPid>, reason: String) -> Atom {
    settle_exited(&handle.0, pid, reason);
    atoms::ok()
}

fn settle_exited(handle: &Step, pid: Option<LocalPid>, reason: String) {
    let mut s = lock(&handle.inner);
    if s.unclaimed() {
        s.answer(Transition::snooze(RETRY_AFTER));
    } else if pid.is_some() && s.runner == pid {
        s.answer(Transition::Error {
            reason,
            detail: None,
        });
    }
}

// ---------------------------------------------------------------------------
// Terms

/// `%GenDurable.Context{}`. Building the map fails only on a duplicate
/// key, and the keys are distinct.
fn context_term<'a>(env: Env<'a>, ctx: &StepContext) -> NifResult<Term<'a>> {
    let wake = match &ctx.wake {
        None => atoms::nil().encode(env),
        Some(Wake::Timeout) => atoms::timeout().encode(env),
        Some(Wake::Signal { name, payload }) => {
            (atoms::signal(), name.as_str(), json_to_term(env, payload)).encode(env)
        }
    };
    let keys = [
        atoms::struct_().encode(env),
        atoms::id().encode(env),
        atoms::workflow().encode(env),
        atoms::queue().encode(env),
        atoms::attempt().encode(env),
        atoms::max_attempts().encode(env),
        atoms::concurrency_key().encode(env),
        atoms::rate_limit().encode(env),
        atoms::wake().encode(env),
    ];
    let values = [
        atoms::context_struct().encode(env),
        ctx.id.encode(env),
        ctx.workflow.encode(env),
        ctx.queue.encode(env),
        ctx.attempt.encode(env),
        ctx.max_attempts.encode(env),
        ctx.concurrency_key.encode(env),
        ctx.rate_limit.encode(env),
        wake,
    ];
    Term::map_from_term_arrays(env, &keys, &values)
}

fn ms(v: Option<u64>) -> Option<Duration> {
    v.map(Duration::from_millis)
}

/// Decodes a normalized step result (see `GenDurable.Runner`):
///
/// * `{:next, step, state, key_change, rate_limit | nil, delay_ms | nil}`,
///   key_change = `:keep | :release | {:set, key}`
/// * `{:done, state}`
/// * `{:await, step, state, signal | nil, timeout_ms | nil, until_us | nil}`
/// * `{:snooze, ms}` · `{:error, reason, detail | nil}` · `{:discard, reason}`
///   · `{:cancel, reason}`
fn decode_transition(term: Term) -> Result<Transition, String> {
    let t = get_tuple(term).map_err(|_| "a step result must be a tuple".to_string())?;
    let tag: Atom = t
        .first()
        .ok_or("empty tuple")?
        .decode()
        .map_err(|_| "a step result must start with an atom".to_string())?;
    let text = |i: usize, what: &str| -> Result<String, String> {
        t[i].decode::<String>()
            .map_err(|_| format!("{what} must be a string"))
    };
    let opt_u64 = |i: usize, what: &str| -> Result<Option<u64>, String> {
        t[i].decode::<Option<u64>>()
            .map_err(|_| format!("{what} must be a non-negative integer (milliseconds)"))
    };
    let state = |i: usize| -> Result<Value, String> {
        let v = term_to_json(t[i]).map_err(|e| format!("the state is not JSON: {e}"))?;
        if !v.is_object() {
            return Err("the state must be a map".into());
        }
        Ok(v)
    };
    if tag == atoms::next() && t.len() == 6 {
        let key = if t[3].decode::<Atom>().ok() == Some(atoms::keep()) {
            KeyChange::Keep
        } else if t[3].decode::<Atom>().ok() == Some(atoms::release()) {
            KeyChange::Release
        } else {
            let (_, k): (Atom, String) = t[3]
                .decode()
                .map_err(|_| "the concurrency key must be a string".to_string())?;
            KeyChange::Set(ConcurrencyKey::from(k))
        };
        let rate_limit = t[4]
            .decode::<Option<String>>()
            .map_err(|_| "rate_limit must be a string".to_string())?;
        Ok(Transition::next_with(
            text(1, "the step")?,
            state(2)?,
            NextOptions {
                concurrency_key: key,
                rate_limit,
                delay: ms(opt_u64(5, "schedule_in")?),
            },
        ))
    } else if tag == atoms::done() && t.len() == 2 {
        Ok(Transition::done(state(1)?))
    } else if tag == atoms::await_() && t.len() == 6 {
        let signal = t[3]
            .decode::<Option<String>>()
            .map_err(|_| "signal must be a string".to_string())?;
        let until = match t[5]
            .decode::<Option<i64>>()
            .map_err(|_| "until must be a DateTime".to_string())?
        {
            Some(us) => {
                Some(chrono::DateTime::from_timestamp_micros(us).ok_or("until is out of range")?)
            }
            None => None,
        };
        Ok(Transition::await_on(
            text(1, "the step")?,
            state(2)?,
            AwaitOn {
                signal,
                timeout: ms(opt_u64(4, "timeout")?),
                until,
            },
        ))
    } else if tag == atoms::snooze() && t.len() == 2 {
        let d = t[1]
            .decode::<u64>()
            .map_err(|_| "snooze takes non-negative milliseconds".to_string())?;
        Ok(Transition::snooze(Duration::from_millis(d)))
    } else if tag == atoms::error() && t.len() == 3 {
        Ok(Transition::Error {
            reason: text(1, "the reason")?,
            detail: t[2]
                .decode::<Option<String>>()
                .map_err(|_| "the detail must be a string".to_string())?,
        })
    } else if tag == atoms::discard() && t.len() == 2 {
        Ok(Transition::discard(text(1, "the reason")?))
    } else if tag == atoms::cancel() && t.len() == 2 {
        Ok(Transition::cancel(text(1, "the reason")?))
    } else {
        Err("not a step result".into())
    }
}
