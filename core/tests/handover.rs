//! Steps answered on a thread the runtime does not own, inside
//! `gendurable::handover` (as the language bindings answer): the answer's
//! call ends the step and starts the next ones there, and nothing else
//! changes: every instance runs each step once, one at a time per key.
mod support;

use gendurable::{NewInstance, StepContext, StepResult, Transition, Workflow};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;
use tokio::sync::oneshot;

type Answer = (oneshot::Sender<Transition>, Value, Option<String>);

/// Hands each step to one answering thread, as a binding does.
struct Foreign {
    hands_over: bool,
    to_answerer: Mutex<mpsc::Sender<Answer>>,
    /// The thread each step started on.
    started_on: Arc<Mutex<Vec<ThreadId>>>,
    /// Steps running per key, and the most seen at once.
    running: Arc<Mutex<HashMap<String, (u32, u32)>>>,
}

#[gendurable::async_trait]
impl Workflow for Foreign {
    fn hands_over(&self) -> bool {
        self.hands_over
    }

    async fn step(&self, step: &str, state: Value, ctx: StepContext) -> StepResult {
        self.started_on
            .lock()
            .unwrap()
            .push(std::thread::current().id());
        if let Some(key) = &ctx.concurrency_key {
            let mut running = self.running.lock().unwrap();
            let (now, most) = running.entry(key.clone()).or_default();
            *now += 1;
            *most = (*most).max(*now);
        }
        let mut state = state;
        state[step] = json!(state[step].as_i64().unwrap_or(0) + 1);
        let (tx, rx) = oneshot::channel();
        let sent = self
            .to_answerer
            .lock()
            .unwrap()
            .send((tx, state, ctx.concurrency_key.clone()));
        sent.map_err(|_| "the answering thread is gone")?;
        Ok(rx.await?)
    }
}

/// Runs 300 instances of two steps over 30 K = 1 keys on a node whose steps
/// are answered by one thread of its own; returns how many steps started on
/// that thread, of how many.
async fn run(hands_over: bool) -> (usize, usize) {
    let schema = support::schema("handover");
    let (to_answerer, requests) = mpsc::channel::<Answer>();
    let running: Arc<Mutex<HashMap<String, (u32, u32)>>> = Arc::default();
    let answerer = std::thread::spawn({
        let running = running.clone();
        move || {
            for (tx, state, key) in requests {
                if let Some(key) = key {
                    running.lock().unwrap().get_mut(&key).unwrap().0 -= 1;
                }
                let next = if state.get("second").is_some() {
                    Transition::done(state)
                } else {
                    Transition::next("second", state)
                };
                gendurable::handover(|| tx.send(next).ok());
            }
            std::thread::current().id()
        }
    });
    let started_on: Arc<Mutex<Vec<ThreadId>>> = Arc::default();
    let engine = support::builder(&support::url(), &schema)
        .queue("default", 4)
        .workflow(
            "Foreign",
            Foreign {
                hands_over,
                to_answerer: Mutex::new(to_answerer),
                started_on: started_on.clone(),
                running: running.clone(),
            },
        )
        .build()
        .await
        .unwrap();
    let n = 300;
    engine
        .insert_many(
            (0..n)
                .map(|i| {
                    NewInstance::new("Foreign", json!({}))
                        .step("first")
                        .concurrency_key(format!("acct:{}", i % 30))
                })
                .collect(),
        )
        .await
        .unwrap();
    engine.start().await.unwrap();
    let pool = sqlx::PgPool::connect(&support::url()).await.unwrap();
    support::wait_count(&pool, &schema, "completed", n).await;
    engine.shutdown().await.unwrap();
    drop(engine);
    let answerer = answerer.join().unwrap();

    let states: Vec<Value> = sqlx::query_scalar(&format!(
        "SELECT state FROM \"{schema}\".instances ORDER BY id"
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(states.len(), n as usize);
    for s in &states {
        assert_eq!(s, &json!({"first": 1, "second": 1}), "each step ran once");
    }
    for (key, (now, most)) in running.lock().unwrap().iter() {
        assert_eq!((*now, *most), (0, 1), "key {key}: one step at a time");
    }
    let started_on = started_on.lock().unwrap();
    assert_eq!(started_on.len(), 2 * n as usize, "two steps per instance");
    let on_answerer = started_on.iter().filter(|t| **t == answerer).count();
    (on_answerer, started_on.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_starts_the_next_steps_on_its_thread() {
    let (here, all) = tokio::time::timeout(Duration::from_secs(240), run(true))
        .await
        .unwrap();
    // The first steps start on the runtime (no answer came yet), and so do
    // rows claimed after the slot they wait for freed; the rest start in
    // the answer that freed their slot.
    assert!(
        here >= all / 4,
        "only {here} of {all} steps started in an answer's hand-over"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_it_every_step_starts_on_the_runtime() {
    let (here, all) = tokio::time::timeout(Duration::from_secs(240), run(false))
        .await
        .unwrap();
    assert_eq!((here, all), (0, 600));
}
