//! The helpers for applications' tests: drain a queue in the calling task,
//! find inserted instances, and the inline mode.

mod support;

use gendurable::{DrainOptions, Drained, Engine, InsertedQuery, NewInstance, Status, Transition};
use serde_json::json;

/// Charge: "start" -> "capture" -> done; fails its first capture when told to.
/// Loop: steps forever.
async fn engine(url: &str, schema: &str, inline: bool) -> Engine {
    support::builder(url, schema)
        .queue("default", 2)
        .queue("other", 2)
        .inline(inline)
        .workflow_fn("Charge", |step, mut state, ctx| async move {
            match step.as_str() {
                "start" => Ok(Transition::next("capture", state)),
                _ if state["flaky"] == json!(true) && ctx.attempt == 1 => {
                    Err("the bank said no".into())
                }
                _ => {
                    state["captured"] = json!(true);
                    Ok(Transition::done(state))
                }
            }
        })
        .workflow_fn("Loop", |_, state, _| async move {
            Ok(Transition::next("again", state))
        })
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn drain_runs_a_queue_to_the_end_in_the_calling_task() {
    let url = support::url();
    let schema = support::schema("drain");
    let engine = engine(&url, &schema, false).await;
    let ids = engine
        .insert_many(vec![
            NewInstance::new("Charge", json!({"n": 1})).concurrency_key("account:1"),
            NewInstance::new("Charge", json!({"n": 2})).concurrency_key("account:1"),
            NewInstance::new("Charge", json!({"n": 3, "flaky": true})),
            NewInstance::new("Charge", json!({"n": 4})).queue("other"),
        ])
        .await
        .unwrap();
    let d = engine.drain("default").await.unwrap();
    assert_eq!(
        d,
        Drained {
            steps: 6,
            completed: 2,
            retried: 1,
            ..Default::default()
        }
    );
    for id in &ids[..2] {
        let i = engine.get(*id).await.unwrap();
        assert_eq!(
            (i.status, i.state["captured"].clone()),
            (Status::Completed, json!(true))
        );
    }
    assert_eq!(engine.get(ids[2]).await.unwrap().status, Status::Scheduled);
    assert_eq!(
        engine.get(ids[3]).await.unwrap().status,
        Status::Available,
        "another queue"
    );
    // With scheduled rows: the retry runs now.
    let d = engine
        .drain_with(
            "default",
            DrainOptions {
                scheduled: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!((d.steps, d.completed), (1, 1));
    assert_eq!(engine.get(ids[2]).await.unwrap().status, Status::Completed);
    // Nothing left: nothing to do.
    assert_eq!(engine.drain("default").await.unwrap(), Drained::default());

    // An error met within the drain is retried within it too.
    let flaky = engine
        .insert(NewInstance::new("Charge", json!({"flaky": true})))
        .await
        .unwrap();
    let d = engine
        .drain_with(
            "default",
            DrainOptions {
                scheduled: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!((d.steps, d.retried, d.completed), (3, 1, 1));
    assert_eq!(engine.get(flaky).await.unwrap().status, Status::Completed);

    // A workflow that never ends stops the drain at its limit, unstarted
    // rows handed back.
    let l = engine
        .insert(NewInstance::new("Loop", json!({})))
        .await
        .unwrap();
    let d = engine
        .drain_with(
            "default",
            DrainOptions {
                max_steps: Some(5),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(d.steps, 5);
    let i = engine.get(l).await.unwrap();
    assert_eq!((i.status, i.node), (Status::Available, None));
}

#[tokio::test]
async fn inserted_finds_instances_by_workflow_state_queue_and_status() {
    let url = support::url();
    let schema = support::schema("inserted");
    let engine = engine(&url, &schema, false).await;
    engine
        .insert_many(vec![
            NewInstance::new("Charge", json!({"account": 7, "cents": 500})),
            NewInstance::new("Charge", json!({"account": 8, "cents": 500})).queue("other"),
            NewInstance::new("Loop", json!({"account": 7})),
        ])
        .await
        .unwrap();
    let found = engine
        .inserted(InsertedQuery::new("Charge").state(json!({"account": 7})))
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].state, json!({"account": 7, "cents": 500}));
    let q = |q: InsertedQuery| {
        let e = engine.clone();
        async move { e.inserted(q).await.unwrap().len() }
    };
    assert_eq!(q(InsertedQuery::new("Charge")).await, 2);
    assert_eq!(q(InsertedQuery::new("Charge").queue("other")).await, 1);
    assert_eq!(
        q(InsertedQuery::new("Charge").state(json!({"cents": 500}))).await,
        2
    );
    assert_eq!(
        q(InsertedQuery::new("Charge").status(Status::Completed)).await,
        0
    );
    assert_eq!(q(InsertedQuery::new("Nope")).await, 0);
}

#[tokio::test]
async fn an_inline_engine_runs_what_it_inserts_before_returning() {
    let url = support::url();
    let schema = support::schema("inline");
    let engine = engine(&url, &schema, true).await;
    let id = engine
        .insert(NewInstance::new("Charge", json!({"n": 1})))
        .await
        .unwrap();
    let i = engine.get(id).await.unwrap();
    assert_eq!(i.status, Status::Completed);
    assert_eq!(i.state["captured"], json!(true));
}
