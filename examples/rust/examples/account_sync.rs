//! Account syncs: one at a time per account (a K = 1 key), pushing to a
//! partner through a gate of 3, then waiting for the partner's webhook (an
//! await on a signal) before finishing.
//!
//! `cargo run -p gendurable-examples --example account_sync`
//! (a throwaway PostgreSQL unless DATABASE_URL is set)

use gendurable::{
    AwaitOn, ConcurrencyKey, Engine, GateConfig, KeyChange, NewInstance, NextOptions, Status,
    Transition, Wake,
};
use gendurable_testing::database_url_or_temp;
use serde_json::json;
use std::time::Duration;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (url, _pg) = database_url_or_temp().await?;
    let engine = Engine::builder()
        .url(url)
        .schema("example_sync")
        .queue("default", 10)
        .concurrency_limit("partner", GateConfig::new(3))
        .workflow_fn("Account.Sync", |step, mut state, ctx| async move {
            Ok(match step.as_str() {
                "start" => {
                    state["fetched"] = json!(true);
                    // Switch from the account's key to the partner gate.
                    Transition::next_with(
                        "push",
                        state,
                        NextOptions {
                            concurrency_key: KeyChange::Set(ConcurrencyKey::from((
                                "partner", "acme",
                            ))),
                            ..Default::default()
                        },
                    )
                }
                "push" => Transition::await_on(
                    "confirmed",
                    state,
                    AwaitOn::signal(format!("webhook:{}", ctx.id))
                        .or_timeout(Duration::from_secs(30)),
                ),
                _ => {
                    state["confirmation"] = match ctx.wake {
                        Some(Wake::Signal { payload, .. }) => payload,
                        _ => json!("timed out"),
                    };
                    Transition::done(state)
                }
            })
        })
        .start()
        .await?;

    let ids = engine
        .insert_many(
            (0..6)
                .map(|i| {
                    NewInstance::new("Account.Sync", json!({ "account": i % 2 }))
                        .concurrency_key(("account", i % 2))
                })
                .collect(),
        )
        .await?;
    println!("inserted {ids:?}");
    for &id in &ids {
        // Wait for the instance to park on its webhook, then deliver it.
        while engine.get(id).await?.status != Status::Awaiting {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        engine
            .signal(&format!("webhook:{id}"), json!({"ok": true}))
            .await?;
    }
    for &id in &ids {
        while !engine.get(id).await?.status.is_final() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let i = engine.get(id).await?;
        println!("{id}: {} {}", i.status, i.state);
    }
    engine.shutdown().await?;
    Ok(())
}
