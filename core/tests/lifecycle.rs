//! Graceful shutdown (running steps finish, stragglers are recorded, claimed
//! rows are handed back) and pruning.
mod support;

use gendurable::{NewInstance, Status, Transition};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_running_steps_finish() {
    let url = support::url();
    let schema = support::schema("shut");
    let started = Arc::new(Semaphore::new(0));
    let go = Arc::new(Semaphore::new(0));
    let (s2, g2) = (started.clone(), go.clone());
    let engine = support::builder(&url, &schema)
        .queue("default", 2)
        .shutdown_timeout(Duration::from_secs(30))
        .workflow_fn("Slow", move |_step, state, _ctx| {
            let (started, go) = (s2.clone(), g2.clone());
            async move {
                started.add_permits(1);
                go.acquire().await.unwrap().forget();
                Ok(Transition::done(state))
            }
        })
        .start()
        .await
        .unwrap();
    let ids = engine
        .insert_many(
            (0..5)
                .map(|_| NewInstance::new("Slow", json!({})))
                .collect(),
        )
        .await
        .unwrap();
    // Two steps are running (the queue's concurrency); three wait.
    let _ = started.acquire_many(2).await.unwrap();
    let e = engine.clone();
    let stopping = tokio::spawn(async move { e.shutdown().await });
    // Shutdown waits for the running steps: let them finish.
    go.add_permits(2);
    stopping.await.unwrap().unwrap();
    let mut completed = 0;
    for id in ids {
        let i = engine.get(id).await.unwrap();
        match i.status {
            Status::Completed => completed += 1,
            Status::Available => assert_eq!(i.attempt, 0, "never started, not counted"),
            other => panic!("{id}: {other}"),
        }
    }
    assert_eq!(completed, 2);
    let nodes: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM \"{schema}\".nodes"))
        .fetch_one(engine.pool())
        .await
        .unwrap();
    assert_eq!(nodes, 0, "the node deregistered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_timeout_records_stragglers_as_errors() {
    let url = support::url();
    let schema = support::schema("straggle");
    let started = Arc::new(Semaphore::new(0));
    let s2 = started.clone();
    let engine = support::builder(&url, &schema)
        .queue("default", 1)
        .shutdown_timeout(Duration::from_millis(200))
        .workflow_fn("Stuck", move |_step, _state, _ctx| {
            let started = s2.clone();
            async move {
                started.add_permits(1);
                std::future::pending::<()>().await;
                unreachable!()
            }
        })
        .start()
        .await
        .unwrap();
    let id = engine
        .insert(NewInstance::new("Stuck", json!({})))
        .await
        .unwrap();
    let _ = started.acquire().await.unwrap();
    engine.shutdown().await.unwrap();
    let i = engine.get(id).await.unwrap();
    assert_eq!(i.status, Status::Scheduled, "retried later");
    assert_eq!(i.errors[0]["kind"], "shutdown");
    assert_eq!(i.attempt, 1);
}

/// Batches after the first start where the one before ended: none is
/// skipped, also where many rows share a finish time across a batch's end.
#[tokio::test]
async fn pruning_in_batches_deletes_every_row_past_the_retention() {
    let url = support::url();
    let schema = support::schema("prune_batches");
    let engine = support::builder(&url, &schema)
        .retention(Some(Duration::from_secs(3600)))
        .build()
        .await
        .unwrap();
    engine.migrate().await.unwrap();
    // 25,000 rows past the retention over 7 distinct finish times (thousands
    // at each), and 3 within it.
    sqlx::query(&format!(
        "INSERT INTO {schema}.instances (workflow, step, state, status, finished_at)
         SELECT 'Old', 'start', '{{}}'::jsonb, 'completed',
                date_trunc('second', now()) - interval '1 day' - make_interval(secs => g % 7)
         FROM generate_series(1, 25000) g
         UNION ALL
         SELECT 'New', 'start', '{{}}'::jsonb, 'completed', now() FROM generate_series(1, 3)"
    ))
    .execute(engine.pool())
    .await
    .unwrap();
    assert_eq!(engine.prune_now().await.unwrap(), 25_000);
    let left: Vec<String> =
        sqlx::query_scalar(&format!("SELECT DISTINCT workflow FROM {schema}.instances"))
            .fetch_all(engine.pool())
            .await
            .unwrap();
    assert_eq!(left, vec!["New".to_owned()]);
    assert_eq!(engine.prune_now().await.unwrap(), 0);
}

#[tokio::test]
async fn finished_instances_are_pruned_after_the_retention() {
    let url = support::url();
    let schema = support::schema("prune");
    // The node keeps everything; a second engine prunes with a 1 ms retention.
    let engine = support::builder(&url, &schema)
        .retention(None)
        .queue("default", 2)
        .workflow_fn("Quick", |_s, state, _c| async move {
            Ok(Transition::done(state))
        })
        .start()
        .await
        .unwrap();
    let pruner = support::builder(&url, &schema)
        .retention(Some(Duration::from_millis(1)))
        .build()
        .await
        .unwrap();
    let done = engine
        .insert(NewInstance::new("Quick", json!({})))
        .await
        .unwrap();
    let waiting = engine
        .insert(NewInstance::new("Quick", json!({})).schedule_in(Duration::from_secs(3600)))
        .await
        .unwrap();
    support::wait_status(&engine, done, Status::Completed).await;
    tokio::time::sleep(Duration::from_millis(5)).await; // older than the 1 ms retention
    assert_eq!(pruner.prune_now().await.unwrap(), 1);
    assert!(matches!(
        engine.get(done).await,
        Err(gendurable::Error::NotFound(_))
    ));
    assert_eq!(
        engine.get(waiting).await.unwrap().status,
        Status::Scheduled,
        "unfinished rows stay"
    );
    engine.shutdown().await.unwrap();
}

/// An insert on a process whose node has idle running slots and nothing
/// left to pick starts the row there at once, claimed by the insert itself;
/// a busy node, a keyed row and an insert in the caller's transaction go
/// through the queue as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserts_start_at_once_on_an_idle_node() {
    let url = support::url();
    let schema = support::schema("here");
    let (ran_tx, mut ran) = tokio::sync::mpsc::unbounded_channel();
    let go = Arc::new(Semaphore::new(0));
    let g2 = go.clone();
    let engine = support::builder(&url, &schema)
        .queue("default", 1)
        .workflow_fn("Job", move |_step, state, ctx| {
            let (ran, go) = (ran_tx.clone(), g2.clone());
            async move {
                ran.send((ctx.id, ctx.attempt, state.clone())).unwrap();
                go.acquire().await.unwrap().forget();
                Ok(Transition::done(state))
            }
        })
        .start()
        .await
        .unwrap();
    let here = || engine.stats().snapshot().started_on_insert;

    // The first row goes whichever way; once it has run, the queue is known
    // to be empty.
    let first = engine
        .insert(NewInstance::new("Job", json!({})))
        .await
        .unwrap();
    go.add_permits(1);
    assert_eq!(ran.recv().await.unwrap().0, first);
    support::eventually(
        "the first outcome written",
        Duration::from_secs(10),
        || async { engine.get(first).await.unwrap().status == Status::Completed },
    )
    .await;

    // Idle: the insert claims the row for this node, which runs it. The node
    // settles (its last pick's answer read, its slot given back) just after
    // the outcome commits, so an insert right then may still find it busy:
    // such a row goes through the queue and runs, and the next insert tries
    // again.
    let mut queued_first = 0;
    let (id, before) = loop {
        let before = here();
        let id = engine
            .insert(NewInstance::new("Job", json!({ "n": 1 })))
            .await
            .unwrap();
        if here() == before + 1 {
            break (id, before);
        }
        go.add_permits(1);
        assert_eq!(ran.recv().await.unwrap().0, id);
        support::eventually(
            "the queued row completed",
            Duration::from_secs(10),
            || async { engine.get(id).await.unwrap().status == Status::Completed },
        )
        .await;
        queued_first += 1;
        assert!(
            queued_first < 20,
            "no insert started at once on the idle node"
        );
    };
    let row = engine.get(id).await.unwrap();
    assert_eq!(row.status, Status::Executing);
    assert_eq!(row.attempt, 1);
    assert_eq!(ran.recv().await.unwrap(), (id, 1, json!({ "n": 1 })));

    // Busy (the one running slot is taken): the next row goes through the
    // queue (the picker may claim it ahead, but it waits for the slot).
    let queued = engine
        .insert(NewInstance::new("Job", json!({})))
        .await
        .unwrap();
    assert_eq!(here(), before + 1);
    go.add_permits(2);
    assert_eq!(
        ran.recv().await.unwrap().0,
        queued,
        "picked once the slot freed"
    );
    support::eventually("both completed", Duration::from_secs(10), || async {
        engine.get(queued).await.unwrap().status == Status::Completed
    })
    .await;

    // A keyed row and a row inserted in a transaction are never started by
    // the insert, idle or not.
    let keyed = engine
        .insert(NewInstance::new("Job", json!({})).concurrency_key("acct:1"))
        .await
        .unwrap();
    let mut tx = engine.pool().begin().await.unwrap();
    let in_tx = engine
        .insert_many_in(&mut tx, vec![NewInstance::new("Job", json!({}))])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(here(), before + 1);
    go.add_permits(2);
    let mut seen = vec![ran.recv().await.unwrap().0, ran.recv().await.unwrap().0];
    seen.sort();
    assert_eq!(seen, vec![keyed, in_tx[0]]);
    engine.shutdown().await.unwrap();
}
