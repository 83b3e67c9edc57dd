//! Durable signals: a signal sent to an instance before it awaits is kept
//! until it does, then delivered once, in order; a signal sent by name with a
//! time to live waits for the first instance that awaits it.

mod support;

use gendurable::{AwaitOn, Delivery, Error, NewInstance, Status, Transition, Wake};
use serde_json::json;
use std::time::Duration;
use tokio::sync::{mpsc, Mutex};

/// A workflow that awaits `go` `n` times and records each payload in its
/// state; its first step waits for the test's word before it returns.
fn awaiter(
    url: &str,
    schema: &str,
    gate: std::sync::Arc<Mutex<mpsc::UnboundedReceiver<()>>>,
) -> gendurable::EngineBuilder {
    support::builder(url, schema)
        .queue("default", 8)
        .workflow_fn("Await", move |step, mut state, ctx| {
            let gate = gate.clone();
            async move {
                if step == "start" && state["hold"] == json!(true) {
                    gate.lock().await.recv().await;
                }
                if let Some(Wake::Signal { name, payload }) = ctx.wake {
                    state["got"]
                        .as_array_mut()
                        .expect("got")
                        .push(json!([name, payload]));
                }
                let left = state["left"].as_i64().unwrap_or(0);
                if left == 0 {
                    return Ok(Transition::done(state));
                }
                state["left"] = json!(left - 1);
                let on = state["on"].as_str().unwrap_or("go").to_owned();
                Ok(Transition::await_on("again", state, AwaitOn::signal(on)))
            }
        })
}

fn new(left: i64, hold: bool, on: &str) -> NewInstance {
    NewInstance::new(
        "Await",
        json!({"left": left, "hold": hold, "on": on, "got": []}),
    )
}

async fn mailbox(pool: &sqlx::PgPool, schema: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM \"{schema}\".mailbox"))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn signals_sent_before_the_await_are_kept_and_delivered_once_in_order() {
    let url = support::url();
    let schema = support::schema("signals_kept");
    let (release, gate) = mpsc::unbounded_channel();
    let engine = awaiter(&url, &schema, std::sync::Arc::new(Mutex::new(gate)))
        .start()
        .await
        .unwrap();
    let id = engine.insert(new(2, true, "go")).await.unwrap();
    support::wait_status(&engine, id, Status::Executing).await;
    // While its first step runs: two for it, one it never awaits.
    for (name, n) in [("go", 1), ("other", 0), ("go", 2)] {
        assert_eq!(
            engine.send(id, name, json!({"n": n})).await.unwrap(),
            Delivery::Kept
        );
    }
    release.send(()).unwrap();
    let i = support::wait_final(&engine, id).await;
    assert_eq!(i.status, Status::Completed);
    assert_eq!(
        i.state["got"],
        json!([["go", {"n": 1}], ["go", {"n": 2}]]),
        "each once, in order"
    );
    assert_eq!(
        mailbox(engine.pool(), &schema).await,
        1,
        "the other is kept"
    );
    // Finished: nothing more is kept; unknown: an error.
    assert_eq!(
        engine.send(id, "go", json!({})).await.unwrap(),
        Delivery::Finished(Status::Completed)
    );
    assert!(matches!(
        engine.send(i64::MAX, "go", json!({})).await,
        Err(Error::NotFound(_))
    ));
    // Pruning the instance takes its kept signals along.
    sqlx::query(&format!(
        "UPDATE \"{schema}\".instances SET finished_at = now() - interval '30 days'"
    ))
    .execute(engine.pool())
    .await
    .unwrap();
    engine.prune_now().await.unwrap();
    assert_eq!(mailbox(engine.pool(), &schema).await, 0);
    engine.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_signal_by_name_with_a_ttl_waits_for_the_first_awaiter() {
    let url = support::url();
    let schema = support::schema("signals_ttl");
    let (_release, gate) = mpsc::unbounded_channel();
    let engine = awaiter(&url, &schema, std::sync::Arc::new(Mutex::new(gate)))
        .start()
        .await
        .unwrap();
    assert_eq!(
        engine
            .signal_with_ttl("ready", json!({"v": 1}), Duration::from_secs(600))
            .await
            .unwrap(),
        0,
        "nobody awaits: kept"
    );
    assert!(engine
        .signal_with_ttl("ready", json!({}), Duration::ZERO)
        .await
        .is_err());
    let first = engine.insert(new(1, false, "ready")).await.unwrap();
    let f = support::wait_final(&engine, first).await;
    assert_eq!(f.state["got"], json!([["ready", {"v": 1}]]));
    // Delivered once: the next awaiter waits for a new signal.
    let second = engine.insert(new(1, false, "ready")).await.unwrap();
    support::wait_status(&engine, second, Status::Awaiting).await;
    assert_eq!(engine.signal("ready", json!({"v": 2})).await.unwrap(), 1);
    let s = support::wait_final(&engine, second).await;
    assert_eq!(s.state["got"], json!([["ready", {"v": 2}]]));
    // Without a ttl nothing is kept.
    assert_eq!(engine.signal("ready", json!({})).await.unwrap(), 0);
    assert_eq!(mailbox(engine.pool(), &schema).await, 0);
    engine.shutdown().await.unwrap();
}

/// Signals race their instances into the await: every instance gets its
/// signal exactly once, whether it was awaiting already or not yet.
#[tokio::test]
async fn signals_racing_the_await_are_never_lost() {
    let url = support::url();
    let schema = support::schema("signals_race");
    let (_release, gate) = mpsc::unbounded_channel();
    let gate = std::sync::Arc::new(Mutex::new(gate));
    let nodes = [
        awaiter(&url, &schema, gate.clone()).start().await.unwrap(),
        awaiter(&url, &schema, gate).start().await.unwrap(),
    ];
    let ids = nodes[0]
        .insert_many((0..200).map(|_| new(1, false, "go")).collect())
        .await
        .unwrap();
    let sender = nodes[1].clone();
    let sent = ids.clone();
    let sending = tokio::spawn(async move {
        for (n, id) in sent.into_iter().enumerate() {
            sender.send(id, "go", json!({"n": n})).await.unwrap();
        }
    });
    sending.await.unwrap();
    for (n, id) in ids.iter().enumerate() {
        let i = support::wait_final(&nodes[0], *id).await;
        assert_eq!(i.state["got"], json!([["go", {"n": n}]]), "instance {id}");
    }
    assert_eq!(mailbox(nodes[0].pool(), &schema).await, 0);
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}
