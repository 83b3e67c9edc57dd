//! The engine's SQL, in `core/sql/`: the migrations (tables, indexes, types),
//! one file per function, one file per statement. Statements are read here
//! and nowhere else, with the schema written in one way ([`in_schema`]).

mod migrate;

pub(crate) use migrate::migrate;

/// Writes the engine's schema into a statement in place of `__S__`. The
/// schema is validated as `[a-z0-9_]`; quoting keeps it exact.
fn in_schema(text: &str, schema: &str) -> String {
    text.replace("__S__", &format!("\"{schema}\""))
}

/// Declares [`Sql`] with one field per file of `sql/queries/`.
macro_rules! queries {
    ($($name:ident),* $(,)?) => {
        /// Every statement the engine runs, with the schema written in. Built
        /// once per engine; the texts are stable, so sqlx prepares each once
        /// per connection. See `sql/queries/<field>.sql` for each.
        #[derive(Debug)]
        pub(crate) struct Sql {
            /// The LISTEN/NOTIFY channel of this schema.
            pub channel: String,
            $(pub $name: String,)*
        }

        impl Sql {
            pub fn new(schema: &str) -> Sql {
                Sql {
                    channel: format!("{schema}_wake"),
                    $($name: in_schema(
                        include_str!(concat!("../../sql/queries/", stringify!($name), ".sql")),
                        schema,
                    ),)*
                }
            }
        }
    };
}

queries! {
    // Inserts.
    insert, next_ids, copy_in, orphans, key_room, rate_room, notify_queues,
    // Claims and outcomes.
    handoff, held_by_node,
    // The client.
    get, signal, cancel,
    // Liveness.
    heartbeat, forget_node, reap, forget_dead_nodes,
    // Maintenance.
    stage, prune, prune_rates, reconcile, park_orphans, unpark_workflows, unpark_sweep, rate_sweep,
    // Status.
    schema_exists, status_counts, status_nodes, status_waiting, status_gates,
    status_executing_keys, status_rates, status_parked,
}

/// Whether a database error is worth retrying: a broken or refused connection,
/// a server shutting down or starting, a deadlock or serialization failure.
pub(crate) fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || code.starts_with("57P")
                || code == "40001"
                || code == "40P01"
                || code == "53300"
        }),
        _ => false,
    }
}
