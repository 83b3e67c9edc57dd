//! Concurrency keys, gates and rate limits, observed from the outside with
//! three engine nodes on one database.
mod support;

use gendurable::{
    AwaitOn, ConcurrencyKey, Engine, GateConfig, KeyChange, NewInstance, NextOptions, RateConfig,
    Status, Transition,
};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use support::Observer;
use tokio::sync::Notify;

/// A node whose one-step workflow "Obs" records start and end by key.
async fn observed_node(
    url: &str,
    schema: &str,
    obs: Observer,
    gates: &[(&str, GateConfig)],
) -> Engine {
    let mut b = support::builder(url, schema).queue("default", 10);
    for (name, g) in gates {
        b = b.concurrency_limit(*name, g.clone());
    }
    b.workflow_fn("Obs", move |step, state, ctx| {
        let obs = obs.clone();
        async move {
            let key = ctx
                .concurrency_key
                .clone()
                .unwrap_or_else(|| format!("none:{}", ctx.id));
            obs.record(ctx.id, &key, "start", &step).await;
            tokio::time::sleep(Duration::from_micros(rand::random::<u64>() % 3000)).await;
            obs.record(ctx.id, &key, "end", &step).await;
            Ok(Transition::done(state))
        }
    })
    .start()
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_never_over_admit() {
    let url = support::url();
    let schema = support::schema("adm");
    let obs = Observer::new(&url, &schema).await;
    let gates = [
        ("api", GateConfig::new(4)),
        ("big", GateConfig::new(6).shards(3)),
    ];
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(observed_node(&url, &schema, obs.clone(), &gates).await);
    }
    let mut news = Vec::new();
    for i in 0..2000 {
        news.push(NewInstance::new("Obs", json!({})).concurrency_key(("acct", i % 40)));
    }
    for _ in 0..700 {
        news.push(NewInstance::new("Obs", json!({})).concurrency_key("api:1"));
        news.push(NewInstance::new("Obs", json!({})).concurrency_key("big:1"));
    }
    let n = news.len() as i64;
    nodes[0].insert_many(news).await.unwrap();
    support::wait_count(nodes[0].pool(), &schema, "completed", n).await;

    let max = obs.max_per_key().await;
    for i in 0..40 {
        assert_eq!(
            max[&format!("acct:{i}")],
            1,
            "K = 1 key acct:{i} overlapped"
        );
    }
    assert!(
        max["api:1"] <= 4,
        "gate api (limit 4) reached {}",
        max["api:1"]
    );
    assert!(
        max["big:1"] <= 6,
        "gate big (limit 6, 3 shards) reached {}",
        max["big:1"]
    );
    assert!(
        max["api:1"] > 1 && max["big:1"] > 1,
        "gated keys did run in parallel: {max:?}"
    );
    let (mut claimed, mut handed) = (0, 0);
    for e in &nodes {
        let s = e.stats().snapshot();
        assert_eq!(s.pick_errors, 0, "{s:?}");
        claimed += s.claimed;
        handed += s.handed_over;
    }
    assert_eq!(claimed as i64, n, "no wasted or repeated claims");
    // The saturated backlogs made queues dry: freed keys and slots went
    // straight to their next rows, and the limits above held throughout.
    assert!(handed > 0, "no key or slot was handed over");
    // Idle now: the reconciler leaves no counter below capacity.
    nodes[0].reconcile_gates_now().await.unwrap();
    for g in nodes[0].status().await.unwrap().gates {
        assert_eq!(g.available, g.limit, "{g:?}");
    }
    for e in nodes {
        e.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn the_database_rejects_over_admission() {
    let url = support::url();
    let schema = support::schema("reject");
    let engine = support::builder(&url, &schema).build().await.unwrap();
    let ids = engine
        .insert_many(vec![
            NewInstance::new("W", json!({})).concurrency_key("acct:1"),
            NewInstance::new("W", json!({})).concurrency_key("acct:1"),
        ])
        .await
        .unwrap();
    let s = format!("\"{schema}\"");
    let exec = format!("UPDATE {s}.instances SET status = 'executing', node = 'x' WHERE id = $1");
    sqlx::query(&exec)
        .bind(ids[0])
        .execute(engine.pool())
        .await
        .unwrap();
    let err = sqlx::query(&exec)
        .bind(ids[1])
        .execute(engine.pool())
        .await
        .unwrap_err();
    let db = err.as_database_error().unwrap();
    assert_eq!(db.code().as_deref(), Some("23505"));
    assert_eq!(db.constraint(), Some("instances_k1"));

    sqlx::query(&format!(
        "INSERT INTO {s}.gate_slots VALUES ('api:1', 0, 2, 0)"
    ))
    .execute(engine.pool())
    .await
    .unwrap();
    for bad in ["available - 1", "available + 3"] {
        let err = sqlx::query(&format!("UPDATE {s}.gate_slots SET available = {bad}"))
            .execute(engine.pool())
            .await
            .unwrap_err();
        let db = err.as_database_error().unwrap();
        assert_eq!(db.code().as_deref(), Some("23514"), "{bad}");
        assert_eq!(db.constraint(), Some("gate_slots_bounds"));
    }
}

/// A workflow whose steps wait for the test's go-ahead, telling it when they start.
struct Gates {
    started: tokio::sync::mpsc::UnboundedSender<(i64, String, Option<String>)>,
    release: Arc<Notify>,
}

fn controlled(b: gendurable::EngineBuilder, g: Arc<Gates>) -> gendurable::EngineBuilder {
    b.workflow_fn("Ctl", move |step, state, ctx| {
        let g = g.clone();
        async move {
            g.started
                .send((ctx.id, step.clone(), ctx.concurrency_key.clone()))
                .unwrap();
            let plan = state["plan"][&step].clone();
            if plan["wait"].as_bool() == Some(true) {
                g.release.notified().await;
            }
            Ok(match plan["do"].as_str() {
                Some("release") => Transition::next_with(
                    plan["to"].as_str().unwrap(),
                    state.clone(),
                    NextOptions {
                        concurrency_key: KeyChange::Release,
                        ..Default::default()
                    },
                ),
                Some("switch") => Transition::next_with(
                    plan["to"].as_str().unwrap(),
                    state.clone(),
                    NextOptions {
                        concurrency_key: KeyChange::Set(ConcurrencyKey::from(
                            plan["key"].as_str().unwrap(),
                        )),
                        ..Default::default()
                    },
                ),
                Some("await") => Transition::await_on(
                    plan["to"].as_str().unwrap(),
                    state.clone(),
                    AwaitOn::signal("go"),
                ),
                _ => Transition::done(state),
            })
        }
    })
}

/// Insert a `Ctl` instance with `plan` under concurrency key `key`.
async fn ctl(engine: &Engine, plan: serde_json::Value, key: &str) -> i64 {
    engine
        .insert(NewInstance::new("Ctl", plan).concurrency_key(key))
        .await
        .unwrap()
}

type Started = tokio::sync::mpsc::UnboundedReceiver<(i64, String, Option<String>)>;

/// The next step that starts: (instance, step, key held).
async fn next_start(rx: &mut Started) -> (i64, String, Option<String>) {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("a step started")
        .unwrap()
}

/// A started node running `Ctl` with `concurrency` slots under `gates`, the
/// test's handle on its steps, and the receiver of their starts.
async fn ctl_node(
    schema: &str,
    concurrency: u32,
    gates: &[(&str, GateConfig)],
) -> (Engine, Arc<Gates>, Started) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let g = Arc::new(Gates {
        started: tx,
        release: Arc::new(Notify::new()),
    });
    let mut b = support::builder(&support::url(), schema).queue("default", concurrency);
    for (name, gate) in gates {
        b = b.concurrency_limit(*name, gate.clone());
    }
    let engine = controlled(b, g.clone()).start().await.unwrap();
    (engine, g, rx)
}

/// The next step to start is `step` of instance `id`, holding `key`.
async fn expect_start(rx: &mut Started, id: i64, step: &str, key: Option<&str>) {
    let got = next_start(rx).await;
    assert_eq!(got, (id, step.to_owned(), key.map(str::to_owned)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_switch_await_and_prefix_capture() {
    let schema = support::schema("keys");
    let gates = [("api", GateConfig::new(1)), ("order", GateConfig::new(2))];
    let (engine, g, mut rx) = ctl_node(&schema, 10, &gates).await;
    // Release: A releases acct:9 and keeps running; B (acct:9) starts meanwhile.
    let a = ctl(
        &engine,
        json!({"plan": {"start": {"do": "release", "to": "free"}, "free": {"wait": true}}}),
        "acct:9",
    )
    .await;
    expect_start(&mut rx, a, "start", Some("acct:9")).await;
    expect_start(&mut rx, a, "free", None).await;
    let b = ctl(&engine, json!({"plan": {}}), "acct:9").await;
    expect_start(&mut rx, b, "start", Some("acct:9")).await;
    g.release.notify_one();

    // Switch: A moves from acct:1 to acct:2 and holds acct:2 while waiting.
    let a = ctl(&engine, json!({"plan": {"start": {"do": "switch", "to": "two", "key": "acct:2"}, "two": {"wait": true}}}), "acct:1").await;
    expect_start(&mut rx, a, "start", Some("acct:1")).await;
    expect_start(&mut rx, a, "two", Some("acct:2")).await;
    let c = ctl(&engine, json!({"plan": {}}), "acct:2").await;
    let b = ctl(&engine, json!({"plan": {}}), "acct:1").await;
    expect_start(&mut rx, b, "start", Some("acct:1")).await;
    // C must wait for A to leave acct:2: it is still available after B finished.
    support::wait_status(&engine, b, Status::Completed).await;
    assert_eq!(
        engine.get(c).await.unwrap().status,
        Status::Available,
        "acct:2 is held by A"
    );
    g.release.notify_one();
    expect_start(&mut rx, c, "start", Some("acct:2")).await;

    // An await releases the gate slot; the woken step re-admits through the gate.
    let a = ctl(
        &engine,
        json!({"plan": {"start": {"do": "await", "to": "after"}}}),
        "api:1",
    )
    .await;
    expect_start(&mut rx, a, "start", Some("api:1")).await;
    support::wait_status(&engine, a, Status::Awaiting).await;
    let b = ctl(&engine, json!({"plan": {"start": {"wait": true}}}), "api:1").await;
    expect_start(&mut rx, b, "start", Some("api:1")).await;
    assert_eq!(engine.signal("go", json!(null)).await.unwrap(), 1);
    // The gate (limit 1) is taken by B: A's next step waits for it.
    let gates = engine.status().await.unwrap().gates;
    assert_eq!(
        (gates[0].key.as_str(), gates[0].in_flight, gates[0].limit),
        ("api:1", 1, 1)
    );
    g.release.notify_one();
    expect_start(&mut rx, a, "after", Some("api:1")).await;

    // Prefix capture: `order` gates order:42 at 2, so two of them run at once.
    assert_eq!(engine.key_limit("order:42").k, 2);
    assert_eq!(engine.key_limit("order:42").gate.as_deref(), Some("order"));
    assert_eq!(engine.key_limit("orders:42").k, 1);
    let o1 = ctl(
        &engine,
        json!({"plan": {"start": {"wait": true}}}),
        "order:42",
    )
    .await;
    let o2 = ctl(
        &engine,
        json!({"plan": {"start": {"wait": true}}}),
        "order:42",
    )
    .await;
    let mut both = vec![next_start(&mut rx).await.0, next_start(&mut rx).await.0];
    both.sort();
    assert_eq!(both, vec![o1, o2], "order:42 admits two at once");
    g.release.notify_one();
    g.release.notify_one();
    engine.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_and_rate_limit_compose_without_deadlock() {
    let url = support::url();
    let schema = support::schema("rate");
    let obs = Observer::new(&url, &schema).await;
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let obs = obs.clone();
        nodes.push(
            support::builder(&url, &schema)
                .queue("default", 10)
                .concurrency_limit("api", GateConfig::new(2))
                .rate_limit("rl", RateConfig::new(20, Duration::from_secs(1)))
                .workflow_fn("Obs", move |step, state, ctx| {
                    let obs = obs.clone();
                    async move {
                        let key = ctx
                            .concurrency_key
                            .clone()
                            .unwrap_or_else(|| format!("none:{}", ctx.id));
                        obs.record(ctx.id, &key, "start", &step).await;
                        tokio::time::sleep(Duration::from_millis(30)).await;
                        obs.record(ctx.id, &key, "end", &step).await;
                        Ok(Transition::done(state))
                    }
                })
                .start()
                .await
                .unwrap(),
        );
    }
    // Both limits on the same rows, plus rows with only one of them.
    let mut news = Vec::new();
    for _ in 0..30 {
        news.push(
            NewInstance::new("Obs", json!({}))
                .concurrency_key("api:1")
                .rate_limit("rl:1"),
        );
    }
    for _ in 0..10 {
        news.push(NewInstance::new("Obs", json!({})).rate_limit("rl:1"));
    }
    let n = news.len() as i64;
    nodes[0].insert_many(news).await.unwrap();
    support::wait_count(nodes[0].pool(), &schema, "completed", n).await;

    let max = obs.max_per_key().await;
    assert!(max["api:1"] <= 2, "gate exceeded: {max:?}");
    // Starts (claim times) are spaced by the GCRA interval: 1/20 s, burst 1.
    let starts: Vec<f64> = sqlx::query_scalar(&format!(
        "SELECT extract(epoch FROM attempted_at)::float8 FROM \"{schema}\".instances ORDER BY attempted_at"
    ))
    .fetch_all(nodes[0].pool())
    .await
    .unwrap();
    for w in starts.windows(2) {
        assert!(
            w[1] - w[0] >= 0.05 - 1e-6,
            "two starts {:.4} s apart",
            w[1] - w[0]
        );
    }
    // Only admitted rows were debited: the rate state is exactly one interval
    // past the last start, and the gate is back to full capacity.
    let tat: f64 = sqlx::query_scalar(&format!(
        "SELECT extract(epoch FROM tat)::float8 FROM \"{schema}\".rate_state"
    ))
    .fetch_one(nodes[0].pool())
    .await
    .unwrap();
    assert!(
        (tat - (starts.last().unwrap() + 0.05)).abs() < 1e-3,
        "tat {tat} vs last start {:?}",
        starts.last()
    );
    nodes[0].reconcile_gates_now().await.unwrap();
    let gates = nodes[0].status().await.unwrap().gates;
    assert!(gates.iter().all(|g| g.available == g.limit), "{gates:?}");
    for e in nodes {
        assert_eq!(e.stats().snapshot().pick_errors, 0);
        e.shutdown().await.unwrap();
    }
}

/// Unrelated work keeps flowing past a saturated gate's deep backlog and past
/// a busy K = 1 key's backlog, at the same priority and inserted earlier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrelated_work_flows_past_saturated_backlogs() {
    let url = support::url();
    let schema = support::schema("fair");
    let obs = Observer::new(&url, &schema).await;
    let engine = support::builder(&url, &schema)
        .queue("default", 10)
        .concurrency_limit("slow", GateConfig::new(2))
        .workflow_fn("Obs", {
            let obs = obs.clone();
            move |step, state, ctx| {
                let obs = obs.clone();
                async move {
                    let key = ctx.concurrency_key.clone().unwrap_or_else(|| "free".into());
                    obs.record(ctx.id, &key, "start", &step).await;
                    if key != "free" {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    obs.record(ctx.id, &key, "end", &step).await;
                    Ok(Transition::done(state))
                }
            }
        })
        .build()
        .await
        .unwrap();
    let mut news = Vec::new();
    for _ in 0..2000 {
        news.push(NewInstance::new("Obs", json!({})).concurrency_key("slow:1"));
        news.push(NewInstance::new("Obs", json!({})).concurrency_key("hot:1"));
    }
    engine.insert_many(news).await.unwrap();
    let free = engine
        .insert_many(
            (0..200)
                .map(|_| NewInstance::new("Obs", json!({})))
                .collect(),
        )
        .await
        .unwrap();
    engine.start().await.unwrap();
    let pool = engine.pool().clone();
    let completed = format!(
        "SELECT count(*) FROM \"{schema}\".instances WHERE id = ANY ($1) AND status = 'completed'"
    );
    support::eventually(
        "the unrelated work finished",
        Duration::from_secs(60),
        || {
            let (pool, completed, free) = (pool.clone(), completed.clone(), free.clone());
            async move {
                let n: i64 = sqlx::query_scalar(&completed)
                    .bind(&free)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                n == free.len() as i64
            }
        },
    )
    .await;
    let (free_done, slow_done, hot_done): (i64, i64, i64) = sqlx::query_as(&format!(
        "SELECT count(*) FILTER (WHERE key = 'free'), count(*) FILTER (WHERE key = 'slow:1'),
                count(*) FILTER (WHERE key = 'hot:1')
         FROM \"{schema}\".observed
         WHERE ev = 'end' AND seq <= (SELECT max(seq) FROM \"{schema}\".observed WHERE key = 'free')"
    ))
    .fetch_one(&obs.pool)
    .await
    .unwrap();
    assert_eq!(free_done, 200);
    assert!(
        slow_done < 1000 && hot_done < 1000,
        "the backlogs did not have to drain first: slow {slow_done}, hot {hot_done}"
    );
    engine.shutdown().await.unwrap();
}

/// A full key's next row is reserved as a successor and runs in the slot its
/// predecessor frees; a reserved row cancelled meanwhile is flagged like an
/// executing one (its step may run; its outcome ends it cancelled unless the
/// step completed it); nothing stays reserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successors_take_over_freed_slots() {
    let schema = support::schema("succ");
    let (engine, g, mut rx) = ctl_node(&schema, 5, &[("api", GateConfig::new(1))]).await;
    let wait = json!({"plan": {"start": {"wait": true}}});
    let a = ctl(&engine, wait.clone(), "api:1").await;
    expect_start(&mut rx, a, "start", Some("api:1")).await;
    let row = |plan: serde_json::Value| NewInstance::new("Ctl", plan).concurrency_key("api:1");
    let ids = engine
        .insert_many(vec![
            row(wait),
            row(json!({"plan": {"start": {"do": "release", "to": "more"}}})),
            row(json!({"plan": {}})),
        ])
        .await
        .unwrap();
    let (b, c, d) = (ids[0], ids[1], ids[2]);
    // Successors pay off for steps that outlast a handoff call: A's does
    // (its length is the condition here, not a synchronisation).
    tokio::time::sleep(Duration::from_millis(300)).await;
    g.release.notify_one();
    // The gate is full and running slots are idle: B's claim reserves C.
    expect_start(&mut rx, b, "start", Some("api:1")).await;
    let reserved = |id: i64| {
        let (pool, schema) = (engine.pool().clone(), schema.clone());
        async move {
            sqlx::query_scalar::<_, bool>(&format!(
                "SELECT status = 'available' AND node IS NOT NULL FROM \"{schema}\".instances WHERE id = $1"
            ))
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert!(reserved(c).await, "C is B's successor");
    assert!(!reserved(d).await, "one successor per slot");
    // Cancelling a reserved row flags it: it may already run.
    engine.cancel(c).await.unwrap();
    assert_eq!(engine.get(c).await.unwrap().status, Status::Available);
    g.release.notify_one();
    expect_start(&mut rx, c, "start", Some("api:1")).await;
    expect_start(&mut rx, d, "start", Some("api:1")).await;
    support::wait_status(&engine, d, Status::Completed).await;
    assert_eq!(engine.get(c).await.unwrap().status, Status::Cancelled);
    let left: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{schema}\".instances WHERE node IS NOT NULL"
    ))
    .fetch_one(engine.pool())
    .await
    .unwrap();
    assert_eq!(left, 0, "nothing stays reserved");
    // The key's counter is whole again, or already deleted as idle by the
    // reconciler (it runs every 500 ms here).
    if let Some(gate) = engine.status().await.unwrap().gates.first() {
        assert_eq!((gate.in_flight, gate.available), (0, 1));
    }
    engine.shutdown().await.unwrap();
}

/// One node working through deep backlogs of K = 1 keys: each freed key goes
/// to its next row in the call that records the outcome (while the node has
/// room), and no key ever runs twice at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freed_keys_go_to_their_next_rows() {
    let url = support::url();
    let schema = support::schema("handover");
    let obs = Observer::new(&url, &schema).await;
    let node = observed_node(&url, &schema, obs.clone(), &[]).await;
    let news: Vec<_> = (0..600)
        .map(|i| NewInstance::new("Obs", json!({})).concurrency_key(("acct", i % 20)))
        .collect();
    node.insert_many(news).await.unwrap();
    support::wait_count(node.pool(), &schema, "completed", 600).await;
    let max = obs.max_per_key().await;
    assert_eq!(max.len(), 20);
    assert!(
        max.values().all(|&m| m == 1),
        "a K = 1 key overlapped: {max:?}"
    );
    let s = node.stats().snapshot();
    assert_eq!(s.claimed, 600, "{s:?}");
    assert!(s.handed_over > 0, "no key was handed over: {s:?}");
    node.shutdown().await.unwrap();
}
