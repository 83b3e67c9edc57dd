//! Workflows: the user code a node runs for each step.

use crate::transition::{Transition, Wake};
use async_trait::async_trait;
use futures::future::BoxFuture;
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;

/// An error returned by a step; recorded as an `error` transition.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a step returns: a transition, or an error (retried with backoff).
pub type StepResult = Result<Transition, BoxError>;

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
}
