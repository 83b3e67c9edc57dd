//! The pruner: finished rows past their retention go.

use super::PRUNE_BATCH;
use crate::context::Context;
use crate::error::Result;

/// Prune one batch of finished rows past their retention.
pub(super) async fn prune_batch(ctx: &Context) -> Result<u64> {
    match ctx.cfg.retention {
        Some(retention) => ctx.store.prune(retention.as_secs_f64(), PRUNE_BATCH).await,
        None => Ok(0),
    }
}

/// Prune every finished row past its retention (on demand).
pub(crate) async fn prune(ctx: &Context) -> Result<u64> {
    let mut total = 0;
    loop {
        let done = prune_batch(ctx).await?;
        total += done;
        if done < PRUNE_BATCH as u64 {
            return Ok(total);
        }
    }
}
