//! Why an instance waits: the rows and counters that hold it back, read
//! from the database and said in a sentence each.

use super::Engine;
use crate::error::{Error, Result};
use chrono::{DateTime, Utc};
use sqlx::Row;
use std::fmt;

/// Rows ahead of an instance in its queue are counted up to this many.
const AHEAD_CAP: i64 = 10_000;

/// One reason an instance is not running now, or what it is doing. Its
/// `Display` is the sentence the dashboard and `gendurable get` show.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Wait {
    /// Waiting for its time: a delay, a retry's backoff, a snooze.
    Scheduled { at: DateTime<Utc>, in_secs: f64 },
    /// Its queue is paused: no node claims from it until it is resumed.
    QueuePaused { queue: String, since: DateTime<Utc> },
    /// A node reserved it as the successor of a step it ran, and runs it
    /// next.
    Reserved { node: String },
    /// Its K = 1 key is held by another instance (`holder`, executing on
    /// `node` for `held_secs`); `None` while a freed key is handed over.
    KeyHeld {
        key: String,
        holder: Option<i64>,
        node: Option<String>,
        held_secs: Option<f64>,
    },
    /// Its gate key has every slot in use.
    GateFull {
        key: String,
        in_flight: i64,
        limit: i64,
    },
    /// Its rate limit allows no start now; the next one comes within
    /// `next_in_secs` (sooner if the limit's burst allows).
    RateLimited { key: String, next_in_secs: f64 },
    /// No live node serves its queue.
    NoNodeServesQueue { queue: String },
    /// Live nodes serve its queue, but none runs its workflow.
    NoNodeRunsWorkflow { workflow: String, queue: String },
    /// Runnable: it starts when a node serving its queue has a free slot;
    /// `ahead` rows of the queue come first (counted up to 10,000).
    Runnable { queue: String, ahead: i64 },
    /// Running on `node` for `running_secs`; `silent_secs`: how long since
    /// the node's last heartbeat, when longer than its lease (it is presumed
    /// dead and the row is rescued at the next reaper pass).
    Executing {
        node: String,
        running_secs: f64,
        silent_secs: Option<f64>,
    },
    /// Waiting for a signal, or a time, or whichever comes first.
    Awaiting {
        signal: Option<String>,
        until: Option<DateTime<Utc>>,
    },
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wait::Scheduled { at, in_secs } if *in_secs > 0.0 => {
                write!(
                    f,
                    "scheduled for {} (in {})",
                    at.to_rfc3339(),
                    secs(*in_secs)
                )
            }
            Wait::Scheduled { at, .. } => write!(
                f,
                "due since {}: the next maintenance pass makes it runnable",
                at.to_rfc3339()
            ),
            Wait::QueuePaused { queue, since } => write!(
                f,
                "queue {queue} is paused (since {}): no node claims from it until it is resumed",
                since.to_rfc3339()
            ),
            Wait::Reserved { node } => write!(f, "reserved by node {node}, which runs it next"),
            Wait::KeyHeld {
                key,
                holder: Some(id),
                node,
                held_secs,
            } => {
                write!(f, "key {key} is held by #{id}")?;
                if let Some(n) = node {
                    write!(f, " on node {n}")?;
                }
                if let Some(s) = held_secs {
                    write!(f, " since {}", secs(*s))?;
                }
                Ok(())
            }
            Wait::KeyHeld { key, .. } => {
                write!(
                    f,
                    "key {key} has no room yet (a freed slot is being handed over)"
                )
            }
            Wait::GateFull {
                key,
                in_flight,
                limit,
            } => write!(f, "gate {key} full: {in_flight}/{limit}"),
            Wait::RateLimited { key, next_in_secs } => {
                write!(f, "rate limit {key}: next start in {}", secs(*next_in_secs))
            }
            Wait::NoNodeServesQueue { queue } => write!(f, "no live node serves queue {queue}"),
            Wait::NoNodeRunsWorkflow { workflow, queue } => write!(
                f,
                "no live node runs workflow {workflow} (live nodes serve queue {queue})"
            ),
            Wait::Runnable { queue, ahead } => {
                let n = if *ahead >= AHEAD_CAP {
                    format!("{AHEAD_CAP} or more rows")
                } else if *ahead == 1 {
                    "1 row".to_owned()
                } else {
                    format!("{ahead} rows")
                };
                write!(
                    f,
                    "runnable: starts when a node serving queue {queue} has a free slot ({n} ahead)"
                )
            }
            Wait::Executing {
                node,
                running_secs,
                silent_secs,
            } => {
                write!(f, "running on node {node} for {}", secs(*running_secs))?;
                if let Some(s) = silent_secs {
                    write!(
                        f,
                        "; the node has not heartbeated for {}: presumed dead, the row is rescued \
                         at the next reaper pass",
                        secs(*s)
                    )?;
                }
                Ok(())
            }
            Wait::Awaiting { signal, until } => match (signal, until) {
                (Some(s), Some(u)) => write!(
                    f,
                    "awaiting signal {s} or the time {}, whichever comes first",
                    u.to_rfc3339()
                ),
                (Some(s), None) => write!(f, "awaiting signal {s}"),
                (None, Some(u)) => write!(f, "awaiting the time {}", u.to_rfc3339()),
                (None, None) => write!(f, "awaiting"),
            },
        }
    }
}

/// A duration as people read it: `0.6 s`, `4 s`, `3 min 20 s`, `2 h 5 min`.
fn secs(s: f64) -> String {
    let s = s.max(0.0);
    if s < 10.0 {
        format!("{:.1} s", s)
    } else if s < 60.0 {
        format!("{} s", s.round() as i64)
    } else if s < 3600.0 {
        let t = s.round() as i64;
        format!("{} min {} s", t / 60, t % 60)
    } else {
        let t = (s / 60.0).round() as i64;
        format!("{} h {} min", t / 60, t % 60)
    }
}

fn since(now: DateTime<Utc>, then: DateTime<Utc>) -> f64 {
    (now - then).num_milliseconds() as f64 / 1000.0
}

impl Engine {
    /// Why instance `id` is not running now (several reasons can hold at
    /// once, e.g. a paused queue and a held key), or what it is doing.
    /// Empty for a finished instance. Each reason is read from the index or
    /// counter that decides it.
    pub async fn why(&self, id: i64) -> Result<Vec<Wait>> {
        let lease = self.ctx.cfg.lease.as_secs_f64();
        let r = sqlx::query(&self.ctx.store.sql.why_waiting)
            .bind(id)
            .bind(lease)
            .bind(AHEAD_CAP)
            .fetch_optional(self.ctx.db())
            .await?
            .ok_or(Error::NotFound(id))?;
        let status: String = r.try_get(0)?;
        let queue: String = r.try_get(1)?;
        let workflow: String = r.try_get(2)?;
        let key: Option<String> = r.try_get(3)?;
        let rate_key: Option<String> = r.try_get(4)?;
        let parked: Option<String> = r.try_get(5)?;
        let node: Option<String> = r.try_get(6)?;
        let scheduled_at: DateTime<Utc> = r.try_get(7)?;
        let attempted_at: Option<DateTime<Utc>> = r.try_get(8)?;
        let now: DateTime<Utc> = r.try_get(11)?;
        let paused_at: Option<DateTime<Utc>> = r.try_get(12)?;
        let mut why = Vec::new();
        if let Some(since) = paused_at {
            if matches!(status.as_str(), "scheduled" | "available") {
                why.push(Wait::QueuePaused {
                    queue: queue.clone(),
                    since,
                });
            }
        }
        match status.as_str() {
            "scheduled" => why.push(Wait::Scheduled {
                at: scheduled_at,
                in_secs: -since(now, scheduled_at),
            }),
            "executing" => {
                let heartbeat: Option<DateTime<Utc>> = r.try_get(21)?;
                let silent = heartbeat.map_or(lease, |h| since(now, h));
                why.push(Wait::Executing {
                    node: node.unwrap_or_default(),
                    running_secs: attempted_at.map_or(0.0, |a| since(now, a)),
                    silent_secs: (silent >= lease).then_some(silent),
                });
            }
            "awaiting" => why.push(Wait::Awaiting {
                signal: r.try_get(9)?,
                until: r.try_get(10)?,
            }),
            "available" => {
                let held = why.len();
                if let Some(n) = node {
                    why.push(Wait::Reserved { node: n });
                }
                if let Some(key) = key {
                    let limit: Option<i64> = r.try_get(16)?;
                    let in_flight: i64 = r.try_get(17)?;
                    let holder: Option<i64> = r.try_get(13)?;
                    match limit {
                        Some(limit) if in_flight >= limit || parked.as_deref() == Some("key") => {
                            why.push(Wait::GateFull {
                                key,
                                in_flight,
                                limit,
                            })
                        }
                        None if holder.is_some() || parked.as_deref() == Some("key") => {
                            let held_since: Option<DateTime<Utc>> = r.try_get(15)?;
                            why.push(Wait::KeyHeld {
                                key,
                                holder,
                                node: r.try_get(14)?,
                                held_secs: held_since.map(|h| since(now, h)),
                            })
                        }
                        _ => {}
                    }
                }
                if parked.as_deref() == Some("rate") {
                    let tat: Option<DateTime<Utc>> = r.try_get(18)?;
                    why.push(Wait::RateLimited {
                        key: rate_key.unwrap_or_default(),
                        next_in_secs: tat.map_or(0.0, |t| (-since(now, t)).max(0.0)),
                    });
                }
                let (serves_queue, runs_workflow): (bool, bool) = (r.try_get(19)?, r.try_get(20)?);
                if !serves_queue {
                    why.push(Wait::NoNodeServesQueue {
                        queue: queue.clone(),
                    });
                } else if !runs_workflow || parked.as_deref() == Some("workflow") {
                    why.push(Wait::NoNodeRunsWorkflow {
                        workflow,
                        queue: queue.clone(),
                    });
                }
                if why.len() == held {
                    why.push(Wait::Runnable {
                        queue,
                        ahead: r.try_get::<Option<i64>, _>(22)?.unwrap_or(0),
                    });
                }
            }
            _ => {}
        }
        Ok(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_read_as_sentences() {
        let key = Wait::KeyHeld {
            key: "account:7".into(),
            holder: Some(123),
            node: Some("x".into()),
            held_secs: Some(4.2),
        };
        assert_eq!(
            key.to_string(),
            "key account:7 is held by #123 on node x since 4.2 s"
        );
        let gate = Wait::GateFull {
            key: "stripe:acme".into(),
            in_flight: 100,
            limit: 100,
        };
        assert_eq!(gate.to_string(), "gate stripe:acme full: 100/100");
        let rate = Wait::RateLimited {
            key: "openai".into(),
            next_in_secs: 0.6,
        };
        assert_eq!(rate.to_string(), "rate limit openai: next start in 0.6 s");
        assert_eq!(secs(200.0), "3 min 20 s");
        assert_eq!(secs(7500.0), "2 h 5 min");
    }
}
