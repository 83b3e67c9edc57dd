//! The claim path's connections are its own: work that takes every other
//! connection of the engine's pool (inserts, the dashboard, maintenance)
//! does not hold back claims and outcomes.
mod support;

use gendurable::{NewInstance, Transition};
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_run_while_every_other_connection_is_taken() {
    let schema = support::schema("connections");
    // One queue: a picker's connection and two for the outcome writer's
    // calls are the claim path's; the other three are the engine's pool.
    let engine = support::builder(&support::url(), &schema)
        .queue("default", 4)
        .max_connections(6)
        .workflow_fn("Noop", |_step, state, _ctx| async move {
            Ok(Transition::done(state))
        })
        .build()
        .await
        .unwrap();
    let n = 200;
    engine
        .insert_many(
            (0..n)
                .map(|i| NewInstance::new("Noop", json!({ "i": i })))
                .collect(),
        )
        .await
        .unwrap();
    engine.start().await.unwrap();
    let mut taken = Vec::new();
    for _ in 0..3 {
        taken.push(engine.pool().acquire().await.unwrap());
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(100), engine.pool().acquire())
            .await
            .is_err(),
        "the engine's pool has no connection left"
    );

    let observer = sqlx::PgPool::connect(&support::url()).await.unwrap();
    support::eventually("every step done", Duration::from_secs(60), || {
        let (observer, schema) = (&observer, &schema);
        async move { support::count(observer, schema, "completed").await == n }
    })
    .await;
    drop(taken);
    engine.shutdown().await.unwrap();
}
