//! The `gendurable` binary end to end: migrate, insert, a Rust echo node,
//! get, status, and clear errors for bad input.

use gendurable_testing::TempPostgres;
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

    // No node yet: nothing serves its queue.
    let why = stdout(&gendurable(&url, &["why", s[0], s[1], &id]));
    assert_eq!(why.trim(), "no live node serves queue default");

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
    let why = stdout(&gendurable(&url, &["why", s[0], s[1], &id]));
    assert_eq!(
        why.trim(),
        format!("#{id} is completed: it waits for nothing")
    );
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

/// The output of a run with `env` set on top of the usual.
fn gendurable_env(url: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gendurable"));
    c.args(args)
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "error");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// stderr of a failed run, asserted to be one line.
fn one_line_error(o: &Output) -> String {
    assert!(!o.status.success(), "expected a failure");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    assert!(err.starts_with("error: "), "{err}");
    err
}

async fn schema_exists(url: &str, schema: &str) -> bool {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_namespace WHERE nspname = $1")
        .bind(schema)
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    n > 0
}

#[tokio::test]
async fn read_only_verbs_never_create_a_schema() {
    let pg = TempPostgres::start().await.unwrap();
    let url = pg.url();
    for args in [
        &["status", "--schema", "typo"][..],
        &["status", "--schema", "typo", "--key", "a:1"],
        &["get", "--schema", "typo", "1"],
        &["insert", "--schema", "typo", "--workflow", "W"],
    ] {
        let o = gendurable_env(&url, args, &[("RUST_BACKTRACE", "1")]);
        let err = one_line_error(&o);
        assert!(
            err.contains(r#"no gendurable schema "typo" in this database"#)
                && err.contains("gendurable migrate --schema typo"),
            "{args:?}: {err}"
        );
    }
    assert!(
        !schema_exists(&url, "typo").await,
        "a read-only verb created it"
    );
    // `migrate` creates it; then the same verbs work.
    stdout(&gendurable(&url, &["migrate", "--schema", "typo"]));
    assert!(schema_exists(&url, "typo").await);
    assert!(stdout(&gendurable(&url, &["status", "--schema", "typo"])).contains("instances"));
    let o = gendurable(&url, &["get", "--schema", "typo", "1"]);
    assert!(one_line_error(&o).contains("no instance with id 1"));
}

#[tokio::test]
async fn errors_are_one_line_without_backtraces() {
    let refused = "postgres://nobody@127.0.0.1:1/none";
    let bt = [("RUST_BACKTRACE", "full"), ("RUST_LIB_BACKTRACE", "1")];
    for args in [
        &["insert", "--workflow", "W", "--state", "{"][..],
        &["insert", "--workflow", "W", "--state", "[1]"],
        &["insert", "--workflow", "", "--state", "{}"],
        &["insert", "--workflow", "W", "--concurrency-key", ":x"],
        &["status", "--schema", "Bad-Name"],
        &["status", "--key", ":x"],
    ] {
        let err = one_line_error(&gendurable_env(refused, args, &bt));
        assert!(
            !err.contains("backtrace") && !err.contains("cannot connect"),
            "{args:?}: {err}"
        );
    }
    // Bad input is reported as such, before any connection is tried.
    let err = one_line_error(&gendurable_env(
        refused,
        &["insert", "--workflow", "W", "--state", "{"],
        &bt,
    ));
    assert!(err.contains("--state is not JSON"), "{err}");

    // A refused connection: its cause, at once (not after the 10 s connect timeout).
    for verb in [&["status"][..], &["get", "1"], &["migrate"], &["echo"]] {
        let start = Instant::now();
        let err = one_line_error(&gendurable_env(refused, verb, &bt));
        assert!(
            err.contains("cannot connect to PostgreSQL at 127.0.0.1:1: connection refused"),
            "{verb:?}: {err}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{verb:?} took {:?}",
            start.elapsed()
        );
    }
    let err = one_line_error(&gendurable_env(
        "postgres://nobody@no-such-host.invalid/none",
        &["status"],
        &bt,
    ));
    assert!(
        err.contains(r#"unknown host "no-such-host.invalid""#),
        "{err}"
    );

    let pg = TempPostgres::start().await.unwrap();
    let url = pg.url();
    let no_db = url.rsplit_once('/').unwrap().0.to_owned() + "/no_such_db";
    let err = one_line_error(&gendurable_env(&no_db, &["status"], &bt));
    assert!(
        err.contains(r#"database "no_such_db" does not exist"#),
        "{err}"
    );
}

#[test]
fn priority_out_of_range_is_a_clear_error() {
    for p in ["-3", "10", "x"] {
        let o = gendurable_env(
            "postgres://nobody@127.0.0.1:1/none",
            &["insert", "--workflow", "W", "--priority", p],
            &[],
        );
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("priority must be between 0 and 9")
                && !err.contains("unexpected argument"),
            "{p}: {err}"
        );
    }
}

#[test]
fn worker_is_listed_and_explained() {
    let o = Command::new(env!("CARGO_BIN_EXE_gendurable"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&o.stdout);
    for verb in [
        "migrate",
        "status",
        "insert",
        "get",
        "why",
        "echo",
        "demo",
        "bench",
        "worker",
        "dashboard",
    ] {
        assert!(
            help.contains(&format!("\n  {verb} ")),
            "{verb} missing: {help}"
        );
    }
    let o = Command::new(env!("CARGO_BIN_EXE_gendurable"))
        .args(["worker", "app:engine"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("pip install gendurable"));
}

#[tokio::test]
async fn status_lists_rows_no_live_node_will_run() {
    let pg = TempPostgres::start().await.unwrap();
    let url = pg.url();
    let s = ["--schema", "waits"];
    stdout(&gendurable(&url, &["migrate", s[0], s[1]]));
    let insert = |workflow: &str, queue: &str| {
        stdout(&gendurable(
            &url,
            &[
                "insert",
                s[0],
                s[1],
                "--workflow",
                workflow,
                "--queue",
                queue,
            ],
        ))
    };
    insert("Known", "default");
    insert("Typo.Flow", "default");
    insert("Known", "nobody_serves_this");

    // No node at all: every queue is unserved.
    let out = stdout(&gendurable(&url, &["status", s[0], s[1]]));
    assert!(
        out.contains(r#"NO: no live node serves queue "default""#),
        "{out}"
    );
    assert!(
        out.contains(r#"NO: no live node serves queue "nobody_serves_this""#),
        "{out}"
    );

    // A live node serving `default` (as a node registers itself).
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO waits.nodes (id, hostname, pid, queues) VALUES ('n1', 'h', 1, '{\"default\": 1}')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let out = stdout(&gendurable(&url, &["status", s[0], s[1]]));
    assert!(
        out.contains(r#"NO: no live node serves queue "nobody_serves_this""#),
        "{out}"
    );
    assert!(!out.contains(r#"serves queue "default""#), "{out}");

    // Nodes record their workflows: a workflow no live node runs is named.
    sqlx::query("UPDATE waits.nodes SET workflows = '[\"Known\"]'")
        .execute(&pool)
        .await
        .unwrap();
    let out = stdout(&gendurable(&url, &["status", s[0], s[1]]));
    assert!(
        out.contains(r#"NO: no live node serving "default" runs workflow "Typo.Flow""#),
        "{out}"
    );
    assert!(out.contains("workflows Known"), "{out}");
    let known = out
        .lines()
        .find(|l| l.contains("Known") && l.contains(" default "))
        .unwrap();
    assert!(known.ends_with("yes"), "{out}");
    pool.close().await;
}

/// A key's backlog beyond its K waits parked; status names the key, how
/// many rows are parked and how many wait where a pick sees them.
#[tokio::test]
async fn status_shows_parked_rows_per_key() {
    let pg = TempPostgres::start().await.unwrap();
    let url = pg.url();
    let s = ["--schema", "parks"];
    stdout(&gendurable(&url, &["migrate", s[0], s[1]]));
    let out = stdout(&gendurable(&url, &["status", s[0], s[1]]));
    assert!(
        out.contains("parked rows") && out.contains("  none"),
        "{out}"
    );
    for _ in 0..4 {
        stdout(&gendurable(
            &url,
            &[
                "insert",
                s[0],
                s[1],
                "--workflow",
                "Job",
                "--concurrency-key",
                "acct:7",
            ],
        ));
    }
    let out = stdout(&gendurable(&url, &["status", s[0], s[1]]));
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("acct:7"))
        .unwrap_or_else(|| panic!("no parked line for acct:7 in {out}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields, ["acct:7", "room", "3", "1"], "{out}");
}

/// `cancel`, `retry`, `delete` by id or by --where, with --dry-run; `signal`.
#[tokio::test]
async fn operators_act_on_instances_from_the_command_line() {
    let pg = TempPostgres::start().await.unwrap();
    let url = pg.url();
    let s = ["--schema", "acts"];
    stdout(&gendurable(&url, &["migrate", s[0], s[1]]));
    let insert = |workflow: &str| {
        stdout(&gendurable(
            &url,
            &["insert", s[0], s[1], "--workflow", workflow],
        ))
        .trim()
        .to_owned()
    };
    let ids: Vec<String> = (0..3).map(|_| insert("Charge")).collect();
    let other = insert("Report");
    let run = |args: &[&str]| {
        let mut all = vec![args[0], s[0], s[1]];
        all.extend_from_slice(&args[1..]);
        stdout(&gendurable(&url, &all)).trim().to_owned()
    };
    assert_eq!(
        run(&["cancel", "--where", "workflow=Charge", "--dry-run"]),
        "3 instances match; nothing changed (dry run)"
    );
    assert_eq!(
        run(&["cancel", "--where", "workflow=Charge"]),
        "3 of 3 matching instances cancelled"
    );
    assert_eq!(
        run(&["retry", &ids[0], "--reason", "fixed the card"]),
        "1 of 1 matching instances made runnable"
    );
    assert_eq!(
        run(&["delete", "--where", "status=cancelled"]),
        "2 of 2 matching instances deleted"
    );
    // Sent to an instance that does not await yet: kept.
    assert_eq!(
        run(&[
            "signal",
            "approved",
            "--id",
            &other,
            "--payload",
            "{\"by\": \"ana\"}"
        ]),
        "kept"
    );
    assert_eq!(run(&["signal", "approved"]), "woke 0");
    assert_eq!(
        run(&[
            "signal",
            "approved",
            "--where",
            "workflow=Report",
            "--dry-run"
        ]),
        "1 instances match; nothing sent (dry run)"
    );
    assert_eq!(
        run(&["signal", "approved", "--where", "workflow=Report"]),
        "1 of 1 matching instances woken or keeping it"
    );
    assert_eq!(run(&["signal", "approved", "--ttl", "60"]), "woke 0; kept");
    // The status as JSON: one available Charge left, and the Report.
    let v: serde_json::Value =
        serde_json::from_str(&run(&["status", "--json", "--key", "api:1"])).unwrap();
    let available: i64 = v["counts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "available")
        .map(|c| c["count"].as_i64().unwrap())
        .sum();
    assert_eq!(available, 2, "{v}");
    assert_eq!(v["key_limits"]["api:1"]["k"], 1, "{v}");
    assert_eq!(run(&["pause", "billing"]), "queue \"billing\" paused");
    assert!(run(&["status"]).contains("paused queues"));
    assert_eq!(
        run(&["pause", "billing"]),
        "queue \"billing\" was already paused"
    );
    assert_eq!(run(&["resume", "billing"]), "queue \"billing\" resumed");
    // Nothing named: a usage error, nothing done.
    let o = gendurable(&url, &["delete", s[0], s[1]]);
    assert!(!o.status.success());
    assert!(
        one_line_error(&o).contains("name the instances"),
        "{}",
        one_line_error(&o)
    );
    let o = gendurable(&url, &["delete", s[0], s[1], "--where", "colour=red"]);
    assert!(one_line_error(&o).contains("unknown field \"colour\""));
}

#[tokio::test]
async fn dashboard_serves_pages_until_stopped() {
    use std::io::{BufRead, BufReader, Read, Write};
    let pg = TempPostgres::start().await.unwrap();
    let url = pg.url();
    assert!(stdout(&gendurable(&url, &["migrate"])).contains("up to date"));
    let mut dash = Command::new(env!("CARGO_BIN_EXE_gendurable"))
        .args(["dashboard", "--listen", "127.0.0.1:0"])
        .env("DATABASE_URL", &url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(dash.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("(read-only)"), "{line}");
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    write!(s, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("<h1>Overview</h1>"));
    unsafe { libc::kill(dash.id() as i32, libc::SIGINT) };
    assert_eq!(dash.wait().unwrap().code(), Some(130));

    // A schema that does not exist is said so, before anything listens.
    let o = gendurable(
        &url,
        &["dashboard", "--schema", "typo", "--listen", "127.0.0.1:0"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no gendurable schema \"typo\""));
}

#[tokio::test]
async fn commit_workload_reports_its_floor_and_leaves_nothing() {
    let pg = TempPostgres::start().await.unwrap();
    let url = pg.url();
    let out = stdout(&gendurable(&url, &["workload", "commit", "--jobs", "20"]));
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["workload"], "commit");
    assert_eq!(v["jobs"], 20);
    let ms = |k: &str| v[k].as_f64().unwrap();
    assert!(0.0 < ms("commit_p50_ms"), "{v}");
    assert!(ms("commit_p50_ms") <= ms("commit_p99_ms"), "{v}");
    assert!(ms("commit_p99_ms") <= ms("commit_max_ms"), "{v}");
    // Its scratch table is dropped as the run ends.
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'workload\\_%'")
            .fetch_one(&pool)
            .await
            .unwrap();
    pool.close().await;
    assert_eq!(left, 0);
}
