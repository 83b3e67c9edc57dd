//! Plans: what each instance does, decided by the controller from the seed
//! and carried in the instance's own state, so the node's code is a pure
//! function of the state and the observer knows what must have happened.
//!
//! The state is `{uid, plan: [step], path: [name], runs: [run], n}`: every
//! applied outcome appends the step's name to `path` and the id of the
//! execution that produced it to `runs`, and increments `n`.

use crate::settings::{self, ACCT, ACCT_KEYS, API_KEYS, GATE, RATE, RATE_KEYS, WORKFLOW};
use gendurable::NewInstance;
use rand::rngs::StdRng;
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::time::Duration;

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub name: String,
    /// Milliseconds the step sleeps (an async sleep).
    pub sleep: u64,
    /// The step fails while its attempt is at most this.
    pub fail: i32,
    pub fail_as: FailAs,
    /// The step ends its process on every attempt (a poison pill): the
    /// instance must be discarded after `max_attempts`.
    #[serde(default)]
    pub crash: bool,
    /// The concurrency key held while it runs.
    pub key: Option<String>,
    /// The rate-limit key it is admitted under.
    pub rate: Option<String>,
    pub then: Then,
}

/// How a failing step fails: all three are error outcomes, retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailAs {
    /// `Transition::error`.
    Error,
    /// An `Err` returned.
    Err,
    /// A panic.
    Panic,
}

/// What a step returns when it succeeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "do", rename_all = "snake_case")]
pub enum Then {
    Next {
        key: KeyMove,
        rate: Option<String>,
        /// Milliseconds before the next step may run.
        delay: Option<u64>,
    },
    Await {
        signal: String,
        /// Milliseconds after which the await times out.
        timeout: Option<u64>,
    },
    Done,
}

/// The `next` transition's key change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyMove {
    Keep,
    Release,
    Set(String),
}

/// Signal names: `tick` is sent by name (waking every instance awaiting it),
/// `poke` to one instance at a time.
pub const TICK: &str = "tick";
pub const POKE: &str = "poke";

/// An instance's plan.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    pub uid: String,
    pub queue: String,
    pub priority: i16,
    /// The key it is inserted with.
    pub key: Option<String>,
    /// Inserted to run this many milliseconds later.
    pub delay: Option<u64>,
    /// Attempts per step (the engine's default when not set).
    pub max_attempts: Option<i32>,
    pub steps: Vec<Step>,
}

impl Plan {
    /// A random plan; `hot_rate` is the rate-limit key most rate-limited
    /// steps of this wave use, so that the limit binds.
    pub fn generate(rng: &mut StdRng, uid: String, hot_rate: &str) -> Plan {
        let queue = if rng.gen_bool(0.55) { "a" } else { "b" };
        let m = match rng.gen_range(0..100) {
            0..=9 => 1,
            10..=29 => 2,
            30..=54 => 3,
            55..=74 => 4,
            75..=89 => 5,
            _ => 6,
        };
        let key = random_key(rng);
        let delay = rng.gen_bool(0.1).then(|| rng.gen_range(200..2000));
        let mut rate = rng.gen_bool(0.3).then(|| pick_rate(rng, hot_rate));
        let mut cur = key.clone();
        let mut steps = Vec::with_capacity(m);
        for i in 0..m {
            let sleep = match rng.gen_range(0..100) {
                0..=59 => rng.gen_range(2..30),
                60..=89 => rng.gen_range(30..150),
                90..=98 => rng.gen_range(150..=settings::MAX_SLEEP_MS),
                _ => rng.gen_range(settings::LONG_SLEEP_MS),
            };
            let fail = if rng.gen_bool(0.08) {
                if rng.gen_bool(0.25) {
                    2
                } else {
                    1
                }
            } else {
                0
            };
            let fail_as = match rng.gen_range(0..100) {
                0..=49 => FailAs::Error,
                50..=84 => FailAs::Err,
                _ => FailAs::Panic,
            };
            let then = if i + 1 == m {
                Then::Done
            } else if rng.gen_bool(0.15) {
                Then::Await {
                    signal: if rng.gen_bool(0.6) { TICK } else { POKE }.into(),
                    timeout: rng.gen_bool(0.4).then(|| rng.gen_range(500..3000)),
                }
            } else {
                let key = match rng.gen_range(0..100) {
                    0..=54 => KeyMove::Keep,
                    55..=74 => KeyMove::Release,
                    _ => KeyMove::Set(random_key(rng).unwrap_or_else(|| format!("{ACCT}:0"))),
                };
                Then::Next {
                    key,
                    rate: rng.gen_bool(0.25).then(|| pick_rate(rng, hot_rate)),
                    delay: rng.gen_bool(0.08).then(|| rng.gen_range(50..400)),
                }
            };
            let (held, step_rate) = (cur.clone(), rate.take());
            // A `next` sets the next step's rate-limit key and may change the key.
            if let Then::Next { key, rate: r, .. } = &then {
                rate = r.clone();
                match key {
                    KeyMove::Keep => {}
                    KeyMove::Release => cur = None,
                    KeyMove::Set(k) => cur = Some(k.clone()),
                }
            }
            steps.push(Step {
                name: format!("s{i}"),
                sleep,
                fail,
                fail_as,
                crash: false,
                key: held,
                rate: step_rate,
                then,
            });
        }
        Plan {
            uid,
            queue: queue.into(),
            priority: rng.gen_range(0..=2),
            key,
            delay,
            max_attempts: None,
            steps,
        }
    }

    /// A poison pill: a plan whose last step ends its node's process on
    /// every attempt, with few attempts allowed.
    pub fn poison(rng: &mut StdRng, uid: String, hot_rate: &str) -> Plan {
        let mut plan = Plan::generate(rng, uid, hot_rate);
        plan.steps.truncate(3);
        if let Some(last) = plan.steps.last_mut() {
            last.crash = true;
            last.fail = 0;
            last.then = Then::Done;
        }
        plan.max_attempts = Some(3);
        plan.delay = None;
        plan
    }

    /// The index of the step that crashes its process, if any.
    pub fn crash_at(&self) -> Option<usize> {
        self.steps.iter().position(|s| s.crash)
    }

    /// The final status and path the instance must end with.
    pub fn expected(&self) -> (&'static str, Vec<&str>) {
        match self.crash_at() {
            Some(c) => ("discarded", self.names()[..c].to_vec()),
            None => ("completed", self.names()),
        }
    }

    /// The instance's initial state.
    pub fn state(&self) -> Value {
        json!({"uid": self.uid, "plan": self.steps, "path": [], "runs": [], "n": 0})
    }

    /// The insert.
    pub fn new_instance(&self) -> NewInstance {
        let mut new = NewInstance::new(WORKFLOW, self.state())
            .step(self.steps[0].name.as_str())
            .queue(self.queue.as_str())
            .priority(self.priority);
        if let Some(k) = &self.key {
            new = new.concurrency_key(k.as_str());
        }
        if let Some(r) = &self.steps[0].rate {
            new = new.rate_limit(r.as_str());
        }
        if let Some(d) = self.delay {
            new = new.schedule_in(Duration::from_millis(d));
        }
        if let Some(m) = self.max_attempts {
            new = new.max_attempts(m);
        }
        new
    }

    /// Whether some step awaits a `poke` (only a signal to the instance wakes it).
    pub fn awaits_poke(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(&s.then, Then::Await { signal, .. } if signal == POKE))
    }

    /// The step names a completed instance's `path` must hold, in order.
    pub fn names(&self) -> Vec<&str> {
        self.steps.iter().map(|s| s.name.as_str()).collect()
    }
}

fn random_key(rng: &mut StdRng) -> Option<String> {
    match rng.gen_range(0..100) {
        0..=44 => Some(format!("{ACCT}:{}", rng.gen_range(0..ACCT_KEYS))),
        45..=69 => Some(format!("{GATE}:{}", rng.gen_range(0..API_KEYS))),
        _ => None,
    }
}

fn pick_rate(rng: &mut StdRng, hot: &str) -> String {
    if rng.gen_bool(0.8) {
        hot.to_owned()
    } else {
        format!("{RATE}:{}", rng.gen_range(0..RATE_KEYS))
    }
}
