//! gendurable-testing: throwaway PostgreSQL clusters for tests, demos and
//! examples.
//!
//! The engine (`gendurable`) never starts a server; it connects to the one it
//! is given. This crate gives test suites, demos and examples a real, private
//! PostgreSQL without setting one up: [`TempPostgres`] runs `initdb` into a
//! fresh temporary directory and starts a server on a free loopback port,
//! using the PostgreSQL server binaries (`initdb`, `pg_ctl`, `postgres`)
//! already installed on the machine. Nothing is downloaded, and nothing is
//! refused silently: when a cluster cannot be started or stopped (no
//! binaries, no user to run them as, a program failing, a timeout) the call
//! returns an [`Error`] saying which and why, with the program's output and
//! the relevant part of the server log. The cluster uses `trust`
//! authentication for the `postgres` role, so [`TempPostgres::url`] needs no
//! password.
//!
//! It runs `initdb` and `pg_ctl` as child processes and waits for them, so the
//! host process must not ignore `SIGCHLD` (with `SIG_IGN` children are reaped
//! by the kernel and waiting fails with "No child processes"). The BEAM does
//! ignore it: the Elixir binding restores the default disposition when its
//! NIF loads.
//!
//! ```no_run
//! # async fn demo() -> gendurable_testing::Result<()> {
//! use gendurable_testing::TempPostgres;
//!
//! let pg = TempPostgres::start().await?;
//! let url = pg.url(); // postgres://postgres@127.0.0.1:PORT/postgres
//! // ... connect with sqlx and run the test ...
//! drop(pg); // stops the server and deletes its directory
//! # let _ = url;
//! # Ok(())
//! # }
//! ```
//!
//! The async functions need a Tokio runtime; process work runs on
//! `tokio::process` or the blocking pool. Each cluster listens on
//! `127.0.0.1` only, allows 300 connections and uses 128 MB of shared
//! buffers; see [`TempPostgresOptions`] for durability and extra settings.
//!
//! # Cleanup
//!
//! Dropping a [`TempPostgres`] stops the server and deletes its directory.
//! `Drop` cannot await, so it waits for `pg_ctl stop` synchronously (usually
//! well under a second).
//! Because destructors do not run when a process is killed or leaves through
//! [`std::process::exit`] (for example a cluster parked in a `static`), every
//! cluster also gets a small watchdog process. The watchdog blocks reading a
//! pipe whose write end only the owning process holds; the kernel closes that
//! end whenever the owner exits, for whatever reason, and the watchdog then
//! stops the server (`pg_ctl stop -m immediate`) and removes the directory.
//! The watchdog runs in its own session with its output sent to `/dev/null`,
//! so it neither receives a terminal's Ctrl-C nor holds a test runner's
//! output pipes open.
//!
//! # Running as root
//!
//! PostgreSQL refuses to run as root. When the current process is root, the
//! server programs are run as the `postgres` operating-system user instead,
//! and the cluster directory is handed over to that user.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Output, Stdio};
use std::time::Duration;

use sqlx::{Connection, PgConnection};
use tempfile::TempDir;

/// Operating-system user that runs the server when the current process is root.
const SERVICE_USER: &str = "postgres";

/// Database role created by `initdb`; it is the superuser of the cluster.
const SUPERUSER: &str = "postgres";

/// Name of the file, inside the data directory, that holds this crate's
/// server settings. `postgresql.conf` includes it.
const SETTINGS_FILE: &str = "gendurable.conf";

/// Name of the server log file inside the cluster's root directory.
const LOG_FILE: &str = "postgres.log";

/// How many times a start is retried on a new port when the chosen port was
/// taken between picking it and the server binding it.
const PORT_ATTEMPTS: usize = 5;

/// Seconds `pg_ctl` itself waits for the server to start or stop.
const PG_CTL_WAIT_SECS: u64 = 60;

/// Upper bound for one `initdb` run; it normally takes well under a second.
const INITDB_TIMEOUT: Duration = Duration::from_secs(120);

/// Upper bound for one `pg_ctl` run. Larger than [`PG_CTL_WAIT_SECS`] so that
/// `pg_ctl` reports its own, more precise, timeout first.
const PG_CTL_TIMEOUT: Duration = Duration::from_secs(PG_CTL_WAIT_SECS + 30);

/// Shell script run by the watchdog.
///
/// Positional parameters: `$1` is `pg_ctl`, `$2` the data directory, `$3` the
/// cluster's root directory. Standard input is a pipe whose write end is held
/// only by the owning process, so the `read` loop ends exactly when the owner
/// is gone: no polling, and no confusion from reused PIDs or unreaped owners.
const WATCHDOG_SCRIPT: &str = r#"while read -r _; do :; done
"$1" stop -D "$2" -m immediate -w -t 30
rm -rf "$3"
"#;

/// Errors from starting, stopping or using a throwaway cluster.
#[derive(thiserror::Error, Debug)]
#[non_exhaustive]
pub enum Error {
    /// No PostgreSQL server binaries were found on this machine.
    #[error(
        "no PostgreSQL server binaries (pg_ctl, initdb, postgres) found; searched: {}. \
         Install PostgreSQL (for example `apt-get install postgresql`) or set DATABASE_URL \
         to an existing server",
        display_paths(.searched)
    )]
    NoBinaries {
        /// Directories that were checked, in search order.
        searched: Vec<PathBuf>,
    },

    /// The current process is root and there is no `postgres` user to run the
    /// server as (PostgreSQL refuses to run as root).
    #[error(
        "running as root, but there is no `{user}` operating-system user to run PostgreSQL as \
         (PostgreSQL refuses to run as root); create that user or set DATABASE_URL"
    )]
    NoServiceUser {
        /// The user name that was looked up.
        user: String,
    },

    /// A PostgreSQL program exited unsuccessfully.
    #[error("`{program}` failed ({status}):\n{output}")]
    Command {
        /// The program and its main arguments.
        program: String,
        /// How the program exited.
        status: ExitStatus,
        /// What the program printed, plus the relevant part of the server
        /// log when the server failed to start.
        output: String,
    },

    /// A file-system or process operation failed.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),

    /// A program or operation did not finish in time.
    #[error("timed out: {0}")]
    Timeout(String),

    /// A database or setting name was rejected before reaching the server.
    #[error("invalid name: {0}")]
    InvalidName(String),

    /// A statement sent to the throwaway server failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn display_paths(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "(nothing)".to_owned();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Settings for [`TempPostgres::start_with`].
///
/// `TempPostgresOptions::default()` suits tests: durability is off and the
/// port is picked automatically.
#[derive(Debug, Clone, Default)]
pub struct TempPostgresOptions {
    /// Keep PostgreSQL's protection against machine crashes on.
    ///
    /// When `false` (the default), `fsync` and `full_page_writes` are turned
    /// off: much faster, and a throwaway cluster never has to survive a power
    /// loss. Committed data still survives any server stop or crash,
    /// including [`StopMode::Immediate`] and `kill -9`, because
    /// `synchronous_commit` stays on: with `fsync` off a commit costs only a
    /// write to the page cache, so turning it off would gain nothing and
    /// would lose recently acknowledged commits in crash tests.
    pub fsync: bool,
    /// Listen on this port instead of a free one picked automatically.
    pub port: Option<u16>,
    /// Extra server settings as `(name, value)` pairs, applied after (and so
    /// overriding) the built-in ones. Values are quoted for
    /// `postgresql.conf`, so they may contain any characters.
    pub extra_settings: Vec<(String, String)>,
}

/// How to shut the server down in [`TempPostgres::stop_with`] and
/// [`TempPostgres::restart_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StopMode {
    /// Disconnect clients, finish with a checkpoint (`pg_ctl stop -m fast`).
    #[default]
    Fast,
    /// Quit at once without a checkpoint (`pg_ctl stop -m immediate`); the
    /// next start goes through crash recovery. Good for simulating a crash.
    Immediate,
}

impl StopMode {
    fn as_arg(self) -> &'static str {
        match self {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        }
    }
}

/// Numeric identity the server programs run under when we are root.
#[derive(Debug, Clone, Copy)]
struct RunAs {
    uid: u32,
    gid: u32,
}

/// A private PostgreSQL server in a temporary directory.
///
/// Dropping it stops the server (fast shutdown, synchronously) and deletes the
/// directory; a watchdog process does the same if the owning process dies
/// without dropping it. See the [crate documentation](crate).
#[derive(Debug)]
pub struct TempPostgres {
    /// Root of everything the cluster owns: data directory, log file and the
    /// Unix socket. `None` only while being dropped.
    root: Option<TempDir>,
    root_path: PathBuf,
    data_dir: PathBuf,
    bin_dir: PathBuf,
    port: u16,
    /// Whether a start may move to another port when the current one is taken.
    port_is_flexible: bool,
    fsync: bool,
    extra_settings: Vec<(String, String)>,
    run_as: Option<RunAs>,
    watchdog: Option<std::process::Child>,
}

impl TempPostgres {
    /// Initialises and starts a cluster with [`TempPostgresOptions::default`]:
    /// durability off, automatically chosen port.
    pub async fn start() -> Result<TempPostgres> {
        Self::start_with(TempPostgresOptions::default()).await
    }

    /// Initialises and starts a cluster with the given options.
    ///
    /// Takes roughly a second, most of it in `initdb`.
    pub async fn start_with(opts: TempPostgresOptions) -> Result<TempPostgres> {
        for (name, _) in &opts.extra_settings {
            validate_setting_name(name)?;
        }
        let bin_dir = blocking(find_bin_dir).await?;
        let run_as = if is_root() {
            Some(
                lookup_user(SERVICE_USER).ok_or_else(|| Error::NoServiceUser {
                    user: SERVICE_USER.to_owned(),
                })?,
            )
        } else {
            None
        };
        let port = match opts.port {
            Some(port) => port,
            None => free_port()?,
        };

        let root = blocking(move || create_root(run_as)).await?;
        let root_path = root.path().to_path_buf();
        let data_dir = root_path.join("data");
        // From here on, an early return drops `pg`, which cleans up.
        let mut pg = TempPostgres {
            root: Some(root),
            root_path,
            data_dir,
            bin_dir,
            port,
            port_is_flexible: opts.port.is_none(),
            fsync: opts.fsync,
            extra_settings: opts.extra_settings,
            run_as,
            watchdog: None,
        };
        // Start the watchdog before anything slow so that even a kill during
        // initdb leaves nothing behind.
        pg.watchdog = Some(spawn_watchdog(
            &pg.bin_dir.join("pg_ctl"),
            &pg.data_dir,
            &pg.root_path,
            run_as,
        )?);

        pg.initdb().await?;
        pg.start_server().await?;
        tracing::debug!(port = pg.port, dir = %pg.root_path.display(), "temporary PostgreSQL started");
        Ok(pg)
    }

    /// Connection URL for the `postgres` database as the `postgres`
    /// superuser: `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        self.database_url("postgres")
    }

    /// TCP port the server listens on (on 127.0.0.1). It stays the same
    /// across [`stop`](Self::stop) and [`start_again`](Self::start_again).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's data directory (`PGDATA`). Its parent directory, which
    /// also holds the log and the Unix socket, is deleted on drop.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server's log file; worth reading when a test fails oddly.
    pub fn log_file(&self) -> PathBuf {
        self.root_path.join(LOG_FILE)
    }

    /// PID of the running postmaster, read from `postmaster.pid`, for
    /// fault-injection tests (for example `kill -9`).
    ///
    /// Returns `None` when the server is not running, including when the file
    /// is left over from a server that died.
    pub fn postmaster_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        let pid: u32 = text.lines().next()?.trim().parse().ok()?;
        process_alive(pid).then_some(pid)
    }

    /// Whether the server process is currently alive.
    pub fn is_running(&self) -> bool {
        self.postmaster_pid().is_some()
    }

    /// Stops the server with a fast shutdown, keeping the data directory.
    /// Does nothing if the server is not running.
    pub async fn stop(&mut self) -> Result<()> {
        self.stop_with(StopMode::Fast).await
    }

    /// Stops the server in the given mode, keeping the data directory.
    /// Does nothing if the server is not running.
    pub async fn stop_with(&mut self, mode: StopMode) -> Result<()> {
        if !self.is_running() {
            return Ok(());
        }
        let mut cmd = self.pg_command("pg_ctl");
        cmd.arg("stop")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-m", mode.as_arg(), "-w", "-t"])
            .arg(PG_CTL_WAIT_SECS.to_string());
        let label = format!("pg_ctl stop -m {}", mode.as_arg());
        let output = run(cmd, &label, PG_CTL_TIMEOUT).await?;
        // pg_ctl also fails when the server exits on its own meanwhile;
        // what matters is whether it is gone now.
        if output.status.success() || !self.is_running() {
            Ok(())
        } else {
            Err(command_error(label, &output, String::new()))
        }
    }

    /// Starts the server again after [`stop`](Self::stop) or after it died,
    /// on the same port and with the same data, to test how clients cope
    /// with PostgreSQL restarting mid-run. Does nothing if it is running.
    ///
    /// Fails if something else has taken the port meanwhile.
    pub async fn start_again(&mut self) -> Result<()> {
        if self.is_running() {
            return Ok(());
        }
        let flexible = std::mem::replace(&mut self.port_is_flexible, false);
        let result = self.start_server().await;
        self.port_is_flexible = flexible;
        result
    }

    /// Fast shutdown followed by a start on the same port, keeping the data.
    pub async fn restart(&mut self) -> Result<()> {
        self.restart_with(StopMode::Fast).await
    }

    /// Stops the server in the given mode and starts it again on the same
    /// port. With [`StopMode::Immediate`] the start runs crash recovery.
    pub async fn restart_with(&mut self, mode: StopMode) -> Result<()> {
        self.stop_with(mode).await?;
        self.start_again().await
    }

    /// Creates a database and returns its connection URL.
    ///
    /// `name` must be a plain identifier: ASCII letters, digits and `_`, not
    /// starting with a digit, at most 63 bytes. It is used as written
    /// (case preserved).
    pub async fn create_database(&self, name: &str) -> Result<String> {
        validate_database_name(name)?;
        let mut conn = PgConnection::connect(&self.url()).await?;
        // The name is validated above, so plain double quoting is enough.
        let sql = format!("CREATE DATABASE \"{name}\"");
        let result = sqlx::query(&sql).execute(&mut conn).await;
        let _ = conn.close().await;
        result?;
        Ok(self.database_url(name))
    }

    fn database_url(&self, database: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{database}", self.port)
    }

    /// A command for one of the server programs, run as the service user
    /// when we are root.
    fn pg_command(&self, program: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(self.bin_dir.join(program));
        // The service user may not be allowed into our working directory.
        cmd.current_dir(&self.root_path)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(user) = self.run_as {
            cmd.uid(user.uid).gid(user.gid);
        }
        cmd
    }

    async fn initdb(&self) -> Result<()> {
        let mut cmd = self.pg_command("initdb");
        cmd.arg("-D")
            .arg(&self.data_dir)
            .args(["-A", "trust", "-U", SUPERUSER, "-E", "UTF8", "--no-locale"])
            // Throwaway cluster: skipping the final fsync saves most of the time.
            .arg("--no-sync");
        let output = run(cmd, "initdb", INITDB_TIMEOUT).await?;
        if !output.status.success() {
            return Err(command_error("initdb".into(), &output, String::new()));
        }

        // Our settings go into a file of their own, so that a port change on
        // retry rewrites just that file, and values never pass through a shell
        // (pg_ctl hands `-o` options to `sh`).
        let conf = self.data_dir.join("postgresql.conf");
        let mut text = tokio::fs::read_to_string(&conf).await?;
        text.push_str(&format!("\ninclude '{SETTINGS_FILE}'\n"));
        tokio::fs::write(&conf, text).await?;
        Ok(())
    }

    async fn write_settings(&self) -> Result<()> {
        let mut settings: Vec<(&str, String)> = vec![
            ("port", self.port.to_string()),
            ("listen_addresses", "127.0.0.1".into()),
            (
                "unix_socket_directories",
                self.root_path.to_string_lossy().into_owned(),
            ),
            ("max_connections", "300".into()),
            ("shared_buffers", "128MB".into()),
        ];
        if !self.fsync {
            // Only machine crashes need these; see `TempPostgresOptions::fsync`.
            settings.push(("fsync", "off".into()));
            settings.push(("full_page_writes", "off".into()));
        }
        let mut text = String::from("# Written by gendurable-testing; rewritten on start.\n");
        let extra = self
            .extra_settings
            .iter()
            .map(|(name, value)| (name.as_str(), value.clone()));
        for (name, value) in settings.into_iter().chain(extra) {
            text.push_str(&format!("{name} = {}\n", conf_quote(&value)));
        }
        let path = self.data_dir.join(SETTINGS_FILE);
        tokio::fs::write(&path, text).await?;
        if let Some(user) = self.run_as {
            std::os::unix::fs::chown(&path, Some(user.uid), Some(user.gid))?;
        }
        Ok(())
    }

    /// Starts the server, moving to a new port if the current one turns out
    /// to be taken and the port was not chosen by the caller.
    async fn start_server(&mut self) -> Result<()> {
        self.clear_stale_pid_file().await?;
        let log = self.log_file();
        let mut attempt = 1;
        loop {
            self.write_settings().await?;
            let log_start = tokio::fs::metadata(&log).await.map_or(0, |m| m.len());
            let mut cmd = self.pg_command("pg_ctl");
            cmd.arg("start")
                .arg("-D")
                .arg(&self.data_dir)
                .arg("-l")
                .arg(&log)
                .args(["-w", "-t"])
                .arg(PG_CTL_WAIT_SECS.to_string());
            let output = run(cmd, "pg_ctl start", PG_CTL_TIMEOUT).await?;
            if output.status.success() {
                return Ok(());
            }
            let log_tail = read_log_since(&log, log_start).await;
            let port_taken = log_tail.contains("Address already in use")
                || log_tail.contains("could not create any TCP/IP sockets");
            if port_taken && self.port_is_flexible && attempt < PORT_ATTEMPTS {
                let old = self.port;
                self.port = free_port()?;
                tracing::debug!(
                    old,
                    new = self.port,
                    "port taken, retrying PostgreSQL start"
                );
                attempt += 1;
                continue;
            }
            return Err(command_error(
                format!("pg_ctl start (port {})", self.port),
                &output,
                log_tail,
            ));
        }
    }

    /// A server that died without cleaning up leaves `postmaster.pid` and its
    /// socket lock file behind. PostgreSQL normally overrides such files, but
    /// not when the recorded PID is an unreaped zombie (common in containers
    /// whose init does not reap orphans), so remove them once the server is
    /// dead.
    ///
    /// First wait (bounded) for the dead server's children to detach from its
    /// shared memory: they exit on their own as soon as they notice the
    /// postmaster is gone, and a start before that would be refused.
    async fn clear_stale_pid_file(&self) -> Result<()> {
        let path = self.data_dir.join("postmaster.pid");
        let Ok(text) = tokio::fs::read_to_string(&path).await else {
            return Ok(());
        };
        if self.is_running() {
            return Ok(());
        }
        // Line 7 holds the shared memory key and id of the interlock segment.
        let shm_id = text
            .lines()
            .nth(6)
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|id| id.parse::<libc::c_int>().ok());
        if let Some(shm_id) = shm_id {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while shm_in_use(shm_id) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        remove_if_exists(&path).await?;

        // The socket lock file records the same dead PID and trips the same
        // check, so it goes too.
        let socket_lock = self.root_path.join(format!(".s.PGSQL.{}.lock", self.port));
        if let Ok(text) = tokio::fs::read_to_string(&socket_lock).await {
            let pid = text
                .lines()
                .next()
                .and_then(|l| l.trim().parse::<u32>().ok());
            if !pid.is_some_and(process_alive) {
                remove_if_exists(&socket_lock).await?;
            }
        }
        Ok(())
    }

    /// Synchronous stop used by `Drop`, where awaiting is impossible.
    fn stop_blocking(&self) {
        for mode in [StopMode::Fast, StopMode::Immediate] {
            if !self.is_running() {
                return;
            }
            let mut cmd = std::process::Command::new(self.bin_dir.join("pg_ctl"));
            cmd.arg("stop")
                .arg("-D")
                .arg(&self.data_dir)
                .args(["-m", mode.as_arg(), "-w", "-t", "30"])
                .current_dir(&self.root_path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some(user) = self.run_as {
                cmd.uid(user.uid).gid(user.gid);
            }
            match cmd.status() {
                Ok(status) if status.success() => return,
                Ok(status) => tracing::warn!(%status, mode = mode.as_arg(), "pg_ctl stop failed"),
                Err(e) => tracing::warn!(error = %e, "could not run pg_ctl stop"),
            }
        }
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        self.stop_blocking();
        if let Some(root) = self.root.take() {
            if let Err(e) = root.close() {
                tracing::warn!(error = %e, dir = %self.root_path.display(), "could not remove temporary PostgreSQL directory");
            }
        }
        // Killed last, so that it still covers us if the stop above hangs and
        // the process is killed meanwhile.
        if let Some(mut watchdog) = self.watchdog.take() {
            // The watchdog leads its own process group; take the whole group
            // so no helper it may have started survives.
            if let Ok(pgid) = i32::try_from(watchdog.id()) {
                // SAFETY: kill(2) has no memory-safety preconditions.
                unsafe {
                    libc::kill(-pgid, libc::SIGKILL);
                }
            }
            // SIGKILL is already pending, so closing its stdin (which `wait`
            // does first) cannot wake it into running the cleanup.
            let _ = watchdog.wait();
        }
    }
}

impl fmt::Display for TempPostgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "temporary PostgreSQL on port {} in {}",
            self.port,
            self.root_path.display()
        )
    }
}

/// Returns the `DATABASE_URL` environment variable when it is set and not
/// empty, otherwise starts a [`TempPostgres`] and returns its URL with the
/// cluster as a guard.
///
/// A real server configured by the caller always wins. Keep the guard alive
/// as long as the URL is in use: dropping it removes the cluster.
pub async fn database_url_or_temp() -> Result<(String, Option<TempPostgres>)> {
    if let Some(url) = std::env::var_os("DATABASE_URL") {
        if !url.is_empty() {
            let url = url.into_string().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    "DATABASE_URL is not valid UTF-8",
                )
            })?;
            return Ok((url, None));
        }
    }
    let pg = TempPostgres::start().await?;
    Ok((pg.url(), Some(pg)))
}

/// The URL of one server shared by the whole process: `DATABASE_URL` when
/// set and not empty, otherwise a [`TempPostgres`] started on the first call
/// (on a thread of its own, so that it outlives any one test's runtime) and
/// kept until the process exits (its watchdog then removes it). For test
/// binaries whose tests each take a schema of their own.
///
/// # Panics
///
/// When no server can be started: a test suite has nothing to run against.
pub fn shared_url() -> String {
    static SHARED: std::sync::OnceLock<(String, Option<TempPostgres>)> = std::sync::OnceLock::new();
    SHARED
        .get_or_init(|| {
            std::thread::spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime to start PostgreSQL on");
                rt.block_on(database_url_or_temp())
                    .unwrap_or_else(|e| panic!("cannot start a throwaway PostgreSQL: {e}"))
            })
            .join()
            .expect("the thread starting PostgreSQL")
        })
        .0
        .clone()
}

/// Finds the directory holding the PostgreSQL server programs.
///
/// Search order:
/// 1. each `PATH` entry holding `pg_ctl`, with symlinks resolved, so that a
///    `/usr/local/bin/pg_ctl` link leads to the real installation;
/// 2. `pg_config --bindir`;
/// 3. well-known locations, highest version first:
///    `/usr/lib/postgresql/<version>/bin` (Debian, Ubuntu),
///    `/usr/pgsql-<version>/bin` (RHEL family), `/usr/local/pgsql/bin`.
///
/// A directory qualifies when `pg_ctl`, `initdb` and `postgres` are all in it.
pub fn find_bin_dir() -> Result<PathBuf> {
    let mut searched = Vec::new();

    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.as_os_str().is_empty() {
                continue;
            }
            let pg_ctl = dir.join("pg_ctl");
            if !is_executable(&pg_ctl) {
                searched.push(dir);
                continue;
            }
            // The other programs live next to the real pg_ctl, not
            // necessarily next to a link to it.
            let real_dir = std::fs::canonicalize(&pg_ctl)
                .ok()
                .and_then(|p| p.parent().map(Path::to_path_buf));
            if let Some(real_dir) = real_dir {
                if has_server_binaries(&real_dir) {
                    return Ok(real_dir);
                }
                searched.push(real_dir);
            }
            searched.push(dir);
        }
    }

    if let Ok(output) = std::process::Command::new("pg_config")
        .arg("--bindir")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    {
        if output.status.success() {
            let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
            if has_server_binaries(&dir) {
                return Ok(dir);
            }
            searched.push(dir);
        }
    }

    let mut well_known = versioned_dirs(Path::new("/usr/lib/postgresql"), "", "bin");
    well_known.extend(versioned_dirs(Path::new("/usr"), "pgsql-", "bin"));
    well_known.push(PathBuf::from("/usr/local/pgsql/bin"));
    for dir in well_known {
        if has_server_binaries(&dir) {
            return Ok(dir);
        }
        searched.push(dir);
    }

    Err(Error::NoBinaries { searched })
}

/// `<parent>/<prefix><version>/<suffix>` for every version-named entry,
/// highest version first.
fn versioned_dirs(parent: &Path, prefix: &str, suffix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut found: Vec<(Vec<u32>, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name();
            let version = name.to_str()?.strip_prefix(prefix)?;
            let key = version
                .split('.')
                .map(|part| part.parse::<u32>().ok())
                .collect::<Option<Vec<_>>>()?;
            Some((key, entry.path().join(suffix)))
        })
        .collect();
    // Numeric comparison, so that 15 sorts above 9.6.
    found.sort_by(|a, b| b.0.cmp(&a.0));
    found.into_iter().map(|(_, dir)| dir).collect()
}

fn has_server_binaries(dir: &Path) -> bool {
    ["pg_ctl", "initdb", "postgres"]
        .iter()
        .all(|name| is_executable(&dir.join(name)))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Runs a blocking closure off the async runtime's worker threads.
async fn blocking<T, F>(f: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Io(io::Error::other(e)))?
}

/// Runs a command to completion, capturing its output, within `limit`.
/// The exit status is left to the caller to judge.
async fn run(mut cmd: tokio::process::Command, label: &str, limit: Duration) -> Result<Output> {
    match tokio::time::timeout(limit, cmd.output()).await {
        Ok(result) => {
            result.map_err(|e| Error::Io(io::Error::new(e.kind(), format!("running {label}: {e}"))))
        }
        // kill_on_drop(true) takes care of the abandoned process.
        Err(_) => Err(Error::Timeout(format!(
            "`{label}` did not finish within {limit:?}"
        ))),
    }
}

fn command_error(program: String, output: &Output, extra: String) -> Error {
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    if !extra.is_empty() {
        text.push_str("\nserver log:\n");
        text.push_str(&extra);
    }
    Error::Command {
        program,
        status: output.status,
        output: text.trim_end().to_owned(),
    }
}

/// The part of the server log written since byte `start`, capped to its
/// last few kilobytes.
async fn read_log_since(log: &Path, start: u64) -> String {
    const MAX: usize = 8 * 1024;
    let Ok(bytes) = tokio::fs::read(log).await else {
        return String::new();
    };
    let from = usize::try_from(start).unwrap_or(0).min(bytes.len());
    let new = &bytes[from..];
    let new = &new[new.len().saturating_sub(MAX)..];
    String::from_utf8_lossy(new).into_owned()
}

/// Asks the kernel for a free loopback port. The port is released again
/// before the server binds it; the start retries if someone else got it.
fn free_port() -> io::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail and has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn lookup_user(name: &str) -> Option<RunAs> {
    let cname = CString::new(name).ok()?;
    let mut buf: Vec<libc::c_char> = vec![0; 4096];
    loop {
        // SAFETY: all-zero is a valid `passwd` (null pointers, zero ids).
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer refers to live, correctly sized storage; the
        // reentrant variant writes only into `pwd` and `buf`.
        let rc = unsafe {
            libc::getpwnam_r(
                cname.as_ptr(),
                &mut pwd,
                buf.as_mut_ptr(),
                buf.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE && buf.len() < (1 << 20) {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || result.is_null() {
            return None;
        }
        return Some(RunAs {
            uid: pwd.pw_uid,
            gid: pwd.pw_gid,
        });
    }
}

/// Whether a process exists and is not a zombie. A zombie postmaster has
/// stopped serving but still answers `kill(pid, 0)` until reaped.
fn process_alive(pid: u32) -> bool {
    let Ok(raw) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if raw <= 0 {
        return false;
    }
    // SAFETY: kill(2) with signal 0 only checks for existence.
    let exists = unsafe { libc::kill(raw, 0) } == 0
        || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if !exists {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(status) => !status
            .lines()
            .any(|line| line.starts_with("State:") && line.contains("Z")),
        // No procfs: trust kill(2).
        Err(_) => true,
    }
}

async fn remove_if_exists(path: &Path) -> Result<()> {
    match tokio::fs::remove_file(path).await {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

/// Whether processes are still attached to a System V shared memory segment.
fn shm_in_use(shm_id: libc::c_int) -> bool {
    // SAFETY: all-zero is a valid `shmid_ds`; shmctl only writes into it.
    let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: IPC_STAT with a valid out-pointer; an unknown id just fails.
    let rc = unsafe { libc::shmctl(shm_id, libc::IPC_STAT, &mut ds) };
    rc == 0 && ds.shm_nattch > 0
}

/// Creates the cluster's root directory under the system temporary
/// directory, owned by the service user when we are root.
fn create_root(run_as: Option<RunAs>) -> Result<TempDir> {
    let mut base = std::env::temp_dir();
    if let Some(user) = run_as {
        // The service user must be able to reach the directory. A private
        // TMPDIR (say under /root) is not reachable, so fall back to /tmp.
        if !traversable_by(&base, user) {
            let tmp = PathBuf::from("/tmp");
            if !traversable_by(&tmp, user) {
                return Err(Error::Io(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "the `{SERVICE_USER}` user cannot reach {} or /tmp",
                        base.display()
                    ),
                )));
            }
            base = tmp;
        }
    }
    let root = tempfile::Builder::new()
        .prefix("gendurable-pg-")
        .tempdir_in(&base)
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("creating a directory in {}: {e}", base.display()),
            )
        })?;
    if let Some(user) = run_as {
        std::os::unix::fs::chown(root.path(), Some(user.uid), Some(user.gid))?;
    }
    Ok(root)
}

/// Whether `user` may search (traverse) `dir` and all of its ancestors.
fn traversable_by(dir: &Path, user: RunAs) -> bool {
    use std::os::unix::fs::MetadataExt;
    dir.ancestors().all(|path| {
        let Ok(meta) = std::fs::metadata(path) else {
            return false;
        };
        let mode = meta.mode();
        if meta.uid() == user.uid {
            mode & 0o100 != 0
        } else if meta.gid() == user.gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        }
    })
}

/// Starts the watchdog described in the crate documentation. Its stdin is a
/// pipe; the write end stays inside the returned `Child` (and so in this
/// process only, as Rust opens pipes close-on-exec).
fn spawn_watchdog(
    pg_ctl: &Path,
    data_dir: &Path,
    root: &Path,
    run_as: Option<RunAs>,
) -> Result<std::process::Child> {
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(WATCHDOG_SCRIPT)
        .arg("gendurable-pg-watchdog")
        .arg(pg_ctl)
        .arg(data_dir)
        .arg(root)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Do not pin (or be denied) the caller's working directory.
        .current_dir("/");
    // As the service user, the watchdog can run pg_ctl and delete the
    // directory it owns, without needing root's help.
    if let Some(user) = run_as {
        cmd.uid(user.uid).gid(user.gid);
    }
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls setsid(2), which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            // Own session: no terminal signals (Ctrl-C, hangup) reach it.
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().map_err(|e| {
        Error::Io(io::Error::new(
            e.kind(),
            format!("starting the cleanup watchdog: {e}"),
        ))
    })
}

/// Quotes a value for `postgresql.conf`, where single-quoted strings treat
/// backslash as an escape and `''` as a quote, and may not span lines.
fn conf_quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('\'');
    for c in value.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

fn validate_database_name(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let valid_start = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let valid_rest = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    // 63 bytes is PostgreSQL's identifier limit (NAMEDATALEN - 1); longer
    // names would be truncated silently.
    if valid_start && valid_rest && name.len() <= 63 {
        Ok(())
    } else {
        Err(Error::InvalidName(format!(
            "{name:?} is not a plain database name (ASCII letters, digits and _, \
             not starting with a digit, at most 63 bytes)"
        )))
    }
}

fn validate_setting_name(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let valid_start = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    // Dots appear in extension settings such as `auto_explain.log_min_duration`.
    let valid_rest = chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    if valid_start && valid_rest {
        Ok(())
    } else {
        Err(Error::InvalidName(format!(
            "{name:?} is not a valid server setting name"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn quotes_conf_values() {
        assert_eq!(conf_quote("plain"), "'plain'");
        assert_eq!(conf_quote("it's"), "'it''s'");
        assert_eq!(conf_quote(r"a\b"), r"'a\\b'");
        assert_eq!(conf_quote("a\nb"), r"'a\nb'");
    }

    #[test]
    fn validates_database_names() {
        for ok in ["app", "_x", "Test_9", &"a".repeat(63)] {
            assert!(validate_database_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "9lives",
            "with-dash",
            "a b",
            "x\"y",
            "é",
            &"a".repeat(64),
        ] {
            assert!(validate_database_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn validates_setting_names() {
        assert!(validate_setting_name("work_mem").is_ok());
        assert!(validate_setting_name("auto_explain.log_min_duration").is_ok());
        assert!(validate_setting_name("a = b").is_err());
        assert!(validate_setting_name("").is_err());
    }

    #[test]
    fn sorts_versions_numerically() {
        let dir = tempfile::tempdir().unwrap();
        for v in ["9.6", "15", "12", "notaversion"] {
            std::fs::create_dir(dir.path().join(v)).unwrap();
        }
        let found = versioned_dirs(dir.path(), "", "bin");
        let names: Vec<_> = found
            .iter()
            .map(|p| p.parent().unwrap().file_name().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["15", "12", "9.6"].map(OsStr::new));
    }
}
