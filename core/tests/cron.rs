//! Periodic workflows: each tick inserted exactly once however many nodes run
//! the schedule, and ticks missed while no node ran follow the entry's policy.

mod support;

use chrono::{DateTime, Utc};
use gendurable::{CronEntry, Engine, Missed, NewInstance, Transition};
use serde_json::json;
use std::time::Duration;

/// Nodes that do not run `Tick`: its instances stay as inserted, scheduled
/// at their tick (running one would move its `scheduled_at`).
fn builder(url: &str, schema: &str) -> gendurable::EngineBuilder {
    support::builder(url, schema)
        .queue("default", 4)
        .workflow_fn("Other", |_, state, _| async { Ok(Transition::done(state)) })
}

async fn ticks(engine: &Engine, schema: &str, name: &str) -> Vec<DateTime<Utc>> {
    sqlx::query_scalar(&format!(
        "SELECT scheduled_at FROM \"{schema}\".instances WHERE state->>'entry' = $1 ORDER BY scheduled_at"
    ))
    .bind(name)
    .fetch_all(engine.pool())
    .await
    .unwrap()
}

#[tokio::test]
async fn three_nodes_insert_each_tick_exactly_once() {
    let url = support::url();
    let schema = support::schema("cron_nodes");
    let every_second = || {
        CronEntry::new(
            "* * * * * *",
            NewInstance::new("Tick", json!({"entry": "s"})),
        )
        .name("s")
    };
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(
            builder(&url, &schema)
                .cron(every_second())
                .start()
                .await
                .unwrap(),
        );
    }
    let observer = &nodes[0];
    support::eventually("eight ticks", Duration::from_secs(60), || async {
        ticks(observer, &schema, "s").await.len() >= 8
    })
    .await;
    for n in &nodes {
        n.shutdown().await.unwrap();
    }
    let got = ticks(observer, &schema, "s").await;
    for pair in got.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            chrono::Duration::seconds(1),
            "each second once, none missed: {got:?}"
        );
    }
    let last: DateTime<Utc> = sqlx::query_scalar(&format!(
        "SELECT last_tick FROM \"{schema}\".cron WHERE name = 's'"
    ))
    .fetch_one(observer.pool())
    .await
    .unwrap();
    assert_eq!(
        Some(&last),
        got.last(),
        "the recorded tick is the last inserted"
    );
}

#[tokio::test]
async fn missed_ticks_follow_each_entrys_policy() {
    let url = support::url();
    let schema = support::schema("cron_missed");
    // Yearly schedules last run three years ago: the ticks of the years
    // between were missed.
    let yearly = |name: &str, missed| {
        CronEntry::new(
            "0 0 1 1 *",
            NewInstance::new("Tick", json!({"entry": name})),
        )
        .name(name)
        .missed(missed)
    };
    let engine = builder(&url, &schema)
        .cron(yearly("all", Missed::All))
        .cron(yearly("latest", Missed::Latest))
        .cron(yearly("skip", Missed::Skip))
        .build()
        .await
        .unwrap();
    sqlx::query(&format!(
        "INSERT INTO \"{schema}\".cron (name, last_tick)
         SELECT n, date_trunc('year', now()) - interval '3 years' FROM unnest($1::text[]) n"
    ))
    .bind(["all", "latest", "skip"])
    .execute(engine.pool())
    .await
    .unwrap();
    engine.start().await.unwrap();
    let this_year: DateTime<Utc> = sqlx::query_scalar(
        "SELECT date_trunc('year', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'",
    )
    .fetch_one(engine.pool())
    .await
    .unwrap();
    // Each entry's round records this year's tick.
    support::eventually("every entry's round", Duration::from_secs(30), || async {
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM \"{schema}\".cron WHERE last_tick = $1"
        ))
        .bind(this_year)
        .fetch_one(engine.pool())
        .await
        .unwrap();
        n == 3
    })
    .await;
    engine.shutdown().await.unwrap();

    let years = |ts: Vec<DateTime<Utc>>| {
        ts.iter()
            .map(|t| t.format("%Y").to_string())
            .collect::<Vec<_>>()
    };
    let y =
        |back: i32| (this_year.format("%Y").to_string().parse::<i32>().unwrap() - back).to_string();
    assert_eq!(
        years(ticks(&engine, &schema, "all").await),
        [y(2), y(1), y(0)]
    );
    assert_eq!(years(ticks(&engine, &schema, "latest").await), [y(0)]);
    assert!(ticks(&engine, &schema, "skip").await.is_empty());
}

#[tokio::test]
async fn bad_entries_are_refused_when_the_engine_is_built() {
    let url = support::url();
    let schema = support::schema("cron_bad");
    let tick = || NewInstance::new("Tick", json!({}));
    let err = |b: gendurable::EngineBuilder| async move {
        match b.build().await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("built"),
        }
    };
    assert_eq!(
        err(builder(&url, &schema)
            .cron(CronEntry::new("* * * * *", tick()))
            .cron(CronEntry::new("0 * * * *", tick())))
        .await,
        "invalid configuration: cron \"Tick\" is configured twice: give each entry its own name"
    );
    assert!(
        err(builder(&url, &schema).cron(CronEntry::new("every minute", tick())))
            .await
            .starts_with("invalid configuration: cron \"Tick\": schedule \"every minute\"")
    );
    assert_eq!(
        err(builder(&url, &schema).cron(CronEntry::new("* * * * *", tick().rate_limit("nope:1"))))
            .await,
        "invalid configuration: cron \"Tick\": instance: invalid rate_limit: no rate limit named \"nope\" is configured (rate_limits: [])"
    );
}
