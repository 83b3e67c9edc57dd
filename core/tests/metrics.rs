//! `GET /metrics` on a node's listener, read with a Prometheus text parser.

mod support;

use gendurable::{GateConfig, NewInstance, Transition};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

    let (status, body) = get(addr, "/metrics").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the Prometheus text format");
    let value = |name: &str, label: Option<(&str, &str)>| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && label.map_or(true, |(k, v)| s.labels.get(k) == Some(v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
                prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
    };
    assert_eq!(value("gendurable_steps_started_total", None), Some(2.0));
    assert_eq!(value("gendurable_steps_completed_total", None), Some(1.0));
    assert_eq!(value("gendurable_steps_failed_total", None), Some(1.0));
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
        prometheus_parse::Value::Histogram(buckets) => {
            assert_eq!(buckets.last().map(|b| b.count), Some(2.0));
        }
        other => panic!("not a histogram: {other:?}"),
    }
    assert_eq!(get(addr, "/").await.0, "HTTP/1.1 404 Not Found");
    engine.shutdown().await.unwrap();
    assert!(engine.metrics_addr().await.is_none());
}
