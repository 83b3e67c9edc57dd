//! One direct connection to the database, to tell why it cannot be reached.
//!
//! A pool retries a refused connection until its acquire timeout and then
//! reports only "pool timed out". Trying one connection first (or after such
//! a timeout) names the cause at once: refused, unknown host, authentication
//! failed, no such database, no answer in time.

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};
use std::str::FromStr;
use std::time::Duration;

/// Why a connection failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cause {
    /// Nothing listens there (the server is down, or on another port).
    Refused,
    /// The host name does not resolve.
    UnknownHost,
    /// The server refused the user or the password.
    Auth,
    /// The server has no database of that name.
    NoDatabase,
    /// The server is starting up or shutting down.
    NotReady,
    /// No answer within the connect timeout.
    Timeout,
    /// Anything else (TLS, a bad URL, too many connections, ...).
    Other,
}

impl Cause {
    /// A short name: `refused`, `unknown_host`, `auth`, `no_database`,
    /// `not_ready`, `timeout`, `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Refused => "refused",
            Cause::UnknownHost => "unknown_host",
            Cause::Auth => "auth",
            Cause::NoDatabase => "no_database",
            Cause::NotReady => "not_ready",
            Cause::Timeout => "timeout",
            Cause::Other => "other",
        }
    }

    /// Whether trying again later may succeed.
    pub fn is_transient(self) -> bool {
        matches!(self, Cause::Refused | Cause::NotReady | Cause::Timeout)
    }
}

/// A failed connection: its cause and one line saying it.
#[derive(Debug, Clone)]
pub struct ConnectError {
    pub cause: Cause,
    pub message: String,
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConnectError {}

/// Open one connection to `url` within `timeout` and close it again.
pub async fn check(url: &str, timeout: Duration) -> Result<(), ConnectError> {
    let opts = PgConnectOptions::from_str(url).map_err(|e| ConnectError {
        cause: Cause::Other,
        message: format!("bad database URL: {e}"),
    })?;
    check_with(&opts, timeout).await
}

/// [`check`] with parsed options (a pool's, say).
pub async fn check_with(opts: &PgConnectOptions, timeout: Duration) -> Result<(), ConnectError> {
    match tokio::time::timeout(timeout, opts.connect()).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            Ok(())
        }
        Ok(Err(e)) => Err(explain(opts, &e).await),
        Err(_) => Err(ConnectError {
            cause: Cause::Timeout,
            message: format!(
                "cannot connect to PostgreSQL at {}: no answer within {}",
                place(opts),
                seconds(timeout)
            ),
        }),
    }
}

/// Whether a database error means the pool could not get a connection in
/// time (the cause is then unknown: see [`check_with`]).
pub fn is_pool_timeout(e: &gendurable::Error) -> bool {
    matches!(e, gendurable::Error::Database(sqlx::Error::PoolTimedOut))
}

fn seconds(d: Duration) -> String {
    format!("{} s", (d.as_secs_f64() * 1000.0).round() / 1000.0)
}

/// Where the connection goes: `host:port` or the socket path.
fn place(opts: &PgConnectOptions) -> String {
    match opts.get_socket() {
        Some(dir) => format!(
            "{}",
            dir.join(format!(".s.PGSQL.{}", opts.get_port())).display()
        ),
        None => format!("{}:{}", opts.get_host(), opts.get_port()),
    }
}

async fn explain(opts: &PgConnectOptions, e: &sqlx::Error) -> ConnectError {
    let at = place(opts);
    let (cause, why) = match e {
        sqlx::Error::Io(io) => match io.kind() {
            std::io::ErrorKind::ConnectionRefused => (
                Cause::Refused,
                "connection refused (is the server running and listening there?)".to_owned(),
            ),
            std::io::ErrorKind::NotFound if opts.get_socket().is_some() => (
                Cause::Refused,
                "no server socket there (is the server running?)".to_owned(),
            ),
            std::io::ErrorKind::TimedOut => (Cause::Timeout, "the connection timed out".into()),
            _ if opts.get_socket().is_none() && !resolves(opts).await => (
                Cause::UnknownHost,
                format!("unknown host {:?}", opts.get_host()),
            ),
            _ => (Cause::Other, io.to_string()),
        },
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            let cause = match code.as_ref() {
                "28P01" | "28000" => Cause::Auth,
                "3D000" => Cause::NoDatabase,
                "57P03" | "57P01" | "57P02" => Cause::NotReady,
                _ => Cause::Other,
            };
            let why = match cause {
                Cause::Auth => format!(
                    "authentication failed for user {:?}: {}",
                    opts.get_username(),
                    db.message()
                ),
                _ => db.message().to_owned(),
            };
            (cause, why)
        }
        sqlx::Error::Tls(t) => (Cause::Other, format!("TLS: {t}")),
        other => (Cause::Other, other.to_string()),
    };
    ConnectError {
        cause,
        message: format!("cannot connect to PostgreSQL at {at}: {}", one_line(&why)),
    }
}

/// Whether the host name resolves (an IP address always does).
async fn resolves(opts: &PgConnectOptions) -> bool {
    let host = opts.get_host().trim_matches(['[', ']']);
    tokio::net::lookup_host((host, opts.get_port()))
        .await
        .map(|mut a| a.next().is_some())
        .unwrap_or(false)
}

/// `s` on one line.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
