//! `gendurable bench`: end-to-end throughput on a throwaway Postgres (fsync
//! on) or DATABASE_URL. Each case runs in a fresh schema.

use anyhow::Result;
use gendurable::{Engine, GateConfig, NewInstance, Transition};
use serde_json::json;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// No-op instances per throughput case.
    #[arg(long, default_value_t = 20_000)]
    jobs: usize,
    /// Worker concurrencies to measure no-op steps/s at.
    #[arg(long, value_delimiter = ',', default_value = "10,20,50")]
    concurrency: Vec<u32>,
    /// Skip the concurrency-key and gate cases.
    #[arg(long)]
    no_keys: bool,
    /// Run the step cases this many times, interleaved; each reports its median.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

const KEYED: &str = "no-op steps over 100 K = 1 keys, concurrency 20";
const GATE10: &str = "gate limit 10, 20 ms steps, concurrency 20";
const GATE1000: &str = "gate limit 1000 / 10 shards, no-op, concurrency 50";

/// One step case's rates over the rounds, and the note of its last run.
struct Case {
    case: String,
    rates: Vec<f64>,
    note: String,
}

impl Case {
    fn median(&self) -> f64 {
        let mut r = self.rates.clone();
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    }
}

fn record(cases: &mut Vec<Case>, r: Row) {
    match cases.iter_mut().find(|c| c.case == r.case) {
        Some(c) => {
            c.rates.push(r.rate);
            c.note = r.note;
        }
        None => cases.push(Case {
            case: r.case,
            rates: vec![r.rate],
            note: r.note,
        }),
    }
}

struct Row {
    case: String,
    rate: f64,
    unit: &'static str,
    note: String,
}

pub async fn run(args: Args) -> Result<()> {
    let (url, _pg) = crate::database(true).await?;
    let mut rows = Vec::new();
    let n = args.jobs;

    // Inserts, one per call and batched.
    let engine = client(&url, &fresh("ins1")).await?;
    let single = 2000.min(n);
    let t = Instant::now();
    for i in 0..single {
        engine.insert(noop(i)).await?;
    }
    rows.push(row(
        "insert, one per call",
        single,
        t.elapsed(),
        "inserts/s",
        "",
    ));
    let engine = client(&url, &fresh("insn")).await?;
    let t = Instant::now();
    engine.insert_many((0..n).map(noop).collect()).await?;
    rows.push(row(
        &format!("insert_many, {n} in one call"),
        n,
        t.elapsed(),
        "inserts/s",
        "",
    ));

    // The step cases, in rounds: on a shared or small machine a single run
    // moves by a third, so each case reports its median over the rounds and
    // the ratios compare medians of cases run interleaved.
    let mut cases: Vec<Case> = Vec::new();
    let rounds = args.rounds.max(1);
    for round in 1..=rounds {
        if rounds > 1 {
            println!("round {round} of {rounds}");
        }
        for &c in &args.concurrency {
            let r = steps(
                &url,
                &format!("no-op steps, concurrency {c}"),
                n,
                c,
                Duration::ZERO,
                None,
                noop,
            )
            .await?;
            record(&mut cases, r);
        }
        if args.no_keys {
            continue;
        }
        // 100 K = 1 keys.
        let r = steps(&url, KEYED, n, 20, Duration::ZERO, None, |i| {
            noop(i).concurrency_key(("acct", i % 100))
        })
        .await?;
        record(&mut cases, r);
        // A gate of 10 with 20 ms steps: ideal 500 steps/s.
        let r = steps(
            &url,
            GATE10,
            2000,
            20,
            Duration::from_millis(20),
            Some(("api", GateConfig::new(10))),
            |i| noop(i).concurrency_key("api:1"),
        )
        .await?;
        record(&mut cases, r);
        // A gate of 1000 over 10 shards.
        let r = steps(
            &url,
            GATE1000,
            n,
            50,
            Duration::ZERO,
            Some(("big", GateConfig::new(1000).shards(10))),
            |i| noop(i).concurrency_key("big:1"),
        )
        .await?;
        record(&mut cases, r);
    }
    let median = |case: &str| cases.iter().find(|c| c.case == case).map(Case::median);
    for c in &cases {
        let m = c.median();
        let vs = |what: &str, base: Option<f64>| {
            base.map(|b| format!("{:.0} % of {what}; ", 100.0 * m / b))
                .unwrap_or_default()
        };
        let ratio = match c.case.as_str() {
            KEYED => vs("keyless", median("no-op steps, concurrency 20")),
            GATE10 => vs("ideal 500/s", Some(500.0)),
            GATE1000 => vs("keyless", median("no-op steps, concurrency 50")),
            _ => String::new(),
        };
        let spread = if c.rates.len() > 1 {
            let lo = c.rates.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = c.rates.iter().copied().fold(0.0, f64::max);
            format!("{lo:.0}–{hi:.0} over {} rounds; ", c.rates.len())
        } else {
            String::new()
        };
        rows.push(Row {
            case: c.case.clone(),
            rate: m,
            unit: "steps/s",
            note: format!("{ratio}{spread}{}", c.note),
        });
    }

    println!("\n| case | rate | note |\n|---|---:|---|");
    for r in rows {
        println!("| {} | {:.0} {} | {} |", r.case, r.rate, r.unit, r.note);
    }
    Ok(())
}

fn fresh(what: &str) -> String {
    format!("bench_{what}_{:08x}", rand::random::<u32>())
}

fn noop(i: usize) -> NewInstance {
    NewInstance::new("Noop", json!({ "i": i }))
}

fn row(case: &str, n: usize, d: Duration, unit: &'static str, note: &str) -> Row {
    let rate = n as f64 / d.as_secs_f64();
    println!("{case}: {rate:.0} {unit}");
    Row {
        case: case.into(),
        rate,
        unit,
        note: note.into(),
    }
}

async fn client(url: &str, schema: &str) -> Result<Engine> {
    Ok(Engine::builder().url(url).schema(schema).build().await?)
}

/// Insert `n` one-step instances, then start a node and time it to the last outcome.
async fn steps(
    url: &str,
    case: &str,
    n: usize,
    concurrency: u32,
    pause: Duration,
    gate: Option<(&str, GateConfig)>,
    make: impl Fn(usize) -> NewInstance,
) -> Result<Row> {
    let mut b = Engine::builder()
        .url(url)
        .schema(fresh("steps"))
        .queue("default", concurrency)
        .workflow_fn("Noop", move |_step, state, _ctx| async move {
            if !pause.is_zero() {
                crate::workload::sleep_exactly(pause).await;
            }
            Ok(Transition::done(state))
        });
    if let Some((name, g)) = gate {
        b = b.concurrency_limit(name, g);
    }
    let engine = b.build().await?;
    for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
        engine
            .insert_many(chunk.iter().map(|&i| make(i)).collect())
            .await?;
    }
    let (elapsed, s) = crate::workload::drain(&engine, case, n).await?;
    engine.pool().close().await;
    let note = crate::workload::amortised(&s);
    Ok(row(case, n, elapsed, "steps/s", &note))
}
