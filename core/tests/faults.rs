//! Faults: a node killed with SIGKILL mid-step, and Postgres restarted mid-run.
mod support;

use gendurable::{GateConfig, NewInstance, Status, Transition};
use gendurable_testing::{StopMode, TempPostgres};
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Child mode: a node whose steps never finish. Run by `node_killed_mid_step`.
#[tokio::test]
async fn child_node_that_hangs() {
    let (Ok(url), Ok(schema)) = (
        std::env::var("GD_CHILD_URL"),
        std::env::var("GD_CHILD_SCHEMA"),
    ) else {
        return; // not in child mode
    };
    let engine = support::builder(&url, &schema)
        .node_id("doomed")
        .queue("default", 10)
        .concurrency_limit("api", GateConfig::new(3))
        .workflow_fn("Job", |_step, _state, _ctx| async move {
            std::future::pending::<()>().await;
            unreachable!()
        })
        .start()
        .await
        .unwrap();
    std::future::pending::<()>().await;
    drop(engine);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_killed_mid_step_is_rescued() {
    let url = support::url();
    let schema = support::schema("kill");
    let survivor = support::builder(&url, &schema)
        .migrate(true)
        .queue("default", 10)
        .concurrency_limit("api", GateConfig::new(3))
        .workflow_fn("Job", |_step, state, _ctx| async move {
            Ok(Transition::done(state))
        })
        .build()
        .await
        .unwrap();
    // One keyless instance, one K = 1 instance, three on a gate of 3 slots.
    let mut news = vec![
        NewInstance::new("Job", json!({})),
        NewInstance::new("Job", json!({})).concurrency_key("acct:1"),
    ];
    news.extend((0..3).map(|_| NewInstance::new("Job", json!({})).concurrency_key("api:x")));
    let ids = survivor.insert_many(news).await.unwrap();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_node_that_hangs", "--nocapture"])
        .env("GD_CHILD_URL", &url)
        .env("GD_CHILD_SCHEMA", &schema)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pool = survivor.pool().clone();
    support::wait_count(&pool, &schema, "executing", 5).await;
    let slots: i64 = sqlx::query_scalar(&format!(
        "SELECT sum(available) FROM \"{schema}\".gate_slots"
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(slots, 0, "the gate is full while the child runs");

    // SIGKILL: no outcome, no shutdown, no goodbye.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();

    // Once the lease runs out the reaper makes the rows runnable again, but
    // does not credit the gate: it is under-credited (stricter), never over.
    let s = survivor.clone();
    support::eventually("rescued by the reaper", Duration::from_secs(60), || {
        let s = s.clone();
        async move { s.reap_now().await.unwrap() > 0 }
    })
    .await;
    assert_eq!(support::count(&pool, &schema, "executing").await, 0);
    let gate = &survivor.status().await.unwrap().gates[0];
    assert_eq!(
        (gate.in_flight, gate.available, gate.limit),
        (0, 0, 3),
        "under-credited"
    );
    // The reconciler restores full capacity (an idle key's counters go; the
    // next claim mints them again, full).
    survivor.reconcile_gates_now().await.unwrap();
    assert!(survivor
        .status()
        .await
        .unwrap()
        .gates
        .iter()
        .all(|g| g.available == g.limit));

    survivor.start().await.unwrap();
    for &id in &ids {
        support::wait_status(&survivor, id, Status::Completed).await;
        let i = survivor.get(id).await.unwrap();
        assert_eq!(i.errors.len(), 1);
        assert_eq!(i.errors[0]["kind"], "lost");
        assert_eq!(i.errors[0]["node"], "doomed");
    }
    assert!(survivor.stats().snapshot().rescued >= 1);
    survivor.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restart_mid_run_loses_nothing() {
    let mut pg = TempPostgres::start().await.unwrap();
    let url = pg.url();
    let schema = support::schema("pgrestart");
    let mut nodes = Vec::new();
    for _ in 0..2 {
        nodes.push(
            support::builder(&url, &schema)
                .lease(Duration::from_secs(30))
                .heartbeat_interval(Duration::from_secs(1))
                .queue("default", 8)
                .workflow_fn("Three", |step, state, _ctx| async move {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    Ok(match step.as_str() {
                        "start" => Transition::next("middle", state),
                        "middle" => Transition::next("finish", state),
                        _ => Transition::done(state),
                    })
                })
                .start()
                .await
                .unwrap(),
        );
    }
    let n = 1200;
    let news = (0..n)
        .map(|i| NewInstance::new("Three", json!({ "i": i })))
        .collect();
    nodes[0].insert_many(news).await.unwrap();
    let pool = nodes[0].pool().clone();
    support::eventually("some work done", Duration::from_secs(60), || {
        let (pool, schema) = (pool.clone(), schema.clone());
        async move { support::count(&pool, &schema, "completed").await >= 100 }
    })
    .await;

    // A crash-restart: in-flight statements fail, connections break.
    pg.restart_with(StopMode::Immediate).await.unwrap();

    support::eventually(
        "everything completed after the restart",
        Duration::from_secs(120),
        || {
            let (pool, schema) = (pool.clone(), schema.clone());
            async move {
                sqlx::query_scalar::<_, i64>(&format!(
                    "SELECT count(*) FROM \"{schema}\".instances WHERE status = 'completed'"
                ))
                .fetch_one(&pool)
                .await
                .map(|c| c == n as i64)
                .unwrap_or(false)
            }
        },
    )
    .await;
    let total: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM \"{schema}\".instances"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(total, n as i64, "nothing lost, nothing duplicated");
    for e in nodes {
        e.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_connections_lose_nothing() {
    let pg = TempPostgres::start().await.unwrap();
    let url = pg.url();
    let schema = support::schema("drop");
    let mut nodes = Vec::new();
    for _ in 0..2 {
        nodes.push(
            support::builder(&url, &schema)
                .queue("default", 8)
                .workflow_fn("Two", |step, state, _ctx| async move {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    Ok(match step.as_str() {
                        "start" => Transition::next("finish", state),
                        _ => Transition::done(state),
                    })
                })
                .start()
                .await
                .unwrap(),
        );
    }
    let n = 1500;
    let news = (0..n)
        .map(|i| NewInstance::new("Two", json!({ "i": i })).concurrency_key(("k", i % 50)))
        .collect();
    nodes[0].insert_many(news).await.unwrap();
    // An outside connection that keeps killing every other client connection
    // (the nodes' pools, their LISTEN connections) while they work.
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    let mut killed = 0i64;
    loop {
        let done: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM \"{schema}\".instances WHERE status = 'completed'"
        ))
        .fetch_one(&admin)
        .await
        .unwrap();
        if done == n as i64 {
            break;
        }
        let k: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE pid <> pg_backend_pid() AND backend_type = 'client backend') t",
        )
        .fetch_one(&admin)
        .await
        .unwrap();
        killed += k;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        killed > 0,
        "connections were dropped while the nodes worked"
    );
    let total: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM \"{schema}\".instances"))
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(total, n as i64);
    for e in nodes {
        e.shutdown().await.unwrap();
    }
}

/// Rows the database records as claimed or reserved under a node's id when
/// that node starts belong to an earlier process with the same id, which
/// ended: the node is alive and heartbeating, so the reaper would never free
/// them. Claims go back as a crash (the attempt counts, the loss is recorded:
/// a step that kills its process reaches max_attempts), reservations to
/// everyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_an_earlier_process_held_are_taken_back_at_start() {
    let url = support::url();
    let schema = support::schema("lost");
    let engine = support::builder(&url, &schema)
        .node_id("steady")
        .queue("default", 4)
        .workflow_fn("Job", |_step, state, _ctx| async move {
            Ok(Transition::done(state))
        })
        .build()
        .await
        .unwrap();
    let key = |k: &str| NewInstance::new("Job", json!({})).concurrency_key(k);
    let ids = engine
        .insert_many(vec![
            key("acct:1"),
            key("acct:1"),
            key("acct:2"),
            NewInstance::new("Job", json!({})),
        ])
        .await
        .unwrap();
    // As an earlier process left them: the first row of acct:1 and the
    // keyless row executing on "steady", acct:2's row reserved by it.
    sqlx::query(&format!(
        "UPDATE \"{schema}\".instances SET node = 'steady', token = token + 1,
             status = CASE WHEN id = $3 THEN 'available' ELSE 'executing' END,
             attempt = CASE WHEN id = $3 THEN 0 ELSE 1 END
         WHERE id IN ($1, $2, $3)"
    ))
    .bind(ids[0])
    .bind(ids[3])
    .bind(ids[2])
    .execute(engine.pool())
    .await
    .unwrap();
    engine.start().await.unwrap();
    support::wait_count(engine.pool(), &schema, "completed", ids.len() as i64).await;
    assert_eq!(engine.stats().snapshot().rescued, 2, "the two claims");
    for id in [ids[0], ids[3]] {
        let i = engine.get(id).await.unwrap();
        assert_eq!(i.errors.len(), 1, "{id}: {i:?}");
        assert_eq!(i.errors[0]["kind"], "lost");
        assert_eq!(i.errors[0]["attempt"], 1);
    }
    for id in [ids[1], ids[2]] {
        let i = engine.get(id).await.unwrap();
        assert!(i.errors.is_empty(), "{id}: {i:?}");
    }
    engine.shutdown().await.unwrap();
}

/// A claim the database holds for a live node that the node never heard of
/// (a call given up whose statement committed later, after the check its
/// failure asked for) goes back within a lease, with no failure to prompt it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_a_live_node_never_heard_of_go_back_within_a_lease() {
    let url = support::url();
    let schema = support::schema("unheard");
    let engine = support::builder(&url, &schema)
        .node_id("unheard")
        .queue("default", 4)
        .workflow_fn("Job", |_step, state, _ctx| async move {
            Ok(Transition::done(state))
        })
        .start()
        .await
        .unwrap();
    // In a queue no node serves: nothing claims them but the test.
    let ids = engine
        .insert_many(vec![
            NewInstance::new("Job", json!({})).queue("other"),
            NewInstance::new("Job", json!({})).queue("other"),
        ])
        .await
        .unwrap();
    let plant = |id: i64| {
        let (pool, schema) = (engine.pool().clone(), schema.clone());
        async move {
            sqlx::query(&format!(
                "UPDATE \"{schema}\".instances SET node = 'unheard', token = token + 1,
                     status = 'executing', attempt = 1 WHERE id = $1"
            ))
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    let given_back = |id: i64| {
        let engine = &engine;
        async move {
            support::eventually("the claim given back", Duration::from_secs(60), || async {
                engine.get(id).await.unwrap().status == Status::Available
            })
            .await;
        }
    };
    // The second is planted after a check found the first: only a check of
    // its own, not the one every node makes as it starts, finds it.
    plant(ids[0]).await;
    given_back(ids[0]).await;
    plant(ids[1]).await;
    given_back(ids[1]).await;
    let i = engine.get(ids[1]).await.unwrap();
    assert_eq!(i.attempt, 0, "never started here, so not an attempt: {i:?}");
    engine.shutdown().await.unwrap();
}
