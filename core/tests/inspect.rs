//! What the dashboard reads: why an instance waits, the instance list, the
//! overview and the keys, against a real database.

mod support;

use gendurable::inspect::{ListQuery, Wait};
use gendurable::{
    AwaitOn, Engine, EngineBuilder, Filter, GateConfig, NewInstance, RateConfig, Status, Transition,
};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Mutex};

/// `why(id)` until `pred` holds for one of its reasons (a row's reason can
/// take a claim or a maintenance pass to appear); the reasons then.
async fn why_until(engine: &Engine, id: i64, pred: impl Fn(&Wait) -> bool) -> Vec<Wait> {
    let mut last = Vec::new();
    for _ in 0..200 {
        last = engine.why(id).await.unwrap();
        if last.iter().any(&pred) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("instance {id}: the expected reason never came; last: {last:?}");
}

/// A "Hold" workflow on `b`: each step says its instance's id on the first
/// channel as it starts, then waits for a word on the second before it ends.
fn holding(
    b: EngineBuilder,
) -> (
    EngineBuilder,
    mpsc::UnboundedReceiver<i64>,
    mpsc::UnboundedSender<()>,
) {
    let (started, starts) = mpsc::unbounded_channel();
    let (release, gate) = mpsc::unbounded_channel::<()>();
    let gate = Arc::new(Mutex::new(gate));
    let b = b.workflow_fn("Hold", move |_, state, ctx| {
        let (started, gate) = (started.clone(), gate.clone());
        async move {
            let _ = started.send(ctx.id);
            gate.lock().await.recv().await;
            Ok(Transition::done(state))
        }
    });
    (b, starts, release)
}

#[tokio::test]
async fn why_names_what_holds_each_instance_back() {
    let url = support::url();
    let schema = support::schema("why");
    let (builder, mut starts, release) = holding(support::builder(&url, &schema));
    let engine = builder
        .queue("default", 8)
        .concurrency_limit("stripe", GateConfig::new(1))
        .rate_limit("openai", RateConfig::new(1, Duration::from_secs(3600)))
        .workflow_fn(
            "Job",
            |_, state, _| async move { Ok(Transition::done(state)) },
        )
        .workflow_fn("Wait", |step, state, _| async move {
            Ok(match step.as_str() {
                "start" => Transition::await_on("after", state, AwaitOn::signal("go")),
                _ => Transition::done(state),
            })
        })
        .start()
        .await
        .unwrap();
    let node = engine.node_id().to_owned();

    // A K = 1 key held by a running step.
    let holder = engine
        .insert(NewInstance::new("Hold", json!({})).concurrency_key("account:7"))
        .await
        .unwrap();
    assert_eq!(starts.recv().await, Some(holder));
    let waiter = engine
        .insert(NewInstance::new("Job", json!({})).concurrency_key("account:7"))
        .await
        .unwrap();
    let why = why_until(&engine, waiter, |w| matches!(w, Wait::KeyHeld { .. })).await;
    match &why[..] {
        [Wait::KeyHeld {
            key,
            holder: Some(h),
            node: Some(n),
            held_secs: Some(_),
        }] => assert_eq!(
            (key.as_str(), *h, n.as_str()),
            ("account:7", holder, &node[..])
        ),
        other => panic!("{other:?}"),
    }
    assert!(why[0].to_string().starts_with(&format!(
        "key account:7 is held by #{holder} on node {node} since"
    )));
    // The holder itself is running, on a live node.
    match &engine.why(holder).await.unwrap()[..] {
        [Wait::Executing {
            node: n,
            silent_secs: None,
            ..
        }] => assert_eq!(n, &node),
        other => panic!("{other:?}"),
    }

    // A full gate.
    let gated = engine
        .insert(NewInstance::new("Hold", json!({})).concurrency_key("stripe:acme"))
        .await
        .unwrap();
    assert_eq!(starts.recv().await, Some(gated));
    let behind = engine
        .insert(NewInstance::new("Job", json!({})).concurrency_key("stripe:acme"))
        .await
        .unwrap();
    let why = why_until(&engine, behind, |w| matches!(w, Wait::GateFull { .. })).await;
    assert_eq!(why.len(), 1, "{why:?}");
    assert_eq!(why[0].to_string(), "gate stripe:acme full: 1/1");

    // A rate limit of one start an hour: the first runs, the second waits.
    let first = engine
        .insert(NewInstance::new("Job", json!({})).rate_limit("openai"))
        .await
        .unwrap();
    support::wait_final(&engine, first).await;
    let second = engine
        .insert(NewInstance::new("Job", json!({})).rate_limit("openai"))
        .await
        .unwrap();
    let why = why_until(&engine, second, |w| matches!(w, Wait::RateLimited { .. })).await;
    match &why[..] {
        [Wait::RateLimited { key, next_in_secs }] => {
            assert_eq!(key, "openai");
            assert!(
                *next_in_secs > 3000.0 && *next_in_secs <= 3600.0,
                "{next_in_secs}"
            );
        }
        other => panic!("{other:?}"),
    }

    // No live node runs the workflow; no live node serves the queue.
    let ghost = engine
        .insert(NewInstance::new("Ghost", json!({})))
        .await
        .unwrap();
    let why = why_until(&engine, ghost, |w| {
        matches!(w, Wait::NoNodeRunsWorkflow { .. })
    })
    .await;
    assert_eq!(
        why[0].to_string(),
        "no live node runs workflow Ghost (live nodes serve queue default)"
    );
    let nowhere = engine
        .insert(NewInstance::new("Job", json!({})).queue("nowhere"))
        .await
        .unwrap();
    assert_eq!(
        engine.why(nowhere).await.unwrap(),
        vec![Wait::NoNodeServesQueue {
            queue: "nowhere".into()
        }]
    );

    // A paused queue comes first.
    engine.pause_queue("nowhere").await.unwrap();
    let why = engine.why(nowhere).await.unwrap();
    assert!(
        matches!(&why[..], [Wait::QueuePaused { queue, .. }, Wait::NoNodeServesQueue { .. }] if queue == "nowhere"),
        "{why:?}"
    );

    // Scheduled, awaiting, finished.
    let later = engine
        .insert(NewInstance::new("Job", json!({})).schedule_in(Duration::from_secs(3600)))
        .await
        .unwrap();
    match &engine.why(later).await.unwrap()[..] {
        [Wait::Scheduled { in_secs, .. }] => assert!(*in_secs > 3500.0, "{in_secs}"),
        other => panic!("{other:?}"),
    }
    let waits = engine
        .insert(NewInstance::new("Wait", json!({})))
        .await
        .unwrap();
    let why = why_until(&engine, waits, |w| matches!(w, Wait::Awaiting { .. })).await;
    assert_eq!(why[0].to_string(), "awaiting signal go");
    assert_eq!(engine.why(first).await.unwrap(), vec![]);
    assert!(matches!(
        engine.why(-5).await,
        Err(gendurable::Error::NotFound(-5))
    ));

    for _ in 0..2 {
        release.send(()).unwrap();
    }
    engine.shutdown().await.unwrap();
}

/// A row waiting for a free slot names the rows ahead of it. A live node
/// serving the queue is written into `nodes` directly: a started node would
/// claim the rows at once.
#[tokio::test]
async fn a_runnable_row_counts_the_rows_ahead_of_it() {
    let url = support::url();
    let schema = support::schema("ahead");
    let engine = support::builder(&url, &schema).build().await.unwrap();
    engine.migrate().await.unwrap();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {schema}.nodes (id, hostname, pid, queues) \
         VALUES ('elsewhere', 'h', 1, '{{\"default\": 1}}')"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let ids = engine
        .insert_many((0..3).map(|_| NewInstance::new("Job", json!({}))).collect())
        .await
        .unwrap();
    let why = engine.why(ids[2]).await.unwrap();
    assert_eq!(
        why,
        vec![Wait::Runnable {
            queue: "default".into(),
            ahead: 2
        }]
    );
    assert_eq!(
        why[0].to_string(),
        "runnable: starts when a node serving queue default has a free slot (2 rows ahead)"
    );
    // A higher priority goes first: nothing ahead of it.
    let urgent = engine
        .insert(NewInstance::new("Job", json!({})).priority(0))
        .await
        .unwrap();
    let low = engine
        .insert(NewInstance::new("Job", json!({})).priority(5))
        .await
        .unwrap();
    assert!(matches!(
        &engine.why(urgent).await.unwrap()[..],
        [Wait::Runnable { ahead: 3, .. }]
    ));
    assert!(matches!(
        &engine.why(low).await.unwrap()[..],
        [Wait::Runnable { ahead: 4, .. }]
    ));
}

/// Every page of a filtered list, following `next` (a page cut short by its
/// time goes on from where it stopped).
async fn all_pages(engine: &Engine, filter: Filter, limit: usize) -> (Vec<i64>, usize) {
    let mut q = ListQuery {
        filter,
        before: None,
        limit,
    };
    let (mut ids, mut pages) = (Vec::new(), 0);
    loop {
        let page = engine.list(&q).await.unwrap();
        assert!(page.rows.len() <= limit);
        assert!(page.partial || page.next.is_none() || page.rows.len() == limit);
        ids.extend(page.rows.iter().map(|r| r.id));
        pages += 1;
        match page.next {
            Some(next) => q.before = Some(next),
            None => return (ids, pages),
        }
    }
}

#[tokio::test]
async fn the_list_pages_newest_first_through_sparse_matches() {
    let url = support::url();
    let schema = support::schema("list");
    let engine = support::builder(&url, &schema).build().await.unwrap();
    engine.migrate().await.unwrap();
    // 25,000 rows, a "Rare" one every 5,000: matches further apart than
    // the first window.
    let news = (0..25_000)
        .map(|i| {
            let wf = if i % 5000 == 4999 { "Rare" } else { "Bulk" };
            NewInstance::new(wf, json!({ "i": i })).queue(if i % 2 == 0 { "even" } else { "odd" })
        })
        .collect();
    let ids = engine.insert_many(news).await.unwrap();
    let rare: Vec<i64> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 5000 == 4999)
        .map(|(_, id)| *id)
        .rev()
        .collect();

    let rare_filter = Filter::parse(["workflow=Rare"]).unwrap();
    let (found, pages) = all_pages(&engine, rare_filter, 2).await;
    assert_eq!(found, rare);
    assert!(pages >= 3, "{pages}");

    // No filter: the newest first, pages contiguous.
    let page = engine
        .list(&ListQuery {
            limit: 7,
            ..Default::default()
        })
        .await
        .unwrap();
    let newest: Vec<i64> = ids.iter().rev().take(7).copied().collect();
    assert_eq!(page.rows.iter().map(|r| r.id).collect::<Vec<_>>(), newest);
    assert_eq!(page.next, Some(newest[6]));
    assert_eq!(page.rows[0].workflow, "Rare", "the last of 25,000 is rare");
    assert_eq!(page.rows[1].workflow, "Bulk");
    assert_eq!(page.rows[0].status, Status::Available);

    // Conditions together: queue and workflow.
    let (odd_rare, _) = all_pages(
        &engine,
        Filter::parse(["workflow=Rare", "queue=odd"]).unwrap(),
        50,
    )
    .await;
    assert_eq!(odd_rare, rare, "4999 + 5000k is odd for every k");
    let (none, _) = all_pages(
        &engine,
        Filter::parse(["workflow=Rare", "status=completed"]).unwrap(),
        50,
    )
    .await;
    assert!(none.is_empty());
    // Bad names are refused, not searched for.
    let bad = ListQuery {
        filter: Filter {
            workflow: Some(String::new()),
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(matches!(
        engine.list(&bad).await,
        Err(gendurable::Error::InvalidInput { .. })
    ));
}

#[tokio::test]
async fn the_overview_counts_the_backlog_and_the_last_hours_steps() {
    let url = support::url();
    let schema = support::schema("overview");
    let engine = support::builder(&url, &schema)
        .queue("default", 4)
        .workflow_fn("Job", |step, state, _| async move {
            Ok(match step.as_str() {
                "start" => Transition::next("finish", state),
                _ if state["fail"] == json!(true) => return Err("no".into()),
                _ => Transition::done(state),
            })
        })
        .workflow_defaults(
            "Job",
            gendurable::WorkflowDefaults {
                max_attempts: Some(1),
                ..Default::default()
            },
        )
        .start()
        .await
        .unwrap();
    let ok = engine
        .insert_many(
            (0..20)
                .map(|_| NewInstance::new("Job", json!({})))
                .collect(),
        )
        .await
        .unwrap();
    let failing = engine
        .insert(NewInstance::new("Job", json!({ "fail": true })))
        .await
        .unwrap();
    for id in ok.iter().chain([&failing]) {
        support::wait_final(&engine, *id).await;
    }
    engine
        .insert_many(
            (0..3)
                .map(|_| NewInstance::new("Job", json!({})).queue("idle"))
                .collect(),
        )
        .await
        .unwrap();
    engine
        .insert(
            NewInstance::new("Job", json!({}))
                .queue("idle")
                .schedule_in(Duration::from_secs(600)),
        )
        .await
        .unwrap();
    engine.pause_queue("frozen").await.unwrap();
    // Its last counts are recorded as it stops.
    engine.shutdown().await.unwrap();

    let client = support::builder(&url, &schema).build().await.unwrap();
    let o = client.overview().await.unwrap();
    let idle = o.queues.iter().find(|q| q.queue == "idle").unwrap();
    assert_eq!((idle.available, idle.scheduled, idle.executing), (3, 1, 0));
    let frozen = o.queues.iter().find(|q| q.queue == "frozen").unwrap();
    assert!(frozen.paused_since.is_some());
    assert_eq!(o.finished.count, 21);
    assert!(!o.finished.estimated);
    let sum = |f: fn(&gendurable::inspect::Minute) -> i64| o.throughput.iter().map(f).sum::<i64>();
    // Two steps per instance; the failing one's second step failed.
    assert_eq!(sum(|m| m.started), 42);
    assert_eq!(sum(|m| m.completed), 20);
    assert_eq!(sum(|m| m.failed), 1);
    assert!(o.nodes.is_empty(), "the node stopped: {:?}", o.nodes);

    // The error's text finds the failed one in the list.
    let page = client
        .list(&ListQuery {
            filter: Filter::parse(["status=discarded"]).unwrap(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.rows.len(), 1);
    assert_eq!(page.rows[0].id, failing);
    assert!(page.rows[0].last_error.as_deref().unwrap().contains("no"));
}

#[tokio::test]
async fn keys_show_gates_and_warn_of_identity_like_gate_keys() {
    let url = support::url();
    let schema = support::schema("keys");
    let (builder, mut starts, release) = holding(support::builder(&url, &schema));
    let engine = builder
        .queue("default", 4)
        .concurrency_limit("order", GateConfig::new(5))
        .start()
        .await
        .unwrap();
    let a = engine
        .insert(NewInstance::new("Hold", json!({})).concurrency_key("order:42"))
        .await
        .unwrap();
    let b = engine
        .insert(NewInstance::new("Hold", json!({})).concurrency_key("account:1"))
        .await
        .unwrap();
    let mut seen = vec![starts.recv().await.unwrap(), starts.recv().await.unwrap()];
    seen.sort();
    assert_eq!(seen, vec![a, b]);
    let k = engine.keys().await.unwrap();
    assert_eq!(k.executing_keys, vec!["account:1".to_owned()]);
    let g = k.gates.iter().find(|g| g.key == "order:42").unwrap();
    assert_eq!((g.in_flight, g.limit), (1, 5));
    assert_eq!(k.warnings.len(), 1, "{:?}", k.warnings);
    assert!(k.warnings[0].contains("order:42"));
    for _ in 0..2 {
        release.send(()).unwrap();
    }
    engine.shutdown().await.unwrap();
}
