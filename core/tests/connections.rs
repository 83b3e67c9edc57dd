//! The claim path's connections are its own: work that takes every other
//! connection of the engine's pool (inserts, the dashboard, maintenance)
//! does not hold back claims and outcomes. It keeps them between calls, and
//! replaces one that broke meanwhile.
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
    insert_and_wait(&support::url(), &schema, 0, 200).await;
    hog.abort();
    let _ = hog.await;
    node.shutdown().await.unwrap();
}

/// Insert `n` rows by another engine and wait until they (and the `from`
/// rows before them) have completed.
async fn insert_and_wait(url: &str, schema: &str, from: i64, n: i64) {
    let client = support::builder(url, schema).build().await.unwrap();
    client
        .insert_many(
            (from..from + n)
                .map(|i| NewInstance::new("Noop", json!({ "i": i })))
                .collect(),
        )
        .await
        .unwrap();
    let observer = sqlx::PgPool::connect(url).await.unwrap();
    support::eventually("every step done", Duration::from_secs(60), || {
        let observer = &observer;
        async move { support::count(observer, schema, "completed").await == from + n }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_claim_connections_that_broke_are_replaced() {
    let schema = support::schema("kept");
    // The node's connections, and only they, carry this name.
    let name = format!("gd_{schema}");
    let base = support::url();
    let sep = if base.contains('?') { '&' } else { '?' };
    let node_url = format!("{base}{sep}application_name={name}");
    let node = support::builder(&node_url, &schema)
        .queue("default", 4)
        .workflow_fn("Noop", |_step, state, _ctx| async move {
            Ok(Transition::done(state))
        })
        .start()
        .await
        .unwrap();
    insert_and_wait(&base, &schema, 0, 100).await;

    // The server ends every connection of the node: the claim path's kept
    // ones among them (a picker's and the outcome writer's two).
    let admin = sqlx::PgPool::connect(&base).await.unwrap();
    let ended: i64 = sqlx::query_scalar(
        "WITH node AS MATERIALIZED (SELECT pid FROM pg_stat_activity WHERE application_name = $1) \
         SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM node",
    )
    .bind(&name)
    .fetch_one(&admin)
    .await
    .unwrap();
    assert!(ended >= 3, "the node held {ended} connections open");

    // Their next calls fail; the node replaces them and runs the rest.
    insert_and_wait(&base, &schema, 100, 200).await;
    node.shutdown().await.unwrap();
}
