//! Inserting instances: validation, then one statement from parallel arrays,
//! or `COPY` for large batches of rows due now.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::instance::{NewInstance, Schedule};
use crate::node::local;
use crate::node::Shared;
use crate::outcome::{check_rate_key, Claimed};
use crate::unique::Inserted;
use crate::validate;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgConnection, Row};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Write;
use std::sync::Arc;

/// From this many rows, all due now, a batch goes in by `COPY`: about a
/// third faster than the statement, whose parameter arrays PostgreSQL has to
/// unnest, at the cost of four round trips instead of one.
pub(crate) const COPY_FROM: usize = 1000;

/// Validated rows as the columns the statement binds.
pub(crate) struct Rows {
    workflow: Vec<String>,
    step: Vec<String>,
    state: Vec<String>,
    queue: Vec<String>,
    priority: Vec<i16>,
    ckey: Vec<Option<String>>,
    rkey: Vec<Option<String>>,
    max_attempts: Vec<i32>,
    delay: Vec<Option<f64>>,
    at: Vec<Option<DateTime<Utc>>>,
    /// A unique row's spec for the SQL function `unique_key`.
    unique: Vec<Option<String>>,
}

impl Rows {
    /// Validate every instance (an error names the first bad one and inserts
    /// nothing) and resolve declared rate-limit keys.
    pub fn new(ctx: &Context, news: Vec<NewInstance>) -> Result<Rows> {
        let n = news.len();
        let mut r = Rows {
            workflow: Vec::with_capacity(n),
            step: Vec::with_capacity(n),
            state: Vec::with_capacity(n),
            queue: Vec::with_capacity(n),
            priority: Vec::with_capacity(n),
            ckey: Vec::with_capacity(n),
            rkey: Vec::with_capacity(n),
            max_attempts: Vec::with_capacity(n),
            delay: Vec::with_capacity(n),
            at: Vec::with_capacity(n),
            unique: Vec::with_capacity(n),
        };
        for (i, mut new) in news.into_iter().enumerate() {
            new.validate().map_err(|e| at_index(e, i, n))?;
            let declared = match &new.rate_limit {
                Some(k) => Some(k.clone()),
                None => ctx
                    .workflows
                    .get(&new.workflow)
                    .and_then(|w| w.rate_limit(&new.step, &new.state)),
            };
            if let Some(k) = &declared {
                check_rate_key(&ctx.cfg, k).map_err(|e| at_index(e, i, n))?;
            }
            let (delay, at) = match new.schedule {
                Schedule::Now => (None, None),
                Schedule::In(d) => (Some(d.as_secs_f64()), None),
                Schedule::At(t) => (None, Some(t)),
            };
            // Serialised once here: the size is checked and the text is what
            // PostgreSQL parses into jsonb.
            let text = new.state.to_string();
            validate::state_size("state", text.len()).map_err(|e| at_index(e, i, n))?;
            let (queue, priority, max_attempts) =
                new.resolve(ctx.cfg.workflow_defaults.get(&new.workflow));
            r.unique.push(new.unique_spec().map(|s| s.to_string()));
            r.workflow.push(new.workflow);
            r.step.push(new.step);
            r.state.push(text);
            r.queue.push(queue);
            r.priority.push(priority);
            r.ckey.push(new.concurrency_key);
            r.rkey.push(declared);
            r.max_attempts.push(max_attempts);
            r.delay.push(delay);
            r.at.push(at);
        }
        Ok(r)
    }

    pub fn len(&self) -> usize {
        self.workflow.len()
    }

    fn due_now(&self, i: usize) -> bool {
        self.delay[i].is_none() && self.at[i].is_none()
    }

    /// The queues of the rows, each once.
    pub fn queues(&self) -> Vec<String> {
        let set: BTreeSet<&String> = self.queue.iter().collect();
        set.into_iter().cloned().collect()
    }

    /// Whether any row is unique.
    pub fn any_unique(&self) -> bool {
        self.unique.iter().any(Option::is_some)
    }

    /// Whether the batch is large, due now and not unique: then `copy` inserts it.
    pub fn wants_copy(&self) -> bool {
        self.len() >= COPY_FROM
            && (0..self.len()).all(|i| self.due_now(i) && self.unique[i].is_none())
    }

    /// The rows at `idx`, in that order.
    fn subset(&self, idx: &[usize]) -> Rows {
        fn pick<T: Clone>(v: &[T], idx: &[usize]) -> Vec<T> {
            idx.iter().map(|&i| v[i].clone()).collect()
        }
        Rows {
            workflow: pick(&self.workflow, idx),
            step: pick(&self.step, idx),
            state: pick(&self.state, idx),
            queue: pick(&self.queue, idx),
            priority: pick(&self.priority, idx),
            ckey: pick(&self.ckey, idx),
            rkey: pick(&self.rkey, idx),
            max_attempts: pick(&self.max_attempts, idx),
            delay: pick(&self.delay, idx),
            at: pick(&self.at, idx),
            unique: pick(&self.unique, idx),
        }
    }
}

/// How often a unique row whose holder finished while it was being looked up
/// is inserted again before the insert gives up.
const UNIQUE_ROUNDS: usize = 5;

/// Insert with one statement (see `insert`), then look up the holders of
/// unique rows that conflicted with an insert the statement could not see.
/// A holder may have left the unique index meanwhile (finished outside its
/// statuses, or pruned): those rows are inserted again.
pub(crate) async fn insert_unique(
    ctx: &Context,
    conn: &mut PgConnection,
    rows: Rows,
    here: Option<&Arc<Shared>>,
) -> Result<Vec<Inserted>> {
    let (mut out, mut unseen) = insert(ctx, &mut *conn, &rows, here).await?;
    let mut rounds = 0;
    while !unseen.is_empty() {
        let keys: Vec<&[u8]> = unseen.iter().map(|(_, k)| k.as_slice()).collect();
        let holders: Vec<(Vec<u8>, i64)> = sqlx::query_as(&ctx.store.sql.unique_holders)
            .bind(&keys)
            .fetch_all(&mut *conn)
            .await?;
        let holders: HashMap<Vec<u8>, i64> = holders.into_iter().collect();
        let mut again = Vec::new();
        for (i, key) in unseen {
            match holders.get(&key) {
                Some(&id) => out[i] = Inserted { id, conflict: true },
                None => again.push(i),
            }
        }
        if again.is_empty() {
            break;
        }
        rounds += 1;
        if rounds == UNIQUE_ROUNDS {
            return Err(Error::Contended(format!(
                "a unique insert kept meeting an instance that finished before it could be read \
                 back ({UNIQUE_ROUNDS} rounds); nothing of the retried rows was inserted"
            )));
        }
        let (retried, still) = insert(ctx, &mut *conn, &rows.subset(&again), None).await?;
        for (j, r) in retried.into_iter().enumerate() {
            out[again[j]] = r;
        }
        unseen = still.into_iter().map(|(j, k)| (again[j], k)).collect();
    }
    Ok(out)
}

/// The rows of a statement that conflicted with a holder it could not see,
/// by index, with their unique key.
type Unseen = Vec<(usize, Vec<u8>)>;

/// Insert with one statement; `here` is this process's node, which may start
/// rows at once (only for a statement that commits on its own).
async fn insert(
    ctx: &Context,
    conn: &mut PgConnection,
    rows: &Rows,
    here: Option<&Arc<Shared>>,
) -> Result<(Vec<Inserted>, Unseen)> {
    let n = rows.len();
    // Claim slots on the node for what it can start now; the rows that got
    // one are inserted as claimed by it.
    let mut start = vec![false; n];
    let mut slots = HashMap::new();
    let mut started = Vec::new();
    if let Some(sh) = here {
        let mut startable: HashMap<&str, Vec<usize>> = HashMap::new();
        for i in 0..n {
            if rows.due_now(i)
                && rows.unique[i].is_none()
                && rows.ckey[i].is_none()
                && rows.rkey[i].is_none()
                && ctx.workflows.contains_key(&rows.workflow[i])
            {
                startable.entry(&rows.queue[i]).or_default().push(i);
            }
        }
        for (q, idx) in startable {
            let Some(permit) = local::local_slots(sh, q, idx.len()) else {
                continue;
            };
            for &i in &idx[..permit.num_permits()] {
                start[i] = true;
                started.push((i, claimed_here(rows, i)));
            }
            slots.insert(q.to_owned(), permit);
        }
    }
    let claiming = match here {
        Some(sh) if !started.is_empty() => Some(local::claiming(sh).await),
        _ => None,
    };
    let l = &ctx.limits;
    let result = sqlx::query(&ctx.store.sql.insert)
        .bind(&rows.workflow)
        .bind(&rows.step)
        .bind(&rows.state)
        .bind(&rows.queue)
        .bind(&rows.priority)
        .bind(&rows.ckey)
        .bind(&rows.rkey)
        .bind(&rows.max_attempts)
        .bind(&rows.delay)
        .bind(&rows.at)
        .bind(&ctx.store.sql.channel)
        .bind(start)
        .bind(&ctx.cfg.node_id)
        .bind(&l.gate_names)
        .bind(&l.gate_limits)
        .bind(&l.rate_names)
        .bind(&l.rate_intervals)
        .bind(&l.rate_tolerances)
        .bind(ctx.cfg.lease.as_secs_f64())
        .bind(&rows.unique)
        .fetch_all(&mut *conn)
        .await;
    // Rows come back in input order; the started ones with their state.
    let read = result.map_err(Error::from).and_then(|out| {
        let mut inserted = Vec::with_capacity(out.len());
        let mut unseen = Vec::new();
        for (i, r) in out.iter().enumerate() {
            let conflict: bool = r.try_get("conflict")?;
            match r.try_get::<Option<i64>, _>("id")? {
                Some(id) => inserted.push(Inserted { id, conflict }),
                None => {
                    inserted.push(Inserted { id: 0, conflict });
                    unseen.push((i, r.try_get("ukey")?));
                }
            }
        }
        // Claimed here: those that came back executing, with their state
        // (not one whose queue is paused).
        let mut claimed = Vec::with_capacity(started.len());
        for (i, mut c) in started {
            if let Some(state) = out[i].try_get::<Option<Value>, _>("state")? {
                c.id = inserted[i].id;
                c.state = state;
                claimed.push(c);
            }
        }
        Ok((inserted, unseen, claimed))
    });
    // On an error (or this future dropped before here) `claiming` goes
    // undone: the node looks for claims it never got.
    let (inserted, unseen, claimed) = read?;
    if let Some(sh) = here.filter(|_| !claimed.is_empty()) {
        local::start_inserted(sh, claimed, slots);
    }
    if let Some(c) = claiming {
        c.done();
    }
    Ok((inserted, unseen))
}

/// A row the insert claims for this node, as the node will run it.
fn claimed_here(rows: &Rows, i: usize) -> Claimed {
    Claimed {
        id: 0,
        workflow: rows.workflow[i].clone(),
        step: rows.step[i].clone(),
        state: Value::Null,
        queue: rows.queue[i].clone(),
        attempt: 1,
        max_attempts: rows.max_attempts[i],
        concurrency_key: None,
        gate_shard: None,
        rate_key: None,
        wake: None,
        // An insert's claim is the row's first.
        token: 1,
    }
}

/// The most `COPY` data sent in one message.
const COPY_PIECE: usize = 1024 * 1024;

/// Insert rows due now with `COPY`, in one transaction: ids drawn from the
/// table's sequence first (so they come back in order), the rows copied with
/// them, the queues woken on commit.
pub(crate) async fn copy(ctx: &Context, conn: &mut PgConnection, rows: Rows) -> Result<Vec<i64>> {
    let mut tx = sqlx::Connection::begin(conn).await?;
    let ids: Vec<i64> = sqlx::query_scalar(&ctx.store.sql.next_ids)
        .bind(rows.len() as i64)
        .fetch_all(&mut *tx)
        .await?;
    let parked = parked_on_copy(ctx, &mut tx, &rows).await?;
    let mut data = String::with_capacity(rows.len() * 64);
    for (i, id) in ids.iter().enumerate() {
        let _ = write!(data, "{id}\t");
        for text in [
            &rows.workflow[i],
            &rows.step[i],
            &rows.state[i],
            &rows.queue[i],
        ] {
            escape(&mut data, text);
            data.push('\t');
        }
        let _ = write!(data, "{}\t", rows.priority[i]);
        for text in [&rows.ckey[i], &rows.rkey[i]] {
            match text {
                Some(t) => escape(&mut data, t),
                None => data.push_str("\\N"),
            }
            data.push('\t');
        }
        let parked = parked[i].unwrap_or("\\N");
        let _ = writeln!(data, "{}\tavailable\t{parked}", rows.max_attempts[i]);
    }
    let mut copy = tx.copy_in_raw(&ctx.store.sql.copy_in).await?;
    // In pieces: a connection keeps its write buffer at the largest message
    // it ever sent, so one message of a large batch (tens of MB after a
    // producer's catch-up) stayed allocated on a pooled connection for good.
    for piece in data.as_bytes().chunks(COPY_PIECE) {
        copy.send(piece).await?;
    }
    copy.finish().await?;
    let queues: Vec<&String> = rows
        .queue
        .iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    sqlx::query(&ctx.store.sql.notify_queues)
        .bind(&ctx.store.sql.channel)
        .bind(queues)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(ids)
}

/// How to park the rows of a batch due now: those of a workflow none of
/// their queue's live nodes runs ("workflow"), else those beyond the room
/// their key has ("key"), else beyond the room their rate limit has
/// ("rate"), in the order the pick would take them (priority, then the
/// batch's order); see `orphaned`, `insert_room` and `rate_room` in
/// `sql/functions/`.
async fn parked_on_copy(
    ctx: &Context,
    tx: &mut sqlx::PgConnection,
    rows: &Rows,
) -> Result<Vec<Option<&'static str>>> {
    let pairs: BTreeSet<(&str, &str)> = (0..rows.len())
        .map(|i| (rows.queue[i].as_str(), rows.workflow[i].as_str()))
        .collect();
    let (queues, workflows): (Vec<&str>, Vec<&str>) = pairs.into_iter().unzip();
    let orphans: Vec<(String, String)> = sqlx::query_as(&ctx.store.sql.orphans)
        .bind(&queues)
        .bind(&workflows)
        .bind(ctx.cfg.lease.as_secs_f64())
        .fetch_all(&mut *tx)
        .await?;
    let orphans: HashSet<(&str, &str)> = orphans
        .iter()
        .map(|(q, w)| (q.as_str(), w.as_str()))
        .collect();
    let mut parked: Vec<Option<&'static str>> = vec![None; rows.len()];
    if !orphans.is_empty() {
        for (i, p) in parked.iter_mut().enumerate() {
            if orphans.contains(&(rows.queue[i].as_str(), rows.workflow[i].as_str())) {
                *p = Some("workflow");
            }
        }
    }
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| (rows.priority[i], i));
    let keys: Vec<&str> = (0..rows.len())
        .filter(|&i| parked[i].is_none())
        .filter_map(|i| rows.ckey[i].as_deref())
        .collect();
    if !keys.is_empty() {
        let room = sqlx::query_as::<_, (String, i32)>(&ctx.store.sql.insert_room)
            .bind(&keys)
            .bind(&ctx.limits.gate_names)
            .bind(&ctx.limits.gate_limits)
            .fetch_all(&mut *tx)
            .await?;
        spend_room(&order, &rows.ckey, room, "key", &mut parked);
    }
    let rated: Vec<&str> = (0..rows.len())
        .filter(|&i| parked[i].is_none())
        .filter_map(|i| rows.rkey[i].as_deref())
        .collect();
    if !rated.is_empty() {
        let room = sqlx::query_as::<_, (String, i32)>(&ctx.store.sql.rate_room)
            .bind(&rated)
            .bind(rows.len() as i32)
            .bind(&ctx.limits.rate_names)
            .bind(&ctx.limits.rate_intervals)
            .bind(&ctx.limits.rate_tolerances)
            .fetch_all(&mut *tx)
            .await?;
        spend_room(&order, &rows.rkey, room, "rate", &mut parked);
    }
    Ok(parked)
}

/// Park, as `why`, the rows (in `order`) of each key in `keys` beyond the
/// room it has; rows already parked take no room.
fn spend_room(
    order: &[usize],
    keys: &[Option<String>],
    room: Vec<(String, i32)>,
    why: &'static str,
    parked: &mut [Option<&'static str>],
) {
    let mut room: HashMap<String, i32> = room.into_iter().collect();
    for &i in order {
        let Some(k) = &keys[i] else { continue };
        if parked[i].is_some() {
            continue;
        }
        match room.get_mut(k) {
            Some(n) if *n > 0 => *n -= 1,
            _ => parked[i] = Some(why),
        }
    }
}

/// `COPY`'s text format: backslash, tab, newline and carriage return escaped.
fn escape(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
}

fn at_index(e: Error, i: usize, n: usize) -> Error {
    match e {
        Error::InvalidInput { field, reason } if n > 1 => Error::InvalidInput {
            field,
            reason: format!("{reason} (instance {i} of {n}; nothing was inserted)"),
        },
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn copy_text_is_escaped() {
        let mut out = String::new();
        escape(&mut out, "a\\b\tc\nd\re \"f\"");
        assert_eq!(out, "a\\\\b\\tc\\nd\\re \"f\"");
    }
}
