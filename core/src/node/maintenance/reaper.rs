//! The reaper: rows executing on nodes presumed dead run again elsewhere.

use crate::context::Context;
use crate::error::Result;
use crate::stats::Stats;

/// Rescue rows of nodes presumed dead (or, with `own`, the rows a previous
/// process of this node id left); forget long-dead nodes.
pub(crate) async fn reap(ctx: &Context, own: Option<&str>) -> Result<u64> {
    let lease = ctx.cfg.lease.as_secs_f64();
    let rescued = ctx.store.reap(lease, own).await?;
    Stats::add(&ctx.stats.rescued, rescued);
    if own.is_none() {
        ctx.store.forget_dead_nodes(lease * 3.0).await?;
    }
    Ok(rescued)
}
