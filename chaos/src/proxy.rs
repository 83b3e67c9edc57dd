//! The TCP proxy every node connects through. It forwards bytes both ways
//! and cuts connections: anywhere (`end_one`, called at random times), and
//! after a commit, before the reply: the server's messages are framed (a
//! type byte and a big-endian length counting itself), each response is
//! held back until its ReadyForQuery, and with some probability a response
//! that completed a command without error and left no transaction open
//! (status `I`: the implicit transaction committed at Sync) is dropped and
//! both sides are closed. The server committed; the client never hears it.
//! A connection can also be *stalled* (`end_one` with [`End::Stall`]): the
//! server's side is closed, the client's is kept open and silent, as after a
//! failover or a dropped NAT mapping that closed nothing on the client's
//! host. Only the client giving up the call ends it. A node can be *cut
//! off* (`cut_off`): each of its connections stalls, and so does every one
//! it opens until `reconnect`, as a host whose network to the database
//! failed while the other hosts still reach it.
//!
//! The startup phase passes untouched: the client's first messages have no
//! type byte (an SSL or GSS request is answered by one unframed byte), and
//! the server's messages up to its first ReadyForQuery are forwarded as they
//! come. The startup message's `application_name` names the node a cut hits.

use crate::record::{now, Record, Recorder};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;

pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

struct Shared {
    target: SocketAddr,
    rec: Arc<Recorder>,
    seed: u64,
    /// Probability of cutting a committed response.
    commit_cut: f64,
    cutting: AtomicBool,
    /// Live connections past their startup, by number.
    conns: Mutex<HashMap<u64, Live>>,
    /// Nodes cut off from Postgres (taken under `conns`' lock).
    cut_off: Mutex<HashSet<String>>,
    next: AtomicU64,
    mid: AtomicU64,
    commit: AtomicU64,
    stalls: AtomicU64,
}

struct Live {
    node: String,
    end: oneshot::Sender<End>,
}

/// How `end_one` ends a connection.
#[derive(Debug, Clone, Copy)]
pub enum End {
    /// Closed on both sides, wherever its exchange is.
    Cut,
    /// Closed on the server's side only; the client's side stays open and
    /// never hears anything again.
    Stall,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Proxy {
    /// Listen on a free loopback port and forward to `target_port`.
    pub async fn start(
        target_port: u16,
        rec: Arc<Recorder>,
        seed: u64,
        commit_cut: f64,
    ) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            target: SocketAddr::from(([127, 0, 0, 1], target_port)),
            rec,
            seed,
            commit_cut,
            cutting: AtomicBool::new(true),
            conns: Mutex::new(HashMap::new()),
            cut_off: Mutex::new(HashSet::new()),
            next: AtomicU64::new(0),
            mid: AtomicU64::new(0),
            commit: AtomicU64::new(0),
            stalls: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Proxy {
            port,
            shared,
            accept,
        })
    }

    /// The URL a node connects with; `node` becomes its application name.
    pub fn url(&self, node: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?application_name={node}&sslmode=disable",
            self.port
        )
    }

    /// Start or stop cutting and stalling.
    pub fn set_cutting(&self, on: bool) {
        self.shared.cutting.store(on, Relaxed);
    }

    /// End one live connection, chosen at random, wherever it is. Returns
    /// the node it belonged to.
    pub fn end_one(&self, rng: &mut StdRng, end: End) -> Option<String> {
        if !self.shared.cutting.load(Relaxed) {
            return None;
        }
        let live = {
            let mut conns = lock(&self.shared.conns);
            let mut ids: Vec<u64> = conns.keys().copied().collect();
            ids.sort_unstable();
            let id = *ids.get(rng.gen_range(0..ids.len().max(1)))?;
            conns.remove(&id)?
        };
        live.end.send(end).ok()?;
        let (count, kind) = match end {
            End::Cut => (&self.shared.mid, "mid"),
            End::Stall => (&self.shared.stalls, "stall"),
        };
        count.fetch_add(1, Relaxed);
        self.shared.rec.write(&Record::Cut {
            t: now(),
            kind: kind.into(),
            node: live.node.clone(),
        });
        Some(live.node)
    }

    /// Cut `node` off from Postgres: each of its connections stalls, and so
    /// does every one it opens until `reconnect`.
    pub fn cut_off(&self, node: &str) {
        let ends: Vec<Live> = {
            let mut conns = lock(&self.shared.conns);
            lock(&self.shared.cut_off).insert(node.to_owned());
            let ids: Vec<u64> = conns
                .iter()
                .filter(|(_, live)| live.node == node)
                .map(|(&id, _)| id)
                .collect();
            ids.iter().filter_map(|id| conns.remove(id)).collect()
        };
        for live in ends {
            let _ = live.end.send(End::Stall);
        }
    }

    /// `node`'s new connections reach Postgres again.
    pub fn reconnect(&self, node: &str) {
        lock(&self.shared.cut_off).remove(node);
    }

    /// Cuts so far: (anywhere, after a commit, stalls).
    pub fn cuts(&self) -> (u64, u64, u64) {
        (
            self.shared.mid.load(Relaxed),
            self.shared.commit.load(Relaxed),
            self.shared.stalls.load(Relaxed),
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, sh: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                let no = sh.next.fetch_add(1, Relaxed);
                tokio::spawn(serve(sh.clone(), client, no));
            }
            Err(e) => {
                eprintln!("proxy: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// How a connection ended.
enum Pumped {
    Closed,
    Cut,
    CommitCut,
    Stalled,
}

async fn serve(sh: Arc<Shared>, mut client: TcpStream, no: u64) {
    // Postgres down: the client sees its connection close at once.
    let Ok(mut server) = TcpStream::connect(sh.target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let node = match startup(&mut client, &mut server).await {
        Ok(Some(node)) => node,
        Ok(None) => {
            // Encrypted or a cancel request: bytes only.
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            return;
        }
        Err(_) => return,
    };
    let (tx, rx) = oneshot::channel();
    {
        let mut conns = lock(&sh.conns);
        if lock(&sh.cut_off).contains(&node) {
            drop(conns);
            stall(server, client).await;
            return;
        }
        conns.insert(
            no,
            Live {
                node: node.clone(),
                end: tx,
            },
        );
    }
    let rng = StdRng::seed_from_u64(sh.seed ^ no.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let pumped = pump(&sh, &mut client, &mut server, rx, rng).await;
    lock(&sh.conns).remove(&no);
    match pumped {
        Pumped::CommitCut => {
            sh.commit.fetch_add(1, Relaxed);
            sh.rec.write(&Record::Cut {
                t: now(),
                kind: "commit".into(),
                node,
            });
        }
        Pumped::Stalled => stall(server, client).await,
        Pumped::Closed | Pumped::Cut => {}
    }
    // Dropping both streams closes both sides.
}

/// The server's side goes (its backend ends, rolling back what was open);
/// the client's stays open, read and never answered, until the client
/// closes it.
async fn stall(server: TcpStream, mut client: TcpStream) {
    drop(server);
    let _ = tokio::io::copy(&mut client, &mut tokio::io::sink()).await;
}

/// Pass the client's untyped first messages through; returns the
/// application name of a normal startup, `None` for a connection that is
/// to be passed through as bytes (SSL or GSS accepted, a cancel request).
async fn startup(
    client: &mut TcpStream,
    server: &mut TcpStream,
) -> std::io::Result<Option<String>> {
    loop {
        let len = client.read_u32().await? as usize;
        if !(8..=1 << 16).contains(&len) {
            return Err(std::io::Error::other("not a PostgreSQL startup"));
        }
        let mut body = vec![0; len - 4];
        client.read_exact(&mut body).await?;
        server.write_all(&(len as u32).to_be_bytes()).await?;
        server.write_all(&body).await?;
        let code = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
        match code {
            SSL_REQUEST | GSSENC_REQUEST => {
                let answer = server.read_u8().await?;
                client.write_u8(answer).await?;
                if answer != b'N' {
                    return Ok(None);
                }
            }
            CANCEL_REQUEST => return Ok(None),
            _ => return Ok(Some(app_name(&body[4..]).unwrap_or_else(|| "?".into()))),
        }
    }
}

/// `application_name` from a startup message's NUL-separated parameters.
fn app_name(params: &[u8]) -> Option<String> {
    let mut it = params.split(|&b| b == 0);
    while let Some(k) = it.next() {
        if k.is_empty() {
            return None;
        }
        let v = it.next()?;
        if k == b"application_name" {
            return Some(String::from_utf8_lossy(v).into_owned());
        }
    }
    None
}

async fn pump(
    sh: &Shared,
    client: &mut TcpStream,
    server: &mut TcpStream,
    end: oneshot::Receiver<End>,
    rng: StdRng,
) -> Pumped {
    let (mut cr, mut cw) = client.split();
    let (mut sr, mut sw) = server.split();
    tokio::select! {
        _ = tokio::io::copy(&mut cr, &mut sw) => Pumped::Closed,
        p = responses(sh, &mut sr, &mut cw, rng) => p,
        Ok(e) = end => match e {
            End::Cut => Pumped::Cut,
            End::Stall => Pumped::Stalled,
        },
    }
}

/// Server to client, framed: responses are held until their ReadyForQuery.
async fn responses(
    sh: &Shared,
    sr: &mut ReadHalf<'_>,
    cw: &mut WriteHalf<'_>,
    mut rng: StdRng,
) -> Pumped {
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    // The response being held back, and what may go to the client now.
    let mut pending: Vec<u8> = Vec::new();
    let mut out: Vec<u8> = Vec::new();
    let mut started = false;
    let (mut completed, mut failed) = (false, false);
    loop {
        let mut off = 0;
        while buf.len() - off >= 5 {
            let ty = buf[off];
            let len = u32::from_be_bytes([buf[off + 1], buf[off + 2], buf[off + 3], buf[off + 4]])
                as usize;
            if len < 4 {
                return Pumped::Closed;
            }
            let end = off + 1 + len;
            if buf.len() < end {
                break;
            }
            let msg = &buf[off..end];
            off = end;
            if !started {
                out.extend_from_slice(msg);
                started = ty == b'Z';
                continue;
            }
            match ty {
                // Asynchronous messages between responses: notifications,
                // notices, parameter changes.
                b'A' | b'N' | b'S' if pending.is_empty() => out.extend_from_slice(msg),
                // COPY: the server now waits for the client.
                b'G' | b'H' | b'W' => {
                    out.append(&mut pending);
                    out.extend_from_slice(msg);
                }
                b'Z' => {
                    pending.extend_from_slice(msg);
                    let committed = completed && !failed && msg.get(5) == Some(&b'I');
                    (completed, failed) = (false, false);
                    if committed && sh.cutting.load(Relaxed) && rng.gen_bool(sh.commit_cut) {
                        let _ = cw.write_all(&out).await;
                        return Pumped::CommitCut;
                    }
                    out.append(&mut pending);
                }
                b'C' => {
                    completed = true;
                    pending.extend_from_slice(msg);
                }
                b'E' => {
                    failed = true;
                    pending.extend_from_slice(msg);
                }
                _ => pending.extend_from_slice(msg),
            }
        }
        buf.drain(..off);
        if !out.is_empty() {
            if cw.write_all(&out).await.is_err() {
                return Pumped::Closed;
            }
            out.clear();
        }
        match sr.read_buf(&mut buf).await {
            Ok(0) | Err(_) => {
                // The server closed (a crash, a fatal error): pass on what it said.
                let _ = cw.write_all(&pending).await;
                return Pumped::Closed;
            }
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::app_name;

    #[test]
    fn application_name_from_a_startup_message() {
        let params = b"user\0postgres\0application_name\0n2r1\0database\0postgres\0\0";
        assert_eq!(app_name(params).as_deref(), Some("n2r1"));
        assert_eq!(app_name(b"user\0postgres\0\0"), None);
        assert_eq!(app_name(b"user\0"), None);
    }
}
