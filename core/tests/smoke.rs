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
