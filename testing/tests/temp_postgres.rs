//! Tests for `gendurable_testing` against real PostgreSQL servers.
//!
//! Some tests need a separate process (to kill it, or to give it its own
//! environment). They re-run this test binary with `GD_EMBEDDED_CHILD` set,
//! which makes [`child_entry`] act out the requested role; in a normal run
//! that test returns at once.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use gendurable_testing::{
    database_url_or_temp, find_bin_dir, Error, StopMode, TempPostgres, TempPostgresOptions,
};
use sqlx::{Connection, PgConnection, Row};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const CHILD_ENV: &str = "GD_EMBEDDED_CHILD";
const CHILD_TEST: &str = "child_entry";

async fn connect(url: &str) -> PgConnection {
    PgConnection::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
}

async fn select_one(url: &str) -> i32 {
    let mut conn = connect(url).await;
    let value: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    value
}

async fn show(conn: &mut PgConnection, setting: &str) -> String {
    sqlx::query(&format!("SHOW {setting}"))
        .fetch_one(conn)
        .await
        .unwrap()
        .get(0)
}

/// Whether nothing listens on the loopback port any more.
fn refuses_connections(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionRefused,
    }
}

/// Whether any live process mentions `needle` on its command line. The
/// postmaster carries its data directory there and the watchdog the cluster
/// directory, so this finds leftovers of either.
fn process_mentions(needle: &Path) -> bool {
    let needle = needle.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.filter_map(Result::ok).any(|entry| {
        std::fs::read(entry.path().join("cmdline"))
            .map(|cmdline| String::from_utf8_lossy(&cmdline).contains(&needle))
            .unwrap_or(false)
    })
}

/// Polls `done` every 100 ms until it holds or `limit` passes.
async fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn cluster_root(pg: &TempPostgres) -> PathBuf {
    pg.data_dir().parent().unwrap().to_path_buf()
}

/// This test binary, re-run as a child acting out `role`.
fn child_command(role: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    cmd
}

/// The child's report, if `line` holds it. libtest may print its own
/// progress text in front of it on the same line.
fn report(line: &str) -> Option<String> {
    line.find("GD_CHILD ").map(|at| line[at..].to_owned())
}

/// Finds the `key=value` field on the child's report line.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|part| part.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

/// Entry point for child processes; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    match role.as_str() {
        // Start a cluster, report it, and wait to be killed.
        "hold" => {
            let pg = runtime.block_on(TempPostgres::start()).unwrap();
            println!(
                "GD_CHILD port={} root={}",
                pg.port(),
                cluster_root(&pg).display()
            );
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        // Start a cluster that is never dropped, report it, and leave
        // through std::process::exit once told to.
        "exit" => {
            static PARKED: std::sync::OnceLock<TempPostgres> = std::sync::OnceLock::new();
            let pg = PARKED.get_or_init(|| runtime.block_on(TempPostgres::start()).unwrap());
            println!(
                "GD_CHILD port={} root={}",
                pg.port(),
                cluster_root(pg).display()
            );
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).unwrap();
            std::process::exit(0);
        }
        // Report what database_url_or_temp picks in this environment.
        "url_or_temp" => runtime.block_on(async {
            let (url, guard) = database_url_or_temp().await.unwrap();
            let mut conn = connect(&url).await;
            let port: i32 = sqlx::query_scalar("SELECT inet_server_port()")
                .fetch_one(&mut conn)
                .await
                .unwrap();
            conn.close().await.unwrap();
            println!("GD_CHILD url={url} guard={} port={port}", guard.is_some());
        }),
        other => panic!("unknown child role {other:?}"),
    }
}

#[test]
fn finds_server_binaries() {
    let dir = find_bin_dir().unwrap();
    for program in ["pg_ctl", "initdb", "postgres"] {
        assert!(
            dir.join(program).is_file(),
            "{program} in {}",
            dir.display()
        );
    }
}

#[tokio::test]
async fn starts_and_answers_queries() {
    let pg = TempPostgres::start().await.unwrap();
    assert_eq!(
        pg.url(),
        format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port())
    );
    assert!(pg.data_dir().join("PG_VERSION").is_file());
    assert!(pg.is_running());
    assert!(pg.postmaster_pid().is_some());
    assert_eq!(select_one(&pg.url()).await, 1);

    // Defaults are tuned for tests.
    let mut conn = connect(&pg.url()).await;
    assert_eq!(show(&mut conn, "fsync").await, "off");
    // Kept on so that acknowledged commits survive crash tests.
    assert_eq!(show(&mut conn, "synchronous_commit").await, "on");
    assert_eq!(show(&mut conn, "full_page_writes").await, "off");
    assert_eq!(show(&mut conn, "max_connections").await, "300");
    assert_eq!(show(&mut conn, "listen_addresses").await, "127.0.0.1");
}

#[tokio::test]
async fn two_clusters_run_side_by_side() {
    let (a, b) = tokio::join!(TempPostgres::start(), TempPostgres::start());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_ne!(a.port(), b.port());
    assert_ne!(a.data_dir(), b.data_dir());
    assert_eq!(select_one(&a.url()).await, 1);
    assert_eq!(select_one(&b.url()).await, 1);
}

#[tokio::test]
async fn options_are_applied() {
    let port = {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        listener.local_addr().unwrap().port()
    };
    let pg = TempPostgres::start_with(TempPostgresOptions {
        fsync: true,
        port: Some(port),
        extra_settings: vec![
            ("work_mem".into(), "8MB".into()),
            // Quotes and backslashes must survive the trip through the config.
            ("cluster_name".into(), r"it's a \test".into()),
            // Later settings override the built-in ones.
            ("max_connections".into(), "50".into()),
        ],
    })
    .await
    .unwrap();
    assert_eq!(pg.port(), port);

    let mut conn = connect(&pg.url()).await;
    assert_eq!(show(&mut conn, "fsync").await, "on");
    assert_eq!(show(&mut conn, "full_page_writes").await, "on");
    assert_eq!(show(&mut conn, "port").await, port.to_string());
    assert_eq!(show(&mut conn, "work_mem").await, "8MB");
    assert_eq!(show(&mut conn, "cluster_name").await, r"it's a \test");
    assert_eq!(show(&mut conn, "max_connections").await, "50");
}

#[tokio::test]
async fn invalid_setting_names_are_rejected() {
    let err = TempPostgres::start_with(TempPostgresOptions {
        extra_settings: vec![("work_mem = 1MB\nfsync".into(), "on".into())],
        ..Default::default()
    })
    .await
    .unwrap_err();
    assert!(matches!(err, Error::InvalidName(_)), "{err}");
}

#[tokio::test]
async fn restart_keeps_data() {
    let mut pg = TempPostgres::start().await.unwrap();
    let port = pg.port();
    let mut conn = connect(&pg.url()).await;
    sqlx::query("CREATE TABLE kept (id int PRIMARY KEY, note text)")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO kept VALUES (1, 'before restart')")
        .execute(&mut conn)
        .await
        .unwrap();
    drop(conn);

    let old_pid = pg.postmaster_pid().unwrap();
    pg.restart().await.unwrap();
    assert_eq!(pg.port(), port);
    assert_ne!(pg.postmaster_pid().unwrap(), old_pid);

    let mut conn = connect(&pg.url()).await;
    let note: String = sqlx::query_scalar("SELECT note FROM kept WHERE id = 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(note, "before restart");
    sqlx::query("INSERT INTO kept VALUES (2, 'before crash')")
        .execute(&mut conn)
        .await
        .unwrap();
    drop(conn);

    // An immediate stop skips the checkpoint; recovery must replay the WAL.
    pg.restart_with(StopMode::Immediate).await.unwrap();
    assert_eq!(pg.port(), port);
    let mut conn = connect(&pg.url()).await;
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM kept")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(count, 2);
}

#[tokio::test]
async fn stop_then_start_again() {
    let mut pg = TempPostgres::start().await.unwrap();
    let port = pg.port();
    let mut conn = connect(&pg.url()).await;
    sqlx::query("CREATE TABLE t (x int)")
        .execute(&mut conn)
        .await
        .unwrap();

    pg.stop().await.unwrap();
    assert!(!pg.is_running());
    assert_eq!(pg.postmaster_pid(), None);
    assert!(refuses_connections(port));
    assert!(pg.data_dir().join("PG_VERSION").is_file(), "data kept");
    // The old connection notices that the server went away.
    assert!(sqlx::query("SELECT 1").execute(&mut conn).await.is_err());
    // Stopping twice is harmless.
    pg.stop().await.unwrap();

    pg.start_again().await.unwrap();
    assert_eq!(pg.port(), port);
    assert!(pg.is_running());
    // Starting a running server is harmless too.
    pg.start_again().await.unwrap();
    let mut conn = connect(&pg.url()).await;
    sqlx::query("SELECT * FROM t")
        .execute(&mut conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn start_again_after_postmaster_is_killed() {
    let mut pg = TempPostgres::start().await.unwrap();
    let mut conn = connect(&pg.url()).await;
    sqlx::query("CREATE TABLE survives (x int)")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO survives VALUES (42)")
        .execute(&mut conn)
        .await
        .unwrap();
    drop(conn);

    let pid = pg.postmaster_pid().unwrap();
    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
    assert!(
        eventually(Duration::from_secs(10), || !pg.is_running()).await,
        "postmaster {pid} still alive"
    );

    pg.start_again().await.unwrap();
    let mut conn = connect(&pg.url()).await;
    let x: i32 = sqlx::query_scalar("SELECT x FROM survives")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(x, 42);
}

#[tokio::test]
async fn drop_stops_server_and_removes_directory() {
    let pg = TempPostgres::start().await.unwrap();
    let root = cluster_root(&pg);
    let port = pg.port();
    assert_eq!(select_one(&pg.url()).await, 1);
    assert!(process_mentions(&root), "server and watchdog are running");

    drop(pg);
    assert!(!root.exists(), "{} still exists", root.display());
    assert!(refuses_connections(port));
    assert!(
        !process_mentions(&root),
        "no server or watchdog process may outlive the drop"
    );
}

#[tokio::test]
async fn dropping_a_stopped_cluster_removes_it() {
    let mut pg = TempPostgres::start().await.unwrap();
    let root = cluster_root(&pg);
    pg.stop().await.unwrap();
    drop(pg);
    assert!(!root.exists());
    assert!(!process_mentions(&root));
}

#[tokio::test]
async fn create_database_returns_a_working_url() {
    let pg = TempPostgres::start().await.unwrap();
    let url = pg.create_database("gd_orders").await.unwrap();
    assert_eq!(
        url,
        format!("postgres://postgres@127.0.0.1:{}/gd_orders", pg.port())
    );
    let mut conn = connect(&url).await;
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(name, "gd_orders");

    // Case is preserved.
    let url = pg.create_database("MixedCase").await.unwrap();
    assert!(url.ends_with("/MixedCase"));
    connect(&url).await;

    let err = pg.create_database("gd_orders").await.unwrap_err();
    assert!(matches!(err, Error::Database(_)), "{err}");

    for bad in [
        "",
        "1st",
        "bad-name",
        "x\"; DROP DATABASE postgres; --",
        "a b",
    ] {
        let err = pg.create_database(bad).await.unwrap_err();
        assert!(matches!(err, Error::InvalidName(_)), "{bad}: {err}");
    }
}

#[tokio::test]
async fn database_url_or_temp_prefers_database_url() {
    // Each case runs in a child process so that no environment variable of
    // this (multi-threaded) test process is modified.
    async fn run_child(database_url: Option<&str>) -> String {
        let mut cmd = child_command("url_or_temp");
        match database_url {
            Some(url) => cmd.env("DATABASE_URL", url),
            None => cmd.env_remove("DATABASE_URL"),
        };
        let output = tokio::time::timeout(Duration::from_secs(120), cmd.output())
            .await
            .expect("child timed out")
            .unwrap();
        assert!(output.status.success(), "child failed: {:?}", output.status);
        let stdout = String::from_utf8(output.stdout).unwrap();
        stdout
            .lines()
            .find_map(report)
            .unwrap_or_else(|| panic!("no report in child output:\n{stdout}"))
    }

    let pg = TempPostgres::start().await.unwrap();

    let line = run_child(Some(&pg.url())).await;
    assert_eq!(field(&line, "url"), pg.url());
    assert_eq!(field(&line, "guard"), "false");
    assert_eq!(field(&line, "port"), pg.port().to_string());

    for unset in [None, Some("")] {
        let line = run_child(unset).await;
        assert_eq!(field(&line, "guard"), "true");
        assert_ne!(field(&line, "port"), pg.port().to_string());
        assert!(field(&line, "url").starts_with("postgres://postgres@127.0.0.1:"));
    }
}

/// Starts a child in `role` and waits for its report line.
async fn spawn_reporting_child(role: &str) -> (tokio::process::Child, String) {
    let mut child = child_command(role).stdin(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(report) = report(&line) {
                return report;
            }
        }
        panic!("child exited without reporting");
    })
    .await
    .expect("child did not report in time");
    (child, line)
}

/// Checks the child's cluster is up, returning its root and port.
async fn child_cluster(line: &str) -> (PathBuf, u16) {
    let port: u16 = field(line, "port").parse().unwrap();
    let root = PathBuf::from(field(line, "root"));
    assert!(root.is_dir());
    assert_eq!(
        select_one(&format!("postgres://postgres@127.0.0.1:{port}/postgres")).await,
        1
    );
    (root, port)
}

/// Waits (up to 20 s) for the watchdog to stop the server and delete the
/// cluster directory.
async fn assert_cleaned_up_by_watchdog(root: &Path, port: u16) {
    let cleaned = eventually(Duration::from_secs(20), || {
        !root.exists() && refuses_connections(port)
    })
    .await;
    assert!(
        cleaned,
        "after 20 s: dir exists={}, port {port} refuses={}",
        root.exists(),
        refuses_connections(port)
    );
    assert!(
        eventually(Duration::from_secs(5), || !process_mentions(root)).await,
        "watchdog or server still running"
    );
}

#[tokio::test]
async fn watchdog_cleans_up_after_sigkill() {
    let (mut child, line) = spawn_reporting_child("hold").await;
    let (root, port) = child_cluster(&line).await;
    // SIGKILL: no destructor runs in the child.
    child.kill().await.unwrap();
    assert_cleaned_up_by_watchdog(&root, port).await;
}

#[tokio::test]
async fn watchdog_cleans_up_after_process_exit() {
    let (mut child, line) = spawn_reporting_child("exit").await;
    let (root, port) = child_cluster(&line).await;
    // Let the child call std::process::exit with its cluster in a static.
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"exit\n").await.unwrap();
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("child did not exit")
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert_cleaned_up_by_watchdog(&root, port).await;
}

#[tokio::test]
async fn unreachable_temp_dir_falls_back_to_tmp_when_root() {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return; // Only root hands the directory to another user.
    }
    // A root-only directory (mode 0700) that the postgres user cannot enter.
    let private = tempfile::tempdir().unwrap();
    let output = child_command("url_or_temp")
        .env_remove("DATABASE_URL")
        .env("TMPDIR", private.path())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "child failed:\n{stdout}");
    let line = stdout.lines().find_map(report).expect("no report");
    assert_eq!(field(&line, "guard"), "true");
    assert_eq!(std::fs::read_dir(private.path()).unwrap().count(), 0);
}
