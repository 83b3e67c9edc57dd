//! The throughput recorder: what this node's step counters moved by, added
//! to its row of the current minute in `throughput` (the dashboard's chart).

use crate::context::Context;
use crate::error::Result;
use crate::store::Pass;

/// Counters as last recorded: started, failed, completed.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Recorded(u64, u64, u64);

/// Add what the counters moved by since `last` (nothing when they did not
/// move); `last` advances only when the row was written, so a failed write
/// is counted at the next one.
pub(crate) async fn record_throughput(
    ctx: &Context,
    pass: &mut Pass<'_>,
    last: &mut Recorded,
) -> Result<()> {
    let s = ctx.stats.snapshot();
    let now = Recorded(s.steps_started, s.steps_failed, s.steps_completed);
    let delta = |a: u64, b: u64| a.saturating_sub(b).min(i64::MAX as u64) as i64;
    let (started, failed, completed) = (
        delta(now.0, last.0),
        delta(now.1, last.1),
        delta(now.2, last.2),
    );
    if started == 0 && failed == 0 && completed == 0 {
        return Ok(());
    }
    let node_id = &ctx.cfg.node_id;
    pass.call(async |c| {
        let store = &ctx.store;
        store
            .throughput_add(c, node_id, started, failed, completed)
            .await
    })
    .await?;
    *last = now;
    Ok(())
}
