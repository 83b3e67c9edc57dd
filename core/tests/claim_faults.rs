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

/// Child mode: a node whose step kills its own process. Run by
/// `a_step_that_kills_its_process_reaches_max_attempts`.
#[tokio::test]
async fn child_node_that_crashes() {
    let (Ok(url), Ok(schema)) = (
        std::env::var("GD_CRASH_URL"),
        std::env::var("GD_CRASH_SCHEMA"),
    ) else {
        return; // not in child mode
    };
    let engine = support::builder(&url, &schema)
        .node_id("crashy")
        .queue("default", 1)
        .workflow_fn("Crash", |_step, _state, _ctx| async move {
            std::process::abort();
        })
        .start()
        .await
        .unwrap();
    std::future::pending::<()>().await;
    drop(engine);
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
        .insert(NewInstance::new("Crash", json!({})).max_attempts(3))
        .await
        .unwrap();
    for _ in 0..6 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_node_that_crashes", "--nocapture"])
            .env("GD_CRASH_URL", &url)
            .env("GD_CRASH_SCHEMA", &schema)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Until the child crashes, or takes the instance back and finds it
        // has had its attempts.
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            if client.get(id).await.unwrap().status == Status::Discarded {
                child.kill().unwrap();
                child.wait().unwrap();
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if client.get(id).await.unwrap().status == Status::Discarded {
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
