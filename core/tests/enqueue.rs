//! `enqueue`, the SQL function an application calls in its own transaction:
//! visible on commit, gone on rollback, run by the nodes like any insert, and
//! refused for the same input with the same message as a client's insert.

mod support;

use gendurable::{Error, NewInstance, Status, Transition};
use serde_json::{json, Value};

#[tokio::test]
async fn an_instance_enqueued_in_a_transaction_exists_once_it_commits() {
    let url = support::url();
    let schema = support::schema("enqueue");
    let engine = support::builder(&url, &schema)
        .queue("default", 2)
        .workflow_fn("Charge", |_, state, _| async {
            Ok(Transition::done(state))
        })
        .start()
        .await
        .unwrap();
    let sql = format!(
        "SELECT \"{schema}\".enqueue('Charge', $1, concurrency_key => 'account:7', priority => 3)"
    );

    let mut tx = engine.pool().begin().await.unwrap();
    let gone: i64 = sqlx::query_scalar(&sql)
        .bind(json!({"id": 1}))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(matches!(engine.get(gone).await, Err(Error::NotFound(_))));

    let mut tx = engine.pool().begin().await.unwrap();
    let id: i64 = sqlx::query_scalar(&sql)
        .bind(json!({"id": 2}))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert!(
        matches!(engine.get(id).await, Err(Error::NotFound(_))),
        "not before the commit"
    );
    tx.commit().await.unwrap();
    let i = support::wait_final(&engine, id).await;
    assert_eq!(i.status, Status::Completed);
    assert_eq!((i.state.clone(), i.priority), (json!({"id": 2}), 3));
    assert_eq!(i.concurrency_key.as_deref(), Some("account:7"));
    assert_eq!(
        (i.queue.as_str(), i.step.as_str(), i.max_attempts),
        ("default", "start", 20)
    );

    let later: i64 = sqlx::query_scalar(&format!(
        "SELECT \"{schema}\".enqueue('Charge', scheduled_at => now() + interval '1 hour')"
    ))
    .fetch_one(engine.pool())
    .await
    .unwrap();
    assert_eq!(engine.get(later).await.unwrap().status, Status::Scheduled);
    engine.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_input_gets_the_clients_message() {
    let url = support::url();
    let schema = support::schema("enqueue_bad");
    let engine = support::builder(&url, &schema)
        .queue("default", 1)
        .workflow_fn("W", |_, state, _| async { Ok(Transition::done(state)) })
        .build()
        .await
        .unwrap();
    let deep = (0..101).fold(json!(1), |v, _| json!([v]));
    let cases: Vec<(NewInstance, Value)> = vec![
        (
            NewInstance::new("W", json!({})).priority(12),
            json!({"workflow": "W", "priority": 12}),
        ),
        (
            NewInstance::new("W", json!({})).max_attempts(0),
            json!({"workflow": "W", "max_attempts": 0}),
        ),
        (NewInstance::new("", json!({})), json!({"workflow": ""})),
        (
            NewInstance::new("W", json!({})).step("a".repeat(256)),
            json!({"workflow": "W", "step": "a".repeat(256)}),
        ),
        (
            NewInstance::new("W", json!({})).queue("tab\there"),
            json!({"workflow": "W", "queue": "tab\there"}),
        ),
        (
            NewInstance::new("W", json!([1])),
            json!({"workflow": "W", "state": [1]}),
        ),
        (
            NewInstance::new("W", json!("x")),
            json!({"workflow": "W", "state": "x"}),
        ),
        (
            NewInstance::new("W", json!({ "a": deep })),
            json!({"workflow": "W", "state": {"a": deep}}),
        ),
        (
            NewInstance::new("W", json!({})).concurrency_key(":7"),
            json!({"workflow": "W", "concurrency_key": ":7"}),
        ),
        (
            NewInstance::new("W", json!({})).rate_limit(""),
            json!({"workflow": "W", "rate_limit": ""}),
        ),
    ];
    for (new, args) in cases {
        let client = engine.insert(new).await.unwrap_err().to_string();
        let sql = format!(
            "SELECT \"{schema}\".enqueue(workflow => $1, state => coalesce($2, '{{}}'::jsonb),
                     step => coalesce($3, 'start'), queue => coalesce($4, 'default'),
                     priority => coalesce($5, 0), concurrency_key => $6, rate_limit => $7,
                     max_attempts => coalesce($8, 20))"
        );
        let err = sqlx::query(&sql)
            .bind(args["workflow"].as_str())
            .bind(args.get("state"))
            .bind(args["step"].as_str())
            .bind(args["queue"].as_str())
            .bind(args["priority"].as_i64().map(|p| p as i32))
            .bind(args["concurrency_key"].as_str())
            .bind(args["rate_limit"].as_str())
            .bind(args["max_attempts"].as_i64().map(|p| p as i32))
            .execute(engine.pool())
            .await
            .unwrap_err();
        let db = err.as_database_error().expect("a database error");
        assert_eq!(db.code().as_deref(), Some("22023"), "{args}");
        assert_eq!(db.message(), client, "{args}");
    }
    let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM \"{schema}\".instances"))
        .fetch_one(engine.pool())
        .await
        .unwrap();
    assert_eq!(rows, 0, "nothing was inserted");
}
