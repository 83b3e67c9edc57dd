//! The pruner: finished rows past their retention go, oldest first.

use super::PRUNE_BATCH;
use crate::context::Context;
use crate::error::Result;
use chrono::{DateTime, Utc};

/// Where the next batch starts: the last pruned row's `finished_at` while
/// batches come back full (so a batch does not walk the index entries of the
/// rows the ones before it deleted); from the oldest after a short one (so
/// a row that finished out of order is found then).
pub(super) type Cursor = Option<DateTime<Utc>>;

/// Prune one batch of finished rows past their retention, from `cursor`.
pub(super) async fn prune_batch(ctx: &Context, cursor: &mut Cursor) -> Result<u64> {
    let Some(retention) = ctx.cfg.retention else {
        return Ok(0);
    };
    let (n, last) = ctx
        .store
        .prune(retention.as_secs_f64(), PRUNE_BATCH, *cursor)
        .await?;
    *cursor = if n >= PRUNE_BATCH as u64 { last } else { None };
    Ok(n)
}

/// Prune every finished row past its retention (on demand).
pub(crate) async fn prune(ctx: &Context) -> Result<u64> {
    let (mut total, mut cursor) = (0, None);
    loop {
        let done = prune_batch(ctx, &mut cursor).await?;
        total += done;
        if done < PRUNE_BATCH as u64 {
            return Ok(total);
        }
    }
}
