//! The gate reconciler: counters repaired from the executing rows, idle
//! keys' counters deleted, configured limits applied.

use super::RECONCILE_BATCH;
use crate::context::Context;
use crate::error::Result;
use crate::stats::Stats;

/// One bounded reconciler pass from the gate key after `after`. Returns how
/// many counters it changed and where the next pass goes on (None: the
/// sweep reached the end, and idle rate-limit state is pruned).
pub(super) async fn reconcile_gates_from(
    ctx: &Context,
    after: Option<&str>,
) -> Result<(u64, Option<String>)> {
    let (changed, next) = ctx
        .store
        .reconcile(after, RECONCILE_BATCH, &ctx.limits)
        .await?;
    Stats::add(&ctx.stats.repaired, changed);
    if next.is_none() {
        ctx.store.prune_rates().await?;
    }
    Ok((changed, next))
}

/// A whole reconciler sweep (on demand). Returns how many counters it changed.
pub(crate) async fn reconcile_gates(ctx: &Context) -> Result<u64> {
    let (mut total, mut after) = reconcile_gates_from(ctx, None).await?;
    while let Some(key) = after {
        let (n, next) = reconcile_gates_from(ctx, Some(&key)).await?;
        total += n;
        after = next;
    }
    Ok(total)
}
