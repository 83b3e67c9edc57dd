//! The node process (`gendurable-chaos node ...`): one engine running the
//! plan workflow, recording the start and the end of every step execution.

use crate::plan::{FailAs, KeyMove, Step, Then};
use crate::record::{now, Record, Recorder};
use crate::settings::{self, QUEUES, WORKFLOW};
use anyhow::Context;
use gendurable::{
    AwaitOn, FnWorkflow, KeyChange, NextOptions, StepContext, StepResult, Transition, Wake,
    Workflow,
};
use serde_json::Value;
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

#[derive(clap::Args, Debug)]
pub struct NodeArgs {
    /// Database URL (the controller's proxy).
    #[arg(long)]
    pub url: String,
    #[arg(long)]
    pub schema: String,
    #[arg(long)]
    pub node_id: String,
    /// The log this process appends its records to.
    #[arg(long)]
    pub log: PathBuf,
    /// This process's number in the run (names its executions).
    #[arg(long, default_value_t = 0)]
    pub proc: u32,
    /// The queues this node serves (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "a,b")]
    pub queues: Vec<String>,
    /// Answer every step from a thread of this process's own, inside
    /// `gendurable::handover`, as the language bindings do: the step's end
    /// and the next step's start then run on that thread.
    #[arg(long)]
    pub hand_over: bool,
}

/// The exit code of a planned crash (a poison pill's step).
pub const PLANNED_CRASH: i32 = 70;

/// What every step of this process shares.
struct Env {
    rec: Recorder,
    node: String,
    pid: u32,
    proc: u32,
    runs: AtomicU64,
}

pub async fn run(args: NodeArgs) -> anyhow::Result<()> {
    let rec = Recorder::open(&args.log)
        .with_context(|| format!("opening the log {}", args.log.display()))?;
    let env = Arc::new(Env {
        rec,
        node: args.node_id.clone(),
        pid: std::process::id(),
        proc: args.proc,
        runs: AtomicU64::new(0),
    });
    // The controller holds the other end of our stdin: when it is gone, so are we.
    std::thread::spawn(|| {
        let mut buf = [0u8; 64];
        loop {
            match std::io::stdin().read(&mut buf) {
                Ok(0) | Err(_) => std::process::exit(3),
                Ok(_) => {}
            }
        }
    });
    // SIGTERM asks for a graceful shutdown, from now on.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let answerer = args.hand_over.then(Answerer::start);
    // Postgres may be down right now: keep trying.
    let engine = loop {
        let env = env.clone();
        let plan = FnWorkflow::new(move |step, state, ctx| run_step(env.clone(), step, state, ctx));
        let b = settings::builder(&args.url)
            .schema(args.schema.as_str())
            .node_id(args.node_id.as_str())
            .migrate(false);
        let mut b = match &answerer {
            Some(a) => b.workflow(
                WORKFLOW,
                AnsweredElsewhere {
                    plan,
                    answerer: a.clone(),
                },
            ),
            None => b.workflow(WORKFLOW, plan),
        };
        for &(q, n) in QUEUES {
            if args.queues.iter().any(|a| a == q) {
                b = b.queue(q, n);
            }
        }
        let started = tokio::select! {
            r = b.start() => r,
            _ = term.recv() => return Ok(()),
        };
        match started {
            Ok(e) => break e,
            Err(e) => {
                eprintln!("node {}: start failed ({e}); retrying", args.node_id);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    };
    env.rec.write(&Record::Up {
        t: now(),
        proc: env.proc,
        pid: env.pid,
        node: env.node.clone(),
    });
    term.recv().await;
    engine.shutdown().await?;
    Ok(())
}

/// The thread that answers the steps of a `--hand-over` node.
#[derive(Clone)]
struct Answerer(Arc<Mutex<mpsc::Sender<Answer>>>);

/// A step's result and where it goes.
type Answer = (oneshot::Sender<StepResult>, StepResult);

impl Answerer {
    fn start() -> Answerer {
        let (tx, rx) = mpsc::channel::<Answer>();
        std::thread::spawn(move || {
            for (answer, result) in rx {
                // A step stopped meanwhile dropped its receiver: nothing to do.
                gendurable::handover(|| answer.send(result).ok());
            }
        });
        Answerer(Arc::new(Mutex::new(tx)))
    }
}

/// The plan workflow, its results answered through the `Answerer`'s thread.
struct AnsweredElsewhere {
    plan: FnWorkflow,
    answerer: Answerer,
}

#[gendurable::async_trait]
impl Workflow for AnsweredElsewhere {
    fn hands_over(&self) -> bool {
        true
    }

    async fn step(&self, step: &str, state: Value, ctx: StepContext) -> StepResult {
        let result = self.plan.step(step, state, ctx).await;
        let (tx, rx) = oneshot::channel();
        let sent = match self.answerer.0.lock() {
            Ok(to) => to.send((tx, result)).is_ok(),
            Err(_) => false,
        };
        if !sent {
            return Err("the answering thread is gone".into());
        }
        rx.await
            .unwrap_or_else(|_| Err("the answering thread dropped the answer".into()))
    }
}

/// Records the end of an execution; one dropped unfinished (the engine
/// aborted the step, or it panicked) records `aborted` or `panic`.
struct Guard {
    env: Arc<Env>,
    run: String,
    id: i64,
    ended: bool,
}

impl Guard {
    fn end(&mut self, kind: &str) {
        self.ended = true;
        self.env.rec.write(&Record::End {
            t: now(),
            run: self.run.clone(),
            proc: self.env.proc,
            id: self.id,
            kind: kind.into(),
        });
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.ended {
            let kind = if std::thread::panicking() {
                "panic"
            } else {
                "aborted"
            };
            self.end(kind);
        }
    }
}

/// One step: whatever the plan in the state says for step `n`.
async fn run_step(env: Arc<Env>, step: String, mut state: Value, ctx: StepContext) -> StepResult {
    let n = state["n"].as_i64().unwrap_or(-1);
    let parent = state["runs"]
        .as_array()
        .and_then(|r| r.last())
        .and_then(Value::as_str)
        .map(str::to_owned);
    let spec: Option<Step> = usize::try_from(n)
        .ok()
        .and_then(|i| state["plan"].get(i))
        .and_then(|s| serde_json::from_value(s.clone()).ok());
    let run = format!("{}.{}", env.proc, env.runs.fetch_add(1, Relaxed));
    env.rec.write(&Record::Start {
        t: now(),
        run: run.clone(),
        proc: env.proc,
        pid: env.pid,
        node: env.node.clone(),
        id: ctx.id,
        step: step.clone(),
        n,
        attempt: ctx.attempt,
        queue: ctx.queue.clone(),
        key: ctx.concurrency_key.clone(),
        rate: ctx.rate_limit.clone(),
        parent,
        wake: ctx.wake.as_ref().map(|w| match w {
            Wake::Signal { name, .. } => format!("signal:{name}"),
            Wake::Timeout => "timeout".into(),
        }),
    });
    let mut guard = Guard {
        env,
        run: run.clone(),
        id: ctx.id,
        ended: false,
    };
    let Some(spec) = spec.filter(|s| s.name == step) else {
        guard.end("mismatch");
        return Ok(Transition::error(format!(
            "step {step:?} with n = {n} is not what the plan says"
        )));
    };
    tokio::time::sleep(Duration::from_millis(spec.sleep)).await;
    if spec.crash {
        // A poison pill: the process goes, with whatever else it runs.
        guard.end("crash");
        std::process::exit(PLANNED_CRASH);
    }
    if ctx.attempt <= spec.fail {
        match spec.fail_as {
            FailAs::Error => {
                guard.end("error");
                return Ok(Transition::error("a planned failure"));
            }
            FailAs::Err => {
                guard.end("err");
                return Err("a planned failure".into());
            }
            // The guard records it while unwinding.
            FailAs::Panic => panic!("a planned panic"),
        }
    }
    let next = state["plan"][(n + 1) as usize]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if let Some(path) = state["path"].as_array_mut() {
        path.push(Value::from(step.as_str()));
    }
    if let Some(runs) = state["runs"].as_array_mut() {
        runs.push(Value::from(run.as_str()));
    }
    state["n"] = Value::from(n + 1);
    let t = match spec.then {
        Then::Done => Transition::done(state),
        Then::Next { key, rate, delay } => Transition::next_with(
            next,
            state,
            NextOptions {
                concurrency_key: match key {
                    KeyMove::Keep => KeyChange::Keep,
                    KeyMove::Release => KeyChange::Release,
                    KeyMove::Set(k) => KeyChange::Set(k.into()),
                },
                rate_limit: rate,
                delay: delay.map(Duration::from_millis),
            },
        ),
        Then::Await { signal, timeout } => {
            let mut on = AwaitOn::signal(signal);
            if let Some(ms) = timeout {
                on = on.or_timeout(Duration::from_millis(ms));
            }
            Transition::await_on(next, state, on)
        }
    };
    guard.end(t.kind());
    Ok(t)
}
