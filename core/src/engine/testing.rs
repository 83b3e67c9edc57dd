//! Helpers for tests of applications: run a queue's instances to the end in
//! the calling task (`drain`), and find inserted instances (`inserted`).

use super::{instance_from_row, Engine};
use crate::context::Context;
use crate::error::Result;
use crate::instance::{Instance, Status};
use crate::node::{outcome_of, UserStep};
use crate::outcome::{Claimed, OutcomeRow};
use crate::store::{read_handoff, Beat, Call, Demand};
use serde_json::Value;
use std::collections::VecDeque;
use std::time::Instant;

/// Steps a drain runs at most unless told otherwise: a workflow that never
/// ends (a `next` loop, a snooze under `scheduled`) ends the drain there.
pub const DRAIN_MAX_STEPS: usize = 10_000;

/// How far [`Engine::drain_with`] goes.
#[derive(Debug, Clone, Default)]
pub struct DrainOptions {
    /// Also run the queue's scheduled instances (delays, retries waiting
    /// out their backoff, snoozes) at once, again after every step: errors
    /// are retried to their last attempt within the drain.
    pub scheduled: bool,
    /// Stop after this many steps (default [`DRAIN_MAX_STEPS`]).
    pub max_steps: Option<usize>,
}

/// What a drain ran: steps, and how they ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drained {
    /// Steps run.
    pub steps: usize,
    /// Steps that completed their instance.
    pub completed: usize,
    /// Steps that discarded it (a discard, or an error on its last attempt).
    pub discarded: usize,
    /// Steps that cancelled it.
    pub cancelled: usize,
    /// Errors with attempts left (scheduled for a retry).
    pub retried: usize,
    /// Steps that snoozed.
    pub snoozed: usize,
    /// Steps that ended in an await.
    pub awaiting: usize,
}

impl Drained {
    fn count(&mut self, o: &OutcomeRow) {
        self.steps += 1;
        let n = match (o.status, o.kind) {
            ("completed", _) => &mut self.completed,
            ("discarded", _) => &mut self.discarded,
            ("cancelled", _) => &mut self.cancelled,
            ("awaiting", _) => &mut self.awaiting,
            (_, "snooze") => &mut self.snoozed,
            ("scheduled", _) => &mut self.retried,
            _ => return,
        };
        *n += 1;
    }
}

/// Which instances [`Engine::inserted`] finds: of a workflow, and
/// optionally whose state contains `state` (JSON containment: the fields
/// given, with those values), in a queue, with a status.
#[derive(Debug, Clone)]
pub struct InsertedQuery {
    pub workflow: String,
    pub state: Option<Value>,
    pub queue: Option<String>,
    pub status: Option<Status>,
    /// At most this many, oldest first (default 1,000).
    pub limit: Option<i64>,
}

impl InsertedQuery {
    /// Every instance of `workflow`.
    pub fn new(workflow: impl Into<String>) -> Self {
        InsertedQuery {
            workflow: workflow.into(),
            state: None,
            queue: None,
            status: None,
            limit: None,
        }
    }

    /// Whose state contains these fields and values.
    pub fn state(mut self, state: Value) -> Self {
        self.state = Some(state);
        self
    }

    /// In this queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// With this status.
    pub fn status(mut self, status: Status) -> Self {
        self.status = Some(status);
        self
    }
}

impl Engine {
    /// Run every runnable instance of `queue` to its end in the calling task,
    /// one step at a time in pick order, each step's next step included:
    /// what `Oban.Testing.drain_queue` and rivertest do. The node need not be
    /// started (and one that runs the queue competes for its rows). Keys,
    /// gates and rate limits apply as on a node; awaits stay awaiting. See
    /// [`Engine::drain_with`].
    pub async fn drain(&self, queue: &str) -> Result<Drained> {
        self.drain_with(queue, DrainOptions::default()).await
    }

    /// [`Engine::drain`], with scheduled instances too, or a step limit.
    pub async fn drain_with(&self, queue: &str, options: DrainOptions) -> Result<Drained> {
        crate::validate::name("queue", queue)?;
        let ctx = &*self.ctx;
        // Its claims are a node's of their own, alive while the drain runs
        // (one per drain: a step may drain too, under `inline`).
        let node_id = format!("{}-drain-{:08x}", ctx.cfg.node_id, rand::random::<u32>());
        let max = options.max_steps.unwrap_or(DRAIN_MAX_STEPS);
        let result = drain(ctx, &node_id, queue, options.scheduled, max).await;
        ctx.pass()
            .call(async |c| ctx.store.forget_node(c, &node_id).await)
            .await?;
        result
    }

    /// The instances a query finds: for assertions in tests
    /// (`assert_inserted`-style helpers of the bindings use it).
    pub async fn inserted(&self, query: InsertedQuery) -> Result<Vec<Instance>> {
        let rows = sqlx::query(&self.ctx.store.sql.inserted)
            .bind(&query.workflow)
            .bind(&query.state)
            .bind(&query.queue)
            .bind(query.status.map(Status::as_str))
            .bind(query.limit.unwrap_or(1000))
            .fetch_all(&self.ctx.store.pool)
            .await?;
        rows.iter().map(instance_from_row).collect()
    }

    /// With [`crate::EngineBuilder::inline`]: drain the queues of what was
    /// just inserted.
    pub(super) async fn run_inline(&self, queues: Vec<String>) -> Result<()> {
        for q in queues {
            self.drain(&q).await?;
        }
        Ok(())
    }
}

async fn drain(
    ctx: &Context,
    node_id: &str,
    queue: &str,
    scheduled: bool,
    max_steps: usize,
) -> Result<Drained> {
    let mut done = Drained::default();
    let mut outcomes: Vec<OutcomeRow> = Vec::new();
    let mut ready: VecDeque<Claimed> = VecDeque::new();
    let mut beat_at: Option<Instant> = None;
    loop {
        // Heartbeat as a node would, so that no reaper takes the rows back.
        if beat_at.is_none_or(|t| t.elapsed() >= ctx.cfg.heartbeat_interval) {
            beat(ctx, node_id, queue).await?;
            beat_at = Some(Instant::now());
        }
        if scheduled {
            sqlx::query_scalar::<_, i64>(&ctx.store.sql.stage_queue)
                .bind(queue)
                .fetch_one(&ctx.store.pool)
                .await?;
        }
        // Record the outcomes so far and claim one more row, in one call.
        let want = usize::from(ready.is_empty() && done.steps < max_steps);
        let demand = [Demand {
            queue,
            rows: want,
            skip_pick: want == 0,
            reserve: false,
        }];
        let call = Call {
            node_id,
            notify: true,
            outcomes: &outcomes,
            demand: &demand,
            unreserve: &[],
        };
        let rows = ctx
            .store
            .handoff(&ctx.store.pool, &call, &ctx.limits)
            .await?;
        let (h, _) = read_handoff(&rows)?;
        let wrote = !outcomes.is_empty();
        outcomes.clear();
        ready.extend(h.claimed);
        let Some(mut row) = ready.pop_front() else {
            if scheduled && wrote {
                // The outcomes just written may have scheduled rows (a
                // retry, a snooze): staged at the top, claimed next round.
                continue;
            }
            return Ok(done);
        };
        if done.steps >= max_steps {
            // Over the limit: what was claimed goes back unstarted.
            outcomes.extend(std::iter::once(&row).chain(&ready).map(OutcomeRow::release));
            ready.clear();
            continue;
        }
        let Some(workflow) = ctx.workflows.get(&row.workflow).cloned() else {
            // The pick claims only registered workflows; never started.
            outcomes.push(OutcomeRow::release(&row));
            continue;
        };
        let (result, timed_out) = UserStep::new(&workflow, &mut row).run(&ctx.cfg, &row).await;
        let outcome = outcome_of(&ctx.cfg, &row, &*workflow, result, None, timed_out);
        done.count(&outcome);
        outcomes.push(outcome);
    }
}

async fn beat(ctx: &Context, node_id: &str, queue: &str) -> Result<()> {
    let beat = Beat {
        node_id,
        hostname: &crate::config::hostname(),
        queues: serde_json::json!({ queue: 1 }),
        workflows: serde_json::to_value(&ctx.limits.workflows).unwrap_or_default(),
        lease: ctx.cfg.lease.as_secs_f64(),
    };
    ctx.store.heartbeat(&ctx.store.pool, &beat).await?;
    Ok(())
}
