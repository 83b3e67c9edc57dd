//! Unique inserts: a charge inserted twice with one idempotency key (a retried
//! HTTP request, say) runs once; a report asked for many times an hour is
//! inserted once per account per hour, and the application inserts a charge
//! in its own transaction with the SQL function `enqueue`.
//!
//! `cargo run -p gendurable-examples --example unique`
//! (a throwaway PostgreSQL unless DATABASE_URL is set)

use gendurable::{Engine, NewInstance, Status, Transition, Unique};
use gendurable_testing::database_url_or_temp;
use serde_json::json;
use sqlx::Executor;
use std::time::Duration;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (url, _pg) = database_url_or_temp().await?;
    // A fresh schema, so that a second run starts with no charges.
    sqlx::PgPool::connect(&url)
        .await?
        .execute("DROP SCHEMA IF EXISTS example_unique CASCADE")
        .await?;
    let engine = Engine::builder()
        .url(url)
        .schema("example_unique")
        .queue("default", 10)
        .workflow_fn("Charge", |_step, state, _ctx| async move {
            Ok(Transition::done(state))
        })
        .workflow_fn("Report", |_step, state, _ctx| async move {
            Ok(Transition::done(state))
        })
        .start()
        .await?;

    // The same request twice: one instance, and the second caller learns its id.
    let charge = || NewInstance::new("Charge", json!({"cents": 500})).idempotency_key("charge:42");
    let first = engine.insert_unique(charge()).await?;
    let again = engine.insert_unique(charge()).await?;
    println!("charge:42 -> #{} (conflict: {})", first.id, first.conflict);
    println!("charge:42 -> #{} (conflict: {})", again.id, again.conflict);
    anyhow::ensure!(again.conflict && again.id == first.id);

    // One report per account per hour, whoever asks: the identity is the
    // workflow and the state's "account" field, in hourly windows.
    let hourly = Unique::new()
        .fields(["account"])
        .period(Duration::from_secs(3600));
    let asks = ["ops", "cron", "support"].map(|who| {
        NewInstance::new("Report", json!({"account": 7, "asked_by": who})).unique(hourly.clone())
    });
    let reports = engine.insert_many_unique(asks.to_vec()).await?;
    for r in &reports {
        println!(
            "report for account 7 -> #{} (conflict: {})",
            r.id, r.conflict
        );
    }
    anyhow::ensure!(reports.iter().filter(|r| !r.conflict).count() == 1);

    // In the application's own transaction, from SQL (any language or ORM):
    // the order row and the charge commit together or not at all.
    let mut tx = engine.pool().begin().await?;
    let (id, conflict): (i64, bool) = sqlx::query_as(
        "SELECT id, conflict FROM example_unique.enqueue('Charge', '{\"cents\": 900}',
                                                      idempotency_key => 'charge:43')",
    )
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    println!("charge:43 from SQL -> #{id} (conflict: {conflict})");

    for id in [first.id, reports[0].id, id] {
        while !engine.get(id).await?.status.is_final() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        anyhow::ensure!(engine.get(id).await?.status == Status::Completed);
    }
    engine.shutdown().await?;
    Ok(())
}
