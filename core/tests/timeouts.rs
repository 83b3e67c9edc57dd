//! Step timeouts and cancellation that stops the step: the step's future is
//! dropped (an async step stops at its next await), the outcome is an error
//! of kind `timeout` (retried) or the cancellation.

mod support;

use gendurable::{Cancelled, NewInstance, Status, Transition, WorkflowDefaults};
use serde_json::json;
use std::time::Duration;
use tokio::sync::mpsc;

/// Sends on drop: proof that a step's future was dropped, not left running.
struct Dropped(mpsc::UnboundedSender<i64>, i64);

impl Drop for Dropped {
    fn drop(&mut self) {
        let _ = self.0.send(self.1);
    }
}

fn kinds(i: &gendurable::Instance) -> Vec<String> {
    i.errors
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[tokio::test]
async fn a_step_past_its_timeout_is_stopped_and_retried() {
    let url = support::url();
    let schema = support::schema("timeouts");
    let (dropped, mut drops) = mpsc::unbounded_channel();
    let engine = support::builder(&url, &schema)
        .queue("default", 4)
        .backoff(Duration::from_millis(10), Duration::from_millis(10))
        // Hangs on its first attempt, finishes on its second.
        .workflow_fn("Flaky", {
            let dropped = dropped.clone();
            move |_, state, ctx| {
                let guard = Dropped(dropped.clone(), ctx.id);
                async move {
                    if ctx.attempt == 1 {
                        std::future::pending::<()>().await;
                    }
                    drop(guard);
                    Ok(Transition::done(state))
                }
            }
        })
        // Always hangs: the workflow's timeout, twice, then discarded.
        .workflow_fn("Stuck", {
            let dropped = dropped.clone();
            move |_, _, ctx| {
                let guard = Dropped(dropped.clone(), ctx.id);
                async move {
                    std::future::pending::<()>().await;
                    drop(guard);
                    unreachable!()
                }
            }
        })
        .workflow_defaults(
            "Stuck",
            WorkflowDefaults {
                timeout: Some(Duration::from_millis(100)),
                max_attempts: Some(2),
                ..Default::default()
            },
        )
        // The step's own timeout wins over the workflow's (none here).
        .step_timeout("Flaky", "start", Duration::from_millis(100))
        .start()
        .await
        .unwrap();

    let flaky = engine
        .insert(NewInstance::new("Flaky", json!({})))
        .await
        .unwrap();
    let stuck = engine
        .insert(NewInstance::new("Stuck", json!({})))
        .await
        .unwrap();
    let f = support::wait_final(&engine, flaky).await;
    assert_eq!(f.status, Status::Completed);
    assert_eq!(kinds(&f), ["timeout"]);
    assert_eq!(
        f.errors[0]["message"],
        "step \"start\" timed out after 100ms"
    );
    let s = support::wait_final(&engine, stuck).await;
    assert_eq!(s.status, Status::Discarded);
    assert_eq!(kinds(&s), ["timeout", "timeout"]);
    // Every attempt's future was dropped: the hung ones by the timeout.
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(drops.recv().await.unwrap());
    }
    seen.sort();
    assert_eq!(seen, [flaky, flaky, stuck, stuck]);
    engine.shutdown().await.unwrap();
}

/// A step that never awaits cannot be stopped; one that returns past its
/// timeout is recorded as timed out all the same (docs/operations.md).
#[tokio::test]
async fn a_step_that_returns_past_its_timeout_without_awaiting_timed_out() {
    let url = support::url();
    let schema = support::schema("timeouts_blocking");
    let engine = support::builder(&url, &schema)
        .queue("default", 2)
        .backoff(Duration::from_millis(10), Duration::from_millis(10))
        // Blocks its thread past the timeout on its first attempt.
        .workflow_fn("Blocking", |_, state, ctx| async move {
            if ctx.attempt == 1 {
                std::thread::sleep(Duration::from_millis(200));
            }
            Ok(Transition::done(state))
        })
        .step_timeout("Blocking", "start", Duration::from_millis(20))
        .start()
        .await
        .unwrap();
    let id = engine
        .insert(NewInstance::new("Blocking", json!({})))
        .await
        .unwrap();
    let i = support::wait_final(&engine, id).await;
    assert_eq!(i.status, Status::Completed);
    assert_eq!(kinds(&i), ["timeout"]);
    engine.shutdown().await.unwrap();
}

/// A node (heartbeat every `heartbeat`, if given) running one `Forever` instance,
/// whose step never returns: the node, the instance, and a receiver told
/// when the step's future is dropped.
async fn running_forever(
    schema: &str,
    heartbeat: Option<Duration>,
) -> (gendurable::Engine, i64, mpsc::UnboundedReceiver<i64>) {
    let (started, mut starts) = mpsc::unbounded_channel();
    let (dropped, drops) = mpsc::unbounded_channel();
    let mut builder = support::builder(&support::url(), schema).queue("default", 2);
    if let Some(h) = heartbeat {
        builder = builder.heartbeat_interval(h);
    }
    let engine = builder
        .workflow_fn("Forever", move |_, _, ctx| {
            let guard = Dropped(dropped.clone(), ctx.id);
            let started = started.clone();
            async move {
                let _ = started.send(ctx.id);
                std::future::pending::<()>().await;
                drop(guard);
                unreachable!()
            }
        })
        .start()
        .await
        .unwrap();
    let id = engine
        .insert(NewInstance::new("Forever", json!({})))
        .await
        .unwrap();
    assert_eq!(starts.recv().await, Some(id));
    (engine, id, drops)
}

/// The step of `id` was stopped and its outcome records the cancellation.
async fn stopped_as_cancelled(
    engine: gendurable::Engine,
    id: i64,
    mut drops: mpsc::UnboundedReceiver<i64>,
) {
    let dropped = tokio::time::timeout(Duration::from_secs(60), drops.recv())
        .await
        .expect("the step was stopped");
    assert_eq!(dropped, Some(id), "the step's future was dropped");
    let i = support::wait_final(&engine, id).await;
    assert_eq!(i.status, Status::Cancelled);
    assert_eq!(kinds(&i), ["cancel", "cancel"]);
    engine.shutdown().await.unwrap();
}

#[tokio::test]
async fn cancelling_an_executing_instance_stops_its_step() {
    let schema = support::schema("cancel_running");
    let (engine, id, drops) = running_forever(&schema, None).await;
    assert_eq!(engine.cancel(id).await.unwrap(), Cancelled::AtOutcome);
    stopped_as_cancelled(engine, id, drops).await;
}

/// The nodes hear of a cancellation on a channel; one sent while a node was
/// not listening (starting, or reconnecting its LISTEN connection) is lost.
/// Flagged in the row without a word on the channel, the cancellation still
/// stops the step: the node looks for its running steps' cancellations with
/// each heartbeat.
#[tokio::test]
async fn a_cancellation_the_node_did_not_hear_stops_its_step_at_a_heartbeat() {
    let schema = support::schema("cancel_unheard");
    let (engine, id, drops) = running_forever(&schema, Some(Duration::from_millis(200))).await;
    // What `cancel` writes, without its notification.
    sqlx::query(&format!(
        "UPDATE \"{schema}\".instances SET cancel_requested = true,
                errors = errors || jsonb_build_array(jsonb_build_object(
                    'kind', 'cancel', 'message', 'unheard', 'at', now()))
         WHERE id = $1"
    ))
    .bind(id)
    .execute(engine.pool())
    .await
    .unwrap();
    stopped_as_cancelled(engine, id, drops).await;
}

#[tokio::test]
async fn timeouts_are_checked_with_the_configuration() {
    let url = support::url();
    let schema = support::schema("timeouts_bad");
    let b = || {
        support::builder(&url, &schema)
            .queue("default", 1)
            .workflow_fn("W", |_, s, _| async { Ok(Transition::done(s)) })
    };
    let err = |b: gendurable::EngineBuilder| b.validate().unwrap_err().to_string();
    assert_eq!(
        err(b().step_timeout("Nope", "start", Duration::from_secs(1))),
        "invalid configuration: step_timeout: no workflow named \"Nope\" is registered"
    );
    assert_eq!(
        err(b().step_timeout("W", "start", Duration::ZERO)),
        "invalid configuration: step_timeout \"W\"/\"start\": must be longer than zero"
    );
    assert_eq!(
        err(b().workflow_defaults(
            "W",
            WorkflowDefaults {
                timeout: Some(Duration::ZERO),
                ..Default::default()
            }
        )),
        "invalid configuration: workflow_defaults \"W\": timeout must be longer than zero"
    );
}
