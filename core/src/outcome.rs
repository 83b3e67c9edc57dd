//! Turning a step's transition into the row update that records it.

use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::transition::{KeyChange, Transition};
use crate::validate;
use crate::workflow::Workflow;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use std::time::Duration;

/// A row claimed by a pick, as the step runner sees it.
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    pub id: i64,
    pub workflow: String,
    pub step: String,
    pub state: Value,
    pub queue: String,
    pub attempt: i32,
    pub max_attempts: i32,
    pub concurrency_key: Option<String>,
    pub gate_shard: Option<i32>,
    pub rate_key: Option<String>,
    pub wake: Option<Value>,
    /// The claim token: bumped by every claim, reservation, handover and
    /// promotion of the row, never reused. Every write about this claim
    /// names it, so it applies to this claim and no later one.
    pub token: i64,
}

impl Claimed {
    /// A claim of no row (id 0): its outcome matches nothing.
    pub fn none() -> Claimed {
        Claimed {
            id: 0,
            workflow: String::new(),
            step: String::new(),
            state: Value::Null,
            queue: String::new(),
            attempt: 0,
            max_attempts: 1,
            concurrency_key: None,
            gate_shard: None,
            rate_key: None,
            wake: None,
            token: 0,
        }
    }
}

/// What the call recording a predecessor's outcome did with the successor
/// started in its slot: `Ok` promoted it; `Err` did not, and did not apply
/// the outcome either (an outcome naming a successor applies only with its
/// promotion), which is to be recorded alone once the successor has stopped.
pub(crate) type Admitted = std::result::Result<(), Box<OutcomeRow>>;

/// Tells a successor, started in its predecessor's slot, whether the call
/// recording the predecessor's outcome promoted it. Dropped unsettled (the
/// outcome was never written), it reads as not promoted.
#[derive(Debug, Default)]
pub(crate) struct Promotion(std::sync::Mutex<Option<tokio::sync::oneshot::Sender<Admitted>>>);

impl Promotion {
    pub fn new() -> (Promotion, tokio::sync::oneshot::Receiver<Admitted>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (Promotion(std::sync::Mutex::new(Some(tx))), rx)
    }

    /// Settle the promotion `outcome` carries, if any: promoted or not.
    pub fn settle(outcome: &OutcomeRow, promoted: bool) {
        let Some(p) = &outcome.promotion else {
            return;
        };
        let tx = p.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tx) = tx {
            let _ = tx.send(match promoted {
                true => Ok(()),
                false => Err(Box::new(outcome.alone())),
            });
        }
    }
}

/// One outcome, serialised into the batch the outcome statement reads with
/// `jsonb_to_recordset`. Field names match its column list. Empty fields are
/// left out (a missing field reads as NULL): PostgreSQL parses and sorts
/// every key it is sent, a tenth of its time on a run of no-op steps.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OutcomeRow {
    pub id: i64,
    /// The claim this outcome is about: it applies to no other.
    pub token: i64,
    #[serde(skip)]
    pub attempt: i32,
    pub kind: &'static str,
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<Value>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub set_key: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ckey: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rkey: Option<String>,
    /// Seconds: the delay of a scheduled row, or an await's timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    /// The key the claim holds and the gate shard it debited (none for
    /// K = 1): freed by this outcome, handed over or credited back. The
    /// outcome applies only while the row holds exactly these.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hkey: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gshard: Option<i32>,
    /// The reserved successor started in the slot this outcome frees, and
    /// the token of its reservation. The outcome applies only together with
    /// that successor's promotion.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ntoken: Option<i64>,
    /// Settled once the call carrying this outcome is written: the successor
    /// waits for it before its own outcome, and stops if not promoted.
    #[serde(skip)]
    pub promotion: Option<std::sync::Arc<Promotion>>,
    /// The claim's slot, carried to the writer so that the call recording
    /// this outcome can claim into it (a picker cannot take it meanwhile).
    #[serde(skip)]
    pub slot: Option<std::sync::Arc<tokio::sync::OwnedSemaphorePermit>>,
    #[serde(skip)]
    pub max_attempts: i32,
    #[serde(skip)]
    pub step_name: String,
    /// The claim's queue: the writer claims for that queue's freed slots.
    #[serde(skip)]
    pub queue: String,
}

impl OutcomeRow {
    fn base(c: &Claimed, kind: &'static str, status: &'static str) -> OutcomeRow {
        OutcomeRow {
            id: c.id,
            token: c.token,
            attempt: c.attempt,
            kind,
            status,
            step: None,
            state: None,
            set_key: false,
            ckey: None,
            rkey: None,
            delay: None,
            until: None,
            signal: None,
            error: None,
            hkey: c.concurrency_key.clone(),
            gshard: c.gate_shard,
            next: None,
            ntoken: None,
            promotion: None,
            slot: None,
            max_attempts: c.max_attempts,
            step_name: c.step.clone(),
            queue: c.queue.clone(),
        }
    }

    /// The database refused to record `o`: record an error instead, keeping the
    /// step and state, so the row is retried rather than stuck executing.
    pub fn refused(o: &OutcomeRow, message: &str) -> OutcomeRow {
        let last = o.attempt >= o.max_attempts;
        OutcomeRow {
            kind: "error",
            status: if last { "discarded" } else { "scheduled" },
            step: None,
            state: None,
            set_key: false,
            ckey: None,
            rkey: None,
            delay: (!last).then_some(5.0),
            until: None,
            signal: None,
            error: Some(json!({
                "kind": "outcome_refused",
                "step": o.step_name,
                "attempt": o.attempt,
                "message": format!("the database refused the step's {} outcome: {message}", o.kind),
            })),
            ..o.clone()
        }
    }

    /// For a row that holds no key and is done, or moves on to its next step
    /// now (no delay, key or rate limit): its next step (`None`: done) and
    /// its state. The call records these from typed arrays instead of its
    /// JSON (the common case, and the cheapest to apply: nothing freed,
    /// promoted or handed over).
    pub fn plain(&self) -> Option<(Option<&str>, &Value)> {
        let step = match (self.kind, self.status, &self.step) {
            ("done", "completed", None) => None,
            ("next", "available", Some(step)) => Some(step.as_str()),
            _ => return None,
        };
        let plain = !self.set_key
            && self.ckey.is_none()
            && self.rkey.is_none()
            && self.delay.is_none()
            && self.until.is_none()
            && self.signal.is_none()
            && self.error.is_none()
            && self.hkey.is_none()
            && self.gshard.is_none()
            && self.next.is_none()
            && self.ntoken.is_none();
        self.state
            .as_ref()
            .filter(|_| plain)
            .map(|state| (step, state))
    }

    /// This outcome without its successor, to record once a successor it
    /// named was not promoted (and has stopped).
    pub fn alone(&self) -> OutcomeRow {
        OutcomeRow {
            next: None,
            ntoken: None,
            promotion: None,
            slot: None,
            ..self.clone()
        }
    }

    /// Whether the row is runnable again right away.
    pub fn runnable_now(&self) -> bool {
        self.status == "available"
    }

    /// Hand a claimed row back untouched: it never started.
    pub fn release(c: &Claimed) -> OutcomeRow {
        OutcomeRow::base(c, "release", "available")
    }

    /// Record a failure that is not the step's own return value (a panic, a
    /// shutdown, an invalid transition): retried like any error.
    pub fn failure(c: &Claimed, cfg: &EngineConfig, kind: &str, message: String) -> OutcomeRow {
        let t = Transition::Error {
            reason: message,
            detail: None,
        };
        let mut row = OutcomeRow::from_transition_unchecked(c, cfg, None, t);
        if let Some(Value::Object(e)) = row.error.as_mut() {
            e.insert("kind".into(), Value::String(kind.to_owned()));
        }
        row
    }

    /// Build the outcome of a transition, or an error outcome saying why the
    /// transition itself is invalid (nothing is lost: the step is retried).
    pub fn from_transition(
        c: &Claimed,
        cfg: &EngineConfig,
        workflow: Option<&dyn Workflow>,
        t: Transition,
    ) -> OutcomeRow {
        match check(cfg, &t) {
            Ok(()) => OutcomeRow::from_transition_unchecked(c, cfg, workflow, t),
            Err(e) => OutcomeRow::failure(
                c,
                cfg,
                "invalid_transition",
                format!("the step returned an invalid {} transition: {e}", t.kind()),
            ),
        }
    }

    fn from_transition_unchecked(
        c: &Claimed,
        cfg: &EngineConfig,
        workflow: Option<&dyn Workflow>,
        t: Transition,
    ) -> OutcomeRow {
        let kind = t.kind();
        match t {
            Transition::Next {
                step,
                state,
                options,
            } => {
                let status = if options.delay.is_some_and(|d| !d.is_zero()) {
                    "scheduled"
                } else {
                    "available"
                };
                let mut row = OutcomeRow::base(c, kind, status);
                row.rkey = options
                    .rate_limit
                    .or_else(|| workflow.and_then(|w| w.rate_limit(&step, &state)));
                match options.concurrency_key {
                    KeyChange::Keep => {}
                    KeyChange::Release => row.set_key = true,
                    KeyChange::Set(k) => {
                        row.set_key = true;
                        row.ckey = Some(k.0);
                    }
                }
                row.delay = options.delay.map(|d| d.as_secs_f64());
                row.step = Some(step);
                row.state = Some(state);
                row
            }
            Transition::Done { state } => {
                let mut row = OutcomeRow::base(c, kind, "completed");
                row.state = Some(state);
                row
            }
            Transition::Await { step, state, on } => {
                let mut row = OutcomeRow::base(c, kind, "awaiting");
                row.rkey = workflow.and_then(|w| w.rate_limit(&step, &state));
                row.signal = on.signal;
                row.delay = on.timeout.map(|d| d.as_secs_f64());
                row.until = on.until;
                row.step = Some(step);
                row.state = Some(state);
                row
            }
            Transition::Snooze { delay } => {
                let mut row = OutcomeRow::base(c, kind, "scheduled");
                row.delay = Some(delay.as_secs_f64());
                row
            }
            Transition::Error { reason, detail } => {
                let last = c.attempt >= c.max_attempts;
                let mut row =
                    OutcomeRow::base(c, kind, if last { "discarded" } else { "scheduled" });
                if !last {
                    row.delay = Some(backoff(cfg, &c.workflow, c.attempt).as_secs_f64());
                }
                row.error = Some(json!({
                    "kind": "error",
                    "step": c.step,
                    "attempt": c.attempt,
                    "message": reason,
                    "detail": detail,
                }));
                row
            }
            Transition::Discard { reason } => {
                let mut row = OutcomeRow::base(c, kind, "discarded");
                row.error = Some(json!({
                    "kind": "discard",
                    "step": c.step,
                    "attempt": c.attempt,
                    "message": reason,
                }));
                row
            }
            Transition::Cancel { reason } => {
                let mut row = OutcomeRow::base(c, kind, "cancelled");
                row.error = Some(json!({"kind": "cancel", "step": c.step, "message": reason}));
                row
            }
        }
    }
}

/// Exponential backoff with jitter: base × 2^(attempt−1), capped, then scaled by
/// a random factor in [0.5, 1.0] so that a burst of failures spreads out. The
/// base and cap are the workflow's, else the engine's.
pub(crate) fn backoff(cfg: &EngineConfig, workflow: &str, attempt: i32) -> Duration {
    let (base, max) = cfg.backoff_for(workflow);
    let exp = attempt.clamp(1, 31) as u32 - 1;
    let raw = base.saturating_mul(2u32.saturating_pow(exp)).min(max);
    raw.mul_f64(0.5 + rand::random::<f64>() * 0.5)
}

/// Validate what a step returned, as strictly as an insert.
pub(crate) fn check(cfg: &EngineConfig, t: &Transition) -> Result<()> {
    match t {
        Transition::Next {
            step,
            state,
            options,
        } => {
            validate::name("step", step)?;
            validate::state("state", state)?;
            if let KeyChange::Set(k) = &options.concurrency_key {
                validate::key("concurrency_key", k.as_str())?;
            }
            if let Some(r) = &options.rate_limit {
                check_rate_key(cfg, r)?;
            }
        }
        Transition::Done { state } => validate::state("state", state)?,
        Transition::Await { step, state, on } => {
            validate::name("step", step)?;
            validate::state("state", state)?;
            if let Some(s) = &on.signal {
                validate::name("signal", s)?;
            }
            if on.signal.is_none() && on.timeout.is_none() && on.until.is_none() {
                return Err(Error::input(
                    "await",
                    "needs a signal, a timeout or an until time to wake on",
                ));
            }
        }
        Transition::Snooze { .. }
        | Transition::Error { .. }
        | Transition::Discard { .. }
        | Transition::Cancel { .. } => {}
    }
    Ok(())
}

/// A rate-limit key must be well formed and name a configured rate limit:
/// an unknown name would silently not be limited.
pub(crate) fn check_rate_key(cfg: &EngineConfig, key: &str) -> Result<()> {
    validate::key("rate_limit", key)?;
    if cfg.rate_for(key).is_none() {
        return Err(Error::input(
            "rate_limit",
            format!(
                "no rate limit named {:?} is configured (rate_limits: {:?})",
                validate::key_name(key),
                cfg.rates.keys().collect::<Vec<_>>()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{backoff, Claimed, OutcomeRow};
    use crate::config::EngineConfig;
    use crate::transition::{KeyChange, NextOptions, Transition};
    use crate::workflow::WorkflowDefaults;
    use serde_json::json;
    use std::time::Duration;

    /// Only outcomes that free, set or schedule nothing take the typed
    /// arrays: a keyless row done, or moved on to its next step now.
    #[test]
    fn only_keyless_rows_done_or_moved_on_now_are_plain() {
        let row = |key: Option<&str>| Claimed {
            id: 1,
            workflow: "W".into(),
            step: "a".into(),
            state: json!({}),
            queue: "default".into(),
            attempt: 1,
            max_attempts: 3,
            concurrency_key: key.map(Into::into),
            gate_shard: None,
            rate_key: None,
            wake: None,
            token: 1,
        };
        let mut cfg = EngineConfig::default();
        let rate = crate::config::RateConfig::new(5, Duration::from_secs(1));
        cfg.rates.insert("rl".into(), rate);
        let of = |key, t| OutcomeRow::from_transition(&row(key), &cfg, None, t);
        let next = |options| Transition::next_with("b", json!({"n": 1}), options);
        let plain = |o: &OutcomeRow| o.plain().map(|(step, _)| step.map(str::to_owned));

        assert_eq!(plain(&of(None, Transition::done(json!({})))), Some(None));
        let now = next(NextOptions::default());
        assert_eq!(plain(&of(None, now.clone())), Some(Some("b".into())));
        for (key, t) in [
            (Some("acct:1"), Transition::done(json!({}))),
            (Some("acct:1"), now),
            (
                None,
                next(NextOptions {
                    delay: Some(Duration::from_secs(1)),
                    ..Default::default()
                }),
            ),
            (
                None,
                next(NextOptions {
                    rate_limit: Some("rl:1".into()),
                    ..Default::default()
                }),
            ),
            (
                None,
                next(NextOptions {
                    concurrency_key: KeyChange::Release,
                    ..Default::default()
                }),
            ),
            (
                None,
                Transition::Snooze {
                    delay: Duration::from_secs(1),
                },
            ),
            (
                None,
                Transition::Error {
                    reason: "no".into(),
                    detail: None,
                },
            ),
        ] {
            assert_eq!(plain(&of(key, t.clone())), None, "{t:?} with key {key:?}");
        }
        assert_eq!(plain(&OutcomeRow::release(&row(None))), None);
    }

    /// A workflow's own backoff replaces the engine's for its errors only.
    #[test]
    fn errors_back_off_by_their_workflows_policy() {
        let ms = Duration::from_millis;
        let mut cfg = EngineConfig {
            backoff_base: ms(1000),
            backoff_max: ms(1_000_000),
            ..EngineConfig::default()
        };
        let defaults = WorkflowDefaults {
            backoff: Some((ms(10), ms(30))),
            ..Default::default()
        };
        cfg.workflow_defaults.insert("Charge".into(), defaults);
        for attempt in 1..=5 {
            // 10 ms doubling per attempt, capped at 30, times 0.5 to 1.
            let cap = ms(10 * 2u64.pow(attempt - 1)).min(ms(30));
            let d = backoff(&cfg, "Charge", attempt as i32);
            assert!(d >= cap / 2 && d <= cap, "attempt {attempt}: {d:?}");
            let d = backoff(&cfg, "Other", attempt as i32);
            let cap = ms(1000 * 2u64.pow(attempt - 1));
            assert!(d >= cap / 2 && d <= cap, "attempt {attempt}: {d:?}");
        }
    }
}
