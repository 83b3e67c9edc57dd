//! `gendurable-chaos`: a fault-injection run of the engine. The controller
//! starts its own PostgreSQL, a cutting proxy and node processes (this same
//! program in `node` mode), inserts load, injects faults, drains the run and
//! checks it from its own records. See README.md.

mod controller;
mod faults;
mod load;
mod node;
mod observer;
mod plan;
mod proxy;
mod record;
mod settings;

use clap::{Args, Parser, Subcommand};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "gendurable-chaos",
    about = "Fault-injection run: node processes, a cutting proxy, Postgres crashes, an outside observer",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one node (started by the controller).
    Node(node::NodeArgs),
}

#[derive(Args)]
struct RunArgs {
    /// Seed of every random decision (default: random; always printed).
    #[arg(long)]
    seed: Option<u64>,
    /// How long faults are injected, e.g. 45s, 10m.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Node processes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
    nodes: u16,
    /// Instances inserted (default: 8 per second of duration).
    #[arg(long)]
    instances: Option<usize>,
    /// Poison pills: instances whose last step ends its node's process on
    /// every attempt (default: one per 30 s of duration; 0 for none).
    #[arg(long)]
    poison: Option<u64>,
    /// Keep the run's directory: the records, the nodes' output and a copy
    /// of the database (kept anyway when a check fails).
    #[arg(long)]
    keep: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 45s or 10m"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1e3,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {s:?} (use ms, s, m or h)"
            ))
        }
    };
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("{s:?} is not a positive duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A duration as the command line takes it.
pub fn show_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 60.0 && s % 60.0 == 0.0 {
        format!("{}m", s / 60.0)
    } else {
        format!("{s}s")
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let code = match cli.cmd {
        Some(Cmd::Node(args)) => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
                )
                .with_writer(std::io::stderr)
                .init();
            // Planned panics are part of the run: one line each.
            std::panic::set_hook(Box::new(|info| eprintln!("panic: {info}")));
            match runtime.block_on(node::run(args)) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("node: {e:#}");
                    2
                }
            }
        }
        None => {
            let a = cli.run;
            let opts = controller::Options {
                seed: a.seed.unwrap_or_else(rand::random),
                duration: a.duration,
                nodes: a.nodes.into(),
                instances: a.instances,
                poison: a.poison,
                keep: a.keep,
            };
            let seed = opts.seed;
            runtime.block_on(async move {
                tokio::select! {
                    r = controller::run(opts) => match r {
                        Ok(true) => 0,
                        Ok(false) => 1,
                        Err(e) => {
                            eprintln!("error: {e:#}\n(seed {seed})");
                            2
                        }
                    },
                    _ = tokio::signal::ctrl_c() => {
                        eprintln!("interrupted (seed {seed}); cleaning up");
                        130
                    }
                }
            })
        }
    };
    // Dropping the runtime drops every task: node processes are killed and
    // Postgres is stopped and removed.
    drop(runtime);
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::{parse_duration, show_duration};
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("45s"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert_eq!(show_duration(Duration::from_secs(600)), "10m");
        assert_eq!(show_duration(Duration::from_secs(45)), "45s");
    }
}
