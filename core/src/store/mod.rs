//! The database side: the engine's SQL, in `core/sql/` (the migrations, one
//! file per function, one file per statement), read here and nowhere else
//! with the schema written in one way ([`in_schema`]), and typed calls of
//! the statements the node runs.

mod claims;
mod durability;
mod kept;
mod limits;
mod maintenance;
mod migrate;
mod pass;

pub(crate) use claims::{read_handoff, Call, Demand, Handoff, Held};
pub(crate) use durability::{raise_synchronous_commit, warn_if_commits_may_be_lost};
pub(crate) use kept::{close_now, unanswered, IDLE_CHECK};
pub(crate) use limits::Limits;
pub(crate) use maintenance::{Beat, RateSwept};
pub(crate) use migrate::migrate;
pub(crate) use pass::{Answered, Limited, Pass};

use kept::Kept;
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use std::time::Duration;

/// The pools and the statements of one schema.
pub(crate) struct Store {
    pub pool: PgPool,
    /// The claim path's own connections (the outcome writer's and the
    /// pickers' `handoff` calls), as many as it runs at once. A connection's
    /// first `handoff` compiles the functions and plans their statements,
    /// about 30 ms of the server's CPU: on a pool shared with everything
    /// else, every connection of it came to pay that in turn, mid-run. The
    /// same pool as `pool` when the engine was handed one, or allowed few
    /// connections.
    pub claims: PgPool,
    /// `claims`' connections between calls, when it is the engine's own
    /// pool (one shared keeps its connections for everything else).
    kept: Option<Kept>,
    pub sql: Sql,
}

impl Store {
    /// `own_claims`: `claims` is a pool of the claim path's alone.
    pub fn new(pool: PgPool, claims: PgPool, own_claims: bool, schema: &str) -> Store {
        Store {
            pool,
            claims,
            kept: own_claims.then(Kept::new),
            sql: Sql::new(schema),
        }
    }

    /// A connection for a claim-path call; give it back with
    /// [`Store::keep_claim_conn`] once the call succeeded. A kept one that
    /// does not answer its check within `limit` is closed.
    pub async fn claim_conn(&self, limit: Duration) -> sqlx::Result<PoolConnection<Postgres>> {
        match &self.kept {
            Some(kept) => kept.take(&self.claims, limit).await,
            None => self.claims.acquire().await,
        }
    }

    /// Keep a claim-path connection whose call succeeded (or return it to a
    /// shared pool).
    pub fn keep_claim_conn(&self, conn: PoolConnection<Postgres>) {
        if let Some(kept) = &self.kept {
            kept.put(conn);
        }
    }
}

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
            /// The channel that tells nodes an instance they run was cancelled.
            pub cancel_channel: String,
            $(pub $name: String,)*
        }

        impl Sql {
            pub fn new(schema: &str) -> Sql {
                Sql {
                    channel: format!("{schema}_wake"),
                    cancel_channel: format!("{schema}_cancel"),
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
    insert, unique_holders, next_ids, copy_in, orphans, insert_room, rate_room, notify_queues,
    // Periodic workflows.
    cron_register, cron_lock, cron_advance,
    // Claims and outcomes.
    handoff, held_by_node, cancel_requested,
    // The client.
    get, signal, signal_instance, cancel,
    // Operators' actions.
    retry, delete, count, matching_ids, pause, resume, paused,
    // Metrics.
    active_counts, metrics_gates,
    // Testing.
    stage_queue, inserted,
    // Liveness.
    heartbeat, forget_node, reap, forget_dead_nodes,
    // Maintenance.
    stage, prune, prune_rates, throughput_add, reconcile, park_orphans, unpark_workflows, unpark_sweep, rate_sweep,
    // The dashboard's reads.
    finished_count, throughput_recent, id_bounds, list_window, why_waiting,
    // Status.
    schema_exists, status_counts, status_nodes, status_waiting, status_gates,
    status_executing_keys, status_rates, status_parked,
}
