//! Bad input gets typed, clear errors and writes nothing; big batches insert
//! in one call; an instance of a workflow nobody runs is kept, not lost.
mod support;

use gendurable::{Engine, Error, GateConfig, NewInstance, RateConfig, Status, Transition};
use serde_json::json;
use std::time::Duration;

fn field_of(e: Error) -> (&'static str, String) {
    match e {
        Error::InvalidInput { field, reason } => (field, reason),
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

async fn client(schema: &str) -> Engine {
    support::builder(&support::url(), schema)
        .rate_limit("openai", RateConfig::new(10, Duration::from_secs(1)))
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn bad_input_is_rejected_and_writes_nothing() {
    let schema = support::schema("input");
    let engine = client(&schema).await;
    let ok = || NewInstance::new("W", json!({"a": 1}));
    let cases: Vec<(NewInstance, &str, &str)> = vec![
        (NewInstance::new("W", json!([1, 2])), "state", "JSON object"),
        (
            NewInstance::new("W", json!("text")),
            "state",
            "got a string",
        ),
        (
            NewInstance::new("W", json!({"a": "nul\u{0}"})),
            "state",
            "NUL",
        ),
        (NewInstance::new("", json!({})), "workflow", "empty"),
        (
            NewInstance::new("x".repeat(300), json!({})),
            "workflow",
            "limit is 255",
        ),
        (NewInstance::new("W\0", json!({})), "workflow", "NUL"),
        (ok().step(""), "step", "empty"),
        (ok().queue("q".repeat(256)), "queue", "limit"),
        (ok().priority(10), "priority", "0 to 9"),
        (ok().max_attempts(0), "max_attempts", "at least 1"),
        (ok().concurrency_key(""), "concurrency_key", "empty"),
        (ok().concurrency_key(":7"), "concurrency_key", "empty name"),
        (ok().concurrency_key("a\0b"), "concurrency_key", "NUL"),
        (
            ok().concurrency_key("k".repeat(2000)),
            "concurrency_key",
            "limit",
        ),
        (
            ok().rate_limit("unknown:1"),
            "rate_limit",
            "no rate limit named \"unknown\"",
        ),
    ];
    for (new, field, words) in cases {
        let (f, reason) = field_of(engine.insert(new).await.unwrap_err());
        assert_eq!(f, field);
        assert!(
            reason.contains(words),
            "{field}: {reason:?} should say {words:?}"
        );
    }
    // A state nested deeper than JSON readers accept.
    let mut deep = json!(1);
    for _ in 0..150 {
        deep = json!([deep]);
    }
    let (f, reason) = field_of(
        engine
            .insert(NewInstance::new("W", json!({ "d": deep })))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (f, reason.contains("levels deep")),
        ("state", true),
        "{reason}"
    );
    // A state over the size limit.
    let huge = json!({ "blob": "x".repeat(gendurable::validate::MAX_STATE_BYTES) });
    let (f, reason) = field_of(
        engine
            .insert(NewInstance::new("W", huge))
            .await
            .unwrap_err(),
    );
    assert_eq!(f, "state");
    assert!(reason.contains("the limit is"), "{reason}");
    // One bad row in a batch: nothing of the batch is inserted.
    let err = engine
        .insert_many(vec![ok(), ok(), NewInstance::new("W", json!(null))])
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("instance 2 of 3; nothing was inserted"),
        "{err}"
    );
    let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM \"{schema}\".instances"))
        .fetch_one(engine.pool())
        .await
        .unwrap();
    assert_eq!(n, 0);
    // Signals too.
    assert_eq!(
        field_of(engine.signal("", json!(1)).await.unwrap_err()).0,
        "signal"
    );
    assert_eq!(
        field_of(engine.signal("s", json!("\u{0}")).await.unwrap_err()).0,
        "payload"
    );
    assert!(matches!(engine.get(42).await, Err(Error::NotFound(42))));
}

#[tokio::test]
async fn invalid_config_is_rejected() {
    let url = support::url();
    let cases: Vec<(gendurable::EngineBuilder, &str)> = vec![
        (
            Engine::builder().url(&url).queue("default", 0),
            "concurrency must be from 1 to 10000, got 0",
        ),
        (
            Engine::builder().url(&url).queue("default", u32::MAX),
            "concurrency must be from 1 to 10000, got 4294967295",
        ),
        (
            Engine::builder()
                .url(&url)
                .queue("default", 1)
                .prefetch(1_000_001),
            "prefetch must be at most 1000000",
        ),
        (Engine::builder().url(&url).schema("Bad-Schema"), "schema"),
        (
            Engine::builder()
                .url(&url)
                .concurrency_limit("stripe", GateConfig::new(0)),
            "limit must be at least 1",
        ),
        (
            Engine::builder()
                .url(&url)
                .concurrency_limit("stripe", GateConfig::new(5).shards(0)),
            "shards must be at least 1",
        ),
        (
            Engine::builder()
                .url(&url)
                .concurrency_limit("s", GateConfig::new(1))
                .concurrency_limit("s", GateConfig::new(2)),
            "configured twice",
        ),
        (
            Engine::builder()
                .url(&url)
                .rate_limit("r", RateConfig::new(0, Duration::from_secs(1))),
            "limit must be at least 1",
        ),
        (
            Engine::builder()
                .url(&url)
                .rate_limit("r", RateConfig::new(1, Duration::ZERO)),
            "period",
        ),
        (
            Engine::builder()
                .url(&url)
                .concurrency_limit("a:b", GateConfig::new(1)),
            "not a key name",
        ),
        (
            Engine::builder().url(&url).lease(Duration::from_secs(1)),
            "lease",
        ),
        (Engine::builder(), "no database"),
        (Engine::builder().url("not a url"), "database url"),
    ];
    for (builder, words) in cases {
        match builder.build().await {
            Err(Error::InvalidConfig(msg)) => {
                assert!(msg.contains(words), "{msg:?} should say {words:?}")
            }
            Err(other) => panic!("expected InvalidConfig({words}), got {other:?}"),
            Ok(_) => panic!("expected InvalidConfig({words}), got an engine"),
        }
    }
}

#[tokio::test]
async fn insert_many_ten_thousand_in_one_call() {
    let schema = support::schema("many");
    let engine = client(&schema).await;
    let news: Vec<_> = (0..10_000)
        .map(|i| NewInstance::new("W", json!({ "i": i })).concurrency_key(("acct", i % 100)))
        .collect();
    let ids = engine.insert_many(news).await.unwrap();
    assert_eq!(ids.len(), 10_000);
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids come back in insert order"
    );
    let first = engine.get(ids[0]).await.unwrap();
    let last = engine.get(ids[9_999]).await.unwrap();
    assert_eq!(
        (first.state["i"].as_i64(), last.state["i"].as_i64()),
        (Some(0), Some(9_999))
    );
    assert_eq!(last.concurrency_key.as_deref(), Some("acct:99"));
    assert_eq!(
        support::count(engine.pool(), &schema, "available").await,
        10_000
    );
}

/// A large batch due now goes in by COPY (sent in pieces of 1 MiB that cut
/// through rows): text that COPY's format escapes (backslashes, tabs,
/// newlines) reads back exactly in every row, and ids stay distinct and in
/// order beside single inserts made at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_batches_keep_every_byte_and_their_order() {
    let schema = support::schema("copy");
    let engine = client(&schema).await;
    let odd = "back\\slash \t tab\ttab new\nline \"quoted\" é 🙂";
    let news: Vec<_> = (0..5_000)
        .map(|i| {
            NewInstance::new(
                "W",
                json!({ "i": i, "text": odd, "pad": odd.repeat(8), "nested": { "a": [1, "\\N"] } }),
            )
            .concurrency_key(format!("acct\t{}\\{}", i % 7, "\\N"))
            .priority((i % 10) as i16)
        })
        .collect();
    let singles = async {
        let mut ids = Vec::new();
        for _ in 0..20 {
            ids.push(
                engine
                    .insert(NewInstance::new("W", json!({})))
                    .await
                    .unwrap(),
            );
        }
        ids
    };
    let (batch, singles) = tokio::join!(engine.insert_many(news), singles);
    let batch = batch.unwrap();
    assert!(batch.windows(2).all(|w| w[0] < w[1]), "in insert order");
    let mut all: Vec<i64> = batch.iter().chain(&singles).copied().collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 5_020, "every id distinct");
    for (i, id) in batch.iter().enumerate().step_by(997) {
        let got = engine.get(*id).await.unwrap();
        assert_eq!(got.state["i"], json!(i));
        assert_eq!(got.state["text"], json!(odd));
        assert_eq!(got.state["nested"], json!({ "a": [1, "\\N"] }));
        assert_eq!(got.concurrency_key, Some(format!("acct\t{}\\\\N", i % 7)));
        assert_eq!(got.priority, (i % 10) as i16);
        assert_eq!(got.status, Status::Available);
    }
    let states: Vec<serde_json::Value> = sqlx::query_scalar(&format!(
        "SELECT state FROM \"{schema}\".instances WHERE id = ANY($1) ORDER BY id"
    ))
    .bind(&batch)
    .fetch_all(engine.pool())
    .await
    .unwrap();
    assert_eq!(states.len(), 5_000);
    for (i, state) in states.iter().enumerate() {
        assert_eq!(state["i"], json!(i), "row {i}");
        assert_eq!(state["text"], json!(odd), "row {i}");
        assert_eq!(state["pad"], json!(odd.repeat(8)), "row {i}");
    }
}

#[tokio::test]
async fn insert_inside_the_callers_transaction() {
    let schema = support::schema("tx");
    let engine = client(&schema).await;
    let mut tx = engine.pool().begin().await.unwrap();
    let ids = engine
        .insert_many_in(&mut tx, vec![NewInstance::new("W", json!({}))])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(matches!(engine.get(ids[0]).await, Err(Error::NotFound(_))));
    let mut tx = engine.pool().begin().await.unwrap();
    let ids = engine
        .insert_many_in(&mut tx, vec![NewInstance::new("W", json!({}))])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(engine.get(ids[0]).await.unwrap().status, Status::Available);
}

#[tokio::test]
async fn unknown_workflow_waits_for_a_node_that_knows_it() {
    let url = support::url();
    let schema = support::schema("unknown");
    let other = support::builder(&url, &schema)
        .queue("default", 4)
        .workflow_fn("Known", |_s, state, _c| async move {
            Ok(Transition::done(state))
        })
        .start()
        .await
        .unwrap();
    let orphan = other
        .insert(NewInstance::new("Orphan", json!({})))
        .await
        .unwrap();
    let known = other
        .insert(NewInstance::new("Known", json!({})))
        .await
        .unwrap();
    support::wait_status(&other, known, Status::Completed).await;
    // Several picks later the orphan is untouched: never claimed, never lost.
    let picks = other.stats().snapshot().picks;
    let o = other.clone();
    support::eventually("more picks", Duration::from_secs(10), || {
        let o = o.clone();
        async move { o.stats().snapshot().picks > picks + 2 }
    })
    .await;
    let i = other.get(orphan).await.unwrap();
    assert_eq!((i.status, i.attempt), (Status::Available, 0));
    let runner = support::builder(&url, &schema)
        .queue("default", 1)
        .workflow_fn("Orphan", |_s, state, _c| async move {
            Ok(Transition::done(state))
        })
        .start()
        .await
        .unwrap();
    support::wait_status(&runner, orphan, Status::Completed).await;
    other.shutdown().await.unwrap();
    runner.shutdown().await.unwrap();
}

#[tokio::test]
async fn rate_limits_declared_per_step() {
    let url = support::url();
    let schema = support::schema("steprate");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let engine = support::builder(&url, &schema)
        .queue("default", 2)
        .rate_limit("openai", RateConfig::new(100, Duration::from_secs(1)))
        .workflow_fn("W", move |step, state, ctx| {
            let tx = tx.clone();
            async move {
                tx.send((step.clone(), ctx.rate_limit.clone())).unwrap();
                Ok(match step.as_str() {
                    "start" => Transition::next("call", state),
                    _ => Transition::done(state),
                })
            }
        })
        .step_rate_limit("W", "call", "openai:t1")
        .start()
        .await
        .unwrap();
    let a = engine
        .insert(NewInstance::new("W", json!({})))
        .await
        .unwrap();
    let b = engine
        .insert(NewInstance::new("W", json!({})).step("call"))
        .await
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(
            tokio::time::timeout(Duration::from_secs(20), rx.recv())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    seen.sort();
    let t1 = Some("openai:t1".to_owned());
    assert_eq!(
        seen,
        [
            ("call".into(), t1.clone()),
            ("call".into(), t1),
            ("start".into(), None)
        ]
    );
    for id in [a, b] {
        assert_eq!(
            support::wait_final(&engine, id).await.status,
            Status::Completed
        );
    }
    engine.shutdown().await.unwrap();

    for (b, words) in [
        (
            Engine::builder()
                .url(&url)
                .step_rate_limit("Nobody", "s", "openai:1"),
            "no workflow named",
        ),
        (
            Engine::builder()
                .url(&url)
                .workflow_fn("W", |_s, st, _c| async move { Ok(Transition::done(st)) })
                .step_rate_limit("W", "s", "unknown:1"),
            "no rate limit named",
        ),
    ] {
        match b.build().await {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains(words), "{msg}"),
            other => panic!("expected InvalidConfig, got {:?}", other.map(|_| ())),
        }
    }
}

#[tokio::test]
async fn validate_without_connecting_and_unreachable_databases() {
    // Nothing listens on this port: validate() never connects.
    let nowhere = "postgres://postgres@127.0.0.1:1/none";
    assert!(Engine::builder()
        .url(nowhere)
        .queue("default", 3)
        .validate()
        .is_ok());
    let err = Engine::builder()
        .url(nowhere)
        .queue("default", 0)
        .validate()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
    // A call on an unreachable database is a database error, worth retrying.
    let engine = Engine::builder()
        .url(nowhere)
        .connect_timeout(Duration::from_millis(300))
        .migrate(false)
        .build()
        .await
        .unwrap();
    let err = engine.get(1).await.unwrap_err();
    assert!(matches!(err, Error::Database(_)), "{err:?}");
    assert!(err.is_transient(), "{err:?}");
}
