//! Unique inserts and idempotency keys: one instance per identity among the
//! chosen statuses, decided by the database whoever races for it, and every
//! caller told which instance holds it.

mod support;

use gendurable::unique::ALL_STATUSES;
use gendurable::{Engine, Inserted, NewInstance, Status, Transition, Unique};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

async fn engine(url: &str, schema: &str) -> Engine {
    support::builder(url, schema)
        .queue("default", 4)
        .workflow_fn("Report", |_, state, _| async {
            Ok(Transition::done(state))
        })
        .build()
        .await
        .unwrap()
}

async fn rows(engine: &Engine, schema: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM \"{schema}\".instances"))
        .fetch_one(engine.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_duplicate_reports_the_instance_that_holds_its_identity() {
    let url = support::url();
    let schema = support::schema("unique");
    let engine = engine(&url, &schema).await;
    let report = |account: i64, by: &str| {
        NewInstance::new("Report", json!({"account": account, "by": by}))
            .unique(Unique::new().fields(["account"]))
    };

    let first = engine.insert_unique(report(7, "ops")).await.unwrap();
    assert!(!first.conflict);
    let again = engine.insert_unique(report(7, "cron")).await.unwrap();
    assert_eq!(
        again,
        Inserted {
            id: first.id,
            conflict: true
        },
        "same field, other state"
    );
    let other = engine.insert_unique(report(8, "ops")).await.unwrap();
    assert!(!other.conflict && other.id != first.id);
    // The whole state by default; the workflow and the concurrency key count.
    let whole = |n| NewInstance::new("Report", json!({"n": n})).unique(Unique::new());
    let a = engine.insert_unique(whole(1)).await.unwrap();
    assert!(engine.insert_unique(whole(1)).await.unwrap().conflict);
    assert!(!engine.insert_unique(whole(2)).await.unwrap().conflict);
    let keyed = engine
        .insert_unique(whole(1).concurrency_key("account:1"))
        .await
        .unwrap();
    assert!(!keyed.conflict && keyed.id != a.id);
    let other_wf = NewInstance::new("Other", json!({"n": 1})).unique(Unique::new());
    assert!(!engine.insert_unique(other_wf).await.unwrap().conflict);

    // In one batch: the first of each identity is inserted, the later ones
    // (and one that meets an earlier insert) report it; plain rows go in.
    let batch = engine
        .insert_many_unique(vec![
            report(9, "a"),
            NewInstance::new("Report", json!({})),
            report(9, "b"),
            report(7, "c"),
            NewInstance::new("Report", json!({})),
        ])
        .await
        .unwrap();
    assert!(!batch[0].conflict && !batch[1].conflict && !batch[4].conflict);
    assert_eq!(
        batch[2],
        Inserted {
            id: batch[0].id,
            conflict: true
        }
    );
    assert_eq!(
        batch[3],
        Inserted {
            id: first.id,
            conflict: true
        }
    );
    assert!(
        batch[0].id < batch[1].id && batch[1].id < batch[4].id,
        "ids in input order"
    );
    assert_eq!(rows(&engine, &schema).await, 9);
    // insert and insert_many report the holder's id too.
    assert_eq!(engine.insert(report(7, "x")).await.unwrap(), first.id);
}

#[tokio::test]
async fn statuses_decide_how_long_an_identity_is_held() {
    let url = support::url();
    let schema = support::schema("unique_statuses");
    let engine = engine(&url, &schema).await;
    engine.start().await.unwrap();

    // Default: held while to run, running or completed; a cancelled one lets
    // a duplicate in.
    let charge = || NewInstance::new("Report", json!({})).idempotency_key("charge:42");
    let done = engine.insert_unique(charge()).await.unwrap();
    assert_eq!(
        support::wait_final(&engine, done.id).await.status,
        Status::Completed
    );
    assert_eq!(
        engine.insert_unique(charge()).await.unwrap(),
        Inserted {
            id: done.id,
            conflict: true
        }
    );

    let later = || {
        NewInstance::new("Report", json!({}))
            .idempotency_key("charge:43")
            .schedule_in(Duration::from_secs(3600))
    };
    let cancelled = engine.insert_unique(later()).await.unwrap();
    engine.cancel(cancelled.id).await.unwrap();
    let next = engine.insert_unique(later()).await.unwrap();
    assert!(!next.conflict && next.id != cancelled.id);

    // Only while not final: a completed instance lets the next one in.
    let active = || {
        NewInstance::new("Report", json!({}))
            .idempotency_key("sync:1")
            .unique(Unique::new().statuses(gendurable::unique::ACTIVE_STATUSES))
    };
    let one = engine.insert_unique(active()).await.unwrap();
    support::wait_final(&engine, one.id).await;
    let two = engine.insert_unique(active()).await.unwrap();
    assert!(!two.conflict && two.id != one.id);

    // Ever (as long as the row is kept): a cancelled one still holds it.
    let ever = || {
        NewInstance::new("Report", json!({}))
            .idempotency_key("refund:9")
            .schedule_in(Duration::from_secs(3600))
            .unique(Unique::new().statuses(ALL_STATUSES))
    };
    let kept = engine.insert_unique(ever()).await.unwrap();
    engine.cancel(kept.id).await.unwrap();
    assert_eq!(
        engine.insert_unique(ever()).await.unwrap(),
        Inserted {
            id: kept.id,
            conflict: true
        }
    );
    engine.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_period_holds_an_identity_within_its_window() {
    let url = support::url();
    let schema = support::schema("unique_period");
    let engine = engine(&url, &schema).await;
    let tick = || {
        NewInstance::new("Report", json!({"a": 1}))
            .schedule_in(Duration::from_secs(3600))
            .unique(Unique::new().period(Duration::from_secs(1)))
    };
    // Both inserts inside one window of the database's clock: retried until
    // they are (the window may turn between them).
    let window = || async {
        sqlx::query_scalar::<_, f64>("SELECT floor(extract(epoch FROM clock_timestamp()))::float8")
            .fetch_one(engine.pool())
            .await
            .unwrap()
    };
    let (first, second) = loop {
        let w = window().await;
        let first = engine.insert_unique(tick()).await.unwrap();
        let second = engine.insert_unique(tick()).await.unwrap();
        if window().await == w {
            break (first, second);
        }
    };
    assert_eq!(
        second,
        Inserted {
            id: first.id,
            conflict: true
        }
    );
    // The next window lets it in again.
    let w = window().await;
    support::eventually(
        "the clock to enter the next second",
        Duration::from_secs(5),
        || async { window().await > w },
    )
    .await;
    let next = engine.insert_unique(tick()).await.unwrap();
    assert!(!next.conflict, "a new window");
}

#[tokio::test]
async fn a_unique_insert_waits_for_a_racing_transaction_and_reports_its_row() {
    let url = support::url();
    let schema = support::schema("unique_tx");
    let engine = engine(&url, &schema).await;
    let key = |k: &str| NewInstance::new("Report", json!({})).idempotency_key(k);

    for commit in [true, false] {
        let k = format!("k:{commit}");
        let mut tx = engine.pool().begin().await.unwrap();
        let held = engine
            .insert_many_unique_in(&mut tx, vec![key(&k)])
            .await
            .unwrap()[0];
        assert!(!held.conflict);
        let racer = {
            let (engine, k) = (engine.clone(), k.clone());
            tokio::spawn(async move { engine.insert_unique(key(&k)).await })
        };
        // The racer waits on the open transaction's row lock.
        support::eventually(
            "the racer to wait on a lock",
            Duration::from_secs(10),
            || async {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND datname = current_database()",
                )
                .fetch_one(engine.pool())
                .await
                .unwrap()
                    > 0
            },
        )
        .await;
        if commit {
            tx.commit().await.unwrap();
            let r = racer.await.unwrap().unwrap();
            assert_eq!(
                r,
                Inserted {
                    id: held.id,
                    conflict: true
                },
                "told the committed row"
            );
        } else {
            tx.rollback().await.unwrap();
            let r = racer.await.unwrap().unwrap();
            assert!(
                !r.conflict && r.id != held.id,
                "inserted after the rollback"
            );
        }
    }
}

/// Nodes and inserters race for the same identities: exactly one row per
/// identity, and every caller is told the id of that row.
#[tokio::test]
async fn racing_inserters_on_two_nodes_agree_on_one_row_per_identity() {
    let url = support::url();
    let schema = support::schema("unique_race");
    let setup = engine(&url, &schema).await;
    let mut engines = Vec::new();
    for _ in 0..2 {
        let e = engine(&url, &schema).await;
        e.start().await.unwrap();
        engines.push(e);
    }
    const KEYS: i64 = 40;
    const INSERTERS: usize = 8;
    let mut tasks = Vec::new();
    for t in 0..INSERTERS {
        let engine = engines[t % 2].clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            // Each inserter walks the keys in its own order, in batches of 5
            // with one identity repeated inside the batch.
            let mut keys: Vec<i64> = (0..KEYS).collect();
            keys.rotate_left((t * 7) % KEYS as usize);
            if t % 2 == 1 {
                keys.reverse();
            }
            for chunk in keys.chunks(5) {
                let mut batch: Vec<NewInstance> = chunk
                    .iter()
                    .map(|k| {
                        NewInstance::new("Report", json!({"account": k, "by": t}))
                            .unique(Unique::new().fields(["account"]))
                    })
                    .collect();
                batch.push(batch[0].clone());
                let out = engine.insert_many_unique(batch).await.unwrap();
                for (k, r) in chunk.iter().chain([&chunk[0]]).zip(out) {
                    got.push((*k, r));
                }
            }
            got
        }));
    }
    let mut told: HashMap<i64, HashSet<i64>> = HashMap::new();
    let mut inserted: HashMap<i64, usize> = HashMap::new();
    for t in tasks {
        for (k, r) in t.await.unwrap() {
            told.entry(k).or_default().insert(r.id);
            if !r.conflict {
                *inserted.entry(k).or_default() += 1;
            }
        }
    }
    let per_key: Vec<(i64, i64)> = sqlx::query_as(&format!(
        "SELECT (state->>'account')::bigint, id FROM \"{schema}\".instances"
    ))
    .fetch_all(setup.pool())
    .await
    .unwrap();
    assert_eq!(per_key.len() as i64, KEYS, "one row per identity");
    for (k, id) in per_key {
        assert_eq!(
            told[&k],
            HashSet::from([id]),
            "every caller told row {id} for {k}"
        );
        assert_eq!(inserted[&k], 1, "one caller inserted {k}");
    }
    for e in engines {
        e.shutdown().await.unwrap();
    }
}

/// Two batches sharing identities in opposite orders: each takes them in key
/// order, so neither holds what the other waits for (no deadlock error).
#[tokio::test]
async fn batches_in_opposite_orders_do_not_deadlock() {
    let url = support::url();
    let schema = support::schema("unique_order");
    let a = engine(&url, &schema).await;
    let b = engine(&url, &schema).await;
    for round in 0..300 {
        let batch = |reverse: bool| {
            let mut keys: Vec<String> = (0..30).map(|k| format!("r{round}:{k}")).collect();
            if reverse {
                keys.reverse();
            }
            keys.into_iter()
                .map(|k| NewInstance::new("Report", json!({})).idempotency_key(k))
                .collect::<Vec<_>>()
        };
        let (x, y) = tokio::join!(
            a.insert_many_unique(batch(false)),
            b.insert_many_unique(batch(true))
        );
        let (x, y) = (x.unwrap(), y.unwrap());
        // The same 30 rows, whoever inserted each.
        let ids: Vec<i64> = x.iter().map(|r| r.id).collect();
        let other: Vec<i64> = y.iter().rev().map(|r| r.id).collect();
        assert_eq!(ids, other, "both told the same row per key");
        assert_eq!(
            x.iter().chain(&y).filter(|r| !r.conflict).count(),
            30,
            "each key inserted once"
        );
    }
}
