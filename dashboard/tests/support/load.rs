//! A cluster with something to look at: a node running workflows that hold
//! K = 1 keys, fill a gate, hit a rate limit, fail, await a signal; and rows
//! no node runs. Shared by the dashboard's tests and its `load` example.
#![allow(dead_code)]

use gendurable::{
    AwaitOn, Engine, GateConfig, NewInstance, RateConfig, Transition, WorkflowDefaults,
};
use serde_json::json;
use std::time::Duration;

/// What [`start`] inserted, by what each shows.
pub struct Seeded {
    /// account:7's five syncs: the first holds the key.
    pub key_syncs: Vec<i64>,
    /// Charges through the gate `stripe:acme` (limit 3).
    pub charges: Vec<i64>,
    /// Summaries under the rate limit `openai` (one start a minute).
    pub summaries: Vec<i64>,
    /// Imports that fail every attempt (two) and are discarded.
    pub failing: Vec<i64>,
    /// Approvals awaiting the signal `approved`.
    pub approvals: Vec<i64>,
    /// A workflow no node runs.
    pub orphan: i64,
}

/// A started node on `schema` whose steps take `hold` (long: the picture
/// stays still for a test; short: it moves, for a demo), and the rows above.
pub async fn start(url: &str, schema: &str, hold: Duration) -> (Engine, Seeded) {
    let pause = move || tokio::time::sleep(hold);
    let engine = Engine::builder()
        .url(url)
        .schema(schema)
        .node_id("node-a")
        .queue("default", 10)
        .queue("billing", 5)
        .concurrency_limit("stripe", GateConfig::new(3))
        .rate_limit("openai", RateConfig::new(1, Duration::from_secs(60)))
        .backoff(Duration::from_millis(50), Duration::from_millis(100))
        .shutdown_timeout(Duration::from_millis(200))
        .workflow_fn("Account.Sync", move |step, state, _| async move {
            pause().await;
            Ok(match step.as_str() {
                "start" => Transition::next("push", state),
                _ => Transition::done(state),
            })
        })
        .workflow_fn("Charge", move |_, state, _| async move {
            pause().await;
            Ok(Transition::done(state))
        })
        .workflow_fn("Summarize", |_, state, _| async move {
            Ok(Transition::done(state))
        })
        .workflow_fn("Import", |_, state, _| async move {
            Ok(Transition::Error {
                reason: format!(
                    "upstream refused file {}: 503 Service Unavailable",
                    state["file"]
                ),
                detail: Some(
                    "Import.fetch/2 at lib/import.ex:42\nImport.run/1 at lib/import.ex:17".into(),
                ),
            })
        })
        .workflow_defaults(
            "Import",
            WorkflowDefaults {
                max_attempts: Some(2),
                ..Default::default()
            },
        )
        .workflow_fn("Approval", |step, state, _| async move {
            Ok(match step.as_str() {
                "start" => Transition::await_on("approved", state, AwaitOn::signal("approved")),
                _ => Transition::done(state),
            })
        })
        .start()
        .await
        .expect("start the node");
    let many = |n: usize, f: &dyn Fn(usize) -> NewInstance| (0..n).map(f).collect::<Vec<_>>();
    let key_syncs = engine
        .insert_many(many(5, &|i| {
            NewInstance::new("Account.Sync", json!({ "account": 7, "n": i }))
                .concurrency_key("account:7")
        }))
        .await
        .expect("insert");
    let charges = engine
        .insert_many(many(8, &|i| {
            NewInstance::new("Charge", json!({ "amount": 100 * (i + 1) }))
                .queue("billing")
                .concurrency_key("stripe:acme")
        }))
        .await
        .expect("insert");
    let summaries = engine
        .insert_many(many(4, &|i| {
            NewInstance::new("Summarize", json!({ "doc": i })).rate_limit("openai")
        }))
        .await
        .expect("insert");
    let failing = engine
        .insert_many(many(2, &|i| {
            NewInstance::new("Import", json!({ "file": format!("batch-{i}.csv") }))
        }))
        .await
        .expect("insert");
    let approvals = engine
        .insert_many(many(2, &|i| {
            NewInstance::new("Approval", json!({ "refund": i }))
        }))
        .await
        .expect("insert");
    let orphan = engine
        .insert(NewInstance::new("Legacy.Report", json!({})))
        .await
        .expect("insert");
    (
        engine,
        Seeded {
            key_syncs,
            charges,
            summaries,
            failing,
            approvals,
            orphan,
        },
    )
}
