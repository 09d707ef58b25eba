//! A TCP proxy on 127.0.0.1 in front of a test server (the in-process S3 server), that
//! misbehaves on demand for the next requests: it accepts and never answers, answers late,
//! cuts or stalls the answer's body, or answers with a status of its own (403, 404, 429 with
//! `Retry-After`, 503, ...). It counts and timestamps every request it reads.
//!
//! Each connection carries one request: the proxy asks the server to close after answering
//! (`Connection: close`, a header the client does not sign), so the client opens a connection
//! per request and the count is exact. Every wait is bounded: a connection is served for at
//! most [`CONNECTION_LIMIT`], and the proxy stops accepting by itself after [`LIFETIME`] (or
//! when dropped).
//!
//! ```ignore
//! #[path = "support/proxy.rs"]
//! mod proxy;
//! let proxy = proxy::start(server.endpoint());
//! proxy.fail(proxy::Mode::Status { code: 503, retry_after: None }, 2);
//! let store = server.store_builder().s3_endpoint(proxy.endpoint()).build();
//! ```
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The proxy stops accepting connections this long after it started.
pub const LIFETIME: Duration = Duration::from_secs(300);
/// A connection is served for at most this long (a silent or stalled one is held this long
/// unless the client leaves first).
pub const CONNECTION_LIMIT: Duration = Duration::from_secs(60);
/// The largest request or response head read.
const MAX_HEAD: usize = 64 << 10;

/// What the proxy does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forwards the request and the whole answer.
    Pass,
    /// Reads the request and never answers (holding the connection open).
    Silent,
    /// Forwards, holding the answer back for this long before its first byte.
    SlowFirstByte(Duration),
    /// Forwards the answer's head and this many bytes of its body, then resets the connection.
    ResetAfter(usize),
    /// Forwards the answer's head and this many bytes of its body, then sends nothing more,
    /// holding the connection open.
    StallAfter(usize),
    /// Answers with this status itself (an S3-style XML error body), with `Retry-After:
    /// seconds` when given.
    Status {
        /// The HTTP status.
        code: u16,
        /// The `Retry-After` header's seconds.
        retry_after: Option<u64>,
    },
}

/// One request the proxy read.
#[derive(Debug, Clone)]
pub struct Seen {
    /// When its head had been read.
    pub at: Instant,
    /// Its request line (`GET /shards/d/x.tar HTTP/1.1`).
    pub line: String,
    /// What the proxy did with it.
    pub mode: Mode,
}

#[derive(Debug)]
struct State {
    mode: Mode,
    faults_left: usize,
    seen: Vec<Seen>,
}

/// A running proxy; dropping it stops it.
pub struct FaultProxy {
    endpoint: String,
    state: Arc<Mutex<State>>,
    runtime: Option<tokio::runtime::Runtime>,
}

/// Starts a proxy on a free port of 127.0.0.1 to `upstream` (`http://127.0.0.1:PORT`),
/// passing every request until [`FaultProxy::fail`] says otherwise.
pub fn start(upstream: &str) -> FaultProxy {
    let upstream: SocketAddr = upstream
        .strip_prefix("http://")
        .and_then(|a| a.trim_end_matches('/').parse().ok())
        .expect("upstream is http://IP:PORT");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("fault-proxy")
        .enable_all()
        .build()
        .expect("proxy runtime");
    let listener = runtime
        .block_on(TcpListener::bind(("127.0.0.1", 0)))
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    let state = Arc::new(Mutex::new(State {
        mode: Mode::Pass,
        faults_left: 0,
        seen: Vec::new(),
    }));
    let shared = Arc::clone(&state);
    runtime.spawn(async move {
        let end = tokio::time::Instant::now() + LIFETIME;
        while let Ok(Ok((socket, _))) = tokio::time::timeout_at(end, listener.accept()).await {
            let state = Arc::clone(&shared);
            tokio::spawn(tokio::time::timeout(
                CONNECTION_LIMIT,
                serve(socket, upstream, state),
            ));
        }
    });
    FaultProxy {
        endpoint: format!("http://{addr}"),
        state,
        runtime: Some(runtime),
    }
}

impl FaultProxy {
    /// `http://127.0.0.1:PORT`, the endpoint to give the client.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The next `count` requests get `mode`; those after them pass.
    pub fn fail(&self, mode: Mode, count: usize) {
        let mut s = self.state.lock().unwrap();
        s.mode = mode;
        s.faults_left = count;
    }

    /// Every request from now on gets `mode`.
    pub fn always(&self, mode: Mode) {
        self.fail(mode, usize::MAX);
    }

    /// The requests read so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// How many requests were read so far.
    pub fn requests(&self) -> usize {
        self.state.lock().unwrap().seen.len()
    }

    /// Forgets the requests read so far.
    pub fn clear(&self) {
        self.state.lock().unwrap().seen.clear();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// One connection: one request, handled as the mode in force says.
async fn serve(mut client: TcpStream, upstream: SocketAddr, state: Arc<Mutex<State>>) {
    let Some((head, mut body)) = read_head(&mut client).await else {
        return;
    };
    let text = String::from_utf8_lossy(&head).into_owned();
    let length = header(&text, "content-length")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut buf = [0u8; 8192];
    while body.len() < length {
        match client.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => body.extend_from_slice(&buf[..n]),
        }
    }
    let line = text.lines().next().unwrap_or_default().to_owned();
    let mode = {
        let mut s = state.lock().unwrap();
        let mode = if s.faults_left > 0 {
            s.faults_left -= 1;
            s.mode
        } else {
            Mode::Pass
        };
        s.seen.push(Seen {
            at: Instant::now(),
            line: line.clone(),
            mode,
        });
        mode
    };
    match mode {
        Mode::Silent => hold(client).await,
        Mode::Status { code, retry_after } => {
            let head_only = line.starts_with("HEAD ");
            let _ = client
                .write_all(&status_answer(code, retry_after, head_only))
                .await;
            let _ = client.shutdown().await;
        }
        _ => forward(client, upstream, &text, &body, mode).await,
    }
}

/// Reads until the end of a request head; the head and the bytes read past it.
async fn read_head(socket: &mut TcpStream) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut data = Vec::new();
    let mut buf = [0u8; 8192];
    while data.len() < MAX_HEAD {
        if let Some(end) = find(&data, b"\r\n\r\n") {
            let rest = data.split_off(end + 4);
            return Some((data, rest));
        }
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => data.extend_from_slice(&buf[..n]),
        }
    }
    None
}

fn find(data: &[u8], needle: &[u8]) -> Option<usize> {
    data.windows(needle.len()).position(|w| w == needle)
}

/// A header's value in a head.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Reads from the client and drops what it sends until it leaves (or the connection's limit).
async fn hold(mut client: TcpStream) {
    let mut buf = [0u8; 1024];
    while let Ok(n) = client.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
}

/// The request to the server, the answer back, with the mode's fault on the answer.
async fn forward(mut client: TcpStream, upstream: SocketAddr, head: &str, body: &[u8], mode: Mode) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    // The same request, asking the server to close after answering.
    let mut request: String = head
        .trim_end()
        .lines()
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .map(|l| format!("{l}\r\n"))
        .collect();
    request.push_str("Connection: close\r\n\r\n");
    if server.write_all(request.as_bytes()).await.is_err() || server.write_all(body).await.is_err()
    {
        return;
    }
    let Some((answer_head, mut pending)) = read_head(&mut server).await else {
        return;
    };
    if let Mode::SlowFirstByte(delay) = mode {
        tokio::time::sleep(delay).await;
    }
    if client.write_all(&answer_head).await.is_err() {
        return;
    }
    let limit = match mode {
        Mode::ResetAfter(n) | Mode::StallAfter(n) => n,
        _ => usize::MAX,
    };
    let mut sent = 0;
    let mut buf = [0u8; 8192];
    loop {
        let take = pending.len().min(limit - sent);
        if client.write_all(&pending[..take]).await.is_err() {
            return;
        }
        sent += take;
        if sent == limit {
            break;
        }
        pending.clear();
        match server.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = client.shutdown().await;
                return;
            }
            Ok(n) => pending.extend_from_slice(&buf[..n]),
        }
    }
    match mode {
        Mode::ResetAfter(_) => {
            // Let the bytes sent reach the client, then reset (SO_LINGER 0: an RST, not a FIN).
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = client.set_zero_linger();
            drop(client);
        }
        _ => hold(client).await,
    }
}

/// An S3-style error answer.
fn status_answer(code: u16, retry_after: Option<u64>, head_only: bool) -> Vec<u8> {
    let (reason, s3_code) = match code {
        400 => ("Bad Request", "InvalidRequest"),
        403 => ("Forbidden", "AccessDenied"),
        404 => ("Not Found", "NoSuchKey"),
        408 => ("Request Timeout", "RequestTimeout"),
        429 => ("Too Many Requests", "SlowDown"),
        500 => ("Internal Server Error", "InternalError"),
        503 => ("Service Unavailable", "SlowDown"),
        _ => ("Error", "Error"),
    };
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{s3_code}</Code>\
         <Message>injected by the test proxy</Message></Error>"
    );
    let mut answer = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        body.len()
    );
    if let Some(secs) = retry_after {
        answer.push_str(&format!("Retry-After: {secs}\r\n"));
    }
    answer.push_str("\r\n");
    if !head_only {
        answer.push_str(&body);
    }
    answer.into_bytes()
}
