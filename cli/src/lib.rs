//! The `gendurable` command line: migrate, inspect, insert, demo and
//! benchmark the engine.
//!
//! A library so that every `gendurable` runs the same verbs: the binary of
//! this crate (`cargo install`) is a thin `main` over [`run`], and the Python
//! package's `gendurable` console script calls [`run`] through its extension
//! for every verb but `worker` (which runs Python workflows, so Python runs it).

mod bench;
mod cluster;
pub mod connect;
mod demo;
mod echo;
mod soak;
mod status;
mod w5;
mod workload;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use gendurable::{Engine, NewInstance};
use gendurable_testing::TempPostgres;
use std::ffi::OsString;
use std::future::Future;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "gendurable",
    version,
    about = "A durable step engine on PostgreSQL",
    after_help = "Read-only verbs (status, get) never create or change anything; only `migrate` \
                  (and the nodes of `echo` and `worker`) create or upgrade the schema."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct Db {
    /// PostgreSQL URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    url: Option<String>,
    /// The schema holding the engine's tables.
    #[arg(long, default_value = "gendurable")]
    schema: String,
    /// Seconds to wait for a connection (a refused one fails at once).
    #[arg(long, default_value = "10", value_parser = parse_seconds)]
    connect_timeout: Duration,
}

#[derive(Subcommand)]
enum Command {
    /// Create or upgrade the schema (idempotent; safe from many nodes at once).
    Migrate {
        #[command(flatten)]
        db: Db,
    },
    /// The cluster now: instances, live nodes, rows no live node will run, gates, keys (read-only).
    ///
    /// Instances per queue and status; live nodes; waiting rows per workflow
    /// and queue, flagging those no live node will run (their queue unserved,
    /// or their workflow run by no node, when nodes record their workflows);
    /// gates with in-flight/limit/shards; executing K = 1 keys; rate-limit
    /// state; with --key, the effective K of a key. Never creates or changes
    /// anything: a schema that does not exist is an error.
    Status {
        #[command(flatten)]
        db: Db,
        /// Also show the effective K of these keys under the --gate settings.
        #[arg(long = "key")]
        keys: Vec<String>,
        /// A gate as configured on the nodes: NAME=LIMIT or NAME=LIMIT/SHARDS.
        #[arg(long = "gate", value_parser = status::parse_gate)]
        gates: Vec<(String, gendurable::GateConfig)>,
        /// Print the status as one JSON object.
        #[arg(long)]
        json: bool,
        /// Print it again every this many seconds, until Ctrl-C.
        #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
        watch: Option<Duration>,
    },
    /// Run a sample workload (a throwaway Postgres unless DATABASE_URL is set).
    Demo(demo::Args),
    /// Measure inserts/s and steps/s on a throwaway Postgres.
    Bench(bench::Args),
    /// One workload of the cross-system benchmark (`benchmarks/`); prints a JSON line.
    Workload(workload::Args),
    /// Insert one instance and print its id (the schema must exist: see `migrate`).
    Insert {
        #[command(flatten)]
        db: Db,
        /// The workflow name.
        #[arg(long)]
        workflow: String,
        /// The state, a JSON object.
        #[arg(long, default_value = "{}")]
        state: String,
        #[arg(long, default_value = gendurable::DEFAULT_STEP)]
        step: String,
        #[arg(long, default_value = gendurable::DEFAULT_QUEUE)]
        queue: String,
        /// 0 (first) to 9.
        #[arg(long, default_value = "0", allow_negative_numbers = true, value_parser = parse_priority)]
        priority: i16,
        #[arg(long)]
        concurrency_key: Option<String>,
    },
    /// Print an instance as JSON (read-only).
    Get {
        #[command(flatten)]
        db: Db,
        #[arg(allow_negative_numbers = true)]
        id: i64,
    },
    /// Say why an instance is not running now, or what it is doing
    /// (read-only): a held key, a full gate, a rate limit, a paused queue, no
    /// node for its queue or workflow, rows ahead of it, its node's silence.
    Why {
        #[command(flatten)]
        db: Db,
        #[arg(allow_negative_numbers = true)]
        id: i64,
    },
    /// Cancel instances: by id, or every one the --where conditions name.
    ///
    /// One not started is cancelled now; an executing one is stopped by the
    /// node running it and recorded as cancelled. With --dry-run, only says
    /// how many the conditions name.
    Cancel(Act),
    /// Run instances again now: scheduled ones (keeping their attempts),
    /// discarded or cancelled ones (with fresh attempts).
    Retry(Act),
    /// Delete instances that are not executing (cancel those first), with
    /// the signals kept for them.
    Delete(Act),
    /// Pause a queue cluster-wide: no node claims from it until `resume`
    /// (running steps finish). Persisted.
    Pause {
        #[command(flatten)]
        db: Db,
        queue: String,
    },
    /// Resume a paused queue.
    Resume {
        #[command(flatten)]
        db: Db,
        queue: String,
    },
    /// Send a signal: to every instance awaiting NAME; or with --id to one,
    /// or with --where to every one the conditions name (each keeps it until
    /// it awaits NAME if it does not yet).
    Signal {
        #[command(flatten)]
        db: Db,
        name: String,
        /// The payload, JSON.
        #[arg(long, default_value = "null")]
        payload: String,
        /// One instance.
        #[arg(long, allow_negative_numbers = true)]
        id: Option<i64>,
        /// A condition, field=value (repeatable), as for cancel: the
        /// instances to send it to.
        #[arg(long = "where", value_name = "FIELD=VALUE", conflicts_with = "id")]
        conditions: Vec<String>,
        /// With --where: say how many instances the conditions name, and
        /// send nothing.
        #[arg(long, requires = "conditions")]
        dry_run: bool,
        /// Without --id: keep it this many seconds for the first instance
        /// that awaits it, if it wakes nobody now.
        #[arg(long, value_parser = parse_seconds)]
        ttl: Option<Duration>,
    },
    /// Serve the web dashboard: queues, instances and why each waits, keys,
    /// gates and rate limits, and /metrics (read-only unless --allow-actions).
    ///
    /// Needs only a connection (no node runs here). Every page reads through
    /// the engine's indexes, so it is safe on a large table; see
    /// docs/dashboard.md.
    Dashboard {
        #[command(flatten)]
        db: Db,
        /// Address to listen on (port 0: any free port).
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Turn on the action buttons and endpoints: cancel, retry, delete,
        /// signal (one instance or every one a filter names), pause and
        /// resume a queue.
        #[arg(long)]
        allow_actions: bool,
        /// Seconds between the pages' live reloads.
        #[arg(long, default_value = "2", value_parser = parse_seconds)]
        refresh: Duration,
    },
    /// Run a node with the built-in `gendurable.Echo` workflow, until SIGTERM or Ctrl-C.
    ///
    /// For cross-language checks: `start` → `finish` → done, adding
    /// `"ran_by": "rust"` to the state.
    Echo {
        #[command(flatten)]
        db: Db,
        /// Steps at once.
        #[arg(long, default_value_t = 10)]
        concurrency: u32,
        #[arg(long, default_value = gendurable::DEFAULT_QUEUE)]
        queue: String,
    },
    /// Run a Python engine's worker (the command installed by pip install gendurable).
    ///
    /// `gendurable worker app.jobs:engine` imports MODULE:ATTRIBUTE (an Engine
    /// or a function returning one) and runs its worker until SIGTERM or
    /// Ctrl-C, then shuts down gracefully; a second signal stops the running
    /// steps at once. It needs the Python package: this verb is run by the
    /// `gendurable` that `pip install gendurable` installs.
    Worker {
        /// e.g. app.jobs:engine
        #[arg(value_name = "MODULE:ATTRIBUTE")]
        engine: String,
    },
}

/// Which instances `cancel`, `retry` and `delete` act on.
#[derive(clap::Args)]
struct Act {
    #[command(flatten)]
    db: Db,
    /// Instance ids.
    #[arg(allow_negative_numbers = true)]
    ids: Vec<i64>,
    /// A condition, field=value (repeatable): id=5,6 workflow=Charge queue=billing
    /// status=discarded,cancelled key=account:7 error=<text in the last error>.
    #[arg(long = "where", value_name = "FIELD=VALUE")]
    conditions: Vec<String>,
    /// Say how many instances the conditions name, and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Recorded with the action in each instance's errors (cancel, retry).
    #[arg(long, default_value = "by an operator")]
    reason: String,
}

impl Act {
    /// The filter: the ids given, and the conditions.
    fn filter(&self) -> Result<gendurable::Filter> {
        let mut terms = self.conditions.clone();
        if !self.ids.is_empty() {
            let ids: Vec<String> = self.ids.iter().map(i64::to_string).collect();
            terms.push(format!("id={}", ids.join(",")));
        }
        if terms.is_empty() {
            return Err(Usage("name the instances: ids, or --where FIELD=VALUE".into()).into());
        }
        Ok(gendurable::Filter::parse(terms)?)
    }
}

/// Exit status of a run stopped by Ctrl-C (128 + SIGINT, as a shell reports it).
pub const INTERRUPTED: i32 = 130;

/// Run the command line `args` (the first is the program name) and return
/// its exit status. Errors are printed to stderr as one line (never a
/// backtrace, whatever `RUST_BACKTRACE` says). Ctrl-C stops the verb (the
/// `echo` node shuts down gracefully) and returns [`INTERRUPTED`].
pub fn run<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&anyhow::Error::from(e)),
    };
    let code = rt.block_on(async {
        let interrupted = async {
            // If the handler cannot be installed, Ctrl-C keeps its default effect.
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        match cli.command {
            // The node stops gracefully on Ctrl-C itself.
            Command::Echo {
                db,
                concurrency,
                queue,
            } => report(echo(db, queue, concurrency, interrupted).await),
            command => {
                tokio::select! {
                    r = execute(command) => report(r),
                    _ = interrupted => {
                        eprintln!("gendurable: interrupted");
                        INTERRUPTED
                    }
                }
            }
        }
    });
    // Tasks left behind (a verb stopped by Ctrl-C) are not waited for long.
    rt.shutdown_timeout(Duration::from_secs(1));
    use std::io::Write;
    let _ = std::io::stdout().flush();
    code
}

fn report(r: Result<()>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

/// Print an error as one line: `error: what: why: cause` (a cause already
/// quoted by the error before it is not repeated).
fn fail(e: &anyhow::Error) -> i32 {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !msg.contains(&cause) {
            msg.push_str(": ");
            msg.push_str(&cause);
        }
    }
    eprintln!("error: {}", connect::one_line(&msg));
    match e.downcast_ref::<Usage>() {
        Some(_) => 2,
        None => 1,
    }
}

/// An error in how the command was called (exit status 2, as clap's).
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

async fn execute(command: Command) -> Result<()> {
    match command {
        Command::Migrate { db } => {
            let engine = client(&db, Schema::Create).await?;
            engine.migrate().await?;
            println!("schema {:?} is up to date", db.schema);
        }
        Command::Status {
            db,
            keys,
            gates,
            json,
            watch,
        } => {
            for k in &keys {
                gendurable::validate::key("key", k)?;
            }
            let engine = client(&db, Schema::MustExist).await?;
            let show = status::Show { keys, gates, json };
            match watch {
                None => status::run(&engine, &show).await?,
                Some(every) => loop {
                    status::run(&engine, &show).await?;
                    println!();
                    tokio::time::sleep(every).await;
                },
            }
        }
        Command::Demo(args) => demo::run(args).await?,
        Command::Bench(args) => bench::run(args).await?,
        Command::Workload(args) => workload::run(args).await?,
        Command::Insert {
            db,
            workflow,
            state,
            step,
            queue,
            priority,
            concurrency_key,
        } => {
            let state = serde_json::from_str(&state).context("--state is not JSON")?;
            // Checked before connecting: bad input is reported as such.
            use gendurable::validate;
            validate::name("workflow", &workflow)?;
            validate::name("step", &step)?;
            validate::name("queue", &queue)?;
            validate::state("state", &state)?;
            let mut new = NewInstance::new(workflow, state)
                .step(step)
                .queue(queue)
                .priority(priority);
            if let Some(k) = concurrency_key {
                validate::key("concurrency_key", &k)?;
                new = new.concurrency_key(k);
            }
            let engine = client(&db, Schema::MustExist).await?;
            println!("{}", engine.insert(new).await?);
        }
        Command::Cancel(act) => act_on(act, Verb::Cancel).await?,
        Command::Retry(act) => act_on(act, Verb::Retry).await?,
        Command::Delete(act) => act_on(act, Verb::Delete).await?,
        Command::Pause { db, queue } => {
            gendurable::validate::name("queue", &queue)?;
            let was = client(&db, Schema::MustExist)
                .await?
                .pause_queue(&queue)
                .await?;
            println!(
                "queue {queue:?} {}",
                if was { "paused" } else { "was already paused" }
            );
        }
        Command::Resume { db, queue } => {
            gendurable::validate::name("queue", &queue)?;
            let was = client(&db, Schema::MustExist)
                .await?
                .resume_queue(&queue)
                .await?;
            println!(
                "queue {queue:?} {}",
                if was { "resumed" } else { "was not paused" }
            );
        }
        Command::Signal {
            db,
            name,
            payload,
            id,
            conditions,
            dry_run,
            ttl,
        } => {
            let payload = serde_json::from_str(&payload).context("--payload is not JSON")?;
            if !conditions.is_empty() {
                if ttl.is_some() {
                    return Err(
                        Usage("--ttl is for a signal by name, not with --where".into()).into(),
                    );
                }
                let filter = gendurable::Filter::parse(&conditions)?;
                let engine = client(&db, Schema::MustExist).await?;
                if dry_run {
                    println!(
                        "{} instances match; nothing sent (dry run)",
                        engine.count(&filter).await?
                    );
                } else {
                    let acted = engine.send_where(&filter, &name, payload).await?;
                    println!(
                        "{} of {} matching instances woken or keeping it",
                        acted.changed, acted.matched
                    );
                }
                return Ok(());
            }
            let engine = client(&db, Schema::MustExist).await?;
            match (id, ttl) {
                (Some(_), Some(_)) => {
                    return Err(Usage("--ttl is for a signal by name, not with --id".into()).into())
                }
                (Some(id), None) => {
                    let d = engine.send(id, &name, payload).await?;
                    println!("{}", format!("{d:?}").to_lowercase());
                }
                (None, Some(ttl)) => {
                    let n = engine.signal_with_ttl(&name, payload, ttl).await?;
                    println!("woke {n}{}", if n == 0 { "; kept" } else { "" });
                }
                (None, None) => println!("woke {}", engine.signal(&name, payload).await?),
            }
        }
        Command::Dashboard {
            db,
            listen,
            allow_actions,
            refresh,
        } => {
            let engine = client(&db, Schema::MustExist).await?;
            let options = gendurable_dashboard::Options {
                listen,
                allow_actions,
                refresh,
            };
            let mode = if allow_actions {
                "actions allowed"
            } else {
                "read-only"
            };
            gendurable_dashboard::serve(
                engine,
                options,
                |addr| {
                    println!("dashboard on http://{addr}/ ({mode}); Ctrl-C stops it");
                    use std::io::Write;
                    let _ = std::io::stdout().flush();
                },
                std::future::pending(),
            )
            .await
            .with_context(|| format!("cannot serve the dashboard on {listen}"))?;
        }
        Command::Why { db, id } => {
            let engine = client(&db, Schema::MustExist).await?;
            let why = engine.why(id).await?;
            if why.is_empty() {
                let status = engine.get(id).await?.status;
                println!("#{id} is {}: it waits for nothing", status.as_str());
            }
            for reason in why {
                println!("{reason}");
            }
        }
        Command::Get { db, id } => {
            let i = client(&db, Schema::MustExist).await?.get(id).await?;
            println!("{}", echo::instance_json(&i));
        }
        Command::Echo { .. } => unreachable!("run handles echo"),
        Command::Worker { .. } => {
            return Err(Usage(
                "`gendurable worker` runs Python workflows and comes with the Python package \
                 (pip install gendurable); this gendurable has no Python"
                    .into(),
            )
            .into())
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Verb {
    Cancel,
    Retry,
    Delete,
}

/// `cancel`, `retry`, `delete`: the action on what the filter names, or
/// with --dry-run only their count.
async fn act_on(act: Act, verb: Verb) -> Result<()> {
    let filter = act.filter()?;
    let engine = client(&act.db, Schema::MustExist).await?;
    if act.dry_run {
        println!(
            "{} instances match; nothing changed (dry run)",
            engine.count(&filter).await?
        );
        return Ok(());
    }
    let (acted, done) = match verb {
        Verb::Cancel => (
            engine.cancel_where(&filter, &act.reason).await?,
            "cancelled",
        ),
        Verb::Retry => (
            engine.retry_where(&filter, &act.reason).await?,
            "made runnable",
        ),
        Verb::Delete => (engine.delete_where(&filter).await?, "deleted"),
    };
    println!(
        "{} of {} matching instances {done}",
        acted.changed, acted.matched
    );
    Ok(())
}

async fn echo(
    db: Db,
    queue: String,
    concurrency: u32,
    interrupted: impl Future<Output = ()>,
) -> Result<()> {
    let url = db.url.clone().context(NO_URL)?;
    connect::check(&url, db.connect_timeout).await?;
    echo::run(&url, &db.schema, &queue, concurrency, interrupted).await
}

const NO_URL: &str = "no database: pass --url or set DATABASE_URL";

/// What a verb may do to the schema.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Schema {
    /// `migrate`: it creates or upgrades it.
    Create,
    /// Every other verb: it must exist; nothing is created.
    MustExist,
}

/// A client engine for `db`: the configuration checked, the database reached
/// (or why not, at once), and for every verb but `migrate` the schema there.
async fn client(db: &Db, schema: Schema) -> Result<Engine> {
    let url = db.url.clone().context(NO_URL)?;
    let builder = Engine::builder()
        .url(&url)
        .schema(&db.schema)
        .connect_timeout(db.connect_timeout)
        .migrate(false);
    builder.validate()?;
    connect::check(&url, db.connect_timeout).await?;
    let engine = builder.build().await?;
    if schema == Schema::MustExist && !engine.schema_exists().await? {
        bail!(
            "no gendurable schema {:?} in this database (nothing was created); \
             `gendurable migrate --schema {}` creates it",
            db.schema,
            db.schema
        );
    }
    Ok(engine)
}

fn parse_priority(s: &str) -> Result<i16, String> {
    match s.trim().parse::<i16>() {
        Ok(p) if (0..=9).contains(&p) => Ok(p),
        _ => Err(format!(
            "priority must be between 0 and 9 (0 runs first), got {s}"
        )),
    }
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| *v > 0.0)
        .and_then(|v| Duration::try_from_secs_f64(v).ok())
        .ok_or_else(|| format!("expected a number of seconds above zero, got {s}"))
}

/// The URL to use: DATABASE_URL when set, else a throwaway server kept alive
/// by the returned guard.
async fn database(fsync: bool) -> Result<(String, Option<TempPostgres>)> {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        return Ok((url, None));
    }
    eprintln!("DATABASE_URL is not set: starting a throwaway PostgreSQL...");
    let pg = TempPostgres::start_with(gendurable_testing::TempPostgresOptions {
        fsync,
        ..Default::default()
    })
    .await?;
    Ok((pg.url(), Some(pg)))
}
