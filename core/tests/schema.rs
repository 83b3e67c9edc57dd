//! The schema as the migrations and functions build it, compared with the
//! committed dump `sql/schema.sql`: a change to the SQL shows in review as a
//! change to that file, and the file cannot drift from what the engine
//! installs. Function bodies appear there as a hash of the installed source
//! (the source itself is in `sql/functions/`, once). After changing the
//! SQL, rewrite the dump with
//! `GENDURABLE_UPDATE_SCHEMA=1 cargo test -p gendurable --test schema`.

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

const DUMP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/schema.sql");

#[tokio::test]
async fn the_committed_schema_dump_matches_what_the_engine_installs() {
    let url = support::url();
    let schema = support::schema("dump");
    let engine = support::builder(&url, &schema).build().await.unwrap();
    engine.shutdown().await.unwrap();
    let bodies: HashMap<String, String> = sqlx::query_as(
        "SELECT p.proname::text, md5(p.prosrc) FROM pg_proc p
         JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1",
    )
    .bind(&schema)
    .fetch_all(engine.pool())
    .await
    .unwrap()
    .into_iter()
    .collect();

    let bin = gendurable_testing::find_bin_dir().expect("PostgreSQL programs");
    let out = Command::new(bin.join("pg_dump"))
        .args(["--schema-only", "--no-owner", "--no-privileges"])
        .args(["--schema", &schema, "--exclude-table"])
        .arg(format!("{schema}._sqlx_migrations"))
        .args(["--dbname", &url])
        .output()
        .expect("run pg_dump");
    assert!(
        out.status.success(),
        "pg_dump failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump = normalise(&String::from_utf8_lossy(&out.stdout), &schema, &bodies);

    if std::env::var_os("GENDURABLE_UPDATE_SCHEMA").is_some() {
        std::fs::write(DUMP, &dump).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(Path::new(DUMP)).unwrap_or_default();
    if committed != dump {
        let line = committed
            .lines()
            .zip(dump.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(dump.lines().count()));
        panic!(
            "sql/schema.sql differs from the schema the engine installs, first at line {}:\n  \
             committed: {:?}\n  installed: {:?}\nIf the change to the SQL is intended, rewrite \
             the dump: GENDURABLE_UPDATE_SCHEMA=1 cargo test -p gendurable --test schema",
            line + 1,
            committed.lines().nth(line).unwrap_or("<end>"),
            dump.lines().nth(line).unwrap_or("<end>"),
        );
    }
}

/// The dump without what varies between runs and PostgreSQL builds (its
/// comments, session settings, the test's schema name), with each function's
/// body replaced by the hash of its source in `bodies`, and with runs of
/// blank lines folded.
fn normalise(dump: &str, schema: &str, bodies: &HashMap<String, String>) -> String {
    let mut out = String::new();
    let mut blank = true;
    let mut function: Option<String> = None;
    // The dollar quote closing the body being skipped.
    let mut closing: Option<String> = None;
    for line in dump.lines() {
        if let Some(end) = &closing {
            if line.starts_with(end.as_str()) {
                closing = None;
                out.push_str(";\n");
            }
            continue;
        }
        let skip = line.starts_with("--")
            || line.starts_with("SET ")
            || line.starts_with("SELECT pg_catalog.set_config")
            || line.starts_with("\\restrict")
            || line.starts_with("\\unrestrict");
        if skip {
            continue;
        }
        let line = line.replace(schema, "gendurable");
        if let Some(name) = line
            .strip_prefix("CREATE FUNCTION gendurable.")
            .and_then(|rest| rest.split('(').next())
        {
            function = Some(name.to_owned());
        }
        if let (Some(tag), Some(name)) = (line.trim().strip_prefix("AS "), &function) {
            let hash = bodies.get(name).map_or("?", String::as_str);
            out.push_str(&format!(
                "    AS -- sql/functions/{name}.sql, source md5 {hash}\n"
            ));
            closing = Some(tag.to_owned());
            function = None;
            blank = false;
            continue;
        }
        if line.trim().is_empty() {
            if !blank {
                out.push('\n');
            }
            blank = true;
            continue;
        }
        blank = false;
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
