//! Commits that survive a crash of the server. Every guarantee rests on
//! them: a claim, a promotion or a handover the server acknowledged and then
//! forgot leaves a step running that the database no longer admits, and its
//! key free for another node.

use sqlx::{PgConnection, PgPool};

/// `synchronous_commit = off` (on the server, the database, the role or the
/// URL's `options`) acknowledges a commit before its WAL is flushed, so a
/// crash of the server loses the last fraction of a second of commits. The
/// engine's own connections raise it to `on`, PostgreSQL's default; a
/// stronger setting (`remote_write`, `remote_apply`) or `local` is left as
/// it is.
pub(crate) async fn raise_synchronous_commit(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::query(
        "SELECT set_config('synchronous_commit', 'on', false)
         WHERE current_setting('synchronous_commit') = 'off'",
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// A pool handed to the engine keeps its own settings: say so if its
/// commits may be lost. A failure to ask is left to the engine's first call.
pub(crate) async fn warn_if_commits_may_be_lost(pool: PgPool) {
    let setting: Result<String, _> =
        sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
            .fetch_one(&pool)
            .await;
    if setting.is_ok_and(|s| s == "off") {
        tracing::warn!(
            "the pool given to the engine commits with synchronous_commit = off: a crash of \
             the server can lose claims it acknowledged and run a key on two nodes at once; \
             set it to on for the engine's connections (docs/operations.md, \"Durable commits\")"
        );
    }
}
