//! Bringing a schema up to date: the migrations, then the functions.

use super::in_schema;
use crate::error::{Error, Result};
use sqlx::{Executor, PgConnection, PgPool};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./sql/migrations");

/// Every function of `sql/functions/`, by name, in the order they are
/// installed (a function written in SQL must come after those it calls).
macro_rules! functions {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), include_str!(concat!("../../sql/functions/", stringify!($name), ".sql"))),)*]
    };
}

const FUNCTIONS: &[(&str, &str)] = functions![
    claim_key,
    may_mint_gate,
    may_mint_rate,
    key_room,
    insert_room,
    rate_room,
    unpark_keys,
    rate_sweep,
    unpark_sweep,
    orphaned,
    park_orphans,
    unpark_workflows,
    reconcile_gates,
    release_reserved,
    node_key_room,
    pick,
    handoff,
    send_signal,
    unique_key,
    name_problem,
    enqueue,
    matching,
];

/// Create the schema and bring it up to date. Safe to run from many nodes at
/// once: a session advisory lock serialises them, and every step is idempotent.
pub(crate) async fn migrate(pool: &PgPool, schema: &str) -> Result<()> {
    let mut conn = pool.acquire().await?;
    let lock = format!("gendurable.migrate.{schema}");
    conn.execute(sqlx::query("SELECT pg_advisory_lock(hashtext($1))").bind(&lock))
        .await?;
    let result = async {
        conn.execute(in_schema("CREATE SCHEMA IF NOT EXISTS __S__", schema).as_str())
            .await?;
        // The migrations and functions name their tables without a schema:
        // they land in ours, and so does the migrations' own bookkeeping table.
        conn.execute(in_schema("SET search_path TO __S__", schema).as_str())
            .await?;
        // run_direct, not run: its future is Send, so `build()` can be spawned.
        MIGRATOR
            .run_direct(&mut *conn)
            .await
            .map_err(|e| migrate_error(e, schema))?;
        install_functions(&mut conn).await
    }
    .await;
    // Leave the pooled connection as we found it, even after a failure.
    let reset = conn.execute("RESET search_path").await;
    let unlock = conn
        .execute(sqlx::query("SELECT pg_advisory_unlock(hashtext($1))").bind(&lock))
        .await;
    if reset.is_err() || unlock.is_err() {
        conn.close_on_drop();
    }
    result
}

/// Installs every function whose source differs from the one recorded in
/// `functions`, in one transaction. A node of this version replaces only
/// what changed; a function whose parameters, result or meaning change gets
/// a new name, so that nodes of the previous version, still running during
/// a rolling deploy, keep calling the one they know (docs/operations.md).
async fn install_functions(conn: &mut PgConnection) -> Result<()> {
    let installed: Vec<(String, String)> = sqlx::query_as("SELECT name, source FROM functions")
        .fetch_all(&mut *conn)
        .await?;
    let stale: Vec<_> = FUNCTIONS
        .iter()
        .filter(|(name, source)| !installed.iter().any(|(n, s)| n == name && s == source))
        .collect();
    if stale.is_empty() {
        return Ok(());
    }
    // Dropped without a commit (an error), the transaction rolls back.
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    for (name, source) in &stale {
        if installed.iter().any(|(n, _)| n == name) {
            tracing::info!(
                function = name,
                "replacing a function whose definition changed"
            );
        }
        tx.execute(*source).await?;
        sqlx::query(
            "INSERT INTO functions (name, source) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE SET source = excluded.source",
        )
        .bind(name)
        .bind(source)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// A schema migrated by a pre-release build whose migrations were since
/// squashed into the baseline cannot be brought up to date: say so.
fn migrate_error(e: sqlx::migrate::MigrateError, schema: &str) -> Error {
    match e {
        sqlx::migrate::MigrateError::VersionMissing(v) => Error::config(format!(
            "schema {schema:?} holds migration {v}, which this version does not know: it was \
             created by a pre-release or a newer gendurable. Use a new schema, or drop this \
             one (DROP SCHEMA \"{schema}\" CASCADE) if its rows can go"
        )),
        e => Error::Migrate(e),
    }
}

#[cfg(test)]
mod tests {
    use super::FUNCTIONS;

    /// Each function is defined once, in the file named for it, and every
    /// file of sql/functions is installed.
    #[test]
    fn each_function_has_one_file_and_one_definition() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/sql");
        let mut files: Vec<String> = std::fs::read_dir(format!("{dir}/functions"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        let mut listed: Vec<String> = FUNCTIONS.iter().map(|(n, _)| format!("{n}.sql")).collect();
        listed.sort();
        assert_eq!(files, listed, "sql/functions and FUNCTIONS differ");
        for (name, source) in FUNCTIONS {
            assert_eq!(
                source.matches("CREATE OR REPLACE FUNCTION ").count(),
                1,
                "{name}.sql must define exactly one function"
            );
            assert!(
                source.contains(&format!("CREATE OR REPLACE FUNCTION {name}(")),
                "{name}.sql must define {name}"
            );
        }
        for entry in std::fs::read_dir(format!("{dir}/migrations")).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            assert!(
                !text.to_uppercase().contains("CREATE FUNCTION")
                    && !text.to_uppercase().contains("REPLACE FUNCTION"),
                "functions belong in sql/functions, not in a migration"
            );
        }
    }
}
