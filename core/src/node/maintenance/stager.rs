//! The stager: scheduled rows that come due, and awaits that time out.

use super::STAGE_BATCH;
use crate::context::Context;
use crate::error::Result;
use crate::store::Pass;

/// One batch of due rows made runnable; their queues are woken.
pub(super) async fn stage(ctx: &Context, pass: &mut Pass<'_>) -> Result<u64> {
    pass.call(async |c| ctx.store.stage(c, STAGE_BATCH).await)
        .await
}
