mod support;

use gendurable::{NewInstance, Transition};
use serde_json::json;

#[tokio::test]
async fn one_instance_runs_to_done() {
    let url = support::url();
    let schema = support::schema("smoke");
    let engine = support::builder(&url, &schema)
        .queue("default", 5)
        .workflow_fn("Greet", |step, state, _ctx| async move {
            Ok(match step.as_str() {
                "start" => {
                    Transition::next("finish", json!({"n": state["n"].as_i64().unwrap() + 1}))
                }
                _ => Transition::done(json!({"n": state["n"].as_i64().unwrap() * 10})),
            })
        })
        .start()
        .await
        .unwrap();
    let id = engine
        .insert(NewInstance::new("Greet", json!({"n": 1})))
        .await
        .unwrap();
    let inst = support::wait_final(&engine, id).await;
    assert_eq!(inst.state, json!({"n": 20}));
    assert_eq!(inst.status, gendurable::Status::Completed);
    engine.shutdown().await.unwrap();
}

/// The engine's futures can be spawned on a multi-threaded runtime.
/// (Checked by the compiler; never run.)
#[allow(dead_code)]
fn futures_are_send(e: gendurable::Engine) {
    fn send<T: Send>(_: T) {}
    send(gendurable::Engine::builder().build());
    send(gendurable::Engine::builder().start());
    send(e.start());
    send(e.shutdown());
    send(e.insert(NewInstance::new("W", json!({}))));
    send(e.migrate());
    send(e.status());
}
