//! Pick order (priority, then scheduled time, then id), wake-ups by NOTIFY
//! without polling, and signals that wake every waiter.
mod support;

use chrono::{DateTime, Utc};
use gendurable::{AwaitOn, GateConfig, NewInstance, RateConfig, Status, Transition};
use serde_json::json;
use std::sync::LazyLock;
use std::time::Duration;

/// The order in which a node built by `b` (one slot of "default") starts
/// `news`, each a "Rec" row whose state carries its number `n`.
async fn start_order(b: gendurable::EngineBuilder, news: Vec<NewInstance>) -> Vec<i64> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let engine = b
        .queue("default", 1)
        .workflow_fn("Rec", move |_s, state, _c| {
            let tx = tx.clone();
            async move {
                tx.send(state["n"].as_i64().unwrap()).unwrap();
                Ok(Transition::done(state))
            }
        })
        .build()
        .await
        .unwrap();
    let n = news.len();
    engine.insert_many(news).await.unwrap();
    engine.start().await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < n {
        seen.push(
            tokio::time::timeout(Duration::from_secs(20), rx.recv())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    engine.shutdown().await.unwrap();
    seen
}

/// Row `n` at `priority`, scheduled `ago` seconds before one instant shared
/// by every row (rows with the same `ago` and priority go by id).
fn rec(n: i64, priority: i16, ago: i64) -> NewInstance {
    static NOW: LazyLock<DateTime<Utc>> = LazyLock::new(Utc::now);
    NewInstance::new("Rec", json!({"n": n}))
        .priority(priority)
        .scheduled_at(*NOW - chrono::Duration::seconds(ago))
}

#[tokio::test]
async fn priority_then_schedule_then_id() {
    let url = support::url();
    let schema = support::schema("order");
    let news = vec![
        rec(5, 5, 0),
        rec(3, 0, 0),
        rec(9, 9, 0),
        rec(1, 0, 60),
        rec(2, 0, 30),
        rec(4, 0, 0),
    ];
    let seen = start_order(support::builder(&url, &schema), news).await;
    assert_eq!(seen, [1, 2, 3, 4, 5, 9]);
}

/// Rows under a K = 1 key, a gate and a rate limit, each with room, take
/// their turn among keyless ones: one order across both kinds, a row at a
/// time (no prefetch, one slot).
#[tokio::test]
async fn limited_and_keyless_rows_start_in_one_order() {
    let url = support::url();
    let schema = support::schema("order_mixed");
    let b = support::builder(&url, &schema)
        .prefetch(0)
        .concurrency_limit("api", GateConfig::new(5))
        .rate_limit("rl", RateConfig::new(100, Duration::from_secs(1)).burst(10));
    let news = vec![
        rec(8, 3, 60),
        rec(6, 2, 60).rate_limit("rl:1"),
        rec(2, 0, 50).concurrency_key("acct:1"),
        rec(1, 0, 60),
        rec(4, 1, 60).concurrency_key("api:1"),
        rec(3, 0, 40).rate_limit("rl:1"),
        rec(7, 2, 30),
        rec(5, 1, 30),
        rec(9, 3, 30).concurrency_key("acct:2"),
    ];
    assert_eq!(start_order(b, news).await, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
}

#[tokio::test]
async fn notify_wakes_pickers_without_polling() {
    let url = support::url();
    let schema = support::schema("notify");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let engine = support::builder(&url, &schema)
        .poll_interval(Duration::from_secs(3600))
        .heartbeat_interval(Duration::from_millis(300))
        .queue("default", 2)
        .workflow_fn("Rec", move |_s, state, ctx| {
            let tx = tx.clone();
            async move {
                tx.send(ctx.id).unwrap();
                Ok(Transition::done(state))
            }
        })
        .start()
        .await
        .unwrap();
    // Give the pickers their first (empty) look, then insert: only a NOTIFY
    // can wake them now, the fallback poll being an hour away.
    let picks = engine.stats().snapshot().picks;
    let e = engine.clone();
    support::eventually("first picks", Duration::from_secs(10), || {
        let e = e.clone();
        async move { e.stats().snapshot().picks > picks }
    })
    .await;
    let id = engine
        .insert(NewInstance::new("Rec", json!({})))
        .await
        .unwrap();
    let ran = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ran, id);
    engine.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_signal_wakes_every_waiter() {
    let url = support::url();
    let schema = support::schema("signal");
    let engine = support::builder(&url, &schema)
        .queue("default", 4)
        .workflow_fn("Wait", |step, state, _c| async move {
            Ok(match step.as_str() {
                "start" => Transition::await_on("after", state, AwaitOn::signal("bell")),
                _ => Transition::done(state),
            })
        })
        .start()
        .await
        .unwrap();
    let ids = engine
        .insert_many(
            (0..3)
                .map(|_| NewInstance::new("Wait", json!({})))
                .collect(),
        )
        .await
        .unwrap();
    for &id in &ids {
        support::wait_status(&engine, id, Status::Awaiting).await;
    }
    assert_eq!(engine.signal("other", json!(1)).await.unwrap(), 0);
    assert_eq!(engine.signal("bell", json!(1)).await.unwrap(), 3);
    for &id in &ids {
        support::wait_status(&engine, id, Status::Completed).await;
    }
    engine.shutdown().await.unwrap();
}

/// A key released by a step of one queue wakes the node's picker of another
/// queue holding a row of that key (no polling to fall back on here).
#[tokio::test]
async fn a_released_key_wakes_other_queues() {
    let url = support::url();
    let schema = support::schema("queues");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let go = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let g = go.clone();
    let engine = support::builder(&url, &schema)
        .poll_interval(Duration::from_secs(3600))
        .queue("a", 2)
        .queue("b", 2)
        .workflow_fn("Hold", move |_s, state, ctx| {
            let (tx, g) = (tx.clone(), g.clone());
            async move {
                tx.send(ctx.queue.clone()).unwrap();
                if ctx.queue == "a" {
                    g.acquire().await.unwrap().forget();
                }
                Ok(Transition::done(state))
            }
        })
        .start()
        .await
        .unwrap();
    engine
        .insert(
            NewInstance::new("Hold", json!({}))
                .queue("a")
                .concurrency_key("k:1"),
        )
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first, "a");
    let picks = engine.stats().snapshot().picks;
    let b = engine
        .insert(
            NewInstance::new("Hold", json!({}))
                .queue("b")
                .concurrency_key("k:1"),
        )
        .await
        .unwrap();
    // Queue b's picker has looked (woken by the insert) and found k:1 busy.
    let e = engine.clone();
    support::eventually("queue b looked", Duration::from_secs(10), || {
        let e = e.clone();
        async move { e.stats().snapshot().picks > picks }
    })
    .await;
    assert_eq!(engine.get(b).await.unwrap().status, Status::Available);
    go.add_permits(1);
    let second = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second, "b");
    assert_eq!(
        support::wait_final(&engine, b).await.status,
        Status::Completed
    );
    engine.shutdown().await.unwrap();
}
