//! The claim path's connections are its own: work that takes every other
//! connection of the engine's pool (inserts, the dashboard, maintenance)
//! does not hold back claims and outcomes. It keeps them between calls, and
//! replaces one that broke meanwhile or stopped answering. Maintenance and
//! the node's stop give up calls that go unanswered too.
mod support;

use gendurable::{CronEntry, EngineBuilder, NewInstance, Transition};
use serde_json::json;
use sqlx::ConnectOptions;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_run_while_every_other_connection_is_taken() {
    let schema = support::schema("connections");
    // One queue: a picker's connection and two for the outcome writer's
    // calls are the claim path's; the other three are the engine's pool.
    let node = noop_node(&support::url(), &schema)
        .max_connections(6)
        .start()
        .await
        .unwrap();

    // Every connection of the node's pool taken, and each one that comes
    // free taken again, for as long as the test runs.
    let hog = tokio::spawn({
        let pool = node.pool().clone();
        async move {
            let mut held = Vec::new();
            loop {
                if let Ok(c) = pool.acquire().await {
                    held.push(c);
                }
            }
        }
    });
    let pool = node.pool().clone();
    support::eventually(
        "the node's pool has no connection left",
        Duration::from_secs(30),
        || {
            let pool = pool.clone();
            async move { pool.size() == 3 && pool.num_idle() == 0 }
        },
    )
    .await;

    // Rows inserted by another engine from now on: only the claim path's
    // own connections can claim and record them.
    insert_and_wait(&support::url(), &schema, 0, 200).await;
    hog.abort();
    let _ = hog.await;
    node.shutdown().await.unwrap();
}

/// A node of one queue (4 steps at once) whose steps of `Noop` are done at
/// once.
fn noop_node(url: &str, schema: &str) -> EngineBuilder {
    support::builder(url, schema)
        .queue("default", 4)
        .workflow_fn("Noop", |_step, state, _ctx| async move {
            Ok(Transition::done(state))
        })
}

/// The server process of a connection of the engine's pool (with one
/// connection: the one its calls run on).
async fn backend_pid(engine: &gendurable::Engine) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(engine.pool())
        .await
        .unwrap()
}

/// Insert `n` rows by another engine and wait until they (and the `from`
/// rows before them) have completed.
async fn insert_and_wait(url: &str, schema: &str, from: i64, n: i64) {
    let client = support::builder(url, schema).build().await.unwrap();
    client
        .insert_many(
            (from..from + n)
                .map(|i| NewInstance::new("Noop", json!({ "i": i })))
                .collect(),
        )
        .await
        .unwrap();
    let observer = sqlx::PgPool::connect(url).await.unwrap();
    support::wait_count(&observer, schema, "completed", from + n).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_claim_connections_that_broke_are_replaced() {
    let schema = support::schema("kept");
    // The node's connections, and only they, carry this name.
    let name = format!("gd_{schema}");
    let base = support::url();
    let sep = if base.contains('?') { '&' } else { '?' };
    let node_url = format!("{base}{sep}application_name={name}");
    let node = noop_node(&node_url, &schema).start().await.unwrap();
    insert_and_wait(&base, &schema, 0, 100).await;

    // The server ends every connection of the node: the claim path's kept
    // ones among them (a picker's and the outcome writer's two).
    let admin = sqlx::PgPool::connect(&base).await.unwrap();
    let ended: i64 = sqlx::query_scalar(
        "WITH node AS MATERIALIZED (SELECT pid FROM pg_stat_activity WHERE application_name = $1) \
         SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM node",
    )
    .bind(&name)
    .fetch_one(&admin)
    .await
    .unwrap();
    assert!(ended >= 3, "the node held {ended} connections open");

    // Their next calls fail; the node replaces them and runs the rest.
    insert_and_wait(&base, &schema, 100, 200).await;
    node.shutdown().await.unwrap();
}

/// A TCP proxy to the test's PostgreSQL whose connections can be made to
/// stop answering, as after a failover or a dropped NAT mapping that closed
/// nothing: after [`Stalling::stall`], every connection open then has its
/// bytes read and never forwarded, its sockets left open; connections opened
/// later pass. While [`Stalling::cut_off`], new connections stall too, as a
/// host cut off from the database sees it.
struct Stalling {
    url: String,
    epoch: Arc<AtomicU64>,
    cut: Arc<AtomicBool>,
    accept: tokio::task::JoinHandle<()>,
}

impl Stalling {
    async fn start(url: &str) -> Stalling {
        let opts: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
        assert!(
            opts.get_socket().is_none(),
            "a proxy needs a TCP url, not {url}"
        );
        let target = format!("{}:{}", opts.get_host(), opts.get_port());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let epoch = Arc::new(AtomicU64::new(0));
        let cut = Arc::new(AtomicBool::new(false));
        let accept = tokio::spawn({
            let (epoch, cut, target) = (epoch.clone(), cut.clone(), target.clone());
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    let Ok(server) = TcpStream::connect(&target).await else {
                        continue;
                    };
                    let born = epoch.load(SeqCst);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let alive = Alive {
                        born,
                        epoch: epoch.clone(),
                        cut: cut.clone(),
                    };
                    tokio::spawn(pump(cr, sw, alive.clone()));
                    tokio::spawn(pump(sr, cw, alive));
                }
            }
        });
        Stalling {
            url: opts.host("127.0.0.1").port(port).to_url_lossy().to_string(),
            epoch,
            cut,
            accept,
        }
    }

    /// Every connection open now stops answering.
    fn stall(&self) {
        self.epoch.fetch_add(1, SeqCst);
    }

    /// Every connection open now, and every one opened until `reconnect`,
    /// stops answering.
    fn cut_off(&self) {
        self.cut.store(true, SeqCst);
        self.stall();
    }

    /// Connections opened from now on pass again.
    fn reconnect(&self) {
        self.cut.store(false, SeqCst);
    }
}

/// Whether a proxied connection still forwards: it was opened in the
/// current epoch and the proxy is not cut off.
#[derive(Clone)]
struct Alive {
    born: u64,
    epoch: Arc<AtomicU64>,
    cut: Arc<AtomicBool>,
}

impl Alive {
    fn forwards(&self) -> bool {
        self.epoch.load(SeqCst) == self.born && !self.cut.load(SeqCst)
    }
}

impl Drop for Stalling {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// A fresh schema, the test database's url and a stalling proxy to it.
async fn stalling(prefix: &str) -> (String, String, Stalling) {
    let base = support::url();
    let proxy = Stalling::start(&base).await;
    (support::schema(prefix), base, proxy)
}

/// Forward bytes while the connection forwards; then hold on to what comes,
/// forever.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, alive: Alive) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if !alive.forwards() {
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_calls_on_connections_that_stopped_answering_are_given_up() {
    let (schema, base, proxy) = stalling("stalled").await;
    let node = noop_node(&proxy.url, &schema).start().await.unwrap();
    insert_and_wait(&base, &schema, 0, 100).await;

    // The claim path's kept connections, among every other of the node's,
    // stop answering without being closed: its next calls wait for an
    // answer that never comes, until the node gives them up (after a lease,
    // 2 s here) and calls again on new connections.
    proxy.stall();
    insert_and_wait(&base, &schema, 100, 200).await;
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_on_connections_that_stopped_answering_goes_on() {
    let (schema, base, proxy) = stalling("stalled_upkeep").await;
    let node = noop_node(&proxy.url, &schema).start().await.unwrap();
    insert_and_wait(&base, &schema, 0, 20).await;

    // Every connection of the node stops answering, its maintenance's among
    // them. Rows scheduled a second ahead run only once the stager (a
    // maintenance service) made them runnable: it gives up the call that
    // went unanswered (after a lease, 2 s here) and stages them on a new
    // connection.
    proxy.stall();
    let client = support::builder(&base, &schema).build().await.unwrap();
    client
        .insert_many(
            (20..40)
                .map(|i| {
                    NewInstance::new("Noop", json!({ "i": i })).schedule_in(Duration::from_secs(1))
                })
                .collect(),
        )
        .await
        .unwrap();
    let observer = sqlx::PgPool::connect(&base).await.unwrap();
    support::wait_count(&observer, &schema, "completed", 40).await;
    // The stop's own calls give up stalled connections too.
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_connection_that_stopped_answering_is_replaced() {
    let (schema, base, proxy) = stalling("stalled_listen").await;
    // Polls an hour apart: only a notification wakes the node's picker.
    let node = noop_node(&proxy.url, &schema)
        .poll_interval(Duration::from_secs(3600))
        .start()
        .await
        .unwrap();
    insert_and_wait(&base, &schema, 0, 20).await;

    // The node's LISTEN connection stops answering, with every other: the
    // next rows' notifications are lost with it. Its probe goes unanswered
    // for a lease (2 s here), the node listens again on a new connection
    // and wakes its picker.
    proxy.stall();
    insert_and_wait(&base, &schema, 20, 20).await;
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_workflows_go_on_after_their_connection_stopped_answering() {
    let (schema, base, proxy) = stalling("stalled_cron").await;
    let node = noop_node(&proxy.url, &schema)
        .cron(CronEntry::new("* * * * * *", NewInstance::new("Noop", json!({}))).name("s"))
        .start()
        .await
        .unwrap();
    let observer = sqlx::PgPool::connect(&base).await.unwrap();
    let ticks = || async {
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM \"{schema}\".instances WHERE workflow = 'Noop'"
        ))
        .fetch_one(&observer)
        .await
        .unwrap();
        n
    };
    support::eventually("a first tick", Duration::from_secs(60), || async {
        ticks().await >= 1
    })
    .await;

    // The connections open now stop answering: a round of the schedule on
    // one of them is given up after a lease (2 s here) and the next ones
    // insert their ticks on new connections.
    proxy.stall();
    let before = ticks().await;
    support::eventually("three ticks more", Duration::from_secs(60), || async {
        ticks().await >= before + 3
    })
    .await;
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_calls_on_connections_that_stopped_answering_fail_in_time() {
    let (schema, _, proxy) = stalling("stalled_calls").await;
    // One connection, so that the next call takes the one that stalls.
    let client = support::builder(&proxy.url, &schema)
        .max_connections(1)
        .call_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let id = client
        .insert(NewInstance::new("Noop", json!({})))
        .await
        .unwrap();
    let pool = client.pool().clone();
    support::eventually(
        "the connection back in the pool",
        Duration::from_secs(30),
        || {
            let pool = pool.clone();
            async move { pool.num_idle() == 1 }
        },
    )
    .await;

    // The client's pooled connection stops answering: the next call on it
    // fails after the call timeout, as a lost connection, and the one after
    // it runs on a new connection.
    proxy.stall();
    let calls = async {
        let lost = client.get(id).await.unwrap_err();
        (lost, client.get(id).await)
    };
    let (lost, next) = tokio::time::timeout(Duration::from_secs(60), calls)
        .await
        .expect("a call on a connection that stopped answering was never given up");
    assert!(lost.is_transient(), "{lost}");
    assert!(lost.to_string().contains("did not answer"), "{lost}");
    assert_eq!(next.unwrap().id, id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_given_up_that_committed_later_runs_the_rows_it_claimed_here() {
    let schema = support::schema("late_insert");
    let base = support::url();
    let node = noop_node(&base, &schema)
        .call_timeout(Duration::from_secs(1))
        .start()
        .await
        .unwrap();
    // Rows inserted by another engine: once they are done, the node is idle
    // and an insert of its own claims what it inserts, to start it here.
    insert_and_wait(&base, &schema, 0, 20).await;

    // A transaction holds, uncommitted, a row with the id the node's insert
    // draws next: the insert waits for it past its call timeout and is given
    // up, its connection closed. Once that transaction rolls back, the
    // insert's statement goes on and commits, its row claimed by this node,
    // which never hears of it. The node must find that claim and run it.
    let observer = sqlx::PgPool::connect(&base).await.unwrap();
    let mut blocker = observer.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO \"{schema}\".instances (id, workflow, step, state, status, queue)
         VALUES (nextval('\"{schema}\".instances_id_seq') + 1, 'Noop', 'start', '{{}}',
                 'scheduled', 'elsewhere')"
    ))
    .execute(&mut *blocker)
    .await
    .unwrap();
    let lost = node
        .insert(NewInstance::new("Noop", json!({ "i": 20 })))
        .await
        .unwrap_err();
    assert!(lost.is_transient(), "{lost}");
    blocker.rollback().await.unwrap();
    support::wait_count(&observer, &schema, "completed", 21).await;
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_server_refused_keeps_its_connection() {
    let schema = support::schema("refused");
    let url = support::url();
    // One connection, so that every call runs on the same one unless a
    // failure closes it.
    let client = support::builder(&url, &schema)
        .max_connections(1)
        .build()
        .await
        .unwrap();
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query(&format!(
        "ALTER TABLE \"{schema}\".instances ADD CONSTRAINT refused CHECK (NOT state ? 'refused')"
    ))
    .execute(&admin)
    .await
    .unwrap();
    let backend = || backend_pid(&client);
    let before = backend().await;

    // Refused alone, and inside the transaction of a unique insert (the row
    // before it rolled back with it).
    let refused = NewInstance::new("Noop", json!({ "refused": true }));
    let alone = client.insert(refused.clone()).await.unwrap_err();
    let unique = gendurable::Unique::new();
    let batch = client
        .insert_many(vec![
            NewInstance::new("Noop", json!({ "i": 1 })).unique(unique.clone()),
            refused.unique(unique),
        ])
        .await
        .unwrap_err();
    for e in [&alone, &batch] {
        assert!(e.to_string().contains("refused"), "{e}");
        assert!(!e.is_transient(), "{e}");
    }
    assert_eq!(
        backend().await,
        before,
        "a refused call closed its connection"
    );

    // The connection goes on: the next insert runs on it, and the refused
    // batch left nothing behind.
    client
        .insert(NewInstance::new("Noop", json!({ "i": 2 })))
        .await
        .unwrap();
    assert_eq!(backend().await, before);
    let states: Vec<serde_json::Value> = sqlx::query_scalar(&format!(
        "SELECT state FROM \"{schema}\".instances ORDER BY id"
    ))
    .fetch_all(&admin)
    .await
    .unwrap();
    assert_eq!(states, vec![json!({ "i": 2 })]);
}

/// A server that takes no writes (a standby, or a primary set read-only
/// before its address moves to another; here a session that is read-only)
/// is left: the call fails as transient and its connection is closed, so
/// that the next one may reach the server that takes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_takes_no_writes_is_left_for_a_new_connection() {
    let schema = support::schema("read_only");
    let url = support::url();
    support::builder(&url, &schema).build().await.unwrap();
    let client = support::builder(
        &support::with_setting(&url, "default_transaction_read_only", "on"),
        &schema,
    )
    .migrate(false)
    .max_connections(1)
    .build()
    .await
    .unwrap();
    let backend = || backend_pid(&client);
    let before = backend().await;
    let e = client
        .insert(NewInstance::new("Noop", json!({})))
        .await
        .unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert_ne!(
        backend().await,
        before,
        "the connection to a server that takes no writes was kept"
    );
}

/// The engine's transactions are read committed, the isolation its
/// statements are written for, whatever the session's default says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_transactions_are_read_committed_whatever_the_default() {
    let url = support::url();
    let schema = support::schema("isolation");
    let engine = support::builder(
        &support::with_setting(&url, "default_transaction_isolation", "serializable"),
        &schema,
    )
    .build()
    .await
    .unwrap();
    let isolation: String = sqlx::query_scalar("SHOW transaction_isolation")
        .fetch_one(engine.pool())
        .await
        .unwrap();
    assert_eq!(isolation, "read committed");
}

/// The engine's commits survive a crash of the server: a connection whose
/// session says `synchronous_commit = off` (here through the URL's options;
/// a server, database or role setting alike) is raised to `on`, since a
/// claim the server acknowledged and then lost would leave its step running
/// with its key free for another node. A stronger or local setting stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_commits_are_durable_whatever_the_session_says() {
    let url = support::url();
    for (asked, kept) in [
        ("off", "on"),
        ("local", "local"),
        ("remote_apply", "remote_apply"),
    ] {
        let schema = support::schema("durable");
        let engine = support::builder(
            &support::with_setting(&url, "synchronous_commit", asked),
            &schema,
        )
        .build()
        .await
        .unwrap();
        let mut conns = Vec::new();
        for _ in 0..3 {
            conns.push(engine.pool().acquire().await.unwrap());
        }
        for c in &mut conns {
            let setting: String = sqlx::query_scalar("SHOW synchronous_commit")
                .fetch_one(&mut **c)
                .await
                .unwrap();
            assert_eq!(setting, kept, "synchronous_commit = {asked} in the session");
        }
    }
}

/// A server that gives up waiting for a lock (`lock_timeout`, here through
/// the URL's options; a server or role setting alike) refuses nothing about
/// the data: the outcome of a step whose row an application's transaction
/// held locked is written once the lock goes, the step having run once and
/// recorded no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_that_waited_past_lock_timeout_is_written_once_the_lock_goes() {
    let schema = support::schema("lock_timeout");
    let url = support::url();
    let (runs, go) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(tokio::sync::Notify::new()),
    );
    let seen = Running::default();
    let node = support::builder(
        &support::with_setting(&url, "lock_timeout", "300ms"),
        &schema,
    )
    .queue("default", 2)
    .workflow_fn("Wait", {
        let (runs, go, seen) = (runs.clone(), go.clone(), seen.clone());
        move |_step, state, _ctx| {
            let (runs, go, seen) = (runs.clone(), go.clone(), seen.clone());
            async move {
                // The first run waits for the test; any other is a
                // run again, which the test counts.
                if runs.fetch_add(1, SeqCst) == 0 {
                    let notified = go.notified();
                    drop(seen.enter("node"));
                    notified.await;
                }
                Ok(Transition::done(state))
            }
        }
    })
    .start()
    .await
    .unwrap();
    let id = node
        .insert(NewInstance::new("Wait", json!({})))
        .await
        .unwrap();
    seen.wait_for("node").await;

    // The application holds the row while the step ends.
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    let mut app = admin.begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT 1 FROM \"{schema}\".instances WHERE id = $1 FOR UPDATE"
    ))
    .bind(id)
    .execute(&mut *app)
    .await
    .unwrap();
    go.notify_one();
    // Three calls waiting on the row's lock, one after the other: the
    // outcome with a claim, then alone (refused, it would have been written
    // as an error next), then again; the first two gave up at the timeout.
    let waits = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    support::eventually(
        "three calls waiting on the row's lock",
        Duration::from_secs(60),
        || {
            let (admin, waits, schema) = (admin.clone(), waits.clone(), schema.clone());
            async move {
                // This schema's calls only: other tests share the server.
                let started: Vec<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
                    "SELECT query_start FROM pg_stat_activity
                     WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0",
                )
                .bind(format!("\"{schema}\""))
                .fetch_all(&admin)
                .await
                .unwrap();
                let mut w = waits.lock().unwrap();
                w.extend(started);
                w.len() >= 3
            }
        },
    )
    .await;
    app.commit().await.unwrap();

    let done = support::wait_final(&node, id).await;
    assert_eq!(done.status, gendurable::Status::Completed, "{done:?}");
    assert_eq!(runs.load(SeqCst), 1, "the step ran again: {done:?}");
    assert!(done.errors.is_empty(), "{done:?}");
    node.shutdown().await.unwrap();
}

/// A node cut off from the database (its host's network, not the server,
/// failed) is presumed dead once its lease runs out, and another node runs
/// its rows. It stops its own steps before that: a heartbeat interval before
/// its lease would run out by its own clock, as it stops starting work.
/// Without that, its step and the rescued one would both be running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_stops_its_steps_before_they_run_elsewhere() {
    let (schema, base, proxy) = stalling("cut_off").await;
    let seen = Running::default();
    // The step on the node cut off holds on until it is stopped; the
    // rescued one is done at once.
    let holder = |node: &'static str, hold: bool| {
        let seen = seen.clone();
        move |_step: String, state: serde_json::Value, _ctx: gendurable::StepContext| {
            let seen = seen.clone();
            async move {
                let _running = seen.enter(node);
                if hold {
                    std::future::pending::<()>().await;
                }
                Ok(Transition::done(state))
            }
        }
    };
    // The node stops its steps a heartbeat interval before the others may
    // presume it dead: 700 ms here, for a loaded machine.
    let node = |url: &str, id: &str| {
        support::builder(url, &schema)
            .node_id(id)
            .heartbeat_interval(Duration::from_millis(700))
            .queue("default", 4)
    };
    let a = node(&proxy.url, "a")
        .workflow_fn("Hold", holder("a", true))
        .start()
        .await
        .unwrap();
    let id = a
        .insert(NewInstance::new("Hold", json!({})).concurrency_key("acct:1"))
        .await
        .unwrap();
    seen.wait_for("a").await;
    let b = node(&base, "b")
        .workflow_fn("Hold", holder("b", false))
        .start()
        .await
        .unwrap();

    proxy.cut_off();
    seen.wait_for("b").await;
    assert_eq!(seen.most(), 1, "the step ran on both nodes at once");
    let observer = sqlx::PgPool::connect(&base).await.unwrap();
    support::wait_count(&observer, &schema, "completed", 1).await;

    // Rescued from node a, whose own record of the stop, written once it
    // reaches the database again, is fenced: its claim is no longer its own.
    proxy.reconnect();
    a.shutdown().await.unwrap();
    let a_stats = a.stats().snapshot();
    assert_eq!((a_stats.stopped, a_stats.fenced), (1, 1), "{a_stats:?}");
    let done = b.get(id).await.unwrap();
    let kinds: Vec<_> = done
        .errors
        .iter()
        .map(|e| (&e["kind"], &e["node"]))
        .collect();
    assert_eq!(kinds, vec![(&json!("lost"), &json!("a"))], "{done:?}");
    b.shutdown().await.unwrap();
}

/// Which nodes run a step now, which ever did, and the most that ran at
/// once.
#[derive(Clone, Default)]
struct Running(Arc<std::sync::Mutex<Seen>>, Arc<tokio::sync::Notify>);

#[derive(Default)]
struct Seen {
    now: Vec<&'static str>,
    ever: Vec<&'static str>,
    most: usize,
}

/// A step's run on a node, until dropped.
struct Run(Running, &'static str);

impl Drop for Run {
    fn drop(&mut self) {
        let mut g = self.0 .0.lock().unwrap();
        if let Some(at) = g.now.iter().position(|n| *n == self.1) {
            g.now.remove(at);
        }
    }
}

impl Running {
    fn enter(&self, node: &'static str) -> Run {
        {
            let mut g = self.0.lock().unwrap();
            g.now.push(node);
            g.ever.push(node);
            g.most = g.most.max(g.now.len());
        }
        self.1.notify_waiters();
        Run(self.clone(), node)
    }

    fn most(&self) -> usize {
        self.0.lock().unwrap().most
    }

    /// Wait until a step started on `node` (at most a minute).
    async fn wait_for(&self, node: &'static str) {
        let started = async {
            loop {
                let notified = self.1.notified();
                if self.0.lock().unwrap().ever.contains(&node) {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), started)
            .await
            .unwrap_or_else(|_| panic!("no step started on node {node}"));
    }
}
