//! Every transition kind, persisted, and still right after the engine restarts.
mod support;

use gendurable::{
    AwaitOn, Cancelled, ConcurrencyKey, KeyChange, NewInstance, NextOptions, Status, Transition,
    Wake,
};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Instances that have snoozed once (a snooze keeps the state as it was).
static SNOOZED: std::sync::Mutex<std::collections::BTreeSet<i64>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A workflow driven by its state: `plan` lists what each step returns.
fn builder(url: &str, schema: &str, gate: Arc<Notify>) -> gendurable::EngineBuilder {
    support::builder(url, schema)
        .queue("default", 8)
        .workflow_fn("Plan", move |step, state, ctx| {
            let gate = gate.clone();
            async move {
                let mut state = state;
                let seen = state["seen"].as_array().cloned().unwrap_or_default();
                let mut seen = seen;
                seen.push(json!({"step": step, "attempt": ctx.attempt, "key": ctx.concurrency_key,
                                 "wake": match &ctx.wake {
                                     Some(Wake::Signal { name, payload }) => json!({"signal": name, "payload": payload}),
                                     Some(Wake::Timeout) => json!("timeout"),
                                     None => Value::Null,
                                 }}));
                state["seen"] = Value::Array(seen);
                let action = state["plan"][&step].clone();
                Ok(match action["do"].as_str().unwrap_or("done") {
                    "next" => {
                        let key = match action["key"].as_str() {
                            Some("release") => KeyChange::Release,
                            Some(k) => KeyChange::Set(ConcurrencyKey::from(k)),
                            None => KeyChange::Keep,
                        };
                        Transition::next_with(
                            action["to"].as_str().unwrap(),
                            state,
                            NextOptions {
                                concurrency_key: key,
                                delay: action["delay_ms"].as_u64().map(Duration::from_millis),
                                ..Default::default()
                            },
                        )
                    }
                    "await" => {
                        let on = match (action["signal"].as_str(), action["timeout_ms"].as_u64()) {
                            (Some(s), Some(t)) => AwaitOn::signal(s).or_timeout(Duration::from_millis(t)),
                            (Some(s), None) => AwaitOn::signal(s),
                            (None, t) => AwaitOn::timeout(Duration::from_millis(t.unwrap())),
                        };
                        Transition::await_on(action["to"].as_str().unwrap(), state, on)
                    }
                    "snooze_once" if SNOOZED.lock().unwrap().insert(ctx.id) => {
                        Transition::snooze(Duration::from_millis(20))
                    }
                    "fail_until" if ctx.attempt < action["n"].as_i64().unwrap() as i32 => {
                        return Err(format!("boom {}", ctx.attempt).into())
                    }
                    "panic" => panic!("step exploded"),
                    "cancel" => Transition::cancel("no longer needed"),
                    "discard_after" if ctx.attempt >= action["n"].as_i64().unwrap() as i32 => {
                        Transition::discard("the card was declined")
                    }
                    "discard_after" => return Err("try again".into()),
                    "block" => {
                        gate.notified().await;
                        Transition::next("after_block", state)
                    }
                    "bad_state" => Transition::done(json!([1, 2])),
                    _ => Transition::done(state),
                })
            }
        })
}

fn plan(plan: Value) -> NewInstance {
    NewInstance::new("Plan", json!({ "plan": plan }))
}

fn steps(i: &gendurable::Instance) -> Vec<String> {
    i.state["seen"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn every_transition_kind() {
    let url = support::url();
    let schema = support::schema("tr");
    let gate = Arc::new(Notify::new());
    let engine = builder(&url, &schema, gate.clone()).start().await.unwrap();

    // next (keep, switch, release the key) then done
    let id = engine
        .insert(
            plan(json!({
                "start": {"do": "next", "to": "b"},
                "b": {"do": "next", "to": "c", "key": "other:1"},
                "c": {"do": "next", "to": "d", "key": "release"},
                "d": {"do": "done"}
            }))
            .concurrency_key(("acct", 1)),
        )
        .await
        .unwrap();
    let i = support::wait_final(&engine, id).await;
    assert_eq!(i.status, Status::Completed);
    assert_eq!(steps(&i), ["start", "b", "c", "d"]);
    let keys: Vec<Value> = i.state["seen"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].clone())
        .collect();
    assert_eq!(
        keys,
        [
            json!("acct:1"),
            json!("acct:1"),
            json!("other:1"),
            Value::Null
        ]
    );
    assert_eq!(i.concurrency_key, None);
    assert!(i.finished_at.is_some());

    // next with a delay goes through 'scheduled'
    let id = engine
        .insert(plan(
            json!({"start": {"do": "next", "to": "later", "delay_ms": 300}}),
        ))
        .await
        .unwrap();
    support::wait_status(&engine, id, Status::Scheduled).await;
    assert_eq!(
        support::wait_final(&engine, id).await.status,
        Status::Completed
    );

    // snooze does not count as an attempt
    let id = engine
        .insert(plan(json!({"start": {"do": "snooze_once"}})))
        .await
        .unwrap();
    let i = support::wait_final(&engine, id).await;
    assert_eq!(i.status, Status::Completed);
    assert!(SNOOZED.lock().unwrap().contains(&id));
    let attempts: Vec<i64> = i.state["seen"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["attempt"].as_i64().unwrap())
        .collect();
    assert_eq!(attempts, [1]);
    assert!(i.errors.is_empty());

    // error: retried with backoff, every error recorded
    let id = engine
        .insert(plan(json!({"start": {"do": "fail_until", "n": 3}})))
        .await
        .unwrap();
    let i = support::wait_final(&engine, id).await;
    assert_eq!(i.status, Status::Completed);
    assert_eq!(i.errors.len(), 2);
    assert_eq!(i.errors[0]["message"], "boom 1");
    assert_eq!(i.errors[1]["attempt"], 2);

    // error until max_attempts: discarded, every error kept
    let id = engine
        .insert(plan(json!({"start": {"do": "fail_until", "n": 99}})).max_attempts(3))
        .await
        .unwrap();
    let i = support::wait_final(&engine, id).await;
    assert_eq!(i.status, Status::Discarded);
    assert_eq!(i.errors.len(), 3);
    assert_eq!(i.attempt, 3);

    // discard: final at once, whatever attempts are left; the errors before
    // it and the discard itself recorded; the key it held is free again
    let id = engine
        .insert(
            plan(json!({"start": {"do": "discard_after", "n": 2}}))
                .max_attempts(10)
                .concurrency_key(("card", 1)),
        )
        .await
        .unwrap();
    let i = support::wait_final(&engine, id).await;
    assert_eq!(i.status, Status::Discarded);
    assert_eq!(i.attempt, 2);
    assert_eq!(i.errors.len(), 2);
    assert_eq!(i.errors[0]["kind"], "error");
    assert_eq!(
        (
            &i.errors[1]["kind"],
            &i.errors[1]["message"],
            &i.errors[1]["attempt"]
        ),
        (
            &json!("discard"),
            &json!("the card was declined"),
            &json!(2)
        )
    );
    assert!(i.finished_at.is_some());
    let next = engine
        .insert(plan(json!({"start": {"do": "done"}})).concurrency_key(("card", 1)))
        .await
        .unwrap();
    assert_eq!(
        support::wait_final(&engine, next).await.status,
        Status::Completed
    );

    // a panic is an error outcome with its message
    let id = engine
        .insert(plan(json!({"start": {"do": "panic"}})).max_attempts(1))
        .await
        .unwrap();
    let i = support::wait_final(&engine, id).await;
    assert_eq!(i.status, Status::Discarded);
    assert_eq!(i.errors[0]["kind"], "panic");
    assert!(i.errors[0]["message"]
        .as_str()
        .unwrap()
        .contains("step exploded"));

    // an invalid transition is recorded as an error, nothing lost
    let id = engine
        .insert(plan(json!({"start": {"do": "bad_state"}})).max_attempts(1))
        .await
        .unwrap();
    let i = support::wait_final(&engine, id).await;
    assert_eq!(i.status, Status::Discarded);
    assert_eq!(i.errors[0]["kind"], "invalid_transition");
    assert!(i.errors[0]["message"]
        .as_str()
        .unwrap()
        .contains("JSON object"));

    // cancel from the step
    let id = engine
        .insert(plan(json!({"start": {"do": "cancel"}})))
        .await
        .unwrap();
    let i = support::wait_final(&engine, id).await;
    assert_eq!(i.status, Status::Cancelled);
    assert_eq!(i.errors[0]["message"], "no longer needed");

    // await a signal: parked, woken with the payload
    let id = engine
        .insert(plan(
            json!({"start": {"do": "await", "to": "woken", "signal": "paid"}}),
        ))
        .await
        .unwrap();
    support::wait_status(&engine, id, Status::Awaiting).await;
    assert_eq!(
        engine.signal("paid", json!({"amount": 5})).await.unwrap(),
        1
    );
    let i = support::wait_final(&engine, id).await;
    assert_eq!(steps(&i), ["start", "woken"]);
    assert_eq!(
        i.state["seen"][1]["wake"],
        json!({"signal": "paid", "payload": {"amount": 5}})
    );

    // await with a timeout: woken with the timeout marker
    let id = engine
        .insert(plan(
            json!({"start": {"do": "await", "to": "late", "signal": "never", "timeout_ms": 200}}),
        ))
        .await
        .unwrap();
    let i = support::wait_final(&engine, id).await;
    assert_eq!(i.state["seen"][1]["wake"], json!("timeout"));

    // cancel by id: a scheduled one at once, an executing one at its outcome
    // (unless that outcome is `done`: finished work stands)
    let id = engine
        .insert(plan(json!({})).schedule_in(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert_eq!(engine.cancel(id).await.unwrap(), Cancelled::Now);
    assert_eq!(engine.get(id).await.unwrap().status, Status::Cancelled);
    assert_eq!(
        engine.cancel(id).await.unwrap(),
        Cancelled::AlreadyFinished(Status::Cancelled)
    );
    let id = engine
        .insert(plan(json!({"start": {"do": "block"}})))
        .await
        .unwrap();
    support::wait_status(&engine, id, Status::Executing).await;
    assert_eq!(engine.cancel(id).await.unwrap(), Cancelled::AtOutcome);
    gate.notify_one();
    assert_eq!(
        support::wait_final(&engine, id).await.status,
        Status::Cancelled
    );
    assert!(matches!(
        engine.cancel(123_456_789).await,
        Err(gendurable::Error::NotFound(_))
    ));

    engine.shutdown().await.unwrap();
}

#[tokio::test]
async fn survives_an_engine_restart() {
    let url = support::url();
    let schema = support::schema("restart");
    let gate = Arc::new(Notify::new());
    let engine = builder(&url, &schema, gate.clone()).start().await.unwrap();
    let awaiting = engine
        .insert(plan(json!({"start": {"do": "next", "to": "wait"},
                            "wait": {"do": "await", "to": "after", "signal": "go"}})))
        .await
        .unwrap();
    let later = engine
        .insert(plan(json!({})).schedule_in(Duration::from_millis(1500)))
        .await
        .unwrap();
    support::wait_status(&engine, awaiting, Status::Awaiting).await;
    engine.shutdown().await.unwrap();

    // A new engine (a new node) on the same schema picks up where it was.
    let engine = builder(&url, &schema, gate).start().await.unwrap();
    let i = engine.get(awaiting).await.unwrap();
    assert_eq!((i.status, i.step.as_str()), (Status::Awaiting, "after"));
    assert!(engine
        .signal_instance(awaiting, "go", json!(1))
        .await
        .unwrap());
    let i = support::wait_final(&engine, awaiting).await;
    assert_eq!(steps(&i), ["start", "wait", "after"]);
    assert_eq!(
        support::wait_final(&engine, later).await.status,
        Status::Completed
    );
    engine.shutdown().await.unwrap();
}
