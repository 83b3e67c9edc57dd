//! Shared by the dashboard's tests: one throwaway PostgreSQL per test
//! binary, a dashboard served in-process, and a small HTTP client.
#![allow(dead_code)]

pub mod load;

use gendurable::Engine;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The database every test of this binary shares; each test takes its own schema.
pub fn url() -> String {
    gendurable_testing::shared_url()
}

/// A schema name no other test uses.
pub fn schema(prefix: &str) -> String {
    format!("t_{prefix}_{:08x}", rand::random::<u32>())
}

/// A dashboard on `schema` served on a free port; its base URL.
pub async fn dashboard(url: &str, schema: &str, allow_actions: bool) -> String {
    let engine = Engine::builder()
        .url(url)
        .schema(schema)
        .migrate(false)
        .build()
        .await
        .expect("a client engine");
    let options = gendurable_dashboard::Options {
        listen: "127.0.0.1:0".parse().unwrap(),
        allow_actions,
        refresh: Duration::from_millis(500),
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(gendurable_dashboard::serve(
        engine,
        options,
        move |addr| {
            let _ = tx.send(addr);
        },
        std::future::pending(),
    ));
    format!("http://{}", rx.await.expect("the dashboard binds"))
}

/// A response: status, headers (lower-case names), body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `GET url`.
pub async fn get(url: &str) -> Reply {
    request("GET", url, None).await
}

/// `POST url` with a form.
pub async fn post(url: &str, form: &[(&str, &str)]) -> Reply {
    let body = form
        .iter()
        .map(|(k, v)| format!("{k}={}", enc(v)))
        .collect::<Vec<_>>()
        .join("&");
    request("POST", url, Some(body)).await
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// One HTTP/1.1 request on its own connection (`Connection: close`).
async fn request(method: &str, url: &str, body: Option<String>) -> Reply {
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let mut s = tokio::net::TcpStream::connect(host).await.expect("connect");
    let body = body.unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a response");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect::<Vec<_>>();
    let body = if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v == "chunked")
    {
        unchunk(body)
    } else {
        body.to_owned()
    };
    Reply {
        status,
        headers,
        body,
    }
}

fn unchunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Waits for instance `id` to reach `status` (a failure if it never does).
pub async fn wait_status(engine: &Engine, id: i64, status: gendurable::Status) {
    for _ in 0..400 {
        if engine.get(id).await.unwrap().status == status {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("#{id} never became {status:?}");
}

/// The action token a page's forms carry.
pub fn token_of(page: &str) -> String {
    let at = page
        .find("name=\"token\" value=\"")
        .expect("a form with a token")
        + 20;
    page[at..at + 32].to_owned()
}
