//! The one error type of the public API.

/// Everything that can go wrong in a call to the engine.
///
/// Input errors ([`Error::InvalidInput`], [`Error::InvalidConfig`]) are raised
/// before anything is written, so a rejected call changes nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A value passed to the engine is not acceptable (a name, a state, a key, ...).
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// Which argument, e.g. `"state"`, `"workflow"`, `"concurrency_key"`.
        field: &'static str,
        /// Why, in a sentence.
        reason: String,
    },
    /// The engine's configuration is not acceptable.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// No instance has this id.
    #[error("no instance with id {0}")]
    NotFound(i64),
    /// The engine has been shut down.
    #[error("the engine is shut down")]
    ShutDown,
    /// The database refused or failed a statement, or the connection broke.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Concurrent writers kept a call from finishing (a unique insert whose
    /// conflicting instances kept finishing under it). Nothing was inserted
    /// (an insert inside the caller's transaction: roll it back). Retrying
    /// succeeds.
    #[error("contended: {0}")]
    Contended(String),
    /// Running the schema migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl Error {
    pub(crate) fn input(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            field,
            reason: reason.into(),
        }
    }

    pub(crate) fn config(reason: impl Into<String>) -> Self {
        Error::InvalidConfig(reason.into())
    }

    /// Whether retrying later may succeed (a broken connection, a server
    /// restarting or taking no writes, a deadlock, a lock or statement
    /// timeout).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Database(e) => is_transient(e),
            Error::Contended(_) => true,
            _ => false,
        }
    }

    /// The server gave up waiting for the statement: its `lock_timeout` or
    /// `statement_timeout`, or a cancel. A smaller call may get through.
    pub(crate) fn gave_up_waiting(&self) -> bool {
        matches!(self, Error::Database(sqlx::Error::Database(db))
            if db.code().is_some_and(|c| gave_up(&c)))
    }
}

/// SQLSTATEs after which a connection is of no use for the next call: class
/// 08 (connection exception), 57P (the server shutting down, crashed or
/// restarting), and 25006 (a server that takes no writes: a standby, or a
/// primary set read-only before a switch-over moves its address; a new
/// connection may reach the one that does).
pub(crate) fn ends_connection(code: &str) -> bool {
    code.starts_with("08") || code.starts_with("57P") || code == "25006"
}

/// SQLSTATEs of a statement the server gave up waiting for (`lock_timeout`,
/// `statement_timeout` or a cancel): nothing about the data, and a server or
/// role setting can bring them to any of the engine's calls.
fn gave_up(code: &str) -> bool {
    code == "55P03" || code == "57014"
}

/// Whether a database error is worth retrying: a broken or refused
/// connection, one that ends (`ends_connection`), a statement the server gave
/// up waiting for, a deadlock or serialization failure, too many connections.
fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            ends_connection(&code)
                || gave_up(&code)
                || code == "40001"
                || code == "40P01"
                || code == "53300"
        }),
        _ => false,
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
