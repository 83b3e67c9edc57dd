//! `gendurable`: migrate, inspect, demo and benchmark the engine.

mod bench;
mod demo;
mod echo;
mod status;
mod workload;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use gendurable::embedded::TempPostgres;
use gendurable::{Engine, NewInstance};

#[derive(Parser)]
#[command(
    name = "gendurable",
    version,
    about = "A durable step engine on PostgreSQL"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct Db {
    /// PostgreSQL URL.
    #[arg(long, env = "DATABASE_URL")]
    url: Option<String>,
    /// The schema holding the engine's tables.
    #[arg(long, default_value = "gendurable")]
    schema: String,
}

#[derive(Subcommand)]
enum Command {
    /// Create or upgrade the schema (idempotent; safe from many nodes at once).
    Migrate {
        #[command(flatten)]
        db: Db,
    },
    /// Instances per queue and status, live nodes, gates, executing keys, rate limits.
    Status {
        #[command(flatten)]
        db: Db,
        /// Also show the effective K of these keys under the --gate settings.
        #[arg(long = "key")]
        keys: Vec<String>,
        /// A gate as configured on the nodes: NAME=LIMIT or NAME=LIMIT/SHARDS.
        #[arg(long = "gate", value_parser = status::parse_gate)]
        gates: Vec<(String, gendurable::GateConfig)>,
    },
    /// Run a sample workload (a throwaway Postgres unless DATABASE_URL is set).
    Demo(demo::Args),
    /// Measure inserts/s and steps/s on a throwaway Postgres.
    Bench(bench::Args),
    /// One workload of the cross-system benchmark (`benchmarks/`); prints a JSON line.
    Workload(workload::Args),
    /// Insert one instance and print its id.
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
        #[arg(long, default_value_t = 0)]
        priority: i16,
        #[arg(long)]
        concurrency_key: Option<String>,
    },
    /// Print an instance as JSON.
    Get {
        #[command(flatten)]
        db: Db,
        id: i64,
    },
    /// Run a node with the built-in `gendurable.Echo` workflow (for
    /// cross-language checks) until SIGTERM or Ctrl-C.
    Echo {
        #[command(flatten)]
        db: Db,
        /// Steps at once.
        #[arg(long, default_value_t = 10)]
        concurrency: u32,
        #[arg(long, default_value = gendurable::DEFAULT_QUEUE)]
        queue: String,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Migrate { db } => {
            let engine = client(&db).await?;
            engine.migrate().await?;
            println!("schema {:?} is up to date", db.schema);
        }
        Command::Status { db, keys, gates } => status::run(client(&db).await?, keys, gates).await?,
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
            let mut new = NewInstance::new(workflow, state)
                .step(step)
                .queue(queue)
                .priority(priority);
            if let Some(k) = concurrency_key {
                new = new.concurrency_key(k);
            }
            println!("{}", client(&db).await?.insert(new).await?);
        }
        Command::Get { db, id } => {
            let i = client(&db).await?.get(id).await?;
            println!("{}", echo::instance_json(&i));
        }
        Command::Echo {
            db,
            concurrency,
            queue,
        } => echo::run(&db.url.context(NO_URL)?, &db.schema, &queue, concurrency).await?,
    }
    Ok(())
}

const NO_URL: &str = "no database: pass --url or set DATABASE_URL";

async fn client(db: &Db) -> Result<Engine> {
    let url = db.url.clone().context(NO_URL)?;
    Ok(Engine::builder()
        .url(url)
        .schema(&db.schema)
        .build()
        .await?)
}

/// The URL to use: DATABASE_URL when set, else a throwaway server kept alive
/// by the returned guard.
async fn database(fsync: bool) -> Result<(String, Option<TempPostgres>)> {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        return Ok((url, None));
    }
    eprintln!("DATABASE_URL is not set: starting a throwaway PostgreSQL...");
    let pg = TempPostgres::start_with(gendurable::embedded::TempPostgresOptions {
        fsync,
        ..Default::default()
    })
    .await?;
    Ok((pg.url(), Some(pg)))
}
