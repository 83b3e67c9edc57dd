//! The reaper: rows executing on nodes presumed dead run again elsewhere.

use crate::context::Context;
use crate::error::Result;
use crate::stats::Stats;
use crate::store::Pass;

/// Rescue rows of nodes presumed dead (or, with `own`, the rows a previous
/// process of this node id left); forget long-dead nodes.
pub(crate) async fn reap(ctx: &Context, pass: &mut Pass<'_>, own: Option<&str>) -> Result<u64> {
    let lease = ctx.cfg.lease.as_secs_f64();
    let rescued = pass
        .call(async |c| ctx.store.reap(c, lease, own).await)
        .await?;
    Stats::add(&ctx.stats.rescued, rescued);
    if own.is_none() {
        pass.call(async |c| ctx.store.forget_dead_nodes(c, lease * 3.0).await)
            .await?;
    }
    Ok(rescued)
}
