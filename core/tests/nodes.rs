//! Several engine nodes on one database: no instance runs twice at once and
//! every instance reaches a terminal state exactly once.
mod support;

use gendurable::{Engine, NewInstance, Transition};
use serde_json::json;
use std::time::Duration;
use support::Observer;

async fn node(url: &str, schema: &str, obs: Observer) -> Engine {
    support::builder(url, schema)
        .queue("default", 10)
        .workflow_fn("Two", move |step, state, ctx| {
            let obs = obs.clone();
            async move {
                let key = ctx.id.to_string();
                obs.record(ctx.id, &key, "start", &step).await;
                tokio::time::sleep(Duration::from_micros(rand::random::<u64>() % 2000)).await;
                obs.record(ctx.id, &key, "end", &step).await;
                Ok(match step.as_str() {
                    "start" => Transition::next("finish", state),
                    _ => Transition::done(state),
                })
            }
        })
        .start()
        .await
        .unwrap()
}

async fn run(nodes: usize, instances: usize) {
    let url = support::url();
    let schema = support::schema(&format!("nodes{nodes}"));
    let obs = Observer::new(&url, &schema).await;
    let mut engines = Vec::new();
    for _ in 0..nodes {
        engines.push(node(&url, &schema, obs.clone()).await);
    }
    let news = (0..instances)
        .map(|i| NewInstance::new("Two", json!({ "i": i })))
        .collect();
    let ids = engines[0].insert_many(news).await.unwrap();
    let pool = engines[0].pool().clone();
    support::wait_count(&pool, &schema, "completed", instances as i64).await;

    let mut outcomes = 0;
    for e in &engines {
        // Stopped first: a node's last call may have committed (the rows
        // show completed) before the node read its answer and counted it.
        e.shutdown().await.unwrap();
        let s = e.stats().snapshot();
        assert!(s.claimed > 0, "every node took part: {s:?}");
        outcomes += s.outcomes;
    }
    // Two steps per instance, each outcome written once.
    assert_eq!(outcomes, 2 * instances as u64);
    let overlap = obs.max_per_key().await;
    assert_eq!(overlap.len(), instances);
    assert!(
        overlap.values().all(|&m| m == 1),
        "an instance ran twice at once"
    );
    let ends = obs.ends_of("finish").await;
    assert_eq!(ends.len(), instances);
    assert!(ids.iter().all(|id| ends.get(id) == Some(&1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_run_each_instance_once() {
    run(2, 1500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_run_each_instance_once() {
    run(3, 1500).await;
}
