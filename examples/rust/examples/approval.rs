//! A refund waits for a human's approval (a durable signal: sent before the
//! refund reaches its await, it is kept and delivered when it does), then
//! pays through a partner whose calls are cut off after two seconds (a step
//! timeout), with the workflow's own retry defaults; a refund the partner
//! refuses for good is discarded at once. The same workflow is then
//! exercised the way a test would: built but not started, inserted, and
//! drained in the calling task.
//!
//! `cargo run -p gendurable-examples --example approval`
//! (a throwaway PostgreSQL unless DATABASE_URL is set)

use gendurable::{
    AwaitOn, Delivery, Engine, NewInstance, Status, Transition, Wake, WorkflowDefaults,
};
use gendurable_testing::database_url_or_temp;
use serde_json::json;
use sqlx::Executor;
use std::time::Duration;

fn refunds(url: &str, schema: &str) -> gendurable::EngineBuilder {
    Engine::builder()
        .url(url)
        .schema(schema)
        .queue("default", 4)
        .workflow_fn("Refund", |step, mut state, ctx| async move {
            Ok(match step.as_str() {
                "start" => Transition::await_on(
                    "pay",
                    state,
                    AwaitOn::signal("approved").or_timeout(Duration::from_secs(3600)),
                ),
                "pay" => {
                    if let Some(Wake::Signal { payload, .. }) = ctx.wake {
                        state["approved_by"] = payload["by"].clone();
                    }
                    if state["order"] == json!(0) {
                        // No retry can change this answer.
                        return Ok(Transition::discard("the partner has no order 0"));
                    }
                    // The partner's call: a slow one would be stopped at the
                    // step's timeout and retried.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    state["paid"] = json!(true);
                    Transition::done(state)
                }
                _ => Transition::discard(format!("unknown step {step}")),
            })
        })
        .step_timeout("Refund", "pay", Duration::from_secs(2))
        .workflow_defaults(
            "Refund",
            WorkflowDefaults {
                max_attempts: Some(5),
                backoff: Some((Duration::from_secs(1), Duration::from_secs(60))),
                ..Default::default()
            },
        )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (url, _pg) = database_url_or_temp().await?;
    let admin = sqlx::PgPool::connect(&url).await?;
    for schema in ["example_approval", "example_approval_test"] {
        admin
            .execute(format!("DROP SCHEMA IF EXISTS {schema} CASCADE").as_str())
            .await?;
    }

    // On a running node: the approval may come before the await.
    let engine = refunds(&url, "example_approval").start().await?;
    let id = engine
        .insert(NewInstance::new("Refund", json!({"order": 42})))
        .await?;
    let delivery = engine.send(id, "approved", json!({"by": "ana"})).await?;
    println!("approval sent: {delivery:?}");
    anyhow::ensure!(matches!(delivery, Delivery::Woken | Delivery::Kept));
    let done = loop {
        let i = engine.get(id).await?;
        if i.status.is_final() {
            break i;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!("refund {id}: {} {}", done.status, done.state);
    anyhow::ensure!(done.status == Status::Completed && done.state["approved_by"] == "ana");
    engine.shutdown().await?;

    // As a test: nothing started, every step run by drain in this task.
    let engine = refunds(&url, "example_approval_test").build().await?;
    let id = engine
        .insert(NewInstance::new("Refund", json!({"order": 43})))
        .await?;
    let first = engine.drain("default").await?;
    println!("drained: {first:?}");
    anyhow::ensure!(first.awaiting == 1);
    engine.send(id, "approved", json!({"by": "test"})).await?;
    let second = engine.drain("default").await?;
    println!("drained: {second:?}");
    anyhow::ensure!(second.completed == 1);
    // Refused for good: discarded at once, whatever attempts are left.
    let refused = engine
        .insert(NewInstance::new("Refund", json!({"order": 0})))
        .await?;
    engine
        .send(refused, "approved", json!({"by": "test"}))
        .await?;
    let third = engine.drain("default").await?;
    let i = engine.get(refused).await?;
    println!(
        "refund {refused}: {} after {} attempt(s)",
        i.status, i.attempt
    );
    anyhow::ensure!(third.discarded == 1 && i.status == Status::Discarded && i.max_attempts == 5);
    Ok(())
}
