//! Running a claimed row's step, and starting its key's successor in the
//! slot it frees.

use super::{handover, lock, payload_message, Running, Shared, Stop};
use crate::config::EngineConfig;
use crate::outcome::{Admitted, Claimed, OutcomeRow, Promotion};
use crate::stats::Stats;
use crate::transition::{Transition, Wake};
use crate::workflow::{StepContext, StepResult, Workflow};
use futures::future::{AbortHandle, Abortable, BoxFuture};
use futures::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Rows claimed here that will not start (stopping, no slot, not this
/// node's): released in the next outcome call, as outcomes that change
/// nothing but the claim, and fenced like any outcome.
pub(super) fn release_unstarted(sh: &Shared, rows: Vec<Claimed>) {
    Stats::add(&sh.ctx.stats.released, rows.len() as u64);
    sh.successors(|s| rows.iter().for_each(|r| s.release(r)));
    for row in rows {
        let _ = sh.outcomes.send(OutcomeRow::release(&row));
    }
}

/// A successor's promotion: settled by the call that records its
/// predecessor's outcome. Read once, kept.
pub(super) struct Admission {
    call: oneshot::Receiver<Admitted>,
    promoted: Option<bool>,
    /// Not promoted: the predecessor's outcome, to record alone.
    alone: Option<Box<OutcomeRow>>,
}

impl Admission {
    fn new(call: oneshot::Receiver<Admitted>) -> Admission {
        Admission {
            call,
            promoted: None,
            alone: None,
        }
    }

    async fn promoted(&mut self) -> bool {
        if let Some(p) = self.promoted {
            return p;
        }
        let p = match (&mut self.call).await {
            Ok(Ok(())) => true,
            Ok(Err(alone)) => {
                self.alone = Some(alone);
                false
            }
            // Never written (given up at shutdown): the rows are rescued.
            Err(_) => false,
        };
        self.promoted = Some(p);
        p
    }
}

/// Run a claimed row: wait for a running slot (unless it comes with one: a
/// successor takes its predecessor's), run the step, queue its outcome, and
/// start the key's reserved successor in the slot, if there is one.
/// `admission`: a successor's promotion. The successor starts at once, in
/// the slot its predecessor freed, which the database still counts as taken
/// by the predecessor until the promotion moves it over; not promoted, it
/// is stopped and its outcome never sent (its predecessor's is recorded
/// alone instead). Its own outcome waits for the promotion.
pub(super) fn spawn_step(
    sh: &Arc<Shared>,
    mut row: Claimed,
    claim: OwnedSemaphorePermit,
    run: Option<OwnedSemaphorePermit>,
    admission: Option<Admission>,
) {
    let Some(workflow) = sh.ctx.workflows.get(&row.workflow).cloned() else {
        // The pick only claims workflows this node knows.
        release_unstarted(sh, vec![row]);
        return;
    };
    let sh2 = sh.clone();
    let runs = sh.runs[&row.queue].clone();
    let hands_over = workflow.hands_over();
    let task = sh.steps.track_future(async move {
        let sh = sh2;
        // A prefetched row waits here for a running slot (in claim order:
        // the semaphore is fair); at shutdown, rows not started go back.
        let run = match run {
            Some(run) => Some(run),
            None => tokio::select! {
                biased;
                _ = sh.shutdown.cancelled() => None,
                run = runs.acquire_owned() => run.ok(),
            },
        };
        let mut admission = admission;
        // Never two runs of one instance here: a run still going on an
        // earlier claim of the row (rescued meanwhile) is stopped first.
        let prior = lock(&sh.running)
            .get(&row.id)
            .map(|r| (r.abort.clone(), r.ended.clone()));
        if let Some((abort, ended)) = prior {
            tracing::warn!(
                id = row.id,
                "stopping the run of an earlier claim of this instance before starting it again"
            );
            abort.abort();
            ended.cancelled().await;
        }
        let user = UserStep::new(&workflow, &mut row);
        let ended = CancellationToken::new();
        let stopped = Arc::new(StdMutex::new(None));
        // A successor not started is given back once promoted: its
        // predecessor's outcome applies only with it.
        let step = Running {
            token: row.token,
            abort: user.abort.clone(),
            stopped: stopped.clone(),
            ended: ended.clone(),
        };
        let run = run.filter(|_| sh.start_if_live(row.id, step));
        let Some(run) = run else {
            // Nothing of the row's state is needed to give it back.
            drop(user);
            if admitted(&sh, &row, &mut admission, claim).await.is_some() {
                release_unstarted(&sh, vec![row]);
            }
            return;
        };
        sh.prefetch[&row.queue].started();
        let began = Instant::now();
        Stats::add(&sh.ctx.stats.steps_started, 1);
        let _ended = ended.drop_guard();
        let abort = user.abort.clone();
        let stepping = user.run(&sh.ctx.cfg, &row);
        tokio::pin!(stepping);
        // A successor runs while its promotion is being written, and is
        // stopped at once if it is not promoted.
        let first = match admission.as_mut() {
            None => Some(stepping.as_mut().await),
            Some(a) => tokio::select! {
                r = stepping.as_mut() => Some(r),
                false = a.promoted() => None,
            },
        };
        let (result, timed_out) = match first {
            Some(ended) => ended,
            None => {
                abort.abort();
                stepping.await
            }
        };
        sh.prefetch[&row.queue].ran(began.elapsed());
        forget_running(&sh, &row);
        let Some(claim) = admitted(&sh, &row, &mut admission, claim).await else {
            return;
        };
        let stop = *lock(&stopped);
        let aborted = matches!(result, Ended::Stopped);
        if aborted && timed_out.is_none() && stop.is_none() && !sh.shutdown.is_cancelled() {
            // Stopped because this claim is no longer the node's (the row
            // was rescued, or claimed here again): nothing to record.
            forget_held(&sh, &row);
            sh.successors(|s| s.release(&row));
            return;
        }
        let mut outcome = outcome_of(&sh.ctx.cfg, &row, &*workflow, result, stop, timed_out);
        let stats = &sh.ctx.stats;
        stats.step_time.record(began.elapsed());
        match (outcome.status, outcome.error.is_some()) {
            ("completed", _) => Stats::add(&stats.steps_completed, 1),
            (_, true) => Stats::add(&stats.steps_failed, 1),
            _ => {}
        }
        let next = if sh.shutdown.is_cancelled() || !sh.live.is_live() {
            sh.successors(|s| s.release(&row));
            None
        } else {
            // On record as held before it leaves the reservations, for
            // `give_back_lost`.
            sh.successors(|s| {
                let next = s.next(&row);
                if let Some(n) = &next {
                    lock(&sh.holding).insert(n.id, n.token);
                }
                next
            })
        };
        match next {
            Some(next) => {
                // A claim too: promoted in this outcome's call.
                Stats::add(&sh.ctx.stats.claimed, 1);
                let (promotion, promoted) = Promotion::new();
                outcome.next = Some(next.id);
                outcome.ntoken = Some(next.token - 1);
                outcome.promotion = Some(Arc::new(promotion));
                spawn_step(&sh, next, claim, Some(run), Some(Admission::new(promoted)));
            }
            None => {
                // The claim slot goes with the outcome: the call that records
                // it claims into that slot (or hands the key over).
                drop(run);
                outcome.slot = Some(Arc::new(claim));
            }
        }
        let _ = sh.outcomes.send(outcome);
    });
    if hands_over {
        handover::spawn(&sh.rt, task);
    } else {
        sh.rt.spawn(task);
    }
}

/// The claim `row` is no longer held here.
pub(super) fn forget_held(sh: &Shared, row: &Claimed) {
    let mut holding = lock(&sh.holding);
    if holding.get(&row.id) == Some(&row.token) {
        holding.remove(&row.id);
    }
}

/// A step of `row` is no longer running here.
pub(super) fn forget_running(sh: &Shared, row: &Claimed) {
    let mut running = lock(&sh.running);
    if running.get(&row.id).is_some_and(|r| r.token == row.token) {
        running.remove(&row.id);
    }
}

/// Hands `claim` back unless `row` is a successor its promotion's call did
/// not promote (waiting for that answer): then it goes back (`not_admitted`).
async fn admitted(
    sh: &Shared,
    row: &Claimed,
    admission: &mut Option<Admission>,
    claim: OwnedSemaphorePermit,
) -> Option<OwnedSemaphorePermit> {
    let Some(a) = admission else {
        return Some(claim);
    };
    if a.promoted().await {
        return Some(claim);
    }
    not_admitted(sh, row, a.alone.take(), claim);
    None
}

/// A successor whose promotion did not happen, stopped if it had started:
/// its queue was paused, or its predecessor's row was rescued or given back.
/// Nothing it did is recorded; its reservation, if the node still has it,
/// goes back, and its predecessor's outcome (`alone`), which did not apply
/// without the promotion, is recorded on its own with the claim slot.
fn not_admitted(
    sh: &Shared,
    row: &Claimed,
    alone: Option<Box<OutcomeRow>>,
    claim: OwnedSemaphorePermit,
) {
    Stats::add(&sh.ctx.stats.not_admitted, 1);
    tracing::info!(
        id = row.id,
        "a successor was not promoted (its queue paused, or its predecessor's row rescued); it goes back"
    );
    forget_held(sh, row);
    sh.successors(|s| {
        s.release(row);
        s.restore_dangling(vec![(row.id, row.token - 1)]);
    });
    if let Some(mut alone) = alone {
        alone.slot = Some(Arc::new(claim));
        let _ = sh.outcomes.send(*alone);
    }
}

/// How a step's run ended.
pub(crate) enum Ended {
    /// The step returned.
    Returned(StepResult),
    /// The step panicked, with this message.
    Panicked(String),
    /// The step was stopped (its abort handle) before it returned.
    Stopped,
}

/// `row`'s step of `workflow`, polled in the caller's task: a panic in it is
/// caught and becomes its end, and its abort handle stops it at its next
/// await. One task per step, not two: the task that runs the step is the
/// one that records it.
pub(crate) struct UserStep {
    run: BoxFuture<'static, Ended>,
    pub abort: AbortHandle,
}

impl UserStep {
    /// Takes the row's state (moved, not copied: the step may start in an
    /// answer's hand-over on a binding's thread, whatever the state's size).
    pub(crate) fn new(workflow: &Arc<dyn Workflow>, row: &mut Claimed) -> UserStep {
        let ctx = StepContext {
            id: row.id,
            workflow: row.workflow.clone(),
            queue: row.queue.clone(),
            attempt: row.attempt,
            max_attempts: row.max_attempts,
            concurrency_key: row.concurrency_key.clone(),
            rate_limit: row.rate_key.clone(),
            wake: Wake::from_json(row.wake.clone()),
        };
        let (step, state, wf) = (
            row.step.clone(),
            std::mem::take(&mut row.state),
            workflow.clone(),
        );
        // One span per step run, for tracing subscribers (OpenTelemetry
        // through tracing-opentelemetry, say).
        let span = tracing::info_span!(
            "gendurable.step",
            id = row.id,
            workflow = %row.workflow,
            step = %row.step,
            queue = %row.queue,
            attempt = row.attempt,
        );
        let (abort, registration) = AbortHandle::new_pair();
        let step =
            AssertUnwindSafe(async move { wf.step(&step, state, ctx).await }.instrument(span))
                .catch_unwind();
        let run = Abortable::new(step, registration).map(|r| match r {
            Ok(Ok(result)) => Ended::Returned(result),
            Ok(Err(panic)) => Ended::Panicked(payload_message(&*panic)),
            Err(_) => Ended::Stopped,
        });
        UserStep {
            run: run.boxed(),
            abort,
        }
    }

    /// Run the step, stopping it at its timeout: a step past it is stopped
    /// at its next await, and one that returns only after it (it never
    /// awaited meanwhile) is recorded as timed out all the same. Returns how
    /// it ended and the timeout that stopped it.
    pub(crate) async fn run(
        mut self,
        cfg: &EngineConfig,
        row: &Claimed,
    ) -> (Ended, Option<Duration>) {
        let Some(limit) = cfg.timeout_of(&row.workflow, &row.step) else {
            return (self.run.await, None);
        };
        let deadline = tokio::time::Instant::from_std(crate::deadline::after(limit));
        tokio::select! {
            biased;
            ended = &mut self.run => {
                if tokio::time::Instant::now() < deadline || matches!(ended, Ended::Stopped) {
                    (ended, None)
                } else {
                    (Ended::Stopped, Some(limit))
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                self.abort.abort();
                (self.run.await, Some(limit))
            }
        }
    }
}

/// The outcome of a step's run: its transition, else what ended it (a
/// panic, a cancellation, the node's lapsed heartbeat, its timeout, the
/// shutdown).
pub(crate) fn outcome_of(
    cfg: &EngineConfig,
    row: &Claimed,
    workflow: &dyn Workflow,
    result: Ended,
    stop: Option<Stop>,
    timed_out: Option<Duration>,
) -> OutcomeRow {
    match result {
        Ended::Returned(Ok(t)) => OutcomeRow::from_transition(row, cfg, Some(workflow), t),
        Ended::Returned(Err(e)) => OutcomeRow::from_transition(
            row,
            cfg,
            Some(workflow),
            Transition::Error {
                reason: e.to_string(),
                detail: Some(format!("{e:?}")),
            },
        ),
        Ended::Panicked(message) => {
            OutcomeRow::failure(row, cfg, "panic", format!("panic: {message}"))
        }
        Ended::Stopped if stop == Some(Stop::Cancelled) => OutcomeRow::failure(
            row,
            cfg,
            "cancel",
            "cancelled while running: the step was stopped".into(),
        ),
        Ended::Stopped if stop == Some(Stop::Lapsed) => OutcomeRow::failure(
            row,
            cfg,
            "lease",
            format!(
                "stopped: this node could not heartbeat for {:?} (its lease {:?} less a heartbeat interval), so the row could be rescued and run elsewhere",
                cfg.lease.saturating_sub(cfg.heartbeat_interval),
                cfg.lease
            ),
        ),
        Ended::Stopped => match timed_out {
            Some(limit) => OutcomeRow::failure(
                row,
                cfg,
                "timeout",
                format!("step {:?} timed out after {limit:?}", row.step),
            ),
            None => OutcomeRow::failure(
                row,
                cfg,
                "shutdown",
                "aborted: the step did not finish within the shutdown timeout".into(),
            ),
        },
    }
}
