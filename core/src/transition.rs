//! What a step returns: the instance's next move.

use chrono::{DateTime, Utc};
use serde_json::Value;
use std::time::Duration;

/// A concurrency key: `"name:rest"`, or built from a `(name, id)` pair.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConcurrencyKey(pub(crate) String);

impl ConcurrencyKey {
    /// The key as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The part before the first `:`, matched against `concurrency_limits`.
    pub fn name(&self) -> &str {
        crate::validate::key_name(&self.0)
    }
}

impl From<&str> for ConcurrencyKey {
    fn from(s: &str) -> Self {
        ConcurrencyKey(s.to_owned())
    }
}

impl From<String> for ConcurrencyKey {
    fn from(s: String) -> Self {
        ConcurrencyKey(s)
    }
}

impl<N: std::fmt::Display, I: std::fmt::Display> From<(N, I)> for ConcurrencyKey {
    fn from((name, id): (N, I)) -> Self {
        ConcurrencyKey(format!("{name}:{id}"))
    }
}

impl std::fmt::Display for ConcurrencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a `next` transition does with the instance's concurrency key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KeyChange {
    /// Keep the current key (the default: keys persist across steps).
    #[default]
    Keep,
    /// Release it: the next step runs without a key.
    Release,
    /// Switch to another key, admitted at the next claim.
    Set(ConcurrencyKey),
}

/// Options of a `next` transition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NextOptions {
    /// Keep, release or switch the concurrency key.
    pub concurrency_key: KeyChange,
    /// A rate-limit key for the next step (rate limits apply to one step).
    pub rate_limit: Option<String>,
    /// Run the next step no sooner than this.
    pub delay: Option<Duration>,
}

/// What an await waits for; at least one of the three must be set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AwaitOn {
    /// Woken by `signal(name, payload)`.
    pub signal: Option<String>,
    /// Woken with a timeout marker after this long.
    pub timeout: Option<Duration>,
    /// Woken with a timeout marker at this time.
    pub until: Option<DateTime<Utc>>,
}

impl AwaitOn {
    /// Wait for a signal by name.
    pub fn signal(name: impl Into<String>) -> Self {
        AwaitOn {
            signal: Some(name.into()),
            ..Default::default()
        }
    }

    /// Wait for a time to pass.
    pub fn timeout(after: Duration) -> Self {
        AwaitOn {
            timeout: Some(after),
            ..Default::default()
        }
    }

    /// Wait until a point in time.
    pub fn until(at: DateTime<Utc>) -> Self {
        AwaitOn {
            until: Some(at),
            ..Default::default()
        }
    }

    /// Also give up waiting for the signal after `after`.
    pub fn or_timeout(mut self, after: Duration) -> Self {
        self.timeout = Some(after);
        self
    }
}

/// The next move of an instance, returned by a step.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// Run `step` next with `state`.
    Next {
        step: String,
        state: Value,
        options: NextOptions,
    },
    /// Finished.
    Done { state: Value },
    /// Park until a signal, a timeout or a time; then run `step`.
    Await {
        step: String,
        state: Value,
        on: AwaitOn,
    },
    /// Run this step again after `delay`; does not count as an attempt.
    Snooze { delay: Duration },
    /// Failed: retried with backoff until `max_attempts`, then discarded.
    Error {
        reason: String,
        detail: Option<String>,
    },
    /// Failed for good: discarded now, whatever attempts are left (a
    /// permanent error, such as a request the partner API will never accept).
    Discard { reason: String },
    /// Stop for good.
    Cancel { reason: String },
}

impl Transition {
    /// `next(step, state)`: keep the key, no delay.
    pub fn next(step: impl Into<String>, state: Value) -> Self {
        Transition::Next {
            step: step.into(),
            state,
            options: NextOptions::default(),
        }
    }

    /// `next` with options.
    pub fn next_with(step: impl Into<String>, state: Value, options: NextOptions) -> Self {
        Transition::Next {
            step: step.into(),
            state,
            options,
        }
    }

    /// `done(state)`.
    pub fn done(state: Value) -> Self {
        Transition::Done { state }
    }

    /// `await(step, state, on)`.
    pub fn await_on(step: impl Into<String>, state: Value, on: AwaitOn) -> Self {
        Transition::Await {
            step: step.into(),
            state,
            on,
        }
    }

    /// `snooze(delay)`.
    pub fn snooze(delay: Duration) -> Self {
        Transition::Snooze { delay }
    }

    /// `error(reason)`.
    pub fn error(reason: impl Into<String>) -> Self {
        Transition::Error {
            reason: reason.into(),
            detail: None,
        }
    }

    /// `discard(reason)`: a permanent error, not retried.
    pub fn discard(reason: impl Into<String>) -> Self {
        Transition::Discard {
            reason: reason.into(),
        }
    }

    /// `cancel(reason)`.
    pub fn cancel(reason: impl Into<String>) -> Self {
        Transition::Cancel {
            reason: reason.into(),
        }
    }

    /// The transition's kind, as recorded.
    pub fn kind(&self) -> &'static str {
        match self {
            Transition::Next { .. } => "next",
            Transition::Done { .. } => "done",
            Transition::Await { .. } => "await",
            Transition::Snooze { .. } => "snooze",
            Transition::Error { .. } => "error",
            Transition::Discard { .. } => "discard",
            Transition::Cancel { .. } => "cancel",
        }
    }
}

/// Why an awaiting step was woken, seen by the step that runs next.
#[derive(Debug, Clone, PartialEq)]
pub enum Wake {
    /// A signal arrived.
    Signal { name: String, payload: Value },
    /// The timeout or the `until` time passed.
    Timeout,
}

impl Wake {
    pub(crate) fn from_json(v: Option<Value>) -> Option<Wake> {
        let v = v?;
        if v.get("timeout").and_then(Value::as_bool) == Some(true) {
            return Some(Wake::Timeout);
        }
        let name = v.get("signal")?.as_str()?.to_owned();
        let payload = v.get("payload").cloned().unwrap_or(Value::Null);
        Some(Wake::Signal { name, payload })
    }
}
