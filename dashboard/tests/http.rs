//! The dashboard over HTTP, on a seeded cluster: its pages and JSON say what
//! the database holds, actions are refused unless allowed (and without this
//! server's form token), and allowed actions do what they say.

mod support;

use gendurable::Status;
use prometheus_parse::{Scrape, Value};
use std::time::Duration;
use support::{get, load, post, token_of, wait_status};

/// Long enough that nothing the test looks at finishes under it.
const HOLD: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn a_read_only_dashboard_shows_the_cluster_and_refuses_actions() {
    let url = support::url();
    let schema = support::schema("ro");
    let (engine, seeded) = load::start(&url, &schema, HOLD).await;
    let base = support::dashboard(&url, &schema, false).await;
    let [holder, waiter, ..] = seeded.key_syncs[..] else {
        unreachable!()
    };
    wait_status(&engine, holder, Status::Executing).await;

    let overview = get(&format!("{base}/")).await;
    assert_eq!(overview.status, 200);
    assert!(overview.body.contains("node-a"), "the live node is listed");
    assert!(!overview.body.contains("/actions/"), "no action forms");

    // Why the second sync of account:7 waits.
    let detail = get(&format!("{base}/instances/{waiter}")).await;
    assert_eq!(detail.status, 200);
    assert!(
        detail.body.contains(&format!(
            "key account:7 is held by <a href=\"/instances/{holder}\">#{holder}</a> on node node-a since"
        )),
        "{}",
        detail.body
    );
    assert!(!detail.body.contains("/actions/"));
    let json: serde_json::Value =
        serde_json::from_str(&get(&format!("{base}/api/instances/{waiter}")).await.body).unwrap();
    assert_eq!(json["why"][0]["kind"], "key_held");
    assert_eq!(json["why"][0]["holder"], holder);
    assert_eq!(json["status"], "available");

    // The gate is full; the keys page says so.
    for id in &seeded.charges[..3] {
        wait_status(&engine, *id, Status::Executing).await;
    }
    let keys = get(&format!("{base}/keys")).await;
    assert!(keys.body.contains("stripe:acme"));
    assert!(keys.body.contains("3/3"), "{}", keys.body);

    // Filters, JSON, errors.
    let list = get(&format!("{base}/instances?workflow=Charge&queue=billing")).await;
    for id in &seeded.charges {
        assert!(list.body.contains(&format!("href=\"/instances/{id}\"")));
    }
    assert!(!list.body.contains(&format!("href=\"/instances/{holder}\"")));
    let bad = get(&format!("{base}/api/instances?status=stuck")).await;
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("not a status"), "{}", bad.body);
    assert_eq!(
        get(&format!("{base}/instances/987654321")).await.status,
        404
    );

    // Every action endpoint refuses, and nothing changes.
    for (path, form) in [
        (
            "/actions/instance",
            vec![("id", waiter.to_string()), ("action", "cancel".into())],
        ),
        (
            "/actions/bulk",
            vec![
                ("action", "cancel".into()),
                ("workflow", "Charge".into()),
                ("confirm", "yes".into()),
            ],
        ),
        (
            "/actions/queue",
            vec![("queue", "default".into()), ("action", "pause".into())],
        ),
    ] {
        let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = post(&format!("{base}{path}"), &form).await;
        assert_eq!(r.status, 403, "{path}");
        assert!(r.body.contains("--allow-actions"), "{path}: {}", r.body);
    }
    assert_eq!(engine.get(waiter).await.unwrap().status, Status::Available);
    assert!(engine.paused_queues().await.unwrap().is_empty());
    let charge = engine.get(seeded.charges[7]).await.unwrap();
    assert_ne!(charge.status, Status::Cancelled);

    // /metrics, as Prometheus reads it.
    let m = get(&format!("{base}/metrics")).await;
    assert_eq!(m.status, 200);
    assert!(m
        .header("content-type")
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let scrape = Scrape::parse(m.body.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let gauge = |status: &str| {
        scrape
            .samples
            .iter()
            .find(|s| {
                s.metric == "gendurable_instances"
                    && s.labels.get("queue") == Some("billing")
                    && s.labels.get("status") == Some(status)
            })
            .map(|s| match s.value {
                Value::Gauge(v) => v,
                _ => f64::NAN,
            })
    };
    assert_eq!(gauge("executing"), Some(3.0));
    assert_eq!(gauge("available"), Some(5.0));
    engine.shutdown().await.unwrap();
}

#[tokio::test]
async fn allowed_actions_need_the_form_token_and_do_what_they_say() {
    let url = support::url();
    let schema = support::schema("rw");
    let (engine, seeded) = load::start(&url, &schema, HOLD).await;
    let base = support::dashboard(&url, &schema, true).await;
    let waiter = seeded.key_syncs[1];

    let page = get(&format!("{base}/instances/{waiter}")).await.body;
    assert!(page.contains("id=\"do-cancel\""));
    let token = token_of(&page);
    let act = |id: i64, action: &'static str| {
        let (base, token) = (base.clone(), token.clone());
        async move {
            post(
                &format!("{base}/actions/instance"),
                &[
                    ("token", &token),
                    ("id", &id.to_string()),
                    ("action", action),
                ],
            )
            .await
        }
    };

    // Without the token (a page from elsewhere): refused.
    let r = post(
        &format!("{base}/actions/instance"),
        &[("id", &waiter.to_string()), ("action", "cancel")],
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(engine.get(waiter).await.unwrap().status, Status::Available);

    // Cancel: done, and said so on the page it goes back to.
    let r = act(waiter, "cancel").await;
    assert_eq!(r.status, 303);
    let to = r.header("location").unwrap().to_owned();
    assert!(to.starts_with(&format!("/instances/{waiter}?msg=")), "{to}");
    assert_eq!(engine.get(waiter).await.unwrap().status, Status::Cancelled);
    let shown = get(&format!("{base}{to}")).await.body;
    assert!(shown.contains(&format!("#{waiter} cancelled")), "{shown}");

    // Retry a discarded import: runnable again, with fresh attempts.
    let failed = seeded.failing[0];
    wait_status(&engine, failed, Status::Discarded).await;
    let errors = engine.get(failed).await.unwrap().errors.len();
    let r = act(failed, "retry").await;
    assert!(r.header("location").unwrap().contains("runnable%20again"));
    assert!(engine.get(failed).await.unwrap().errors.len() > errors);

    // Signal an approval: woken, then done.
    let approval = seeded.approvals[0];
    wait_status(&engine, approval, Status::Awaiting).await;
    let r = post(
        &format!("{base}/actions/instance"),
        &[
            ("token", &token),
            ("id", &approval.to_string()),
            ("action", "signal"),
            ("signal", "approved"),
            ("payload", "{\"by\": \"ops\"}"),
        ],
    )
    .await;
    assert!(r.header("location").unwrap().contains("woken"), "{r:?}");
    wait_status(&engine, approval, Status::Completed).await;

    // A payload that is not JSON is said so; nothing is sent.
    let r = post(
        &format!("{base}/actions/instance"),
        &[
            ("token", &token),
            ("id", &seeded.approvals[1].to_string()),
            ("action", "signal"),
            ("signal", "approved"),
            ("payload", "{oops"),
        ],
    )
    .await;
    assert!(r.header("location").unwrap().contains("not%20JSON"));
    assert_eq!(
        engine.get(seeded.approvals[1]).await.unwrap().status,
        Status::Awaiting
    );

    // Delete the cancelled one.
    let r = act(waiter, "delete").await;
    assert!(r.header("location").unwrap().starts_with("/instances?msg="));
    assert!(matches!(
        engine.get(waiter).await,
        Err(gendurable::Error::NotFound(_))
    ));

    // Bulk: the count first, then the action.
    let bulk = |confirm: &'static str| {
        let (base, token) = (base.clone(), token.clone());
        async move {
            post(
                &format!("{base}/actions/bulk"),
                &[
                    ("token", &token),
                    ("action", "cancel"),
                    ("workflow", "Charge"),
                    ("status", "available"),
                    ("confirm", confirm),
                ],
            )
            .await
        }
    };
    let review = bulk("").await;
    assert_eq!(review.status, 200);
    assert!(
        review.body.contains("cancel <b>5</b> instances"),
        "{}",
        review.body
    );
    assert_eq!(
        engine.get(seeded.charges[7]).await.unwrap().status,
        Status::Available
    );
    let r = bulk("yes").await;
    assert_eq!(r.status, 303);
    assert!(r
        .header("location")
        .unwrap()
        .contains("5%20of%205%20matching%20instances%20cancelled"));
    for id in &seeded.charges[3..] {
        assert_eq!(engine.get(*id).await.unwrap().status, Status::Cancelled);
    }

    // A signal to every instance a filter names; what the form echoes back
    // is escaped.
    let signal = |name: &'static str, confirm: &'static str| {
        let (base, token) = (base.clone(), token.clone());
        async move {
            post(
                &format!("{base}/actions/bulk"),
                &[
                    ("token", &token),
                    ("action", "signal"),
                    ("workflow", "Approval"),
                    ("status", "awaiting"),
                    ("signal", name),
                    ("payload", "{\"by\": \"ops\"}"),
                    ("confirm", confirm),
                ],
            )
            .await
        }
    };
    let review = signal("<b>approved</b>", "").await;
    assert!(
        review.body.contains("&lt;b&gt;approved&lt;/b&gt;"),
        "{}",
        review.body
    );
    assert!(!review.body.contains("<b>approved</b>"));
    let r = signal("approved", "yes").await;
    assert!(
        r.header("location")
            .unwrap()
            .contains("1%20of%201%20matching%20instances%20woken"),
        "{r:?}"
    );
    wait_status(&engine, seeded.approvals[1], Status::Completed).await;

    // Pause and resume a queue.
    let r = post(
        &format!("{base}/actions/queue"),
        &[("token", &token), ("queue", "billing"), ("action", "pause")],
    )
    .await;
    assert_eq!(r.status, 303);
    assert_eq!(engine.paused_queues().await.unwrap()[0].0, "billing");
    let overview = get(&format!("{base}/")).await.body;
    assert!(overview.contains("paused"));
    post(
        &format!("{base}/actions/queue"),
        &[
            ("token", &token),
            ("queue", "billing"),
            ("action", "resume"),
        ],
    )
    .await;
    assert!(engine.paused_queues().await.unwrap().is_empty());
    engine.shutdown().await.unwrap();
}
