//! Defaults declared per workflow: the queue, priority and attempts of an
//! insert that does not name them, and the backoff of the workflow's errors.

mod support;

use gendurable::options::EngineOptions;
use gendurable::{Engine, Error, NewInstance, Status, Transition, WorkflowDefaults};
use serde_json::json;
use std::time::Duration;

fn charge_defaults() -> WorkflowDefaults {
    WorkflowDefaults {
        queue: Some("billing".into()),
        priority: Some(2),
        max_attempts: Some(3),
        backoff: Some((Duration::from_millis(5), Duration::from_millis(10))),
        timeout: None,
    }
}

#[tokio::test]
async fn an_insert_takes_its_workflows_defaults_unless_it_names_its_own() {
    let url = support::url();
    let schema = support::schema("defaults");
    let engine = support::builder(&url, &schema)
        .queue("default", 2)
        .queue("billing", 2)
        .workflow_fn("Charge", |_, _, _| async { Err("declined".into()) })
        .workflow_fn("Other", |_, state, _| async { Ok(Transition::done(state)) })
        .workflow_defaults("Charge", charge_defaults())
        .start()
        .await
        .unwrap();

    let id = engine
        .insert(NewInstance::new("Charge", json!({})))
        .await
        .unwrap();
    let i = support::wait_final(&engine, id).await;
    assert_eq!(
        (i.queue.as_str(), i.priority, i.max_attempts),
        ("billing", 2, 3)
    );
    // Retried with the workflow's backoff until its attempts ran out.
    assert_eq!(
        (i.status, i.attempt, i.errors.len()),
        (Status::Discarded, 3, 3)
    );

    let id = engine
        .insert(
            NewInstance::new("Charge", json!({}))
                .queue("default")
                .priority(0)
                .max_attempts(1),
        )
        .await
        .unwrap();
    let i = support::wait_final(&engine, id).await;
    assert_eq!(
        (i.queue.as_str(), i.priority, i.max_attempts),
        ("default", 0, 1)
    );

    let id = engine
        .insert(NewInstance::new("Other", json!({})))
        .await
        .unwrap();
    let i = support::wait_final(&engine, id).await;
    assert_eq!(
        (i.queue.as_str(), i.priority, i.max_attempts),
        ("default", 0, gendurable::DEFAULT_MAX_ATTEMPTS)
    );
    engine.shutdown().await.unwrap();
}

#[test]
fn defaults_are_checked_with_the_configuration() {
    let builder = || {
        Engine::builder()
            .url("postgres://localhost/x")
            .queue("default", 1)
            .workflow_fn("Charge", |_, state, _| async {
                Ok(Transition::done(state))
            })
    };
    let config_error = |b: gendurable::EngineBuilder| match b.validate() {
        Err(Error::InvalidConfig(m)) => m,
        other => panic!("expected a configuration error, got {other:?}"),
    };
    let m = config_error(builder().workflow_defaults("Nope", WorkflowDefaults::default()));
    assert!(m.contains(r#"no workflow named "Nope""#), "{m}");
    let bad = |d: WorkflowDefaults| config_error(builder().workflow_defaults("Charge", d));
    let m = bad(WorkflowDefaults {
        priority: Some(12),
        ..Default::default()
    });
    assert_eq!(
        m,
        r#"workflow_defaults "Charge": invalid priority: must be 0 to 9, got 12"#
    );
    let m = bad(WorkflowDefaults {
        max_attempts: Some(0),
        ..Default::default()
    });
    assert!(m.contains("max_attempts: must be at least 1, got 0"), "{m}");
    let m = bad(WorkflowDefaults {
        queue: Some(String::new()),
        ..Default::default()
    });
    assert!(
        m.starts_with(r#"workflow_defaults "Charge": invalid queue"#),
        "{m}"
    );
    let m = bad(WorkflowDefaults {
        backoff: Some((Duration::from_secs(2), Duration::from_secs(1))),
        ..Default::default()
    });
    assert!(m.contains("backoff base must be longer than zero"), "{m}");
    let m = config_error(
        builder()
            .workflow_defaults("Charge", WorkflowDefaults::default())
            .workflow_defaults("Charge", WorkflowDefaults::default()),
    );
    assert!(m.contains("configured twice"), "{m}");
    builder()
        .workflow_defaults("Charge", charge_defaults())
        .validate()
        .unwrap();
}

#[test]
fn defaults_read_from_options() {
    let options = EngineOptions::from_json(json!({
        "url": "postgres://localhost/x",
        "queues": {"billing": 1},
        "workflow_defaults": {"Charge": {
            "queue": "billing", "priority": 2, "max_attempts": 3,
            "backoff": {"base": 5, "max": 10}
        }}
    }))
    .unwrap();
    let d = &options.workflow_defaults["Charge"];
    assert_eq!(
        (d.queue.as_deref(), d.priority, d.max_attempts),
        (Some("billing"), Some(2), Some(3))
    );
    options
        .apply(
            Engine::builder().workflow_fn("Charge", |_, state, _| async {
                Ok(Transition::done(state))
            }),
        )
        .validate()
        .unwrap();
    let err = EngineOptions::from_json(json!({"workflow_defaults": {"Charge": {"retries": 3}}}))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(r#"workflow_defaults.Charge: unknown option "retries""#),
        "{err}"
    );
}

/// A workflow that declares its defaults itself (the Rust trait).
struct Billing;

#[gendurable::async_trait]
impl gendurable::Workflow for Billing {
    async fn step(
        &self,
        _step: &str,
        state: serde_json::Value,
        _ctx: gendurable::StepContext,
    ) -> gendurable::StepResult {
        Ok(Transition::done(state))
    }

    fn defaults(&self) -> WorkflowDefaults {
        WorkflowDefaults {
            queue: Some("billing".into()),
            max_attempts: Some(3),
            ..Default::default()
        }
    }
}

/// Where an instance of `Billing` inserted with no options lands, and its
/// attempts, with `defaults` given to the builder (if any).
async fn billing_insert(defaults: Option<WorkflowDefaults>) -> (String, i32) {
    let url = support::url();
    let schema = support::schema("trait_defaults");
    let mut b = support::builder(&url, &schema)
        .queue("billing", 1)
        .workflow("Billing", Billing);
    if let Some(d) = defaults {
        b = b.workflow_defaults("Billing", d);
    }
    let engine = b.build().await.unwrap();
    let id = engine
        .insert(NewInstance::new("Billing", json!({})))
        .await
        .unwrap();
    let i = engine.get(id).await.unwrap();
    (i.queue, i.max_attempts)
}

#[tokio::test]
async fn a_workflow_declares_its_defaults_and_the_builder_may_replace_them() {
    assert_eq!(billing_insert(None).await, ("billing".to_owned(), 3));
    let replaced = WorkflowDefaults {
        max_attempts: Some(7),
        ..Default::default()
    };
    assert_eq!(
        billing_insert(Some(replaced)).await,
        ("default".to_owned(), 7)
    );
}
