//! Parking: rows that cannot be admitted now wait out of the pick's index
//! and come back, in their key's order, when their key has room or their
//! rate limit allows a start. A parked row is never lost.
mod support;

use gendurable::{Engine, GateConfig, NewInstance, RateConfig, Status, Transition};
use serde_json::json;
use sqlx::PgPool;
use std::time::Duration;

/// How many rows of `key` are parked, and how many wait unparked.
async fn parked(pool: &PgPool, schema: &str, key: &str) -> (i64, i64) {
    sqlx::query_as(&format!(
        "SELECT count(*) FILTER (WHERE parked IS NOT NULL), count(*) FILTER (WHERE parked IS NULL)
         FROM \"{schema}\".instances WHERE status = 'available' AND concurrency_key = $1"
    ))
    .bind(key)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn client(schema: &str) -> Engine {
    support::builder(&support::url(), schema)
        .concurrency_limit("api", GateConfig::new(3))
        .rate_limit("rl", RateConfig::new(10, Duration::from_secs(1)).burst(2))
        .build()
        .await
        .unwrap()
}

fn job(key: &str) -> NewInstance {
    NewInstance::new("Job", json!({})).concurrency_key(key)
}

/// An insert parks what its key has no room for, by statement and by COPY:
/// a K = 1 key keeps one row where a pick sees it, a gate of 3 keeps 3.
#[tokio::test]
async fn an_insert_parks_what_its_key_has_no_room_for() {
    let schema = support::schema("park_insert");
    let c = client(&schema).await;
    let pool = c.pool();
    c.insert_many((0..5).map(|_| job("acct:1")).collect())
        .await
        .unwrap();
    c.insert_many((0..5).map(|_| job("api:1")).collect())
        .await
        .unwrap();
    assert_eq!(parked(pool, &schema, "acct:1").await, (4, 1));
    assert_eq!(parked(pool, &schema, "api:1").await, (2, 3));
    // One more later: the key already has its rows waiting.
    c.insert(job("acct:1")).await.unwrap();
    assert_eq!(parked(pool, &schema, "acct:1").await, (5, 1));
    // A batch large enough for COPY, keys mixed with keyless rows.
    let big: Vec<NewInstance> = (0..3000)
        .map(|i| match i % 3 {
            0 => job("acct:2"),
            1 => job("api:2"),
            _ => NewInstance::new("Job", json!({})),
        })
        .collect();
    c.insert_many(big).await.unwrap();
    assert_eq!(parked(pool, &schema, "acct:2").await, (999, 1));
    assert_eq!(parked(pool, &schema, "api:2").await, (997, 3));
    // A rate limit that allows two starts now keeps two rows unparked.
    c.insert_many(
        (0..5)
            .map(|_| NewInstance::new("Job", json!({})).rate_limit("rl:1"))
            .collect(),
    )
    .await
    .unwrap();
    let rated: (i64, i64) = sqlx::query_as(&format!(
        "SELECT count(*) FILTER (WHERE parked = 'rate'), count(*) FILTER (WHERE parked IS NULL)
         FROM \"{schema}\".instances WHERE rate_key = 'rl:1'"
    ))
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(rated, (3, 2));
    // Scheduled rows are not parked: they are not waiting for their key yet.
    c.insert(job("acct:3").schedule_in(Duration::from_secs(3600)))
        .await
        .unwrap();
    let scheduled_parked: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{schema}\".instances WHERE concurrency_key = 'acct:3' AND parked IS NOT NULL"
    ))
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(scheduled_parked, 0);
}

/// Parked rows run, in their key's order, at their key's limit: a node works
/// through a K = 1 key and a gate whose backlogs were parked on insert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_rows_run_in_key_order() {
    let schema = support::schema("park_order");
    let c = client(&schema).await;
    let row = |i: i64, priority: i16| {
        NewInstance::new("Job", json!({ "i": i }))
            .concurrency_key("acct:1")
            .priority(priority)
    };
    let mut ids = c
        .insert_many((0..40).map(|i| row(i, 1)).collect())
        .await
        .unwrap();
    // A later row of higher priority goes ahead of the parked ones.
    ids.push(c.insert(row(-1, 0)).await.unwrap());
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = order.clone();
    let node = support::builder(&support::url(), &schema)
        .queue("default", 4)
        .workflow_fn("Job", move |_step, state, _ctx| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(state["i"].as_i64().unwrap());
                Ok(Transition::done(state))
            }
        })
        .start()
        .await
        .unwrap();
    support::wait_count(node.pool(), &schema, "completed", ids.len() as i64).await;
    let order = order.lock().unwrap().clone();
    // In key order: the later row of higher priority first, although the
    // first row of the others was already waiting unparked.
    let expected: Vec<i64> = (-1..40).collect();
    assert_eq!(order, expected);
    node.shutdown().await.unwrap();
}

/// The pick parks rows it finds blocked (rows made runnable by a retry, a
/// wake-up or a released claim, which no insert parked), and they run once
/// their key has room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pick_parks_what_it_finds_blocked() {
    let schema = support::schema("park_pick");
    let c = client(&schema).await;
    let pool = c.pool();
    let ids = c
        .insert_many((0..6).map(|_| job("acct:busy")).collect())
        .await
        .unwrap();
    // The first row executes on a node that stays alive; the others wait
    // unparked, as rows woken together would.
    sqlx::raw_sql(&format!(
        "INSERT INTO \"{schema}\".nodes (id, hostname, pid, queues, heartbeat_at)
         VALUES ('elsewhere', 'h', 1, '{{}}', now() + interval '1 hour');
         UPDATE \"{schema}\".instances SET status = 'executing', node = 'elsewhere', attempt = 1,
             token = 1, attempted_at = now() WHERE id = {first};
         UPDATE \"{schema}\".instances SET parked = NULL WHERE id <> {first};",
        first = ids[0]
    ))
    .execute(pool)
    .await
    .unwrap();
    let node = support::builder(&support::url(), &schema)
        .queue("default", 4)
        .workflow_fn("Job", |_step, state, _ctx| async move {
            Ok(Transition::done(state))
        })
        .start()
        .await
        .unwrap();
    support::eventually("the pick parks them", Duration::from_secs(30), || async {
        parked(pool, &schema, "acct:busy").await == (5, 0)
    })
    .await;
    // The holder ends elsewhere; the sweep gives its key's rows room again.
    sqlx::query(&format!(
        "UPDATE \"{schema}\".instances SET status = 'completed', node = NULL, finished_at = now()
         WHERE id = $1"
    ))
    .bind(ids[0])
    .execute(pool)
    .await
    .unwrap();
    support::wait_count(pool, &schema, "completed", ids.len() as i64).await;
    node.shutdown().await.unwrap();
}

/// A row parked while its key had room (a pick and an outcome racing, a
/// repaired gate, a raised limit) is put back by the maintenance sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_unparks_what_a_race_left_behind() {
    let schema = support::schema("park_sweep");
    let c = client(&schema).await;
    let ids = c
        .insert_many((0..10).map(|_| job("api:1")).collect())
        .await
        .unwrap();
    // As a race leaves them: every row parked, nothing running.
    sqlx::query(&format!("UPDATE \"{schema}\".instances SET parked = 'key'"))
        .execute(c.pool())
        .await
        .unwrap();
    let node = support::builder(&support::url(), &schema)
        .queue("default", 4)
        .concurrency_limit("api", GateConfig::new(3))
        .workflow_fn("Job", |_step, state, _ctx| async move {
            Ok(Transition::done(state))
        })
        .start()
        .await
        .unwrap();
    support::wait_count(node.pool(), &schema, "completed", ids.len() as i64).await;
    assert!(node.stats().snapshot().unparked > 0);
    node.shutdown().await.unwrap();
}

/// Cancelling a parked row ends it at once.
#[tokio::test]
async fn a_parked_row_can_be_cancelled() {
    let schema = support::schema("park_cancel");
    let c = client(&schema).await;
    let ids = c
        .insert_many((0..3).map(|_| job("acct:1")).collect())
        .await
        .unwrap();
    c.cancel(ids[2]).await.unwrap();
    assert_eq!(c.get(ids[2]).await.unwrap().status, Status::Cancelled);
    assert_eq!(parked(c.pool(), &schema, "acct:1").await, (1, 1));
}

/// A backlog under a rate limit is parked by the pick and comes back as the
/// limit allows, at its rate, without polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_parked_rows_come_back_at_their_rate() {
    let schema = support::schema("park_rate");
    let node = support::builder(&support::url(), &schema)
        .poll_interval(Duration::from_secs(3600))
        .queue("default", 4)
        .rate_limit("rl", RateConfig::new(50, Duration::from_secs(1)))
        .workflow_fn("Job", |_step, state, _ctx| async move {
            Ok(Transition::done(state))
        })
        .start()
        .await
        .unwrap();
    let ids = node
        .insert_many(
            (0..60)
                .map(|_| NewInstance::new("Job", json!({})).rate_limit("rl:1"))
                .collect(),
        )
        .await
        .unwrap();
    support::wait_count(node.pool(), &schema, "completed", ids.len() as i64).await;
    node.shutdown().await.unwrap();
}

/// Two nodes share a rate limit: whichever node's claims exhaust it watches
/// it, so the backlog drains without polling on either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_shared_by_two_nodes_drains_without_polling() {
    let schema = support::schema("park_rate_two");
    let node = || {
        support::builder(&support::url(), &schema)
            .poll_interval(Duration::from_secs(3600))
            .queue("default", 4)
            .rate_limit("rl", RateConfig::new(50, Duration::from_secs(1)).burst(2))
            .workflow_fn("Job", |_step, state, _ctx| async move {
                Ok(Transition::done(state))
            })
            .start()
    };
    let (a, b) = (node().await.unwrap(), node().await.unwrap());
    let ids = a
        .insert_many(
            (0..60)
                .map(|_| NewInstance::new("Job", json!({})).rate_limit("rl:1"))
                .collect(),
        )
        .await
        .unwrap();
    support::wait_count(a.pool(), &schema, "completed", ids.len() as i64).await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// The rate sweep's timer: with a row waiting unparked for each start the
/// limit allows, nothing is due before a claim; after a claim, the next
/// start is due one interval on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_sweep_says_when_the_next_start_is_due() {
    let schema = support::schema("park_rate_timer");
    let c = client(&schema).await;
    c.insert_many(
        (0..3)
            .map(|_| NewInstance::new("Job", json!({})).rate_limit("rl:1"))
            .collect(),
    )
    .await
    .unwrap();
    let sweep = |pool: sqlx::PgPool| {
        let schema = schema.clone();
        async move {
            sqlx::query_as::<_, (i32, Option<f64>)>(&format!(
                "SELECT unparked, next_in FROM \"{schema}\".rate_sweep(NULL, 100, NULL, '{{rl}}', '{{60}}', '{{0}}', '{{}}', '{{}}', false)"
            ))
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    sqlx::query(&format!(
        "UPDATE \"{schema}\".instances SET parked = 'rate' WHERE rate_key = 'rl:1'"
    ))
    .execute(c.pool())
    .await
    .unwrap();
    // One a minute, burst 1: one row comes back; with it waiting, no timer.
    assert_eq!(sweep(c.pool().clone()).await, (1, None));
    // A start taken now: the next is due a minute on.
    sqlx::query(&format!(
        "INSERT INTO \"{schema}\".rate_state (key, tat) VALUES ('rl:1', now() + interval '60 seconds')"
    ))
    .execute(c.pool())
    .await
    .unwrap();
    sqlx::query(&format!(
        "UPDATE \"{schema}\".instances SET parked = 'rate' WHERE rate_key = 'rl:1'"
    ))
    .execute(c.pool())
    .await
    .unwrap();
    let (n, next) = sweep(c.pool().clone()).await;
    assert_eq!(n, 0);
    let next = next.expect("a start is due");
    assert!(next > 0.0 && next <= 60.0, "next start in {next} s");
}

/// Rows of `key` in `queue`, all parked for their rate limit.
async fn parked_for_rate(c: &Engine, schema: &str, queue: &str, key: &str, n: usize) {
    c.insert_many(
        (0..n)
            .map(|_| {
                NewInstance::new("Job", json!({}))
                    .queue(queue)
                    .rate_limit(key)
            })
            .collect(),
    )
    .await
    .unwrap();
    sqlx::query(&format!(
        "UPDATE \"{schema}\".instances SET parked = 'rate' WHERE rate_key = $1"
    ))
    .bind(key)
    .execute(c.pool())
    .await
    .unwrap();
}

/// A rate sweep by a node with room for what it unparks leaves the rows to
/// that node (no NOTIFY), and wakes every node for a queue it has no room
/// in. With another sweep under way, a timed sweep does nothing and a sweep
/// after a claim waits for its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_sweep_wakes_the_sweeping_node_when_it_has_room() {
    let schema = support::schema("park_rate_own");
    let c = client(&schema).await;
    parked_for_rate(&c, &schema, "a", "rl:a", 2).await;
    parked_for_rate(&c, &schema, "b", "rl:b", 2).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(c.pool())
        .await
        .unwrap();
    listener.listen(&schema).await.unwrap();
    // One start a minute per key, burst 1: a sweep unparks one row of each.
    let sweep = |room: &'static str, wait_turn: bool| {
        let (pool, schema) = (c.pool().clone(), schema.clone());
        async move {
            sqlx::query_as::<_, (i32, Vec<String>)>(&format!(
                "SELECT unparked, own_woken FROM \"{schema}\".rate_sweep(
                     NULL, 100, $1, '{{rl}}', '{{60}}', '{{0}}', '{{a,b}}', $2::integer[], $3)"
            ))
            .bind(&schema)
            .bind(room)
            .bind(wait_turn)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };

    // Another sweep under way: a timed one leaves every row parked.
    let mut other = c.pool().begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT pg_advisory_xact_lock(hashtext('{schema}:rate_sweep'))"
    ))
    .execute(&mut *other)
    .await
    .unwrap();
    assert_eq!(sweep("{1,1}", false).await, (0, vec![]));
    // One after a claim waits for it to end, then sweeps: room for a's row
    // only, so a is this node's to pick and b is woken for every node.
    let waiting = tokio::spawn(sweep("{1,0}", true));
    let pool = c.pool().clone();
    support::eventually(
        "the sweep waits for its turn",
        Duration::from_secs(30),
        || {
            let (pool, schema) = (pool.clone(), schema.clone());
            async move {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE wait_event = 'advisory' AND position($1 IN query) > 0",
                )
                .bind(format!("\"{schema}\".rate_sweep"))
                .fetch_one(&pool)
                .await
                .unwrap()
                    > 0
            }
        },
    )
    .await;
    assert!(!waiting.is_finished());
    other.rollback().await.unwrap();
    assert_eq!(waiting.await.unwrap(), (2, vec!["a".to_string()]));
    let woken = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("queue b woken")
        .unwrap();
    assert_eq!(woken.payload(), "b", "queue a left to the sweeping node");
}

/// Rows parked because no live node runs their workflow.
async fn parked_for_workflow(pool: &PgPool, schema: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{schema}\".instances WHERE status = 'available' AND parked = 'workflow'"
    ))
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A node of the default queue running only `workflow`.
async fn node_running(schema: &str, workflow: &str) -> Engine {
    support::builder(&support::url(), schema)
        .queue("default", 4)
        .workflow_fn(workflow, |_step, state, _ctx| async move {
            Ok(Transition::done(state))
        })
        .start()
        .await
        .unwrap()
}

fn of(workflow: &str, n: usize) -> Vec<NewInstance> {
    (0..n)
        .map(|_| NewInstance::new(workflow, json!({})))
        .collect()
}

/// While live nodes serve a queue and none of them runs a workflow, its rows
/// are parked as they are inserted (by statement and by COPY), so picks of
/// the queue never step over them; a node that runs the workflow takes them
/// back and runs them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_a_workflow_no_live_node_runs_wait_parked() {
    let schema = support::schema("park_workflow");
    let a = node_running(&schema, "Job").await;
    let pool = a.pool().clone();
    a.insert_many(of("Other", 20)).await.unwrap();
    a.insert_many(of("Other", 3000)).await.unwrap();
    a.insert_many(of("Job", 5)).await.unwrap();
    assert_eq!(parked_for_workflow(&pool, &schema).await, 3020);
    support::wait_count(&pool, &schema, "completed", 5).await;
    assert_eq!(parked_for_workflow(&pool, &schema).await, 3020);
    let b = node_running(&schema, "Other").await;
    support::wait_count(&pool, &schema, "completed", 3025).await;
    assert_eq!(parked_for_workflow(&pool, &schema).await, 0);
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

/// Rows inserted while no node served their queue are not parked (the
/// first node decides); a node that does not run their workflow parks them
/// from the head of its queue, and one that does takes them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_parks_what_it_finds_no_live_node_runs() {
    let schema = support::schema("park_orphans");
    let c = client(&schema).await;
    let pool = c.pool().clone();
    c.insert_many(of("Other", 2500)).await.unwrap();
    c.insert_many(of("Job", 5)).await.unwrap();
    assert_eq!(parked_for_workflow(&pool, &schema).await, 0);
    let a = node_running(&schema, "Job").await;
    support::wait_count(&pool, &schema, "completed", 5).await;
    support::eventually(
        "the other workflow's rows parked",
        Duration::from_secs(60),
        || {
            let pool = pool.clone();
            let schema = schema.clone();
            async move { parked_for_workflow(&pool, &schema).await == 2500 }
        },
    )
    .await;
    let b = node_running(&schema, "Other").await;
    support::wait_count(&pool, &schema, "completed", 2505).await;
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

/// A key's heads are read through their own index only, whatever the
/// statistics say: with the heads' indexes gone (in a transaction rolled
/// back), the room lookups scan the table rather than the pick's index or a
/// key's index of available rows, which hold every waiting row (a backlog of
/// thousands read once per key looked up). The same answers either way.
#[tokio::test]
async fn heads_are_read_through_their_own_index_only() {
    let schema = support::schema("park_heads");
    let c = client(&schema).await;
    c.insert_many(
        (0..2000)
            .map(|i| match i % 4 {
                0 => job("acct:1"),
                1 => job("api:1"),
                2 => NewInstance::new("Job", json!({})).rate_limit("rl:1"),
                _ => NewInstance::new("Job", json!({})),
            })
            .collect(),
    )
    .await
    .unwrap();
    let mut tx = c.pool().begin().await.unwrap();
    let mut rooms = Vec::new();
    for drop in [false, true] {
        if drop {
            sqlx::query(&format!(
                "DROP INDEX \"{schema}\".instances_key_heads, \"{schema}\".instances_rate_key_heads"
            ))
            .execute(&mut *tx)
            .await
            .unwrap();
        }
        let keys: Vec<(String, i32)> = sqlx::query_as(&format!(
            "SELECT key, room FROM \"{schema}\".key_room($1, '{{api}}', '{{5}}') ORDER BY key"
        ))
        .bind(vec!["acct:1", "acct:2", "api:1"])
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        let rates: Vec<(String, i32)> = sqlx::query_as(&format!(
            "SELECT key, room FROM \"{schema}\".rate_room($1, 100, '{{rl}}', '{{0.1}}', '{{0.1}}')"
        ))
        .bind(vec!["rl:1"])
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        rooms.push((keys, rates));
    }
    // Scans this transaction made of the indexes of all available rows.
    let scans =
        support::index_scans(&mut tx, &schema, &["instances_pick", "instances_key_next"]).await;
    tx.rollback().await.unwrap();
    assert_eq!(
        scans,
        vec![
            ("instances_key_next".to_string(), 0),
            ("instances_pick".to_string(), 0)
        ]
    );
    let acct = |room| ("acct:1".to_string(), room);
    let expected = (
        vec![acct(0), ("acct:2".to_string(), 1), ("api:1".to_string(), 2)],
        vec![("rl:1".to_string(), 0)],
    );
    assert_eq!(rooms, vec![expected.clone(), expected]);
}
