//! Lost claims: rows claimed for this node by a call whose answer never
//! reached it go back.

use crate::error::Result;
use crate::node::{lock, Shared};
use crate::outcome::OutcomeRow;
use crate::stats::Stats;
use crate::store::{Held, Pass};

/// Give back rows the database says this node claimed or reserved but the
/// node never heard of: a call that committed while its answer was lost (a
/// dropped connection, a server restart). Nothing else can free them while
/// this node heartbeats. Claiming calls are held off while the rows are
/// listed, so every row they claimed is known by then. A row is this node's
/// only under the token of its claim: one claimed again by a call whose
/// answer was lost is given back even if an earlier claim of it is known.
pub(super) async fn give_back_lost(sh: &Shared, pass: &mut Pass<'_>) -> Result<()> {
    let guard = sh.claiming.write().await;
    let ctx = &sh.ctx;
    let node_id = &ctx.cfg.node_id;
    let rows = pass
        .call(async |c| ctx.store.held_by_node(c, node_id).await)
        .await?;
    let (mut lost, mut unreserve) = (Vec::new(), Vec::new());
    {
        // In this order only (a successor goes from one to the other).
        let successors = lock(&sh.successors);
        let holding = lock(&sh.holding);
        for Held { row, executing } in rows {
            if executing {
                if holding.get(&row.id) != Some(&row.token) {
                    lost.push(row);
                }
            } else if !holding.contains_key(&row.id) && !successors.is_reserved(row.id, row.token) {
                unreserve.push((row.id, row.token));
            }
        }
    }
    drop(guard);
    if lost.is_empty() && unreserve.is_empty() {
        return Ok(());
    }
    tracing::warn!(
        claimed = lost.len(),
        reserved = unreserve.len(),
        "giving back rows claimed for this node whose claim never reached it"
    );
    Stats::add(&sh.ctx.stats.released, lost.len() as u64);
    // As releases of rows that never started: fenced like any outcome, so a
    // row whose outcome was written meanwhile is left alone.
    for row in &lost {
        let _ = sh.outcomes.send(OutcomeRow::release(row));
    }
    sh.successors(|s| s.restore_dangling(unreserve));
    Ok(())
}
