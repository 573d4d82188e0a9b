//! A real HTTP proxy that loses answers on purpose, for the object-store
//! adapter's lost-answer tests.
//!
//! It sits between an S3 client and an S3-compatible server (moto), forwards
//! every request unchanged and relays the answer, except for one request it
//! was armed for: a conditional PUT (`If-Match`) to a chosen path. That one
//! it forwards too, lets the server apply it, then runs a hook (e.g. another
//! writer) and answers the client `500`, or closes the connection without an
//! answer, as a proxy or load balancer that failed on the way back would.
//! The client then cannot know whether its PUT was applied.
//!
//! Plain HTTP/1.1 on `std::net`, one request per connection (every answer
//! says `Connection: close`), bodies framed by `Content-Length` only (what
//! object_store sends); anything else is answered `501` so a test notices.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;

/// How the proxy loses the answer to the armed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostAnswer {
    /// Forward it, let the server apply it, answer the client `500`.
    ServerErrorAfterApplying,
    /// Forward it, let the server apply it, close the connection without
    /// an answer.
    DropAfterApplying,
    /// Do not forward it at all, answer the client `500` (nothing applied).
    ServerErrorWithoutForwarding,
}

/// One request the proxy saw, and what the server answered (`None`: it was
/// not forwarded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The HTTP method.
    pub method: String,
    /// The request path, without the query.
    pub path: String,
    /// Whether it carried `If-Match`.
    pub if_match: bool,
    /// The server's status code.
    pub status: Option<u16>,
    /// Whether the proxy lost the answer of this one.
    pub answer_lost: bool,
}

type Hook = Box<dyn FnOnce() + Send>;

/// The armed fault: the next `times` `If-Match` PUTs to `path` lose their
/// answers.
struct Armed {
    path: String,
    how: LostAnswer,
    times: usize,
    before_answer: Option<Hook>,
}

#[derive(Default)]
struct Shared {
    armed: Mutex<Option<Armed>>,
    seen: Mutex<Vec<Seen>>,
    stopping: AtomicBool,
}

/// A running proxy on a loopback port; stops accepting on drop.
pub struct FaultProxy {
    address: SocketAddr,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("address", &self.address)
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FaultProxy {
    /// Starts a proxy to `upstream` (an `http://host:port` endpoint) on a
    /// free loopback port.
    pub fn start(upstream: &str) -> io::Result<FaultProxy> {
        let upstream = upstream
            .strip_prefix("http://")
            .unwrap_or(upstream)
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let accepting = Arc::clone(&shared);
        thread::spawn(move || {
            for client in listener.incoming() {
                if accepting.stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let (shared, upstream) = (Arc::clone(&accepting), upstream.clone());
                thread::spawn(move || {
                    let _ = serve(client, &upstream, &shared);
                });
            }
        });
        Ok(FaultProxy { address, shared })
    }

    /// The endpoint URL to point the S3 client at.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Arms the fault: the next PUT with `If-Match` to `path` (e.g.
    /// `/bucket/key`) loses its answer `how`; `before_answer` runs after the
    /// server answered and before the client gets (or misses) the answer.
    pub fn lose_next_answer(
        &self,
        path: &str,
        how: LostAnswer,
        before_answer: impl FnOnce() + Send + 'static,
    ) {
        *lock(&self.shared.armed) = Some(Armed {
            path: path.to_owned(),
            how,
            times: 1,
            before_answer: Some(Box::new(before_answer)),
        });
    }

    /// Arms the fault for the next `times` PUTs with `If-Match` to `path`.
    pub fn lose_next_answers(&self, path: &str, how: LostAnswer, times: usize) {
        *lock(&self.shared.armed) = (times > 0).then(|| Armed {
            path: path.to_owned(),
            how,
            times,
            before_answer: None,
        });
    }

    /// Whether the armed fault is still waiting for its request.
    pub fn armed(&self) -> bool {
        lock(&self.shared.armed).is_some()
    }

    /// Every request seen so far, in the order their answers came back.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.shared.seen).clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.address);
    }
}

/// A request as read from the client: its head lines and body.
struct Request {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }
}

fn read_request(reader: &mut impl BufRead) -> io::Result<Option<Request>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(io::Error::other(format!("bad request line {line:?}")));
    };
    let (method, target) = (method.to_owned(), target.to_owned());
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(io::Error::other(format!("bad header line {line:?}")));
        };
        headers.push((name.trim().to_owned(), value.trim().to_owned()));
    }
    let mut request = Request {
        method,
        target,
        headers,
        body: Vec::new(),
    };
    let length: usize = match request.header("content-length") {
        Some(value) => value
            .parse()
            .map_err(|_| io::Error::other(format!("bad content-length {value:?}")))?,
        None => 0,
    };
    request.body = vec![0; length];
    reader.read_exact(&mut request.body)?;
    Ok(Some(request))
}

fn serve(client: TcpStream, upstream: &str, shared: &Shared) -> io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut client = client;
    let Some(request) = read_request(&mut reader)? else {
        return Ok(());
    };
    if request.header("transfer-encoding").is_some() || request.header("expect").is_some() {
        return client.write_all(
            b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
    }
    let if_match = request.header("if-match").is_some();
    let armed = {
        let mut armed = lock(&shared.armed);
        let hit = armed
            .as_ref()
            .is_some_and(|a| request.method == "PUT" && if_match && a.path == request.path());
        match armed.as_mut() {
            Some(a) if hit && a.times > 1 => {
                a.times -= 1;
                Some(Armed {
                    path: a.path.clone(),
                    how: a.how,
                    times: 1,
                    before_answer: a.before_answer.take(),
                })
            }
            _ if hit => armed.take(),
            _ => None,
        }
    };
    let mut seen = Seen {
        method: request.method.clone(),
        path: request.path().to_owned(),
        if_match,
        status: None,
        answer_lost: armed.is_some(),
    };
    let answer = match &armed {
        Some(a) if a.how == LostAnswer::ServerErrorWithoutForwarding => None,
        _ => Some(forward(&request, upstream)?),
    };
    seen.status = answer.as_ref().map(|(status, _)| *status);
    lock(&shared.seen).push(seen);
    match armed {
        None => {
            let (_, bytes) = answer.unwrap_or_default();
            client.write_all(&bytes)?;
        }
        Some(mut armed) => {
            if let Some(hook) = armed.before_answer.take() {
                hook();
            }
            match armed.how {
                LostAnswer::DropAfterApplying => {}
                LostAnswer::ServerErrorAfterApplying | LostAnswer::ServerErrorWithoutForwarding => {
                    client.write_all(
                        b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    )?;
                }
            }
        }
    }
    client.flush()?;
    client.shutdown(Shutdown::Both)
}

/// Sends `request` to `upstream` on a fresh connection and returns the
/// status and the answer to relay (with `Connection: close`).
fn forward(request: &Request, upstream: &str) -> io::Result<(u16, Vec<u8>)> {
    let mut server = TcpStream::connect(upstream)?;
    let mut head = format!("{} {} HTTP/1.1\r\n", request.method, request.target);
    for (name, value) in &request.headers {
        if !name.eq_ignore_ascii_case("connection") {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    head.push_str("Connection: close\r\n\r\n");
    server.write_all(head.as_bytes())?;
    server.write_all(&request.body)?;
    server.flush()?;
    let mut answer = Vec::new();
    server.read_to_end(&mut answer)?;
    let head_end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| io::Error::other("answer without a complete head"))?;
    let head = String::from_utf8_lossy(&answer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| io::Error::other(format!("bad status line {status_line:?}")))?;
    let mut relayed = format!("{status_line}\r\n");
    let mut has_length = false;
    for line in lines {
        let name = line.split(':').next().unwrap_or_default();
        if name.eq_ignore_ascii_case("connection") {
            continue;
        }
        has_length |= name.eq_ignore_ascii_case("content-length")
            || name.eq_ignore_ascii_case("transfer-encoding");
        relayed.push_str(line);
        relayed.push_str("\r\n");
    }
    let body = &answer[head_end + 4..];
    if !has_length && request.method != "HEAD" {
        relayed.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    relayed.push_str("Connection: close\r\n\r\n");
    let mut bytes = relayed.into_bytes();
    bytes.extend_from_slice(body);
    Ok((status, bytes))
}

/// A server that accepts TCP connections on a loopback port and never says
/// a word, for tests of connect timeouts: a client's connection attempt
/// succeeds at the TCP level and then waits for an answer that never comes.
/// Returns the port; the listener lives as long as the test process.
pub fn silent_server() -> u16 {
    let listener = match TcpListener::bind("127.0.0.1:0") {
        Ok(listener) => listener,
        Err(error) => panic!("bind a silent server: {error}"),
    };
    let port = match listener.local_addr() {
        Ok(address) => address.port(),
        Err(error) => panic!("the silent server's port: {error}"),
    };
    thread::spawn(move || {
        // Accept and hold every connection; never answer.
        let mut silent = Vec::new();
        for stream in listener.incoming() {
            silent.push(stream);
        }
    });
    port
}
