//! The stager: scheduled rows that come due, and awaits that time out.

use super::STAGE_BATCH;
use crate::context::Context;
use crate::error::Result;

/// One batch of due rows made runnable; their queues are woken.
pub(super) async fn stage(ctx: &Context) -> Result<u64> {
    ctx.store.stage(STAGE_BATCH).await
}
