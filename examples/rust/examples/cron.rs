//! A periodic workflow: a heartbeat report every two seconds, inserted once
//! per tick by whichever of two nodes gets there first.
//!
//! `cargo run -p gendurable-examples --example cron`
//! (a throwaway PostgreSQL unless DATABASE_URL is set)

use gendurable::{CronEntry, Engine, NewInstance, Transition};
use gendurable_testing::database_url_or_temp;
use serde_json::json;
use sqlx::Executor;
use tokio::sync::mpsc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (url, _pg) = database_url_or_temp().await?;
    sqlx::PgPool::connect(&url)
        .await?
        .execute("DROP SCHEMA IF EXISTS example_cron CASCADE")
        .await?;
    let (ran, mut reports) = mpsc::unbounded_channel();
    let mut nodes = Vec::new();
    for node in ["a", "b"] {
        let ran = ran.clone();
        let engine = Engine::builder()
            .url(&url)
            .schema("example_cron")
            .node_id(format!("node-{node}"))
            .queue("default", 2)
            .workflow_fn("Heartbeat", move |_step, state, ctx| {
                let ran = ran.clone();
                async move {
                    let _ = ran.send((ctx.id, node));
                    Ok(Transition::done(state))
                }
            })
            // Six fields: seconds first.
            .cron(CronEntry::new(
                "*/2 * * * * *",
                NewInstance::new("Heartbeat", json!({})),
            ))
            .start()
            .await?;
        nodes.push(engine);
    }
    for _ in 0..3 {
        if let Some((id, node)) = reports.recv().await {
            let i = nodes[0].get(id).await?;
            println!(
                "tick inserted at {} ran on node {node} (#{id})",
                i.inserted_at.format("%H:%M:%S%.3f")
            );
        }
    }
    for n in nodes {
        n.shutdown().await?;
    }
    Ok(())
}
