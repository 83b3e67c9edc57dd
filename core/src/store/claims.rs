//! The claim path's one statement (`sql/functions/handoff.sql`) and what the
//! database says a node holds.

use super::{Limits, Store};
use crate::outcome::{Claimed, OutcomeRow};
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{Column, Row};

/// A pick locks a window of this many candidates per row wanted (plus 8):
/// rows one limit turns away leave room for the next ones.
const WINDOW_FACTOR: f64 = 1.0;

/// What a handoff call is to claim for one queue.
#[derive(Clone, Copy)]
pub(crate) struct Demand<'a> {
    pub queue: &'a str,
    pub rows: usize,
    /// A pick would find nothing new: only promotions and reservations.
    pub skip_pick: bool,
    /// Reserve successors for the keyed rows claimed or promoted.
    pub reserve: bool,
}

/// What one handoff call did.
pub(crate) struct Handoff {
    /// Outcomes applied (the others were fenced: no longer executing under
    /// this claim).
    pub written: usize,
    /// Keys the outcomes freed that no row took over, plus reserved rows
    /// given back: either may let rows of other nodes run.
    pub released: usize,
    /// Rows claimed by handing freed keys and slots over (also in `claimed`).
    pub handed_over: usize,
    /// The keys the outcomes freed that are still free after the call.
    pub released_keys: Vec<String>,
    /// The successors the outcomes name that run under this node now.
    pub promoted: Vec<i64>,
    /// Runnable rows the call's picks found under a rate limit that allowed
    /// no start now, and parked (0 from a pick of an earlier release).
    pub rate_parked: u64,
    pub claimed: Vec<Claimed>,
}

/// A row the database says a node holds.
pub(crate) struct Held {
    pub row: Claimed,
    /// Executing; otherwise reserved as a successor.
    pub executing: bool,
}

/// One handoff call's arguments besides the node's configuration.
pub(crate) struct Call<'a> {
    pub node_id: &'a str,
    /// Whether to notify other nodes of keys and slots left free.
    pub notify: bool,
    pub outcomes: &'a [OutcomeRow],
    pub demand: &'a [Demand<'a>],
    /// Reservations given back: (id, token).
    pub unreserve: &'a [(i64, i64)],
}

impl Store {
    /// The `handoff` statement on `exec`: its rows, read by [`read_handoff`].
    pub async fn handoff<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        call: &Call<'_>,
        limits: &Limits,
    ) -> sqlx::Result<Vec<PgRow>> {
        let d = call.demand;
        let queues: Vec<&str> = d.iter().map(|d| d.queue).collect();
        let rows: Vec<i32> = d.iter().map(|d| d.rows as i32).collect();
        let skip_pick: Vec<bool> = d.iter().map(|d| d.skip_pick).collect();
        let reserve: Vec<bool> = d.iter().map(|d| d.reserve).collect();
        let (unreserve, unreserve_tokens): (Vec<i64>, Vec<i64>) =
            call.unreserve.iter().copied().unzip();
        let (mut ids, mut tokens, mut steps, mut states) = (vec![], vec![], vec![], vec![]);
        let mut outcomes = Vec::new();
        for o in call.outcomes {
            match o.plain() {
                Some((step, state)) => {
                    ids.push(o.id);
                    tokens.push(o.token);
                    steps.push(step);
                    states.push(Json(state));
                }
                None => outcomes.push(o),
            }
        }
        sqlx::query(&self.sql.handoff)
            .bind(&ids)
            .bind(&tokens)
            .bind(&steps)
            .bind(&states)
            .bind(Json(&outcomes))
            .bind(call.node_id)
            .bind(&self.sql.channel)
            .bind(call.notify)
            .bind(&queues)
            .bind(&rows)
            .bind(&skip_pick)
            .bind(&reserve)
            .bind(&unreserve)
            .bind(&unreserve_tokens)
            .bind(WINDOW_FACTOR)
            .bind(&limits.workflows)
            .bind(&limits.gate_names)
            .bind(&limits.gate_limits)
            .bind(&limits.gate_shards)
            .bind(&limits.rate_names)
            .bind(&limits.rate_intervals)
            .bind(&limits.rate_tolerances)
            .fetch_all(exec)
            .await
    }

    /// Of `ids`, the instances whose cancellation was requested.
    pub async fn cancel_requested<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        ids: &[i64],
    ) -> sqlx::Result<Vec<i64>> {
        sqlx::query_scalar(&self.sql.cancel_requested)
            .bind(ids)
            .fetch_all(exec)
            .await
    }

    /// What the database says `node_id` holds: executing, or reserved.
    pub async fn held_by_node<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        node_id: &str,
    ) -> sqlx::Result<Vec<Held>> {
        let rows = sqlx::query(&self.sql.held_by_node)
            .bind(node_id)
            .fetch_all(exec)
            .await?;
        let Some(first) = rows.first() else {
            return Ok(Vec::new());
        };
        let cols = ClaimColumns::of(first)?;
        rows.iter()
            .map(|r| {
                Ok(Held {
                    row: cols.read(r)?,
                    executing: r.try_get("executing")?,
                })
            })
            .collect()
    }
}

/// A handoff's rows: its header, the rows it claimed, and those it reserved.
pub(crate) fn read_handoff(rows: &[PgRow]) -> sqlx::Result<(Handoff, Vec<Claimed>)> {
    let mut h = Handoff {
        written: 0,
        released: 0,
        handed_over: 0,
        released_keys: Vec::new(),
        promoted: Vec::new(),
        rate_parked: 0,
        claimed: Vec::with_capacity(rows.len()),
    };
    let mut reserved = Vec::new();
    let Some(first) = rows.first() else {
        return Ok((h, reserved));
    };
    let cols = ClaimColumns::of(first)?;
    let reserved_at = first.try_column("reserved")?.ordinal();
    for r in rows {
        match r.try_get::<Option<bool>, _>(reserved_at)? {
            None => {
                h.written = r.try_get::<i32, _>("written")? as usize;
                h.released = r.try_get::<i32, _>("released")? as usize;
                h.handed_over = r.try_get::<i32, _>("handed_over")? as usize;
                h.released_keys = r.try_get("released_keys")?;
                h.promoted = r.try_get("promoted")?;
                let parked: Option<i64> = r.try_get("rate_parked")?;
                h.rate_parked = parked.map_or(0, |n| n.max(0) as u64);
            }
            Some(false) => h.claimed.push(cols.read(r)?),
            Some(true) => reserved.push(cols.read(r)?),
        }
    }
    Ok((h, reserved))
}

/// Where a claimed row's columns are in a result, looked up by name once
/// per result: a lookup by name hashes the name, and a call reads thousands
/// of rows of twelve columns.
struct ClaimColumns([usize; 12]);

impl ClaimColumns {
    const NAMES: [&'static str; 12] = [
        "id",
        "workflow",
        "step",
        "state",
        "queue",
        "attempt",
        "max_attempts",
        "concurrency_key",
        "gate_shard",
        "rate_key",
        "wake",
        "token",
    ];

    fn of(r: &PgRow) -> sqlx::Result<ClaimColumns> {
        let mut at = [0; 12];
        for (i, name) in Self::NAMES.iter().enumerate() {
            at[i] = r.try_column(*name)?.ordinal();
        }
        Ok(ClaimColumns(at))
    }

    /// A claimed row, as the claim path's statements return it.
    fn read(&self, r: &PgRow) -> sqlx::Result<Claimed> {
        let [id, workflow, step, state, queue, attempt, max_attempts, concurrency_key, gate_shard, rate_key, wake, token] =
            self.0;
        Ok(Claimed {
            id: r.try_get(id)?,
            workflow: r.try_get(workflow)?,
            step: r.try_get(step)?,
            state: r.try_get(state)?,
            queue: r.try_get(queue)?,
            attempt: r.try_get(attempt)?,
            max_attempts: r.try_get(max_attempts)?,
            concurrency_key: r.try_get(concurrency_key)?,
            gate_shard: r.try_get(gate_shard)?,
            rate_key: r.try_get(rate_key)?,
            wake: r.try_get(wake)?,
            token: r.try_get(token)?,
        })
    }
}
