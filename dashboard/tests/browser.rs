//! The dashboard in a real browser: headless Chromium driven through
//! chromedriver (WebDriver), on a seeded cluster. An operator finds a stuck
//! instance by filter, reads why it waits, cancels it, retries a discarded
//! one, watches a page update live; with actions off, no button shows and
//! the endpoints refuse.
//!
//! Needs `chromium` and `chromium-driver` (Debian packages; `scripts/test`
//! installs them). Set GENDURABLE_SKIP_BROWSER=1 to skip it on a machine
//! without them. GENDURABLE_SCREENSHOTS=<dir> saves a screenshot of each
//! page there (docs/dashboard.md shows them).

mod support;

use fantoccini::{Client, ClientBuilder, Locator};
use gendurable::{NewInstance, Status};
use serde_json::json;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

/// How long the browser may take to show something that is there.
const SHOWS: Duration = Duration::from_secs(20);

/// chromedriver on a free port, in a process group of its own; dropped,
/// the group is killed: the browsers it started too, even when the test
/// failed before closing its session.
struct Driver {
    child: tokio::process::Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on the group this process leads; no memory involved.
            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
        }
    }
}

/// Start chromedriver and wait for it to say it listens. `None`: it is not
/// installed and GENDURABLE_SKIP_BROWSER is set.
async fn driver() -> Option<Driver> {
    let bin = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = tokio::process::Command::new(&bin)
        .arg(format!("--port={port}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if std::env::var_os("GENDURABLE_SKIP_BROWSER").is_some() => {
            eprintln!("skipped: no chromedriver ({e})");
            return None;
        }
        Err(e) => panic!(
            "cannot run {bin:?} ({e}): install chromium and chromium-driver \
             (apt-get install chromium chromium-driver), or set GENDURABLE_SKIP_BROWSER=1"
        ),
    };
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while let Some(line) = lines.next_line().await.unwrap() {
        if line.contains("started successfully") {
            // Keep reading its output so that it never blocks on a full pipe.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            return Some(Driver {
                child,
                url: format!("http://127.0.0.1:{port}"),
            });
        }
    }
    panic!("chromedriver exited before it listened");
}

async fn browser(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({ "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,1000"] }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a browser session")
}

/// The text of the first element matching `css`, once it shows.
async fn text(c: &Client, css: &str) -> String {
    on_element(c, css, |e| async move { e.text().await }).await
}

async fn click(c: &Client, css: &str) {
    on_element(c, css, |e| async move { e.click().await }).await
}

/// Waits for `css` and runs `act` on it. The page reloads `main` on its own
/// (every `refresh`): an element found just before a reload is stale when
/// `act` reaches it, so it is looked up again, until `SHOWS` has passed.
async fn on_element<T, F, Fut>(c: &Client, css: &str, act: F) -> T
where
    F: Fn(fantoccini::elements::Element) -> Fut,
    Fut: std::future::Future<Output = Result<T, fantoccini::error::CmdError>>,
{
    let deadline = tokio::time::Instant::now() + SHOWS;
    loop {
        let found = c
            .wait()
            .at_most(SHOWS)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        match act(found).await {
            Ok(v) => return v,
            Err(e) if e.is_stale_element_reference() && tokio::time::Instant::now() < deadline => {}
            Err(e) => panic!("{css}: {e}"),
        }
    }
}

/// Save a screenshot as `<GENDURABLE_SCREENSHOTS>/<name>.png`, if asked.
async fn shot(c: &Client, name: &str) {
    if let Some(dir) = std::env::var_os("GENDURABLE_SCREENSHOTS") {
        let png = c.screenshot().await.unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(std::path::Path::new(&dir).join(format!("{name}.png")), png).unwrap();
    }
}

#[tokio::test]
async fn an_operator_finds_why_an_instance_waits_and_acts_on_it() {
    let Some(driver) = driver().await else { return };
    let url = support::url();
    let schema = support::schema("browser");
    let (engine, seeded) = support::load::start(&url, &schema, Duration::from_secs(3600)).await;
    let [holder, waiter, ..] = seeded.key_syncs[..] else {
        unreachable!()
    };
    let base = support::dashboard(&url, &schema, true).await;
    let read_only = support::dashboard(&url, &schema, false).await;
    for id in [
        holder,
        seeded.charges[0],
        seeded.charges[1],
        seeded.charges[2],
    ] {
        support::wait_status(&engine, id, Status::Executing).await;
    }
    support::wait_status(&engine, seeded.failing[0], Status::Discarded).await;
    let c = browser(&driver).await;

    // The overview: the live node and the queues.
    c.goto(&format!("{base}/")).await.unwrap();
    assert!(text(&c, "#nodes").await.contains("node-a"));
    assert!(text(&c, "#queues").await.contains("billing"));
    shot(&c, "overview").await;

    // Find the stuck syncs of account:7 with the filter form.
    c.goto(&format!("{base}/instances")).await.unwrap();
    let form = c.form(Locator::Css("#filter")).await.unwrap();
    form.set_by_name("key", "account:7").await.unwrap();
    form.set_by_name("status", "available").await.unwrap();
    form.submit().await.unwrap();
    // The filtered page, not the one the form was on.
    c.wait()
        .at_most(SHOWS)
        .for_element(Locator::Css("#filter input[name=key][value=\"account:7\"]"))
        .await
        .expect("the filtered page");
    let list = text(&c, "#instances").await;
    assert!(list.contains(&format!("#{waiter}")), "{list}");
    assert!(
        !list.contains(&format!("#{holder}")),
        "the holder is executing: {list}"
    );
    shot(&c, "instances").await;

    // Why it waits.
    click(&c, &format!("#instances a[href=\"/instances/{waiter}\"]")).await;
    let why = text(&c, "#why").await;
    assert!(
        why.contains(&format!(
            "key account:7 is held by #{holder} on node node-a since"
        )),
        "{why}"
    );
    shot(&c, "instance").await;

    // Cancel it.
    click(&c, "#do-cancel").await;
    assert!(text(&c, "#banner")
        .await
        .contains(&format!("#{waiter} cancelled")));
    assert_eq!(engine.get(waiter).await.unwrap().status, Status::Cancelled);

    // A full gate and a rate limit on the keys page.
    c.goto(&format!("{base}/keys")).await.unwrap();
    assert!(text(&c, "#gates").await.contains("3/3"));
    assert!(text(&c, "#rates").await.contains("openai"));
    shot(&c, "keys").await;

    // Retry a discarded import: its errors are on its page, with their detail.
    c.goto(&format!("{base}/instances?status=discarded"))
        .await
        .unwrap();
    let failed = seeded.failing[0];
    click(&c, &format!("#instances a[href=\"/instances/{failed}\"]")).await;
    let errors = text(&c, "#errors").await;
    assert!(errors.contains("503 Service Unavailable"), "{errors}");
    assert!(errors.contains("lib/import.ex:42"), "{errors}");
    shot(&c, "failed").await;
    click(&c, "#do-retry").await;
    assert!(text(&c, "#banner").await.contains("runnable again"));
    assert!(engine.get(failed).await.unwrap().errors.len() > 2);

    // A bulk action shows its count before it runs.
    c.goto(&format!(
        "{base}/instances?workflow=Charge&status=available"
    ))
    .await
    .unwrap();
    click(&c, "#bulk button").await;
    assert!(text(&c, "#confirm-count")
        .await
        .contains("cancel 5 instances"));
    shot(&c, "confirm").await;

    // The page follows the database on its own.
    c.goto(&format!("{base}/instances?workflow=Late"))
        .await
        .unwrap();
    assert!(text(&c, "#instances").await.contains("no instance"));
    let late = engine
        .insert(NewInstance::new("Late", json!({})).queue("nowhere"))
        .await
        .unwrap();
    let row = text(&c, &format!("#instances a[href=\"/instances/{late}\"]")).await;
    assert_eq!(row, format!("#{late}"));

    // Read-only: no buttons, and the endpoints refuse.
    c.goto(&format!("{read_only}/instances/{}", seeded.key_syncs[2]))
        .await
        .unwrap();
    assert!(text(&c, "#why").await.contains("key account:7 is held by"));
    assert!(c.find(Locator::Css("#actions")).await.is_err());
    assert!(c
        .find(Locator::Css("form[action^=\"/actions\"]"))
        .await
        .is_err());
    let status = c
        .execute_async(
            "const done = arguments[arguments.length - 1];\
             fetch('/actions/instance', {method: 'POST', body: new URLSearchParams(\
               {id: arguments[0], action: 'cancel'})}).then(r => done(r.status));",
            vec![json!(seeded.key_syncs[2])],
        )
        .await
        .unwrap();
    assert_eq!(status, json!(403));
    assert_eq!(
        engine.get(seeded.key_syncs[2]).await.unwrap().status,
        Status::Available
    );

    c.close().await.unwrap();
    engine.shutdown().await.unwrap();
}
