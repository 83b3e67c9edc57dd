//! Workflows: the user code a node runs for each step.

use crate::error::{Error, Result};
use crate::transition::{Transition, Wake};
use crate::validate;
use async_trait::async_trait;
use futures::future::BoxFuture;
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// An error returned by a step; recorded as an `error` transition.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a step returns: a transition, or an error (retried with backoff).
pub type StepResult = std::result::Result<Transition, BoxError>;

/// What a workflow's instances get when their insert does not say, and how
/// its errors are retried: declared once per workflow with
/// [`crate::EngineBuilder::workflow_defaults`] (`use GenDurable,
/// max_attempts: 5` in Elixir, `@engine.workflow(max_attempts=5)` in
/// Python). Each is applied where the engine knows the workflow: inserts
/// through an engine that registered it, retries on the nodes that run it.
///
/// ```
/// use gendurable::WorkflowDefaults;
/// use std::time::Duration;
/// let charge = WorkflowDefaults {
///     queue: Some("billing".into()),
///     max_attempts: Some(5),
///     backoff: Some((Duration::from_secs(10), Duration::from_secs(600))),
///     ..Default::default()
/// };
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkflowDefaults {
    /// The queue of an insert that names none (else `"default"`).
    pub queue: Option<String>,
    /// The priority of an insert that names none (else 0).
    pub priority: Option<i16>,
    /// Attempts per step of an insert that names none (else 20).
    pub max_attempts: Option<i32>,
    /// Retry backoff (base, max) of this workflow's errors (else the
    /// engine's).
    pub backoff: Option<(Duration, Duration)>,
    /// How long one of its steps may run before it is stopped and recorded
    /// as an error of kind `timeout` (retried like any error); a step's own
    /// ([`crate::EngineBuilder::step_timeout`]) wins. None: no limit.
    pub timeout: Option<Duration>,
}

impl WorkflowDefaults {
    /// Checks the values by the rules an insert's follow.
    pub(crate) fn validate(&self, workflow: &str) -> Result<()> {
        let at = |e: Error| Error::config(format!("workflow_defaults {workflow:?}: {e}"));
        if let Some(q) = &self.queue {
            validate::name("queue", q).map_err(at)?;
        }
        if let Some(p) = self.priority {
            validate::priority("priority", p).map_err(at)?;
        }
        if let Some(n) = self.max_attempts {
            validate::max_attempts("max_attempts", n).map_err(at)?;
        }
        if self.timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::config(format!(
                "workflow_defaults {workflow:?}: timeout must be longer than zero"
            )));
        }
        if let Some((base, max)) = self.backoff {
            if base.is_zero() || max < base {
                return Err(Error::config(format!(
                    "workflow_defaults {workflow:?}: backoff base must be longer than zero and \
                     max at least base, got {base:?} and {max:?}"
                )));
            }
        }
        Ok(())
    }
}

/// A workflow: one `step` function called with the current step's name.
///
/// ```
/// use gendurable::{StepContext, StepResult, Transition, Workflow};
/// use serde_json::{json, Value};
///
/// struct Greet;
///
/// #[gendurable::async_trait]
/// impl Workflow for Greet {
///     async fn step(&self, step: &str, state: Value, _ctx: StepContext) -> StepResult {
///         match step {
///             "start" => Ok(Transition::next("finish", json!({"hello": state["name"]}))),
///             _ => Ok(Transition::done(state)),
///         }
///     }
/// }
/// ```
#[async_trait]
pub trait Workflow: Send + Sync + 'static {
    /// Run one step. A panic is caught and recorded as an error.
    async fn step(&self, step: &str, state: Value, ctx: StepContext) -> StepResult;

    /// A rate-limit key declared for a step, applied whenever the instance
    /// moves to that step (or is inserted at it) without an explicit one.
    fn rate_limit(&self, _step: &str, _state: &Value) -> Option<String> {
        None
    }

    /// The workflow's own defaults (queue, priority, attempts, backoff,
    /// timeout), as [`crate::EngineBuilder::workflow_defaults`] would give
    /// them; that call, when made too, wins.
    fn defaults(&self) -> WorkflowDefaults {
        WorkflowDefaults::default()
    }

    /// Whether this workflow's steps are answered on threads the engine's
    /// runtime does not own (a language binding's), inside
    /// [`crate::handover`]: its step tasks then run where they are woken,
    /// so that the answer's own call ends the step and starts the next.
    /// Steps that run on the runtime (the default) gain nothing from it.
    fn hands_over(&self) -> bool {
        false
    }
}

/// Everything a step may want to know about the instance it runs for.
#[derive(Debug, Clone)]
pub struct StepContext {
    /// The instance id.
    pub id: i64,
    /// The workflow name.
    pub workflow: String,
    /// The queue it runs in.
    pub queue: String,
    /// This step's attempt, from 1.
    pub attempt: i32,
    /// Attempts allowed per step.
    pub max_attempts: i32,
    /// The concurrency key held while this step runs.
    pub concurrency_key: Option<String>,
    /// The rate-limit key this step was admitted under.
    pub rate_limit: Option<String>,
    /// Why the step was woken, when it follows an await.
    pub wake: Option<Wake>,
}

type StepFn =
    dyn Fn(String, Value, StepContext) -> BoxFuture<'static, StepResult> + Send + Sync + 'static;

/// A workflow made of a closure: `|step, state, ctx| async move { ... }`.
pub struct FnWorkflow(Arc<StepFn>);

impl FnWorkflow {
    /// Wrap a closure returning a future.
    pub fn new<F, Fut>(f: F) -> Self
    where
        F: Fn(String, Value, StepContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = StepResult> + Send + 'static,
    {
        FnWorkflow(Arc::new(move |step, state, ctx| {
            Box::pin(f(step, state, ctx))
        }))
    }
}

#[async_trait]
impl Workflow for FnWorkflow {
    async fn step(&self, step: &str, state: Value, ctx: StepContext) -> StepResult {
        (self.0)(step.to_owned(), state, ctx).await
    }
}

/// A workflow with rate-limit keys declared per step in the builder
/// ([`crate::EngineBuilder::step_rate_limit`]), for workflows that cannot
/// override [`Workflow::rate_limit`] (those of the language bindings).
pub(crate) struct WithStepRates {
    pub inner: Arc<dyn Workflow>,
    pub steps: std::collections::HashMap<String, String>,
}

#[async_trait]
impl Workflow for WithStepRates {
    async fn step(&self, step: &str, state: Value, ctx: StepContext) -> StepResult {
        self.inner.step(step, state, ctx).await
    }

    fn rate_limit(&self, step: &str, state: &Value) -> Option<String> {
        self.inner
            .rate_limit(step, state)
            .or_else(|| self.steps.get(step).cloned())
    }

    fn hands_over(&self) -> bool {
        self.inner.hands_over()
    }
}
