//! The claim protocol under faults, one case at a time: each of these broke
//! the engine's promise once (a panic that left rows stuck, a crash loop that
//! never ended, a heartbeat held back by maintenance, a key run twice after
//! an outage, a rate-limited backlog left waiting for the poll).
mod support;

use gendurable::{GateConfig, NewInstance, RateConfig, Status, Transition};
use gendurable_testing::{StopMode, TempPostgres};
use serde_json::json;
use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Steps running now per key, and the most ever seen at once: the outside
/// observer of the tests below.
#[derive(Clone, Default)]
struct Overlap(Arc<Mutex<(HashMap<String, usize>, usize)>>);

impl Overlap {
    fn enter(&self, key: &str) {
        let mut g = self.0.lock().unwrap();
        let n = {
            let n = g.0.entry(key.to_owned()).or_default();
            *n += 1;
            *n
        };
        g.1 = g.1.max(n);
    }

    fn leave(&self, key: &str) {
        *self.0.lock().unwrap().0.get_mut(key).unwrap() -= 1;
    }

    fn most(&self) -> usize {
        self.0.lock().unwrap().1
    }
}

/// The database to work on, when this process is a child node started by
/// `run_child`.
fn child_mode() -> Option<(String, String)> {
    Some((
        std::env::var("GD_CHILD_URL").ok()?,
        std::env::var("GD_CHILD_SCHEMA").ok()?,
    ))
}

/// Child mode: a node (named for its schema) whose "Job" steps sleep 100 ms
/// and are done, unless their state says `crash` (the process aborts) or
/// `poison` (it exits). Run by `run_child`.
#[tokio::test]
async fn child_node() {
    let Some((url, schema)) = child_mode() else {
        return;
    };
    let engine = support::builder(&url, &schema)
        .node_id(schema.as_str())
        .queue("default", 4)
        .workflow_fn("Job", |_step, state, _ctx| async move {
            if state["crash"] == true {
                std::process::abort();
            }
            if state["poison"] == true {
                std::process::exit(3);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(Transition::done(state))
        })
        .start()
        .await
        .unwrap();
    std::future::pending::<()>().await;
    drop(engine);
}

/// Run `child_node` as a child process working on `schema`, until it exits,
/// or `done` holds (it is then killed).
async fn run_child(url: &str, schema: &str, done: &impl AsyncFn() -> bool) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_node", "--nocapture"])
        .env("GD_CHILD_URL", url)
        .env("GD_CHILD_SCHEMA", schema)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut ended = false;
    support::eventually(
        "the child ends, or its work is done",
        Duration::from_secs(60),
        || {
            ended = child.try_wait().unwrap().is_some();
            async move { ended || done().await }
        },
    )
    .await;
    if !ended {
        child.kill().unwrap();
    }
    child.wait().unwrap();
}

/// Case 2: one gate key in two queues of one node, with successors in play
/// (the gate, not the node, is the limit, and steps outlast a call). A
/// successor must stay in its own queue: one taken across queues ran on the
/// other queue's permits (a queue ran more steps than its concurrency) and
/// could panic the outcome writer, leaving its rows executing for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successors_never_cross_queues() {
    let url = support::url();
    let schema = support::schema("xqueue");
    let seen = Overlap::default();
    let observer = seen.clone();
    let engine = support::builder(&url, &schema)
        .queue("a", 2)
        .queue("b", 2)
        .concurrency_limit("api", GateConfig::new(3))
        .workflow_fn("Job", move |_step, state, ctx| {
            let seen = observer.clone();
            async move {
                seen.enter(&ctx.queue);
                tokio::time::sleep(Duration::from_millis(20)).await;
                seen.leave(&ctx.queue);
                Ok(Transition::done(state))
            }
        })
        .start()
        .await
        .unwrap();
    let news = (0..300)
        .map(|i| {
            NewInstance::new("Job", json!({}))
                .queue(if i % 2 == 0 { "a" } else { "b" })
                .concurrency_key("api:1")
        })
        .collect();
    let ids = engine.insert_many(news).await.unwrap();
    support::wait_count(engine.pool(), &schema, "completed", ids.len() as i64).await;
    assert!(
        seen.most() <= 2,
        "a queue ran more steps than its concurrency: {}",
        seen.most()
    );
    let stats = engine.stats().snapshot();
    assert!(stats.successors > 0, "successors were in play: {stats:?}");
    engine.shutdown().await.unwrap();
}

/// Case 5: a step that kills its process, restarted under the same node id
/// within the lease (as a supervisor does). Each crash is an attempt, so the
/// instance is discarded at max_attempts with every crash recorded, instead
/// of being given back uncounted forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_kills_its_process_reaches_max_attempts() {
    let url = support::url();
    let schema = support::schema("crashloop");
    let client = support::builder(&url, &schema).build().await.unwrap();
    let id = client
        .insert(NewInstance::new("Job", json!({ "crash": true })).max_attempts(3))
        .await
        .unwrap();
    // Until the child crashes, or takes the instance back and finds it has
    // had its attempts.
    for _ in 0..6 {
        let c = client.clone();
        let discarded = async move || c.get(id).await.unwrap().status == Status::Discarded;
        run_child(&url, &schema, &discarded).await;
        if discarded().await {
            break;
        }
    }
    let i = client.get(id).await.unwrap();
    assert_eq!(i.status, Status::Discarded, "{i:?}");
    assert_eq!(i.errors.len(), 3, "{:?}", i.errors);
    assert!(i.errors.iter().all(|e| e["kind"] == "lost"));
}

/// Case 4: maintenance that cannot go on (the gate reconciler waits on a
/// lock for longer than the lease) must not hold back the heartbeat, or
/// other nodes rescue a live node's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_maintenance_pass_does_not_stop_the_heartbeat() {
    let url = support::url();
    let schema = support::schema("blocked");
    let engine = support::builder(&url, &schema)
        .node_id("patient")
        .queue("default", 1)
        .concurrency_limit("api", GateConfig::new(1))
        .workflow_fn("Job", |_step, state, _ctx| async move {
            Ok(Transition::done(state))
        })
        .start()
        .await
        .unwrap();
    let pool = engine.pool();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "LOCK TABLE \"{schema}\".gate_slots IN ACCESS EXCLUSIVE MODE"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    // The reconciler is stuck on the lock ...
    let waiting = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_locks
                        WHERE NOT granted AND relation = '\"{schema}\".gate_slots'::regclass)"
    );
    support::eventually("the reconciler waits", Duration::from_secs(10), || async {
        sqlx::query_scalar::<_, bool>(&waiting)
            .fetch_one(pool)
            .await
            .unwrap()
    })
    .await;
    let since: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await
        .unwrap();
    // ... for longer than a lease (2 s) ...
    support::eventually("a lease passes", Duration::from_secs(10), || async {
        sqlx::query_scalar::<_, bool>("SELECT clock_timestamp() > $1 + interval '2.5 s'")
            .bind(since)
            .fetch_one(pool)
            .await
            .unwrap()
    })
    .await;
    // ... and the node's heartbeat is as fresh as ever.
    let (fresh, lease): (bool, Option<f64>) = sqlx::query_as(&format!(
        "SELECT heartbeat_at > $1 + interval '1 s', lease_s FROM \"{schema}\".nodes WHERE id = 'patient'"
    ))
    .bind(since)
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(fresh, "the heartbeat went on while maintenance was blocked");
    assert_eq!(lease, Some(2.0), "the heartbeat records the node's lease");
    tx.rollback().await.unwrap();
    engine.shutdown().await.unwrap();
}

/// Case 7: a Postgres outage longer than the lease. After the restart no
/// node may rescue another's rows before that node could heartbeat again,
/// so no key runs twice at once and no live node's step is run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outage_longer_than_the_lease_runs_no_key_twice() {
    let mut pg = TempPostgres::start().await.unwrap();
    let url = pg.url();
    let schema = support::schema("outage");
    let seen = Overlap::default();
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let observer = seen.clone();
        nodes.push(
            support::builder(&url, &schema)
                .queue("default", 4)
                .workflow_fn("Slow", move |_step, state, ctx| {
                    let seen = observer.clone();
                    async move {
                        let key = ctx.concurrency_key.clone().unwrap_or_default();
                        seen.enter(&key);
                        tokio::time::sleep(Duration::from_millis(400)).await;
                        seen.leave(&key);
                        Ok(Transition::done(state))
                    }
                })
                .start()
                .await
                .unwrap(),
        );
    }
    let n = 60;
    let news = (0..n)
        .map(|i| NewInstance::new("Slow", json!({})).concurrency_key(("acct", i % 6)))
        .collect();
    let ids = nodes[0].insert_many(news).await.unwrap();
    let pool = nodes[0].pool().clone();
    support::wait_count(&pool, &schema, "executing", 6).await;

    // Down for longer than the lease (2 s), in crash mode.
    pg.stop_with(StopMode::Immediate).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    pg.start_again().await.unwrap();

    support::eventually("all completed", Duration::from_secs(120), || {
        let (pool, schema) = (pool.clone(), schema.clone());
        async move {
            sqlx::query_scalar::<_, i64>(&format!(
                "SELECT count(*) FROM \"{schema}\".instances WHERE status = 'completed'"
            ))
            .fetch_one(&pool)
            .await
            .is_ok_and(|c| c == n)
        }
    })
    .await;
    assert_eq!(seen.most(), 1, "a K = 1 key ran twice at once");
    for id in ids {
        let i = nodes[0].get(id).await.unwrap();
        assert!(i.errors.is_empty(), "no live node was presumed dead: {i:?}");
    }
    for e in nodes {
        e.shutdown().await.unwrap();
    }
}

/// Case 8: a rate-limited backlog drains at its limit: the picker wakes when
/// the next start is allowed. With a poll interval of an hour, nothing else
/// would wake it once the first burst has run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_backlog_drains_without_polling() {
    let url = support::url();
    let schema = support::schema("ratewake");
    let engine = support::builder(&url, &schema)
        .poll_interval(Duration::from_secs(3600))
        .queue("default", 4)
        .rate_limit("rl", RateConfig::new(20, Duration::from_secs(1)))
        .workflow_fn("Job", |_step, state, _ctx| async move {
            Ok(Transition::done(state))
        })
        .start()
        .await
        .unwrap();
    let news = (0..30)
        .map(|_| NewInstance::new("Job", json!({})).rate_limit("rl:1"))
        .collect();
    let ids = engine.insert_many(news).await.unwrap();
    support::wait_count(engine.pool(), &schema, "completed", ids.len() as i64).await;
    engine.shutdown().await.unwrap();
}

/// A successor starts before the call that promotes it commits, so a step
/// that ends its process there has not been counted yet. Its reservation,
/// taken back when the node's next process starts, is marked cautious: it
/// starts only once claimed from then on, so it reaches max_attempts, and
/// the row before it (whose outcome was lost with the process) runs again
/// once, not until its own attempts run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_that_ends_its_process_is_counted() {
    let url = support::url();
    let schema = support::schema("poison");
    let engine = support::builder(&url, &schema)
        .migrate(true)
        .workflow_fn("Job", |_step, state, _ctx| async move {
            Ok(Transition::done(state))
        })
        .build()
        .await
        .unwrap();
    // One K = 1 key: a row, then the poison pill, after a first row that each
    // process runs first (so that, its step time known, the node reserves
    // successors when that row's outcome hands the key on).
    let key = |poison: bool, priority: i16| {
        NewInstance::new("Job", json!({ "poison": poison }))
            .concurrency_key("acct:1")
            .priority(priority)
            .max_attempts(3)
    };
    let ids = engine
        .insert_many(vec![key(false, 1), key(true, 1).max_attempts(2)])
        .await
        .unwrap();
    let pill = ids[1];
    let mut runs = 0;
    while !engine.get(pill).await.unwrap().status.is_final() {
        runs += 1;
        assert!(
            runs <= 8,
            "the poison pill is still not discarded after 8 processes"
        );
        engine.insert(key(false, 0)).await.unwrap();
        // Until the pill ends the process, or is discarded (the process then
        // idles).
        let e = engine.clone();
        let done = async move || e.get(pill).await.unwrap().status.is_final();
        run_child(&url, &schema, &done).await;
    }
    // The last process took the pill back at its start, counted out.
    let pill = engine.get(pill).await.unwrap();
    assert_eq!(pill.status, Status::Discarded, "{pill:?}");
    let first = engine.get(ids[0]).await.unwrap();
    assert_eq!(first.status, Status::Completed, "{first:?}");
    assert!(first.errors.len() <= 1, "lost once at most: {first:?}");
}

/// A node running one K = 1 key's rows: a first one (500 ms; its outcome
/// hands the key on, its step time known by then, so the node reserves a
/// successor),
/// one held until `release` is notified, and its successor, whose step is
/// `successor` (`"pending"`: never returns; else 50 ms). Returns once the
/// held row runs and its successor is reserved; `started` tells each start.
struct HeldKey {
    engine: gendurable::Engine,
    schema: String,
    ids: Vec<i64>,
    started: tokio::sync::mpsc::UnboundedReceiver<i64>,
    release: Arc<tokio::sync::Notify>,
}

async fn held_key(prefix: &str, successor: &str) -> HeldKey {
    let url = support::url();
    let schema = support::schema(prefix);
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let hold = release.clone();
    let engine = support::builder(&url, &schema)
        .queue("default", 4)
        .workflow_fn("Job", move |_step, state, ctx| {
            let (started, hold) = (started_tx.clone(), hold.clone());
            async move {
                started.send(ctx.id).unwrap();
                match state["role"].as_str() {
                    Some("held") => hold.notified().await,
                    Some("pending") => std::future::pending().await,
                    // Longer than any claim call of a loaded machine's
                    // fresh connections: the node reserves successors only
                    // for steps that outlast its calls.
                    Some("first") => tokio::time::sleep(Duration::from_millis(500)).await,
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
                }
                Ok(Transition::done(state))
            }
        })
        .build()
        .await
        .unwrap();
    let row =
        |role: &str| NewInstance::new("Job", json!({ "role": role })).concurrency_key("acct:1");
    let ids = engine
        .insert_many(vec![row("first"), row("held"), row(successor)])
        .await
        .unwrap();
    engine.start().await.unwrap();
    assert_eq!(next_start(&mut started).await, Some(ids[0]));
    assert_eq!(next_start(&mut started).await, Some(ids[1]));
    let pool = engine.pool().clone();
    let sql = format!("SELECT node IS NOT NULL FROM \"{schema}\".instances WHERE id = $1");
    let next = ids[2];
    support::eventually("the successor reserved", Duration::from_secs(30), || {
        let (pool, sql) = (pool.clone(), sql.clone());
        async move {
            sqlx::query_scalar(&sql)
                .bind(next)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    })
    .await;
    HeldKey {
        engine,
        schema,
        ids,
        started,
        release,
    }
}

/// The next step started, waiting at most 30 s (None: none started): a
/// step that never starts fails the test instead of hanging it.
async fn next_start(started: &mut tokio::sync::mpsc::UnboundedReceiver<i64>) -> Option<i64> {
    tokio::time::timeout(Duration::from_secs(30), started.recv())
        .await
        .ok()
        .flatten()
}

/// A successor starts the moment its predecessor's step ends, before the
/// call that promotes it commits (held back here by a lock on its row), and
/// the database counts the key taken throughout: the predecessor stays
/// executing until that call promotes the successor in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_starts_before_its_promotion_commits() {
    let HeldKey {
        engine,
        schema,
        ids,
        mut started,
        release,
    } = held_key("early", "next").await;
    let (held, next) = (ids[1], ids[2]);
    // Hold the successor's row: the call that would promote it waits.
    let mut lock = engine.pool().begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT 1 FROM \"{schema}\".instances WHERE id = $1 FOR UPDATE"
    ))
    .bind(next)
    .execute(&mut *lock)
    .await
    .unwrap();
    release.notify_one();
    let start = tokio::time::timeout(Duration::from_secs(30), started.recv()).await;
    assert_eq!(start, Ok(Some(next)), "started before its promotion");
    assert_eq!(
        engine.get(held).await.unwrap().status,
        Status::Executing,
        "the key still held"
    );
    assert_eq!(engine.get(next).await.unwrap().status, Status::Available);
    lock.commit().await.unwrap();
    for id in ids {
        assert_eq!(
            support::wait_final(&engine, id).await.status,
            Status::Completed
        );
    }
    assert_eq!(engine.stats().snapshot().successors, 1);
    engine.shutdown().await.unwrap();
}

/// A reserved row cancelled before its predecessor ends starts as its
/// successor all the same (it is flagged, like an executing row), is
/// promoted, then stopped: it ends cancelled, and the key goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_cancelled_while_reserved_is_stopped_once_started() {
    let HeldKey {
        engine,
        ids,
        mut started,
        release,
        ..
    } = held_key("early_cancel", "pending").await;
    let after = engine
        .insert(NewInstance::new("Job", json!({})).concurrency_key("acct:1"))
        .await
        .unwrap();
    engine.cancel(ids[2]).await.unwrap();
    release.notify_one();
    assert_eq!(next_start(&mut started).await, Some(ids[2]));
    let cancelled = support::wait_final(&engine, ids[2]).await;
    assert_eq!(cancelled.status, Status::Cancelled, "{cancelled:?}");
    for id in [ids[0], ids[1], after] {
        assert_eq!(
            support::wait_final(&engine, id).await.status,
            Status::Completed
        );
    }
    engine.shutdown().await.unwrap();
}

/// A successor started as its predecessor ends, in a queue paused meanwhile,
/// is not promoted: the node stops it, records the predecessor's outcome
/// alone and gives the reservation back. It runs again once resumed.
///
/// The node starts a successor only while it still holds the reservation and
/// its heartbeat is recent; on a busy machine either may lapse, and then the
/// reservation goes back unstarted. What must hold either way: the paused
/// queue promotes nothing, and the row runs once resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_started_in_a_queue_paused_meanwhile_is_stopped() {
    let HeldKey {
        engine,
        ids,
        mut started,
        release,
        ..
    } = held_key("early_pause", "next").await;
    assert!(engine.pause_queue("default").await.unwrap());
    release.notify_one();
    assert_eq!(
        support::wait_final(&engine, ids[1]).await.status,
        Status::Completed,
        "recorded alone"
    );
    // A successor that ran sent its id on its first poll, before the stop
    // that lets the predecessor's outcome be recorded alone: if it ran, the
    // id is in by now. One aborted before its first poll sends nothing.
    if let Ok(early) = started.try_recv() {
        assert_eq!(early, ids[2]);
        assert_eq!(engine.stats().snapshot().not_admitted, 1);
    }
    let (e, id) = (engine.clone(), ids[2]);
    support::eventually(
        "the reservation given back",
        Duration::from_secs(30),
        || {
            let e = e.clone();
            async move { e.get(id).await.unwrap().node.is_none() }
        },
    )
    .await;
    let next = engine.get(ids[2]).await.unwrap();
    assert_eq!(
        (next.status, next.attempt),
        (Status::Available, 0),
        "{next:?}"
    );
    assert!(engine.resume_queue("default").await.unwrap());
    assert_eq!(
        next_start(&mut started).await,
        Some(ids[2]),
        "runs again once resumed"
    );
    engine.shutdown().await.unwrap();
}
