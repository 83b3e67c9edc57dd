//! `enqueue`, the SQL function an application calls in its own transaction:
//! visible on commit, gone on rollback, run by the nodes like any insert, and
//! refused for the same input with the same message as a client's insert.

mod support;

use gendurable::{Error, NewInstance, Status, Transition, Unique};
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
        "SELECT id FROM \"{schema}\".enqueue('Charge', $1, concurrency_key => 'account:7', priority => 3)"
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
        "SELECT id FROM \"{schema}\".enqueue('Charge', scheduled_at => now() + interval '1 hour')"
    ))
    .fetch_one(engine.pool())
    .await
    .unwrap();
    assert_eq!(engine.get(later).await.unwrap().status, Status::Scheduled);
    engine.shutdown().await.unwrap();
}

/// An engine, not started, that knows workflow `W`.
async fn w_engine(url: &str, schema: &str) -> gendurable::Engine {
    support::builder(url, schema)
        .queue("default", 1)
        .workflow_fn("W", |_, state, _| async { Ok(Transition::done(state)) })
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn bad_input_gets_the_clients_message() {
    let url = support::url();
    let schema = support::schema("enqueue_bad");
    let engine = w_engine(&url, &schema).await;
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
        (
            NewInstance::new("W", json!({})).idempotency_key(""),
            json!({"workflow": "W", "idempotency_key": ""}),
        ),
        (
            NewInstance::new("W", json!({})).idempotency_key("k".repeat(1025)),
            json!({"workflow": "W", "idempotency_key": "k".repeat(1025)}),
        ),
        (
            NewInstance::new("W", json!({})).unique(Unique::new().fields(Vec::<String>::new())),
            json!({"workflow": "W", "unique_fields": []}),
        ),
        (
            NewInstance::new("W", json!({})).unique(Unique::new().fields(["a\u{1}"])),
            json!({"workflow": "W", "unique_fields": ["a\u{1}"]}),
        ),
        (
            NewInstance::new("W", json!({})).unique(Unique::new().statuses([
                Status::Scheduled,
                Status::Available,
                Status::Awaiting,
            ])),
            json!({"workflow": "W", "unique_states": ["scheduled", "available", "awaiting"]}),
        ),
    ];
    for (new, args) in cases {
        let client = engine.insert(new).await.unwrap_err().to_string();
        let sql = format!(
            "SELECT id FROM \"{schema}\".enqueue(workflow => $1, state => coalesce($2, '{{}}'::jsonb),
                     step => coalesce($3, 'start'), queue => coalesce($4, 'default'),
                     priority => coalesce($5, 0), concurrency_key => $6, rate_limit => $7,
                     max_attempts => coalesce($8, 20), unique_fields => $9,
                     unique_period => make_interval(secs => $10), unique_states => $11,
                     idempotency_key => $12)"
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
            .bind(
                args.get("unique_fields")
                    .map(|f| serde_json::from_value::<Vec<String>>(f.clone()).unwrap()),
            )
            .bind(args["unique_period"].as_f64())
            .bind(
                args.get("unique_states")
                    .map(|f| serde_json::from_value::<Vec<String>>(f.clone()).unwrap()),
            )
            .bind(args["idempotency_key"].as_str())
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

#[tokio::test]
async fn enqueue_and_the_client_share_unique_identities() {
    let url = support::url();
    let schema = support::schema("enqueue_unique");
    let engine = w_engine(&url, &schema).await;
    let enqueue = |args: &str| {
        format!(
            "SELECT id, conflict FROM \"{schema}\".enqueue('W', '{{\"a\": 1, \"b\": 2}}', {args})"
        )
    };
    let client = engine
        .insert_unique(
            NewInstance::new("W", json!({"a": 1, "b": 3})).unique(Unique::new().fields(["a"])),
        )
        .await
        .unwrap();
    let (id, conflict): (i64, bool) = sqlx::query_as(&enqueue("unique_fields => '{a}'"))
        .fetch_one(engine.pool())
        .await
        .unwrap();
    assert_eq!(
        (id, conflict),
        (client.id, true),
        "the same identity as the client's"
    );
    let (whole, conflict): (i64, bool) = sqlx::query_as(&enqueue("\"unique\" => true"))
        .fetch_one(engine.pool())
        .await
        .unwrap();
    assert!(!conflict && whole != client.id, "the whole state differs");
    let (keyed, conflict): (i64, bool) = sqlx::query_as(&enqueue("idempotency_key => 'charge:1'"))
        .fetch_one(engine.pool())
        .await
        .unwrap();
    assert!(!conflict);
    let again = engine
        .insert_unique(NewInstance::new("W", json!({})).idempotency_key("charge:1"))
        .await
        .unwrap();
    assert_eq!((again.id, again.conflict), (keyed, true));
    // A period given as an interval is the client's period in seconds.
    let hourly = engine
        .insert_unique(
            NewInstance::new("W", json!({"a": 1, "b": 2}))
                .unique(Unique::new().period(std::time::Duration::from_secs(3600))),
        )
        .await
        .unwrap();
    let (id, conflict): (i64, bool) =
        sqlx::query_as(&enqueue("unique_period => interval '1 hour'"))
            .fetch_one(engine.pool())
            .await
            .unwrap();
    // Unless the hour turned between the two inserts.
    let turned: bool = sqlx::query_scalar(&format!(
        "SELECT floor(extract(epoch FROM inserted_at) / 3600) <> floor(extract(epoch FROM now()) / 3600)
         FROM \"{schema}\".instances WHERE id = $1"
    ))
    .bind(hourly.id)
    .fetch_one(engine.pool())
    .await
    .unwrap();
    if !turned {
        assert_eq!((id, conflict), (hourly.id, true));
    }
}
