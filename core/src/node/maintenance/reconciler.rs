//! The gate reconciler: counters repaired from the executing rows, idle
//! keys' counters deleted, configured limits applied.

use super::RECONCILE_BATCH;
use crate::context::Context;
use crate::error::Result;
use crate::stats::Stats;
use crate::store::Pass;

/// One bounded reconciler pass from the gate key after `after`. Returns how
/// many counters it changed and where the next pass goes on (None: the
/// sweep reached the end, and idle rate-limit state is pruned).
pub(super) async fn reconcile_gates_from(
    ctx: &Context,
    pass: &mut Pass<'_>,
    after: Option<&str>,
) -> Result<(u64, Option<String>)> {
    let (changed, next) = pass
        .call(async |c| {
            ctx.store
                .reconcile(c, after, RECONCILE_BATCH, &ctx.limits)
                .await
        })
        .await?;
    Stats::add(&ctx.stats.repaired, changed);
    if next.is_none() {
        pass.call(async |c| ctx.store.prune_rates(c).await).await?;
    }
    Ok((changed, next))
}

/// A whole reconciler sweep (on demand). Returns how many counters it changed.
pub(crate) async fn reconcile_gates(ctx: &Context) -> Result<u64> {
    let mut pass = ctx.pass();
    let (mut total, mut after) = reconcile_gates_from(ctx, &mut pass, None).await?;
    while let Some(key) = after {
        let (n, next) = reconcile_gates_from(ctx, &mut pass, Some(&key)).await?;
        total += n;
        after = next;
    }
    Ok(total)
}
