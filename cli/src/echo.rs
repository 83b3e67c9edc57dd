//! The built-in `gendurable.Echo` workflow: `start` → `finish` → done, adding
//! `"ran_by": "rust"` to the state. Lets other languages check that what they
//! insert runs on a Rust node.

use anyhow::Result;
use gendurable::{Engine, Instance, Transition};
use serde_json::json;

pub const ECHO: &str = "gendurable.Echo";

/// Run the node until `interrupted` (Ctrl-C) completes or SIGTERM arrives,
/// then shut it down gracefully.
pub async fn run(
    url: &str,
    schema: &str,
    queue: &str,
    concurrency: u32,
    interrupted: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let engine = Engine::builder()
        .url(url)
        .schema(schema)
        .queue(queue, concurrency)
        .workflow_fn(ECHO, |step, mut state, ctx| async move {
            Ok(match step.as_str() {
                "start" => Transition::next("finish", state),
                _ => {
                    state["ran_by"] = json!("rust");
                    state["echo_id"] = json!(ctx.id);
                    Transition::done(state)
                }
            })
        })
        .start()
        .await?;
    eprintln!(
        "echo node {} running; SIGTERM or Ctrl-C stops it",
        engine.node_id()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = interrupted => {}
        _ = term.recv() => {}
    }
    engine.shutdown().await?;
    Ok(())
}

pub fn instance_json(i: &Instance) -> serde_json::Value {
    json!({
        "id": i.id,
        "workflow": i.workflow,
        "step": i.step,
        "state": i.state,
        "queue": i.queue,
        "priority": i.priority,
        "status": i.status.as_str(),
        "concurrency_key": i.concurrency_key,
        "rate_limit": i.rate_limit,
        "attempt": i.attempt,
        "max_attempts": i.max_attempts,
        "errors": i.errors,
        "inserted_at": i.inserted_at,
        "scheduled_at": i.scheduled_at,
        "finished_at": i.finished_at,
    })
}
