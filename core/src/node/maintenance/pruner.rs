//! The pruner: finished rows past their retention go, oldest first.

use super::PRUNE_BATCH;
use crate::context::Context;
use crate::error::Result;
use crate::store::Pass;
use chrono::{DateTime, Utc};

/// Where the next batch starts: the last pruned row's `finished_at` while
/// batches come back full (so a batch does not walk the index entries of the
/// rows the ones before it deleted); from the oldest after a short one (so
/// a row that finished out of order is found then).
pub(super) type Cursor = Option<DateTime<Utc>>;

/// Prune one batch of finished rows past their retention, from `cursor`.
pub(super) async fn prune_batch(
    ctx: &Context,
    pass: &mut Pass<'_>,
    cursor: &mut Cursor,
) -> Result<u64> {
    let Some(retention) = ctx.cfg.retention else {
        return Ok(0);
    };
    let from = *cursor;
    let (n, last) = pass
        .call(async |c| {
            ctx.store
                .prune(c, retention.as_secs_f64(), PRUNE_BATCH, from)
                .await
        })
        .await?;
    *cursor = if n >= PRUNE_BATCH as u64 { last } else { None };
    Ok(n)
}

/// Prune every finished row past its retention (on demand).
pub(crate) async fn prune(ctx: &Context) -> Result<u64> {
    let (mut total, mut cursor, mut pass) = (0, None, ctx.pass());
    loop {
        let done = prune_batch(ctx, &mut pass, &mut cursor).await?;
        total += done;
        if done < PRUNE_BATCH as u64 {
            return Ok(total);
        }
    }
}
