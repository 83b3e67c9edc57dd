//! The `gendurable` binary end to end: migrate, insert, a Rust echo node,
//! get, status, and clear errors for bad input.

use gendurable::embedded::TempPostgres;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn gendurable(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gendurable"))
        .args(args)
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[tokio::test]
async fn migrate_insert_echo_get_status() {
    let pg = TempPostgres::start().await.unwrap();
    let url = pg.url();
    let s = ["--schema", "cli"];
    assert!(stdout(&gendurable(&url, &["migrate", s[0], s[1]])).contains("up to date"));
    let id = stdout(&gendurable(
        &url,
        &[
            "insert",
            s[0],
            s[1],
            "--workflow",
            "gendurable.Echo",
            "--state",
            r#"{"from": "cli"}"#,
        ],
    ));
    let id = id.trim().to_owned();
    assert!(id.parse::<i64>().is_ok(), "{id}");

    let mut echo = Command::new(env!("CARGO_BIN_EXE_gendurable"))
        .args(["echo", s[0], s[1]])
        .env("DATABASE_URL", &url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let got = loop {
        let o = gendurable(&url, &["get", s[0], s[1], &id]);
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        if v["status"] == "completed" {
            break v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "echo never finished: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(got["state"]["from"], "cli");
    assert_eq!(got["state"]["ran_by"], "rust");
    // SIGTERM: a graceful stop, exit status 0.
    unsafe { libc::kill(echo.id() as i32, libc::SIGTERM) };
    assert!(echo.wait().unwrap().success());

    let status = stdout(&gendurable(
        &url,
        &["status", s[0], s[1], "--gate", "api=5/2", "--key", "api:1"],
    ));
    assert!(status.contains("completed"), "{status}");
    assert!(
        status.contains("api:1: K = 5 (captured by gate \"api\", 2 shards)"),
        "{status}"
    );
}

#[tokio::test]
async fn bad_input_is_a_clear_error() {
    let pg = TempPostgres::start().await.unwrap();
    let url = pg.url();
    let o = gendurable(&url, &["insert", "--workflow", "W", "--state", "[1]"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("invalid state: must be a JSON object, got an array"),
        "{err}"
    );
    let o = gendurable(&url, &["insert", "--workflow", "W", "--state", "{"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--state is not JSON"));
    let o = gendurable(&url, &["migrate", "--schema", "Bad-Name"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("schema"));
    let o = Command::new(env!("CARGO_BIN_EXE_gendurable"))
        .args(["migrate"])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no database: pass --url or set DATABASE_URL")
    );
}
