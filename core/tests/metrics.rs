//! `GET /metrics` on a node's listener, read with a Prometheus text parser.

mod support;

use gendurable::bulkhead::{Bulkhead, BulkheadConfig};
use gendurable::{GateConfig, NewInstance, RateConfig, Transition};
use prometheus_parse::{Scrape, Value};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

async fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).await.unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

/// `GET /metrics`, read as Prometheus reads it.
async fn scrape(addr: std::net::SocketAddr) -> Scrape {
    let (status, body) = get(addr, "/metrics").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    Scrape::parse(lines).expect("the Prometheus text format")
}

/// The value of the first sample of `name` (with `label`, if given).
fn value(scrape: &Scrape, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            _ => f64::NAN,
        })
}

#[tokio::test]
async fn a_node_serves_its_metrics_in_the_prometheus_format() {
    let url = support::url();
    let schema = support::schema("metrics");
    let engine = support::builder(&url, &schema)
        .queue("default", 2)
        .concurrency_limit("partner", GateConfig::new(5))
        // No reconciler pass deletes the idle gate counter before the scrape.
        .gc_interval(std::time::Duration::from_secs(3600))
        .metrics_listen("127.0.0.1:0".parse().unwrap())
        .workflow_fn("Job", |_, state, _| async move {
            if state["fail"] == json!(true) {
                return Err("no".into());
            }
            Ok(Transition::done(state))
        })
        .start()
        .await
        .unwrap();
    let addr = engine.metrics_addr().await.expect("listening");
    let ok = engine
        .insert(NewInstance::new("Job", json!({})).concurrency_key("partner:1"))
        .await
        .unwrap();
    let bad = engine
        .insert(NewInstance::new("Job", json!({"fail": true})).max_attempts(1))
        .await
        .unwrap();
    support::wait_final(&engine, ok).await;
    support::wait_final(&engine, bad).await;
    engine
        .insert(
            NewInstance::new("Job", json!({})).schedule_in(std::time::Duration::from_secs(3600)),
        )
        .await
        .unwrap();

    let scrape = scrape(addr).await;
    let value = |name: &str, label: Option<(&str, &str)>| value(&scrape, name, label);
    assert_eq!(value("gendurable_steps_started_total", None), Some(2.0));
    assert_eq!(value("gendurable_steps_completed_total", None), Some(1.0));
    assert_eq!(value("gendurable_steps_failed_total", None), Some(1.0));
    assert_eq!(value("gendurable_rate_limited_total", None), Some(0.0));
    // No bulkhead was given to the builder.
    assert!(!scrape
        .samples
        .iter()
        .any(|s| s.metric.starts_with("gendurable_bulkhead_")));
    assert_eq!(
        value("gendurable_instances", Some(("status", "scheduled"))),
        Some(1.0)
    );
    // The gate's counter stays until a reconciler pass deletes it as idle.
    assert_eq!(
        value("gendurable_gate_limit", Some(("gate", "partner"))),
        Some(5.0)
    );
    assert_eq!(
        value("gendurable_gate_in_flight", Some(("gate", "partner"))),
        Some(0.0)
    );
    let step = scrape
        .samples
        .iter()
        .find(|s| s.metric == "gendurable_step_duration_seconds")
        .expect("the step histogram");
    match &step.value {
        Value::Histogram(buckets) => {
            assert_eq!(buckets.last().map(|b| b.count), Some(2.0));
        }
        other => panic!("not a histogram: {other:?}"),
    }
    assert_eq!(get(addr, "/").await.0, "HTTP/1.1 404 Not Found");
    engine.shutdown().await.unwrap();
    assert!(engine.metrics_addr().await.is_none());
}

/// A step whose rate limit has no start left is a denial: the pick that
/// finds its row parks it, and the node counts it.
#[tokio::test]
async fn rate_limit_denials_are_counted() {
    let url = support::url();
    let schema = support::schema("metrics_rate");
    let engine = support::builder(&url, &schema)
        .queue("default", 2)
        // One start an hour: the first step takes it, the second is denied
        // until long after the test.
        .rate_limit("api", RateConfig::new(1, Duration::from_secs(3600)))
        .step_rate_limit("Limited", "call", "api:1")
        .metrics_listen("127.0.0.1:0".parse().unwrap())
        .workflow_fn("Limited", |step, state, _| async move {
            Ok(match step.as_str() {
                "start" => Transition::next("call", state),
                _ => Transition::done(state),
            })
        })
        .start()
        .await
        .unwrap();
    let addr = engine.metrics_addr().await.expect("listening");
    let id = engine
        .insert(NewInstance::new("Limited", json!({})).rate_limit("api:1"))
        .await
        .unwrap();
    // The step "call" is runnable once "start" is recorded; the next pick
    // that meets it finds the limit spent.
    support::eventually(
        "a pick finds the limit spent",
        Duration::from_secs(60),
        || async { engine.stats().snapshot().rate_limited > 0 },
    )
    .await;
    let scrape = scrape(addr).await;
    // Exactly one: the row, once parked, is out of every pick's sight until
    // the limit allows a start, an hour on.
    assert_eq!(
        value(&scrape, "gendurable_rate_limited_total", None),
        Some(1.0)
    );
    let i = engine.get(id).await.unwrap();
    assert_eq!(i.step, "call");
    assert_eq!(i.status, gendurable::Status::Available);
    engine.shutdown().await.unwrap();
}

/// A bulkhead given to the builder shows its gauges while a step holds one
/// of its permits, and its refusals.
#[tokio::test]
async fn a_bulkhead_shows_what_is_in_flight() {
    let url = support::url();
    let schema = support::schema("metrics_bulkhead");
    let partner =
        Arc::new(Bulkhead::new(BulkheadConfig::new(2, Duration::from_secs(600))).unwrap());
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let (b, e, r) = (partner.clone(), entered.clone(), release.clone());
    let engine = support::builder(&url, &schema)
        .queue("default", 2)
        .bulkhead("partner", partner.clone())
        .metrics_listen("127.0.0.1:0".parse().unwrap())
        .workflow_fn("Call", move |_, state, _| {
            let (b, e, r) = (b.clone(), e.clone(), r.clone());
            async move {
                let _permit = b.acquire().await?;
                e.notify_one();
                r.notified().await;
                Ok(Transition::done(state))
            }
        })
        .start()
        .await
        .unwrap();
    let addr = engine.metrics_addr().await.expect("listening");
    let id = engine
        .insert(NewInstance::new("Call", json!({})))
        .await
        .unwrap();
    entered.notified().await;
    let gauge = |scrape: &Scrape, family: &str| {
        value(
            scrape,
            &format!("gendurable_bulkhead_{family}"),
            Some(("name", "partner")),
        )
    };
    let during = scrape(addr).await;
    assert_eq!(gauge(&during, "in_flight"), Some(1.0));
    assert_eq!(gauge(&during, "limit"), Some(2.0));
    assert_eq!(gauge(&during, "waiting"), Some(0.0));
    assert_eq!(gauge(&during, "saturated_total"), Some(0.0));
    assert_eq!(gauge(&during, "reclaimed_total"), Some(0.0));

    // The application takes the other permit; a third call is refused.
    let mine = partner.try_acquire().unwrap();
    assert!(partner.try_acquire().is_err());
    let full = scrape(addr).await;
    assert_eq!(gauge(&full, "in_flight"), Some(2.0));
    assert_eq!(gauge(&full, "saturated_total"), Some(1.0));

    drop(mine);
    release.notify_one();
    support::wait_final(&engine, id).await;
    let after = scrape(addr).await;
    assert_eq!(gauge(&after, "in_flight"), Some(0.0));
    assert_eq!(gauge(&after, "saturated_total"), Some(1.0));
    engine.shutdown().await.unwrap();
}
