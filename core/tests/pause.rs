//! Pausing a queue: no node claims from it (no pick, no handover of a freed
//! key, no start on insert) until it is resumed; running steps finish.

mod support;

use gendurable::{Drained, NewInstance, Status, Transition};
use serde_json::json;
use std::sync::Arc;
use tokio::sync::{mpsc, Mutex};

#[tokio::test]
async fn a_paused_queue_claims_nothing_until_resumed() {
    let url = support::url();
    let schema = support::schema("pause");
    let (started, mut starts) = mpsc::unbounded_channel();
    let (release, gate) = mpsc::unbounded_channel::<()>();
    let gate = Arc::new(Mutex::new(gate));
    let engine = support::builder(&url, &schema)
        .queue("default", 4)
        // The first step of "hold" instances waits for the test's word.
        .workflow_fn("Job", move |_, state, ctx| {
            let (started, gate) = (started.clone(), gate.clone());
            async move {
                let _ = started.send(ctx.id);
                if state["hold"] == json!(true) {
                    gate.lock().await.recv().await;
                }
                Ok(Transition::done(state))
            }
        })
        .start()
        .await
        .unwrap();

    // A K = 1 key: the first runs, the second waits for the key.
    let key =
        |hold: bool| NewInstance::new("Job", json!({ "hold": hold })).concurrency_key("account:1");
    let first = engine.insert(key(true)).await.unwrap();
    let second = engine.insert(key(false)).await.unwrap();
    assert_eq!(starts.recv().await, Some(first));

    assert!(engine.pause_queue("default").await.unwrap());
    assert!(
        !engine.pause_queue("default").await.unwrap(),
        "already paused"
    );
    let status = engine.status().await.unwrap();
    assert_eq!(status.paused.len(), 1);
    assert!(status.to_string().contains("paused queues"), "{status}");

    // The running step finishes and is recorded; its key is not handed over
    // (that would be a claim, made in the same call as the outcome).
    release.send(()).unwrap();
    assert_eq!(
        support::wait_final(&engine, first).await.status,
        Status::Completed
    );
    // (It may have been reserved as the key's successor, and started as the
    // first ended: not promoted into the paused queue, it was stopped.)
    assert_eq!(engine.get(second).await.unwrap().status, Status::Available);
    // An insert on this idle node does not start its row here, and a drain
    // (the pick of any node) claims nothing.
    let third = engine
        .insert(NewInstance::new("Job", json!({})))
        .await
        .unwrap();
    assert_eq!(engine.get(third).await.unwrap().status, Status::Available);
    assert_eq!(engine.drain("default").await.unwrap(), Drained::default());

    // Resumed: the pickers are woken and both run.
    assert!(engine.resume_queue("default").await.unwrap());
    assert!(!engine.resume_queue("default").await.unwrap(), "not paused");
    for id in [second, third] {
        assert_eq!(
            support::wait_final(&engine, id).await.status,
            Status::Completed
        );
    }
    assert!(engine.paused_queues().await.unwrap().is_empty());
    engine.shutdown().await.unwrap();
}
