//! An operator's actions: retry, cancel and delete one instance or every one
//! a filter names, and count what a filter names (a dry run).

mod support;

use gendurable::{Acted, Engine, Filter, NewInstance, Status, Transition};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

async fn engine(url: &str, schema: &str, broken: Arc<AtomicBool>) -> Engine {
    support::builder(url, schema)
        .queue("default", 4)
        // Discarded while `broken`; done once fixed.
        .workflow_fn("Charge", move |_, state, _| {
            let broken = broken.load(SeqCst);
            async move {
                Ok(if broken {
                    Transition::discard("the card was refused")
                } else {
                    Transition::done(state)
                })
            }
        })
        .build()
        .await
        .unwrap()
}

fn later() -> NewInstance {
    NewInstance::new("Charge", json!({})).schedule_in(Duration::from_secs(3600))
}

#[tokio::test]
async fn a_discarded_instance_retried_runs_again() {
    let url = support::url();
    let schema = support::schema("retry");
    let broken = Arc::new(AtomicBool::new(true));
    let engine = engine(&url, &schema, broken.clone()).await;
    let id = engine
        .insert(NewInstance::new("Charge", json!({})))
        .await
        .unwrap();
    engine.drain("default").await.unwrap();
    assert_eq!(engine.get(id).await.unwrap().status, Status::Discarded);

    broken.store(false, SeqCst);
    assert!(engine.retry(id).await.unwrap());
    assert_eq!(engine.drain("default").await.unwrap().completed, 1);
    let i = engine.get(id).await.unwrap();
    assert_eq!(i.status, Status::Completed);
    let kinds: Vec<&str> = i.errors.iter().filter_map(|e| e["kind"].as_str()).collect();
    assert_eq!(kinds, ["discard", "retry"]);
    // A completed instance is not retried; an unknown one is an error.
    assert!(!engine.retry(id).await.unwrap());
    assert!(engine.retry(i64::MAX).await.is_err());

    // A scheduled one runs now, its attempts kept.
    let s = engine.insert(later()).await.unwrap();
    assert!(engine.retry(s).await.unwrap());
    assert_eq!(engine.get(s).await.unwrap().status, Status::Available);
}

#[tokio::test]
async fn a_retry_does_not_take_an_identity_another_instance_holds() {
    let url = support::url();
    let schema = support::schema("retry_unique");
    let engine = engine(&url, &schema, Arc::new(AtomicBool::new(true))).await;
    let charge = || NewInstance::new("Charge", json!({})).idempotency_key("charge:1");
    let first = engine.insert(charge()).await.unwrap();
    engine.drain("default").await.unwrap();
    // Discarded: the identity is free again, and taken by a second charge.
    let second = engine.insert_unique(charge()).await.unwrap();
    assert!(!second.conflict);
    assert!(!engine.retry(first).await.unwrap(), "the second holds it");
    assert_eq!(engine.get(first).await.unwrap().status, Status::Discarded);
}

#[tokio::test]
async fn bulk_actions_apply_to_what_a_filter_names() {
    let url = support::url();
    let schema = support::schema("bulk");
    let engine = engine(&url, &schema, Arc::new(AtomicBool::new(false))).await;
    // More than one statement's batch.
    engine
        .insert_many((0..2500).map(|_| later()).collect())
        .await
        .unwrap();
    engine
        .insert_many((0..3).map(|_| later().queue("other")).collect())
        .await
        .unwrap();
    let scheduled = Filter::parse(["status=scheduled", "queue=default"]).unwrap();
    assert_eq!(engine.count(&scheduled).await.unwrap(), 2500);
    assert_eq!(
        engine.cancel_where(&scheduled, "not needed").await.unwrap(),
        Acted {
            matched: 2500,
            changed: 2500
        }
    );
    assert_eq!(engine.count(&scheduled).await.unwrap(), 0);
    let cancelled = Filter::parse(["status=cancelled"]).unwrap();
    assert_eq!(engine.count(&cancelled).await.unwrap(), 2500);
    // By the text of the last error.
    let by_error = Filter::parse(["error=NOT NEEDED"]).unwrap();
    assert_eq!(engine.count(&by_error).await.unwrap(), 2500);
    // Retry 10 of them by id, then delete the rest.
    let ten: Vec<i64> = engine
        .inserted(gendurable::InsertedQuery::new("Charge").status(Status::Cancelled))
        .await
        .unwrap()
        .into_iter()
        .take(10)
        .map(|i| i.id)
        .collect();
    let f = Filter {
        ids: Some(ten),
        ..Default::default()
    };
    assert_eq!(engine.retry_where(&f, "by hand").await.unwrap().changed, 10);
    assert_eq!(
        engine.delete_where(&cancelled).await.unwrap(),
        Acted {
            matched: 2490,
            changed: 2490
        }
    );
    assert_eq!(
        engine
            .count(&Filter::parse(["queue=default"]).unwrap())
            .await
            .unwrap(),
        10
    );
    assert_eq!(
        engine
            .count(&Filter::parse(["queue=other"]).unwrap())
            .await
            .unwrap(),
        3
    );
}

#[tokio::test]
async fn executing_instances_are_cancelled_not_deleted() {
    let url = support::url();
    let schema = support::schema("bulk_running");
    let (started, mut starts) = mpsc::unbounded_channel();
    let engine = support::builder(&url, &schema)
        .queue("default", 2)
        .workflow_fn("Forever", move |_, _, ctx| {
            let started = started.clone();
            async move {
                let _ = started.send(ctx.id);
                std::future::pending::<()>().await;
                Ok(Transition::done(json!({})))
            }
        })
        .start()
        .await
        .unwrap();
    let id = engine
        .insert(NewInstance::new("Forever", json!({})))
        .await
        .unwrap();
    assert_eq!(starts.recv().await, Some(id));
    let all = Filter::parse(["workflow=Forever"]).unwrap();
    assert_eq!(
        engine.delete_where(&all).await.unwrap(),
        Acted {
            matched: 1,
            changed: 0
        },
        "executing: not deleted"
    );
    assert_eq!(engine.cancel_where(&all, "stop").await.unwrap().changed, 1);
    let i = support::wait_final(&engine, id).await;
    assert_eq!(i.status, Status::Cancelled);
    assert!(engine.delete(id).await.unwrap());
    assert!(engine.get(id).await.is_err());
    engine.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_signal_sent_where_a_filter_says_wakes_or_is_kept() {
    let url = support::url();
    let schema = support::schema("send_where");
    let engine = support::builder(&url, &schema)
        .queue("default", 4)
        .workflow_fn("Refund", |step, state, ctx| async move {
            Ok(match step.as_str() {
                "start" => {
                    Transition::await_on("approved", state, gendurable::AwaitOn::signal("approve"))
                }
                _ => Transition::done(json!({ "by": match ctx.wake {
                    Some(gendurable::Wake::Signal { payload, .. }) => payload,
                    _ => json!(null),
                } })),
            })
        })
        .start()
        .await
        .unwrap();
    let awaiting = engine
        .insert_many(
            (0..3)
                .map(|_| NewInstance::new("Refund", json!({})))
                .collect(),
        )
        .await
        .unwrap();
    for id in &awaiting {
        support::wait_status(&engine, *id, Status::Awaiting).await;
    }
    // Not awaiting yet: it keeps the signal until it does.
    let later = engine
        .insert(NewInstance::new("Refund", json!({})).schedule_in(Duration::from_secs(3600)))
        .await
        .unwrap();
    let filter = Filter::parse(["workflow=Refund"]).unwrap();
    let acted = engine
        .send_where(&filter, "approve", json!("ops"))
        .await
        .unwrap();
    assert_eq!(
        acted,
        Acted {
            matched: 4,
            changed: 4
        }
    );
    for id in &awaiting {
        let done = support::wait_final(&engine, *id).await;
        assert_eq!(done.state, json!({ "by": "ops" }));
    }
    engine.retry(later).await.unwrap();
    assert_eq!(
        support::wait_final(&engine, later).await.state,
        json!({ "by": "ops" })
    );
    // Finished now: matched, nothing kept.
    let again = engine
        .send_where(&filter, "approve", json!("late"))
        .await
        .unwrap();
    assert_eq!(
        again,
        Acted {
            matched: 4,
            changed: 0
        }
    );
    assert!(engine
        .send_where(&Filter::default(), "approve", json!(null))
        .await
        .is_err());
    engine.shutdown().await.unwrap();
}
