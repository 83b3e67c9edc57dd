//! The claim protocol in SQL, driven the way a node drives it: the `handoff`
//! function called with the engine's call shapes, and interleavings that a
//! lost reply, a rescue or a slow node produce. The database is the arbiter:
//! these hold whatever any node does.
mod support;

use gendurable::{Engine, GateConfig, NewInstance};
use serde_json::{json, Value};
use sqlx::{PgPool, Row};

const NODE: &str = "n1";

async fn engine(prefix: &str) -> (Engine, String) {
    let url = support::url();
    let schema = support::schema(prefix);
    let engine = support::builder(&url, &schema)
        .queue("default", 4)
        .concurrency_limit("api", GateConfig::new(2))
        .workflow_fn("Job", |_step, state, _ctx| async move {
            Ok(gendurable::Transition::done(state))
        })
        .build()
        .await
        .unwrap();
    (engine, schema)
}

/// What one handoff call returned.
#[derive(Debug, Default)]
struct Call {
    written: i32,
    promoted: Vec<i64>,
    /// (id, token) of the rows claimed, and of those reserved.
    claimed: Vec<(i64, i64)>,
    reserved: Vec<(i64, i64)>,
}

/// One handoff call as the node makes it: `outcomes`, then a claim of up to
/// `demand` rows of the default queue (reserving successors if `reserve`),
/// giving back `unreserve` (id, token).
async fn handoff(
    pool: &PgPool,
    schema: &str,
    outcomes: Value,
    demand: i32,
    reserve: bool,
    unreserve: &[(i64, i64)],
) -> Call {
    handoff_as(pool, schema, NODE, outcomes, demand, reserve, unreserve).await
}

/// `handoff` for node `node`.
async fn handoff_as(
    pool: &PgPool,
    schema: &str,
    node: &str,
    outcomes: Value,
    demand: i32,
    reserve: bool,
    unreserve: &[(i64, i64)],
) -> Call {
    call_as(
        pool,
        schema,
        node,
        &[],
        outcomes,
        demand,
        reserve,
        unreserve,
    )
    .await
}

/// `handoff_as` with keyless rows done or moved on to their next step,
/// `plain` (id, token, next step or `None` for done, state), sent as the
/// node sends them: in the call's typed arrays, not in `outcomes`.
#[allow(clippy::too_many_arguments)]
async fn call_as(
    db: impl sqlx::PgExecutor<'_>,
    schema: &str,
    node: &str,
    plain: &[(i64, i64, Option<&str>, Value)],
    outcomes: Value,
    demand: i32,
    reserve: bool,
    unreserve: &[(i64, i64)],
) -> Call {
    let plain_ids: Vec<i64> = plain.iter().map(|p| p.0).collect();
    let plain_tokens: Vec<i64> = plain.iter().map(|p| p.1).collect();
    let plain_steps: Vec<Option<&str>> = plain.iter().map(|p| p.2).collect();
    let plain_states: Vec<&Value> = plain.iter().map(|p| &p.3).collect();
    let (ids, tokens): (Vec<i64>, Vec<i64>) = unreserve.iter().copied().unzip();
    let (queues, demands): (Vec<&str>, Vec<i32>) = match demand {
        0 => (vec![], vec![]),
        n => (vec!["default"], vec![n]),
    };
    let rows = sqlx::query(&format!(
        "SELECT (claimed).id, (claimed).token, reserved, written, promoted
         FROM \"{schema}\".handoff($9, $10, $11, $12, $1, $2, 'chan', false, $3, $4, $5, $6, $7, $8, 1.0,
                                 '{{Job}}', '{{api}}', '{{2}}', '{{1}}', '{{}}', '{{}}', '{{}}')"
    ))
    .bind(outcomes)
    .bind(node)
    .bind(&queues)
    .bind(&demands)
    .bind(vec![false; queues.len()])
    .bind(vec![reserve; queues.len()])
    .bind(&ids)
    .bind(&tokens)
    .bind(&plain_ids)
    .bind(&plain_tokens)
    .bind(&plain_steps)
    .bind(&plain_states)
    .fetch_all(db)
    .await
    .unwrap();
    let mut call = Call::default();
    for r in rows {
        let row = || (r.get::<i64, _>(0), r.get::<i64, _>(1));
        match r.get::<Option<bool>, _>("reserved") {
            None => {
                call.written = r.get("written");
                call.promoted = r.get("promoted");
            }
            Some(false) => call.claimed.push(row()),
            Some(true) => call.reserved.push(row()),
        }
    }
    call
}

async fn row(
    pool: &PgPool,
    schema: &str,
    id: i64,
) -> (String, Option<String>, i64, Option<String>) {
    let r = sqlx::query(&format!(
        "SELECT status, node, token, concurrency_key FROM \"{schema}\".instances WHERE id = $1"
    ))
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

async fn gate_available(pool: &PgPool, schema: &str, key: &str) -> Option<i64> {
    sqlx::query_scalar(&format!(
        "SELECT sum(available)::bigint FROM \"{schema}\".gate_slots WHERE key = $1"
    ))
    .bind(key)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A `next` outcome of claim `token` of row `id`, which held `hkey` (gate
/// shard `gshard`), switching its key to `ckey`.
fn next(id: i64, token: i64, hkey: &str, gshard: Option<i32>, ckey: &str) -> Value {
    json!({"id": id, "token": token, "kind": "next", "status": "available", "step": "again",
           "state": {}, "set_key": true, "ckey": ckey, "hkey": hkey, "gshard": gshard})
}

/// Case 1: an outcome recorded by a call whose answer was lost, which also
/// claimed the same row again, is replayed by the node. The replay must not
/// apply to the new claim (the row would go back to `available` while its
/// step runs) nor credit the gate a second time.
#[tokio::test]
async fn a_replayed_outcome_never_applies_to_a_later_claim() {
    let (engine, schema) = engine("replay").await;
    let pool = engine.pool();
    let id = engine
        .insert(NewInstance::new("Job", json!({})).concurrency_key("api:1"))
        .await
        .unwrap();
    let first = handoff(pool, &schema, json!([]), 1, false, &[]).await;
    assert_eq!(first.claimed.len(), 1);
    let token = first.claimed[0].1;
    // The step switches the key from api:1 to api:2; the same call claims
    // the row again (its answer is what gets lost).
    let outcome = json!([next(id, token, "api:1", Some(0), "api:2")]);
    let second = handoff(pool, &schema, outcome.clone(), 1, false, &[]).await;
    assert_eq!((second.written, second.claimed.len()), (1, 1));
    assert!(second.claimed[0].1 > token, "a new claim, a new token");
    assert_eq!(gate_available(pool, &schema, "api:1").await, Some(2));
    assert_eq!(gate_available(pool, &schema, "api:2").await, Some(1));

    // The replay is fenced: the row stays executing under its new claim,
    // and neither gate moves.
    let replay = handoff(pool, &schema, outcome, 0, false, &[]).await;
    assert_eq!(replay.written, 0);
    let (status, node, now_token, key) = row(pool, &schema, id).await;
    assert_eq!(
        (status.as_str(), node.as_deref(), now_token, key.as_deref()),
        ("executing", Some(NODE), second.claimed[0].1, Some("api:2"))
    );
    assert_eq!(gate_available(pool, &schema, "api:1").await, Some(2));
    assert_eq!(gate_available(pool, &schema, "api:2").await, Some(1));
}

/// Keyless rows done or moved on to their next step go as typed arrays (the
/// common case): fenced like any outcome, and the row they leave is the row
/// the general outcome leaves, a cancellation requested meanwhile included.
#[tokio::test]
async fn a_plain_outcome_is_fenced_and_recorded_as_the_general_one() {
    let (engine, schema) = engine("plain").await;
    let pool = engine.pool();
    let new = || NewInstance::new("Job", json!({"n": 1}));
    let keyed = engine
        .insert(new().concurrency_key("acct:1"))
        .await
        .unwrap();
    let mut pairs = Vec::new();
    for _ in 0..3 {
        let x = engine.insert(new()).await.unwrap();
        pairs.push((x, engine.insert(new()).await.unwrap()));
    }
    let claimed = handoff(pool, &schema, json!([]), 7, false, &[])
        .await
        .claimed;
    assert_eq!(claimed.len(), 7);
    let token = |id| claimed.iter().find(|c| c.0 == id).map(|c| c.1).unwrap();
    let state = json!({"n": 2});
    let none = || json!([]);

    // A stale claim, another node, a row that holds a key (its outcome
    // frees the key: never through the arrays): none applies.
    let a = pairs[0].0;
    for (node, plain) in [
        (NODE, [(a, token(a) - 1, None, state.clone())]),
        ("n2", [(a, token(a), None, state.clone())]),
        (NODE, [(keyed, token(keyed), Some("again"), state.clone())]),
    ] {
        let call = call_as(pool, &schema, node, &plain, none(), 0, false, &[]).await;
        assert_eq!(call.written, 0, "{node} {plain:?}");
    }
    assert_eq!(row(pool, &schema, a).await.0, "executing");
    assert_eq!(row(pool, &schema, keyed).await.0, "executing");

    // The third pair's cancellation is requested while its rows run.
    sqlx::query(&format!(
        "UPDATE \"{schema}\".instances SET cancel_requested = true WHERE id = ANY ($1)"
    ))
    .bind(vec![pairs[2].0, pairs[2].1])
    .execute(pool)
    .await
    .unwrap();
    // Done, next, next: each pair's first row through the arrays, its second
    // through the JSON, all in one call.
    let steps = [None, Some("again"), Some("again")];
    let plain: Vec<_> = pairs
        .iter()
        .zip(steps)
        .map(|(&(x, _), step)| (x, token(x), step, state.clone()))
        .collect();
    let general: Vec<Value> = pairs
        .iter()
        .zip(steps)
        .map(|(&(_, y), step)| match step {
            None => json!({"id": y, "token": token(y), "kind": "done", "status": "completed",
                           "state": state}),
            Some(step) => json!({"id": y, "token": token(y), "kind": "next",
                                 "status": "available", "step": step, "state": state}),
        })
        .collect();
    let call = call_as(pool, &schema, NODE, &plain, json!(general), 0, false, &[]).await;
    assert_eq!(call.written, 6);
    let sql = format!(
        "SELECT to_jsonb(i) - 'id' - 'inserted_at' FROM \"{schema}\".instances i WHERE id = $1"
    );
    let left = |id| {
        sqlx::query_scalar::<_, Value>(&sql)
            .bind(id)
            .fetch_one(pool)
    };
    for (&(x, y), status) in pairs.iter().zip(["completed", "available", "cancelled"]) {
        let (left_x, left_y) = (left(x).await.unwrap(), left(y).await.unwrap());
        assert_eq!(left_x, left_y, "{status}");
        assert_eq!(left_x["status"], status);
        assert_eq!(left_x["state"], state);
    }

    // Replayed (its answer lost): fenced.
    let replay = call_as(pool, &schema, NODE, &plain, none(), 0, false, &[]).await;
    assert_eq!(replay.written, 0);
}

/// The same for a K = 1 key: the replay must not free the key of the row's
/// new claim, so the key's next row cannot start beside it.
#[tokio::test]
async fn a_replayed_outcome_never_frees_a_key_held_again() {
    let (engine, schema) = engine("replay_k1").await;
    let pool = engine.pool();
    let key = || NewInstance::new("Job", json!({})).concurrency_key("acct:1");
    let held = engine.insert(key()).await.unwrap();
    let first = handoff(pool, &schema, json!([]), 1, false, &[]).await;
    assert_eq!(first.claimed, vec![(held, 1)]);
    // A snooze keeps the key; the same call claims the row again.
    let outcome = json!([{"id": held, "token": 1, "kind": "snooze", "status": "available",
                          "hkey": "acct:1"}]);
    let second = handoff(pool, &schema, outcome.clone(), 1, false, &[]).await;
    assert_eq!(second.claimed, vec![(held, 2)]);
    let waiting = engine.insert(key()).await.unwrap();
    let replay = handoff(pool, &schema, outcome, 2, false, &[]).await;
    assert_eq!(replay.written, 0);
    assert!(
        replay.claimed.is_empty(),
        "acct:1 is held: nothing to claim"
    );
    assert_eq!(row(pool, &schema, held).await.0, "executing");
    assert_eq!(row(pool, &schema, waiting).await.0, "available");
}

/// An outcome applies only while the row holds the key and shard it names:
/// what it frees and credits is the row's own, never what a caller sends.
#[tokio::test]
async fn an_outcome_naming_another_key_or_shard_is_fenced() {
    let (engine, schema) = engine("names").await;
    let pool = engine.pool();
    let id = engine
        .insert(NewInstance::new("Job", json!({})).concurrency_key("api:1"))
        .await
        .unwrap();
    let token = handoff(pool, &schema, json!([]), 1, false, &[])
        .await
        .claimed[0]
        .1;
    for wrong in [
        next(id, token, "api:9", Some(0), "api:2"),
        next(id, token, "api:1", Some(1), "api:2"),
        next(id, token, "api:1", None, "api:2"),
        next(id, token + 1, "api:1", Some(0), "api:2"),
    ] {
        let call = handoff(pool, &schema, json!([wrong]), 0, false, &[]).await;
        assert_eq!(call.written, 0, "{wrong}");
    }
    assert_eq!(row(pool, &schema, id).await.0, "executing");
    assert_eq!(gate_available(pool, &schema, "api:9").await, None);
    assert_eq!(gate_available(pool, &schema, "api:1").await, Some(1));
    let right = handoff(
        pool,
        &schema,
        json!([next(id, token, "api:1", Some(0), "api:2")]),
        0,
        false,
        &[],
    )
    .await;
    assert_eq!(right.written, 1);
    assert_eq!(gate_available(pool, &schema, "api:1").await, Some(2));
}

/// Case 3: a successor is promoted only with its predecessor's outcome, and
/// the call says which successors run here. One whose predecessor was
/// rescued meanwhile is not admitted, stays reserved, and goes back. The
/// node starts a successor before the call: an outcome naming one the call
/// cannot promote does not apply, so the key stays held while it runs.
#[tokio::test]
async fn a_successor_is_admitted_only_with_its_predecessors_outcome() {
    let (engine, schema) = engine("promote").await;
    let pool = engine.pool();
    let key = || NewInstance::new("Job", json!({})).concurrency_key("acct:1");
    let ids = engine.insert_many(vec![key(), key(), key()]).await.unwrap();
    let (p, s) = (ids[0], ids[1]);
    let first = handoff(pool, &schema, json!([]), 1, true, &[]).await;
    assert_eq!(first.claimed, vec![(p, 1)]);
    assert_eq!(first.reserved, vec![(s, 1)]);

    // P is rescued while its node is slow (as the reaper does it).
    sqlx::query(&format!(
        "UPDATE \"{schema}\".instances SET status = 'available', node = NULL WHERE id = $1"
    ))
    .bind(p)
    .execute(pool)
    .await
    .unwrap();
    let done = |token: i64| {
        json!([{"id": p, "token": token, "kind": "done", "status": "completed", "state": {},
                "hkey": "acct:1", "next": s, "ntoken": 1}])
    };
    let fenced = handoff(pool, &schema, done(1), 0, false, &[]).await;
    assert_eq!((fenced.written, fenced.promoted.clone()), (0, vec![]));
    assert_eq!(row(pool, &schema, s).await.0, "available");
    assert_eq!(row(pool, &schema, s).await.1.as_deref(), Some(NODE));
    // The node gives the reservation back.
    handoff(pool, &schema, json!([]), 0, false, &[(s, 1)]).await;
    assert_eq!(row(pool, &schema, s).await.1, None);

    // Claimed again (token 2) and S reserved again (token 2): now the
    // outcome applies and S is promoted under token 3.
    let again = handoff(pool, &schema, json!([]), 1, true, &[]).await;
    assert_eq!(again.claimed, vec![(p, 2)]);
    assert_eq!(again.reserved, vec![(s, 2)]);
    let stale = json!([{"id": p, "token": 2, "kind": "done", "status": "completed", "state": {},
                        "hkey": "acct:1", "next": s, "ntoken": 1}]);
    let wrong_token = handoff(pool, &schema, stale, 0, false, &[]).await;
    assert_eq!(
        (wrong_token.written, wrong_token.promoted),
        (0, vec![]),
        "a successor named under an old reservation is not promoted, nor its predecessor's outcome applied"
    );
    assert_eq!(row(pool, &schema, s).await.0, "available");
    assert_eq!(
        row(pool, &schema, p).await.0,
        "executing",
        "the key stays held"
    );
    // Recorded alone, once the node has stopped the successor, it applies.
    let alone = json!([{"id": p, "token": 2, "kind": "done", "status": "completed", "state": {},
                        "hkey": "acct:1"}]);
    assert_eq!(
        handoff(pool, &schema, alone, 0, false, &[]).await.written,
        1
    );
    assert_eq!(row(pool, &schema, p).await.0, "completed");
}

/// The successors a call may promote are read through the primary key only:
/// on statistics that say no row is available (sampled from a table of
/// finished rows), the planner would otherwise read them through an index of
/// every available row, which a backlog fills.
#[tokio::test]
async fn successors_are_read_through_the_primary_key_only() {
    let (engine, schema) = engine("promote_plan").await;
    let pool = engine.pool();
    let key = || NewInstance::new("Job", json!({})).concurrency_key("acct:1");
    let finished = (0..2000).map(|_| NewInstance::new("Job", json!({})));
    engine.insert_many(finished.collect()).await.unwrap();
    sqlx::raw_sql(&format!(
        "UPDATE \"{schema}\".instances SET status = 'completed', finished_at = now();
         ANALYZE \"{schema}\".instances"
    ))
    .execute(pool)
    .await
    .unwrap();
    let ids = engine.insert_many(vec![key(), key()]).await.unwrap();
    let first = handoff(pool, &schema, json!([]), 1, true, &[]).await;
    assert_eq!(
        (first.claimed, first.reserved),
        (vec![(ids[0], 1)], vec![(ids[1], 1)])
    );

    let mut tx = pool.begin().await.unwrap();
    let done = json!([{"id": ids[0], "token": 1, "kind": "done", "status": "completed",
                       "state": {}, "hkey": "acct:1", "next": ids[1], "ntoken": 1}]);
    let call = call_as(&mut *tx, &schema, NODE, &[], done, 0, false, &[]).await;
    assert_eq!((call.written, call.promoted), (1, vec![ids[1]]));
    // Scans this transaction made of the indexes of available rows (the
    // planner's look at a key's bounds in instances_key_heads, one short
    // read, aside).
    let indexes = ["instances_pick", "instances_key_next", "instances_reserved"];
    let scans = support::index_scans(&mut tx, &schema, &indexes).await;
    tx.rollback().await.unwrap();
    assert!(scans.iter().all(|(_, n)| *n == 0), "{scans:?}");
}

/// A successor is not promoted into a paused queue, and the outcome naming
/// it does not apply: the node stops the successor it started, and records
/// the outcome alone (the key goes free, handed to nobody while paused).
#[tokio::test]
async fn an_outcome_naming_a_successor_in_a_paused_queue_waits_for_it_to_stop() {
    let (engine, schema) = engine("promote_paused").await;
    let pool = engine.pool();
    let key = || NewInstance::new("Job", json!({})).concurrency_key("acct:1");
    let ids = engine.insert_many(vec![key(), key(), key()]).await.unwrap();
    let (p, s) = (ids[0], ids[1]);
    let first = handoff(pool, &schema, json!([]), 1, true, &[]).await;
    assert_eq!(
        (first.claimed, first.reserved),
        (vec![(p, 1)], vec![(s, 1)])
    );
    assert!(engine.pause_queue("default").await.unwrap());
    let done = json!([{"id": p, "token": 1, "kind": "done", "status": "completed", "state": {},
                       "hkey": "acct:1", "next": s, "ntoken": 1}]);
    let refused = handoff(pool, &schema, done, 1, false, &[]).await;
    assert_eq!((refused.written, refused.promoted), (0, vec![]));
    assert_eq!(row(pool, &schema, p).await.0, "executing");
    let alone = json!([{"id": p, "token": 1, "kind": "done", "status": "completed", "state": {},
                        "hkey": "acct:1"}]);
    let call = handoff(pool, &schema, alone, 1, false, &[(s, 1)]).await;
    assert_eq!((call.written, call.claimed), (1, vec![]));
    assert_eq!(row(pool, &schema, p).await.0, "completed");
    let (status, node, _, _) = row(pool, &schema, s).await;
    assert_eq!((status.as_str(), node), ("available", None));
}

/// A successor may have started on its node and ended the process before
/// its promotion counted the attempt. The reaper marks the reservations it
/// takes back cautious: such a row is never reserved again, so it starts
/// only once claimed, its attempt counted (a crash loop ends at
/// max_attempts). Moving on to its next step clears the mark.
#[tokio::test]
async fn a_reservation_taken_back_from_the_dead_starts_only_once_claimed() {
    let (engine, schema) = engine("cautious").await;
    let pool = engine.pool();
    let key = || NewInstance::new("Job", json!({})).concurrency_key("acct:1");
    let ids = engine.insert_many(vec![key(), key(), key()]).await.unwrap();
    let sql = format!("SELECT cautious FROM \"{schema}\".instances WHERE id = $1");
    let cautious = |id: i64| sqlx::query_scalar::<_, bool>(&sql).bind(id).fetch_one(pool);
    let first = handoff_as(pool, &schema, "gone", json!([]), 1, true, &[]).await;
    assert_eq!(
        (first.claimed, first.reserved),
        (vec![(ids[0], 1)], vec![(ids[1], 1)])
    );
    // The node's process ends (its stop, or the reaper's pass for it).
    sqlx::query(&format!(
        "SELECT \"{schema}\".release_reserved('gone', NULL, NULL)"
    ))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "UPDATE \"{schema}\".instances SET status = 'available', node = NULL WHERE id = $1"
    ))
    .bind(ids[0])
    .execute(pool)
    .await
    .unwrap();
    assert!(cautious(ids[1]).await.unwrap());
    assert!(
        !cautious(ids[0]).await.unwrap(),
        "a claimed row is not marked"
    );

    // Another node claims the key's first row: the cautious row after it is
    // not reserved as its successor.
    let again = handoff(pool, &schema, json!([]), 1, true, &[]).await;
    assert_eq!((again.claimed, again.reserved), (vec![(ids[0], 2)], vec![]));
    // Its outcome hands the key over to the cautious row: claimed, counted.
    let done = json!([{"id": ids[0], "token": 2, "kind": "done", "status": "completed",
                       "state": {}, "hkey": "acct:1"}]);
    let call = handoff(pool, &schema, done, 1, true, &[]).await;
    assert_eq!(call.claimed, vec![(ids[1], 2)]);
    let attempt: i32 = sqlx::query_scalar(&format!(
        "SELECT attempt FROM \"{schema}\".instances WHERE id = $1 AND status = 'executing'"
    ))
    .bind(ids[1])
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(attempt, 1, "counted");
    // Moving on to its next step clears the mark.
    let next = json!([{"id": ids[1], "token": 2, "kind": "next", "status": "available",
                       "step": "two", "state": {}, "hkey": "acct:1"}]);
    assert_eq!(handoff(pool, &schema, next, 0, false, &[]).await.written, 1);
    assert!(!cautious(ids[1]).await.unwrap());
}

/// A promotion reported once is reported again when the call is replayed
/// (its first answer was lost), and a late give-back of the reservation
/// leaves the promoted row alone.
#[tokio::test]
async fn a_promotion_survives_a_lost_answer() {
    let (engine, schema) = engine("promote_lost").await;
    let pool = engine.pool();
    let key = || NewInstance::new("Job", json!({})).concurrency_key("acct:1");
    let ids = engine.insert_many(vec![key(), key()]).await.unwrap();
    let (p, s) = (ids[0], ids[1]);
    let first = handoff(pool, &schema, json!([]), 1, true, &[]).await;
    assert_eq!(
        (first.claimed.clone(), first.reserved.clone()),
        (vec![(p, 1)], vec![(s, 1)])
    );
    let done = json!([{"id": p, "token": 1, "kind": "done", "status": "completed", "state": {},
                       "hkey": "acct:1", "next": s, "ntoken": 1}]);
    let call = handoff(pool, &schema, done.clone(), 0, false, &[]).await;
    assert_eq!((call.written, call.promoted), (1, vec![s]));
    let replay = handoff(pool, &schema, done, 0, false, &[(s, 1)]).await;
    assert_eq!((replay.written, replay.promoted), (0, vec![s]));
    let (status, node, token, _) = row(pool, &schema, s).await;
    assert_eq!(
        (status.as_str(), node.as_deref(), token),
        ("executing", Some(NODE), 2)
    );
}

/// Case 6: the reaper gives back a dead node's reservations in the same
/// pass that rescues its claims. And it leaves alone a node that claimed
/// within the lease, whatever its heartbeat says.
#[tokio::test]
async fn the_reaper_frees_claims_and_reservations_of_the_dead_at_once() {
    let (engine, schema) = engine("reap").await;
    let pool = engine.pool();
    let key = |k: &str| NewInstance::new("Job", json!({})).concurrency_key(k);
    let ids = engine
        .insert_many(vec![key("acct:1"), key("acct:1"), key("acct:2")])
        .await
        .unwrap();
    sqlx::raw_sql(&format!(
        "INSERT INTO \"{schema}\".nodes (id, hostname, pid, queues, heartbeat_at)
         VALUES ('ghost', 'h', 1, '{{}}', now() - interval '1 hour'),
                ('busy', 'h', 2, '{{}}', now() - interval '1 hour');
         UPDATE \"{schema}\".instances SET node = 'ghost', status = 'executing', attempt = 1,
             token = 1, attempted_at = now() - interval '1 hour' WHERE id = {a};
         UPDATE \"{schema}\".instances SET node = 'ghost', token = 1 WHERE id = {b};
         UPDATE \"{schema}\".instances SET node = 'busy', status = 'executing', attempt = 1,
             token = 1, attempted_at = now() WHERE id = {c};",
        a = ids[0],
        b = ids[1],
        c = ids[2],
    ))
    .execute(pool)
    .await
    .unwrap();
    // The reaper waits until the server has been up for a lease.
    let e = engine.clone();
    support::eventually("a rescue", std::time::Duration::from_secs(30), || {
        let e = e.clone();
        async move { e.reap_now().await.unwrap() > 0 }
    })
    .await;
    assert_eq!(row(pool, &schema, ids[0]).await.0, "available");
    assert_eq!(
        row(pool, &schema, ids[1]).await.1,
        None,
        "the reservation went back in the same pass"
    );
    assert_eq!(
        row(pool, &schema, ids[2]).await.0,
        "executing",
        "busy claimed within the lease"
    );
}

/// Two nodes of 3 slots share the default queue, in which `keys` keys of
/// one row each and `plain` keyless rows wait.
async fn shared_queue(prefix: &str, keys: usize, plain: usize) -> (Engine, String) {
    let (engine, schema) = engine(prefix).await;
    insert_keyed(&engine, keys, 1).await;
    let rows: Vec<NewInstance> = (0..plain)
        .map(|_| NewInstance::new("Job", json!({})))
        .collect();
    engine.insert_many(rows).await.unwrap();
    for id in [NODE, "n2"] {
        register(engine.pool(), &schema, id).await;
    }
    (engine, schema)
}

/// `per_key` rows of each of the keys `acct:0` .. `acct:{keys - 1}`.
async fn insert_keyed(engine: &Engine, keys: usize, per_key: usize) {
    let rows: Vec<NewInstance> = (0..per_key)
        .flat_map(|_| {
            (0..keys)
                .map(|k| NewInstance::new("Job", json!({})).concurrency_key(format!("acct:{k}")))
        })
        .collect();
    engine.insert_many(rows).await.unwrap();
}

/// Node `id` serves the queue `default` with 3 slots.
async fn register(pool: &PgPool, schema: &str, id: &str) {
    sqlx::query(&format!(
        "INSERT INTO \"{schema}\".nodes (id, hostname, pid, queues)
         VALUES ($1, 'h', 1, '{{\"default\": 3}}')"
    ))
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
}

/// `done` outcomes of the keyed rows `claims` (id, token), each of which
/// holds its key `acct:N`.
async fn done_keyed(pool: &PgPool, schema: &str, claims: &[(i64, i64)]) -> Value {
    let mut outcomes = Vec::new();
    for &(id, token) in claims {
        let key = row(pool, schema, id).await.3;
        outcomes.push(
            json!({"id": id, "token": token, "kind": "done", "status": "completed",
                             "state": {}, "hkey": key}),
        );
    }
    Value::Array(outcomes)
}

/// The keyed rows `node` holds executing.
async fn keys_held(pool: &PgPool, schema: &str, node: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{schema}\".instances
         WHERE status = 'executing' AND node = $1 AND concurrency_key IS NOT NULL"
    ))
    .bind(node)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Claims for the node until it holds `keys` keyed rows and a call with
/// `demand` claims nothing more. Returns the first call.
async fn claim_until_full(pool: &PgPool, schema: &str, demand: i32, keys: i64) -> Call {
    let first = handoff(pool, schema, json!([]), demand, false, &[]).await;
    assert_eq!(keys_held(pool, schema, NODE).await, keys, "{first:?}");
    let second = handoff(pool, schema, json!([]), demand, false, &[]).await;
    assert!(second.claimed.is_empty(), "no room for keys: {second:?}");
    first
}

/// Keyed rows a node claims ahead wait on that node while another node's
/// slots could run them: with no more keys than the nodes have slots, a node
/// sharing its queue holds no more keyed rows executing there than it runs
/// at once, and claims keyless rows ahead as before. Alone, it claims keyed
/// rows ahead too.
#[tokio::test]
async fn a_node_sharing_its_queue_holds_no_more_keys_than_it_runs() {
    let (engine, schema) = shared_queue("share", 5, 5).await;
    let pool = engine.pool();

    // As many keys as the node runs.
    let first = claim_until_full(pool, &schema, 12, 3).await;
    assert_eq!(first.claimed.len(), 8, "and every keyless row: {first:?}");
    let other = handoff_as(pool, &schema, "n2", json!([]), 12, false, &[]).await;
    assert_eq!(
        other.claimed.len(),
        2,
        "the other node runs the rest: {other:?}"
    );

    // The other node is gone, and its keys are back: they are claimed ahead.
    sqlx::raw_sql(&format!(
        "UPDATE \"{schema}\".instances SET status = 'available', node = NULL WHERE node = 'n2';
         DELETE FROM \"{schema}\".nodes WHERE id = 'n2'"
    ))
    .execute(pool)
    .await
    .unwrap();
    let alone = handoff(pool, &schema, json!([]), 12, false, &[]).await;
    assert_eq!(alone.claimed.len(), 2, "{alone:?}");
    assert_eq!(keys_held(pool, &schema, NODE).await, 5);
}

/// With more keys than the nodes have slots, a node sharing its queue claims
/// keyed rows ahead up to its share of the keys (so that its slots do not
/// wait a round trip between one key's rows), and leaves the rest to the
/// other nodes.
#[tokio::test]
async fn a_node_sharing_its_queue_claims_its_share_of_many_keys_ahead() {
    let (engine, schema) = shared_queue("share_many", 12, 0).await;
    let pool = engine.pool();

    // Half of the keys.
    claim_until_full(pool, &schema, 20, 6).await;
    handoff_as(pool, &schema, "n2", json!([]), 20, false, &[]).await;
    assert_eq!(
        keys_held(pool, &schema, "n2").await,
        6,
        "the other half for the other node"
    );
}

/// A node presumed dead (no heartbeat within the lease it recorded) does not
/// count in the share of the keys, though it is listed until the reaper
/// forgets it: the live node claims every key ahead, as if alone. A node
/// that recorded no lease (an earlier release) counts while it is listed.
#[tokio::test]
async fn a_node_presumed_dead_takes_no_share_of_the_keys() {
    let (engine, schema) = shared_queue("share_dead", 12, 0).await;
    let pool = engine.pool();
    let set_n2 = |sql: &'static str| {
        let schema = schema.clone();
        async move {
            sqlx::query(&format!(
                "UPDATE \"{schema}\".nodes SET {sql} WHERE id = 'n2'"
            ))
            .execute(pool)
            .await
            .unwrap();
        }
    };
    set_n2("lease_s = 30").await;
    claim_until_full(pool, &schema, 20, 6).await;
    set_n2("lease_s = NULL, heartbeat_at = now() - interval '1 hour'").await;
    let listed = handoff(pool, &schema, json!([]), 20, false, &[]).await;
    assert!(
        listed.claimed.is_empty(),
        "no lease, still counted: {listed:?}"
    );
    set_n2("lease_s = 30").await;
    let dead = handoff(pool, &schema, json!([]), 20, false, &[]).await;
    assert_eq!(dead.claimed.len(), 6, "the other half too: {dead:?}");
    assert_eq!(keys_held(pool, &schema, NODE).await, 12);
}

/// `per_key` rows of each of 12 keys, claimed ahead (reserving successors
/// if `reserve`) by the node while it serves the queue alone: one per key.
async fn alone_with_12_keys(prefix: &str, per_key: usize, reserve: bool) -> (Engine, String, Call) {
    let (engine, schema) = engine(prefix).await;
    insert_keyed(&engine, 12, per_key).await;
    register(engine.pool(), &schema, NODE).await;
    let alone = handoff(engine.pool(), &schema, json!([]), 20, reserve, &[]).await;
    assert_eq!(
        alone.claimed.len(),
        12,
        "every key, claimed ahead: {alone:?}"
    );
    (engine, schema, alone)
}

/// A node that joins late gets its share of the keys: the first node, which
/// claimed every key ahead while alone, hands over no more than its share of
/// the keys its outcomes free, and the rest go free for the new node's pick.
#[tokio::test]
async fn a_node_that_joins_late_gets_its_share_of_the_keys() {
    let (engine, schema, alone) = alone_with_12_keys("late", 2, false).await;
    let pool = engine.pool();
    assert_eq!(alone.reserved.len(), 0);

    register(pool, &schema, "n2").await;
    let outcomes = done_keyed(pool, &schema, &alone.claimed).await;
    let first = handoff(pool, &schema, outcomes, 20, false, &[]).await;
    assert_eq!(first.written, 12);
    assert_eq!(
        keys_held(pool, &schema, NODE).await,
        6,
        "half of the keys handed over: {first:?}"
    );
    let other = handoff_as(pool, &schema, "n2", json!([]), 20, false, &[]).await;
    assert_eq!(other.claimed.len(), 6, "the other half: {other:?}");
    assert_eq!(keys_held(pool, &schema, "n2").await, 6);
}

/// A node holding more than its share of the keys reserves no successors
/// for them: their keys go free as their rows end.
#[tokio::test]
async fn a_node_above_its_share_reserves_no_successors() {
    let (engine, schema, alone) = alone_with_12_keys("late_reserve", 3, true).await;
    let pool = engine.pool();
    assert_eq!(alone.reserved.len(), 12, "{alone:?}");

    // The outcome of the claim `i`, promoting its key's reserved successor.
    let promote = |i: usize| {
        let (pool, schema, alone) = (pool, &schema, &alone);
        async move {
            let (p, token) = alone.claimed[i];
            let key = row(pool, schema, p).await.3;
            let mut next = None;
            for &(id, ntoken) in &alone.reserved {
                if row(pool, schema, id).await.3 == key {
                    next = Some((id, ntoken));
                }
            }
            let (s, ntoken) = next.expect("a successor of the key");
            let outcome = json!([{"id": p, "token": token, "kind": "done", "status": "completed",
                                  "state": {}, "hkey": key, "next": s, "ntoken": ntoken}]);
            (s, handoff(pool, schema, outcome, 1, true, &[]).await)
        }
    };
    let (s, call) = promote(0).await;
    assert_eq!(call.promoted, vec![s]);
    assert_eq!(
        call.reserved.len(),
        1,
        "alone: the key's next row: {call:?}"
    );

    register(pool, &schema, "n2").await;
    let (s, call) = promote(1).await;
    assert_eq!(call.promoted, vec![s]);
    assert_eq!(
        call.reserved,
        vec![],
        "12 keys held, a share of 6: {call:?}"
    );
}

/// `per_key` rows of each of 12 keys, and two nodes serving the queue.
async fn two_nodes_with_12_keys(prefix: &str, per_key: usize) -> (Engine, String) {
    let (engine, schema) = engine(prefix).await;
    insert_keyed(&engine, 12, per_key).await;
    register(engine.pool(), &schema, NODE).await;
    register(engine.pool(), &schema, "n2").await;
    (engine, schema)
}

/// A row of the K = 1 key `acct:1`, claimed by the node: its holder.
async fn held_key(prefix: &str) -> (Engine, String, i64) {
    let (engine, schema) = engine(prefix).await;
    let holder = engine.insert(acct_1()).await.unwrap();
    let held = handoff(engine.pool(), &schema, json!([]), 1, false, &[]).await;
    assert_eq!(held.claimed, vec![(holder, 1)]);
    (engine, schema, holder)
}

fn acct_1() -> NewInstance {
    NewInstance::new("Job", json!({})).concurrency_key("acct:1")
}

/// `n` rows of "acct:1" inserted in a transaction left open.
async fn acct_1_uncommitted(
    engine: &Engine,
    n: usize,
) -> (sqlx::Transaction<'static, sqlx::Postgres>, Vec<i64>) {
    let mut tx = engine.pool().begin().await.unwrap();
    let ids = engine
        .insert_many_in(&mut tx, (0..n).map(|_| acct_1()).collect())
        .await
        .unwrap();
    (tx, ids)
}

/// A call that reserves successors for many keyed rows counts the node's
/// share of the keys once per queue, not once per row: the count reads every
/// keyed row executing in the queue, so per row it cost a W2 call on four
/// nodes a third of its time.
#[tokio::test]
async fn the_share_of_the_keys_is_counted_once_per_call() {
    let (engine, schema) = two_nodes_with_12_keys("share_once", 3).await;
    let pool = engine.pool();
    let other = handoff_as(pool, &schema, "n2", json!([]), 20, false, &[]).await;
    assert_eq!(other.claimed.len(), 6, "{other:?}");

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL track_functions = 'all'")
        .execute(&mut *tx)
        .await
        .unwrap();
    let call = call_as(&mut *tx, &schema, NODE, &[], json!([]), 20, true, &[]).await;
    assert_eq!(
        (call.claimed.len(), call.reserved.len()),
        (6, 6),
        "a share of 6 keys, each with a successor: {call:?}"
    );
    let counted: i64 = sqlx::query_scalar(&format!(
        "SELECT pg_stat_get_xact_function_calls('\"{schema}\".node_key_room(text, text, text[])'::regprocedure)"
    ))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(counted, 2, "once for the pick, once for the reservations");
}

/// A pick that parks a busy key's next row and an outcome call that frees
/// the key, in either order, leave that row where the next pick finds it:
/// the outcome call waits for the pick and then unparks the row, or the pick
/// sees the key's holder being changed and parks nothing. Otherwise the key
/// stayed free with its rows parked until the maintenance sweep. For a
/// K = 1 key (one holder) and a gate of 2 (two holders, both shards' slots).
#[tokio::test]
async fn a_key_freed_while_a_pick_parks_its_rows_keeps_its_next_row_runnable() {
    for (key, holders) in [("acct:1", 1usize), ("api:1", 2)] {
        for outcome_first in [false, true] {
            let prefix = format!("park_race_{}_{outcome_first}", holders);
            let (engine, schema) = engine(&prefix).await;
            let pool = engine.pool();
            let rows = (0..=holders)
                .map(|_| NewInstance::new("Job", json!({})).concurrency_key(key))
                .collect();
            let ids = engine.insert_many(rows).await.unwrap();
            let held = handoff(pool, &schema, json!([]), holders as i32, false, &[]).await;
            assert_eq!(held.claimed.len(), holders, "{held:?}");
            // The next row back where picks see it while the key is full, as
            // a reservation given back leaves it.
            let waiting = ids[holders];
            sqlx::query(&format!(
                "UPDATE \"{schema}\".instances SET parked = NULL WHERE id = $1"
            ))
            .bind(waiting)
            .execute(pool)
            .await
            .unwrap();
            let (h, token) = held.claimed[0];
            let shard: Option<i32> = sqlx::query_scalar(&format!(
                "SELECT gate_shard FROM \"{schema}\".instances WHERE id = $1"
            ))
            .bind(h)
            .fetch_one(pool)
            .await
            .unwrap();
            let done = json!([{"id": h, "token": token, "kind": "done", "status": "completed",
                               "state": {}, "hkey": key, "gshard": shard}]);

            if outcome_first {
                // The outcome call has freed the key but not committed: the
                // other node's pick neither waits nor parks.
                let mut outcome = pool.begin().await.unwrap();
                let call = call_as(&mut *outcome, &schema, NODE, &[], done, 0, false, &[]).await;
                assert_eq!(call.written, 1);
                let pick = handoff_as(pool, &schema, "n2", json!([]), 1, false, &[]).await;
                assert_eq!(pick.claimed, vec![], "the key is held in its snapshot");
                outcome.commit().await.unwrap();
            } else {
                // The other node's pick has parked the row but not committed:
                // the outcome call waits for it.
                let mut pick = pool.begin().await.unwrap();
                let call = call_as(&mut *pick, &schema, "n2", &[], json!([]), 1, false, &[]).await;
                assert_eq!(call.claimed, vec![]);
                let outcome = {
                    let (pool, schema) = (pool.clone(), schema.clone());
                    tokio::spawn(async move { handoff(&pool, &schema, done, 0, false, &[]).await })
                };
                support::eventually(
                    "the outcome call to end or wait on a lock",
                    std::time::Duration::from_secs(10),
                    || async {
                        outcome.is_finished()
                            || sqlx::query_scalar::<_, i64>(
                                "SELECT count(*) FROM pg_stat_activity
                                 WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0",
                            )
                            .bind(format!("\"{schema}\""))
                            .fetch_one(pool)
                            .await
                            .unwrap()
                                > 0
                    },
                )
                .await;
                pick.commit().await.unwrap();
                assert_eq!(outcome.await.unwrap().written, 1);
            }

            let next = handoff_as(pool, &schema, "n2", json!([]), 1, false, &[]).await;
            assert_eq!(
                next.claimed.iter().map(|c| c.0).collect::<Vec<_>>(),
                vec![waiting],
                "{key}, outcome first: {outcome_first}"
            );
        }
    }
}

/// A pick that leaves runnable keyed rows for the other nodes' shares wakes
/// them: a pick of theirs running beside it skipped those rows (its window
/// held them) and came back short, and would otherwise wait for its poll.
#[tokio::test]
async fn a_pick_that_leaves_keys_for_other_nodes_wakes_them() {
    let (engine, schema) = two_nodes_with_12_keys("share_wake", 1).await;
    let pool = engine.pool();
    let mut listener = sqlx::postgres::PgListener::connect_with(pool)
        .await
        .unwrap();
    listener.listen(&schema).await.unwrap();

    let claimed: i64 = sqlx::query_scalar(&format!(
        "SELECT count((claimed).id) FROM \"{schema}\".handoff(
             '{{}}', '{{}}', '{{}}', '{{}}', '[]', $1, $2, true, '{{default}}', '{{20}}', '{{f}}',
             '{{f}}', '{{}}', '{{}}', 1.0, '{{Job}}', '{{api}}', '{{2}}', '{{1}}', '{{}}', '{{}}', '{{}}')"
    ))
    .bind(NODE)
    .bind(&schema)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(claimed, 6, "its share of the 12 keys");
    let woken = tokio::time::timeout(std::time::Duration::from_secs(10), listener.recv())
        .await
        .expect("the other nodes woken")
        .unwrap();
    assert_eq!(woken.payload(), format!("*{NODE}"));
}

/// Rows inserted for a key whose holder's outcome is recorded while the
/// insert is not yet committed: the call freeing the key sees none of them,
/// so the first waits unparked and the next pick takes it (one row and a
/// batch large enough to go in by `COPY`).
#[tokio::test]
async fn a_row_inserted_while_its_key_goes_free_is_picked() {
    for n in [1usize, 1000] {
        let (engine, schema, holder) = held_key(&format!("insert_race_{n}")).await;
        let pool = engine.pool();

        let (tx, ids) = acct_1_uncommitted(&engine, n).await;
        let done = json!([{"id": holder, "token": 1, "kind": "done", "status": "completed",
                           "state": {}, "hkey": "acct:1"}]);
        assert_eq!(handoff(pool, &schema, done, 0, false, &[]).await.written, 1);
        tx.commit().await.unwrap();

        let next = handoff_as(pool, &schema, "n2", json!([]), 1, false, &[]).await;
        assert_eq!(
            next.claimed.iter().map(|c| c.0).collect::<Vec<_>>(),
            vec![ids[0]],
            "{n} rows"
        );
    }
}

/// An insert behind a full key looks for the key's waiting rows through the
/// key's indexes, not a scan of the table: planned on a table with no
/// statistics yet, a `NOT EXISTS` there became one hashed scan of the whole
/// table per call (146 ms an insert call behind a million rows).
#[tokio::test]
async fn an_insert_behind_a_full_key_scans_no_table() {
    for n in [1usize, 1000] {
        let (engine, schema, _) = held_key(&format!("insert_room_plan_{n}")).await;

        let (mut tx, _) = acct_1_uncommitted(&engine, n).await;
        let scans: i64 = sqlx::query_scalar(
            "SELECT seq_scan FROM pg_stat_xact_user_tables
             WHERE schemaname = $1 AND relname = 'instances'",
        )
        .bind(&schema)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(scans, 0, "{n} rows");
    }
}
