//! The outside observer's records: one JSON object per line, appended with
//! one `write` call to a file opened with `O_APPEND`, stamped with
//! `CLOCK_MONOTONIC`, which every process of the machine shares.

use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

/// Nanoseconds of `CLOCK_MONOTONIC`: comparable across processes.
pub fn now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One line of a log.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Record {
    /// A step begins (written by a node).
    Start {
        t: u64,
        /// Unique in the run: `<proc>.<counter>`.
        run: String,
        proc: u32,
        pid: u32,
        node: String,
        id: i64,
        step: String,
        /// The state's step counter: outcomes applied so far.
        n: i64,
        attempt: i32,
        queue: String,
        /// The concurrency key and rate-limit key the engine says it
        /// admitted the step under.
        key: Option<String>,
        rate: Option<String>,
        /// The run whose outcome produced the state this step sees.
        parent: Option<String>,
        /// What woke the step, after an await.
        wake: Option<String>,
    },
    /// A step ends: `next`, `done`, `await`, `error`, `err`, `panic`,
    /// `aborted` (its future was dropped), `mismatch` (the state and step
    /// name disagree with the plan) or `crash` (it is about to end its
    /// process, as planned).
    End {
        t: u64,
        run: String,
        proc: u32,
        id: i64,
        kind: String,
    },
    /// A node process is up (its engine started).
    Up {
        t: u64,
        proc: u32,
        pid: u32,
        node: String,
    },
    /// The controller's own records.
    Begin { t: u64, seed: u64 },
    Spawn {
        t: u64,
        proc: u32,
        pid: u32,
        node: String,
        queues: Vec<String>,
        log: String,
    },
    /// A node process found exited on its own (a planned crash, or not).
    Exit {
        t: u64,
        proc: u32,
        pid: u32,
        node: String,
        status: String,
    },
    /// SIGKILL sent at `t`; the process was reaped (gone) at `dead`.
    Kill {
        t: u64,
        proc: u32,
        pid: u32,
        node: String,
        dead: u64,
    },
    /// SIGSTOP: `t` is when the process was seen stopped.
    Stop {
        t: u64,
        proc: u32,
        pid: u32,
        node: String,
    },
    /// SIGCONT sent.
    Cont {
        t: u64,
        proc: u32,
        pid: u32,
        node: String,
    },
    /// Postgres stopped in immediate mode (`t`: the stop was requested).
    PgDown { t: u64 },
    /// Postgres accepts connections again.
    PgUp { t: u64 },
    /// Postgres frozen: its postmaster and every backend SIGSTOPped, its
    /// connections open and silent (a paused VM, a storage stall).
    PgFreeze { t: u64 },
    /// Postgres continued after a freeze.
    PgThaw { t: u64 },
    /// The proxy cut a connection of `node`: `mid` (anywhere) or `commit`
    /// (a committed response dropped before it reached the client).
    Cut { t: u64, kind: String, node: String },
    /// The proxy cut `node` off from Postgres: its connections stall, and so
    /// does every one it opens, until `Reconnect`.
    CutOff { t: u64, node: String },
    /// `node`'s new connections reach Postgres again.
    Reconnect { t: u64, node: String },
    /// SIGTERM (a graceful shutdown, mid-run or at the end); gone at `dead`.
    Term {
        t: u64,
        proc: u32,
        pid: u32,
        node: String,
        dead: u64,
    },
}

/// An append-only log file. Each record is one `write` call, so lines of a
/// process killed mid-run are whole; nothing is buffered.
pub struct Recorder {
    file: File,
}

impl Recorder {
    pub fn open(path: &Path) -> std::io::Result<Recorder> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Recorder { file })
    }

    pub fn write(&self, rec: &Record) {
        let mut line = match serde_json::to_vec(rec) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("cannot encode a record: {e}");
                return;
            }
        };
        line.push(b'\n');
        match (&self.file).write(&line) {
            Ok(n) if n == line.len() => {}
            Ok(n) => eprintln!("short write to the log: {n} of {} bytes", line.len()),
            Err(e) => eprintln!("cannot write to the log: {e}"),
        }
    }
}

/// Every record of a log file, and how many lines could not be read (a line
/// cut short can only be the last one of a killed process).
pub fn read(path: &Path) -> std::io::Result<(Vec<Record>, usize)> {
    let text = std::fs::read_to_string(path)?;
    let mut recs = Vec::new();
    let mut bad = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str(line) {
            Ok(r) => recs.push(r),
            Err(_) => bad += 1,
        }
    }
    Ok((recs, bad))
}
