//! The unparker: parked rows whose key has room (a race, a rescue, a
//! repaired gate), and rows of workflows no live node runs parked and taken
//! back. Rate-limited rows have a sweep of their own (`rate_waker`).

use super::{ORPHAN_BATCH, ORPHAN_PASSES, UNPARK_BATCH, UNPARK_WORKFLOW_BATCH};
use crate::error::Result;
use crate::node::Shared;
use crate::stats::Stats;
use crate::store::Pass;

/// One bounded pass over keys with parked rows from the one after `after`,
/// each unparked as far as it has room (a race, a rescue, a repaired gate
/// left it room). Returns the rows unparked and where the sweep goes on
/// (None: it reached the end).
pub(super) async fn unpark_keys(
    sh: &Shared,
    pass: &mut Pass<'_>,
    after: Option<&str>,
) -> Result<(u64, Option<String>)> {
    let ctx = &sh.ctx;
    let (n, next) = pass
        .call(async |c| {
            ctx.store
                .unpark_sweep(c, after, UNPARK_BATCH, &ctx.limits)
                .await
        })
        .await?;
    Stats::add(&ctx.stats.unparked, n);
    Ok((n, next))
}

/// Rows a pick would step over because no live node runs their workflow:
/// park those at the head of each of this node's queues (a batch, again
/// while batches come back full, up to `ORPHAN_PASSES`), and take back the
/// rows parked for the workflows this node runs
/// (`sql/functions/park_orphans.sql`, `unpark_workflows.sql`). Returns the
/// rows parked and unparked.
pub(super) async fn park_by_workflow(sh: &Shared, pass: &mut Pass<'_>) -> Result<(u64, u64)> {
    let ctx = &sh.ctx;
    let lease = ctx.cfg.lease.as_secs_f64();
    let mut parked = 0;
    for queue in ctx.cfg.queues.keys() {
        for _ in 0..ORPHAN_PASSES {
            let n = pass
                .call(async |c| ctx.store.park_orphans(c, queue, lease, ORPHAN_BATCH).await)
                .await?;
            parked += n;
            if n < ORPHAN_BATCH as u64 {
                break;
            }
        }
    }
    let queues: Vec<&String> = ctx.cfg.queues.keys().collect();
    let n = pass
        .call(async |c| {
            let workflows = &ctx.limits.workflows;
            ctx.store
                .unpark_workflows(c, &queues, workflows, UNPARK_WORKFLOW_BATCH)
                .await
        })
        .await?;
    Stats::add(&ctx.stats.unparked, n);
    Ok((parked, n))
}
