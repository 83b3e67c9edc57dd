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
    let node = support::builder(&support::url(), &schema)
        .queue("default", 4)
        .max_connections(6)
        .workflow_fn("Noop", |_step, state, _ctx| async move {
            Ok(Transition::done(state))
        })
        .start()
        .await
        .unwrap();

    // Every connection of the node's pool taken, and each one that comes
    // free taken again, for as long as the test runs.
    let hog = tokio::spawn({
        let pool = node.pool().clone();
        async move {
            let mut held = Vec::new();
            loop {
                if let Ok(c) = pool.acquire().await {
                    held.push(c);
                }
            }
        }
    });
    let pool = node.pool().clone();
    support::eventually(
        "the node's pool has no connection left",
        Duration::from_secs(30),
        || {
            let pool = pool.clone();
            async move { pool.size() == 3 && pool.num_idle() == 0 }
        },
    )
    .await;

    // Rows inserted by another engine from now on: only the claim path's
    // own connections can claim and record them.
    let client = support::builder(&support::url(), &schema)
        .build()
        .await
        .unwrap();
    let n = 200;
    client
        .insert_many(
            (0..n)
                .map(|i| NewInstance::new("Noop", json!({ "i": i })))
                .collect(),
        )
        .await
        .unwrap();
    let observer = sqlx::PgPool::connect(&support::url()).await.unwrap();
    support::eventually("every step done", Duration::from_secs(60), || {
        let (observer, schema) = (&observer, &schema);
        async move { support::count(observer, schema, "completed").await == n }
    })
    .await;
    hog.abort();
    let _ = hog.await;
    node.shutdown().await.unwrap();
}
