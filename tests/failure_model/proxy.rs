//! A TCP proxy between a client and the server that can lose one exchange
//! on purpose, to provoke "connection lost during commit" deterministically.
//!
//! - [`Proxy::drop_next_answer`]: forward the client's next request, let the
//!   server answer, and when the answer's ReadyForQuery message has arrived
//!   (so an autocommitted call has committed), close both connections
//!   without forwarding any of it.
//! - [`Proxy::drop_answer_of_request`]: the same for the client's n-th
//!   request from now (the earlier ones pass): for a call that sends more
//!   than one statement.
//! - [`Proxy::drop_next_request`]: close both connections instead of
//!   forwarding the client's next request (so nothing reaches the server).
//!
//! Arm it only while the connection is idle: the server-to-client stream is
//! then at a message boundary, which is where message parsing starts, and
//! the next bytes the client sends are the request the drop is meant for.
//! Arming is a plain store that completes before the arming call returns,
//! and the relay thread switches to "hold the answer" before it forwards
//! the request, so the drop applies to exactly that request's answer no
//! matter how the threads are scheduled.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;

const PASS: u8 = 0;
const DROP_ANSWER_ARMED: u8 = 1;
const AWAITING_ANSWER: u8 = 2;
const DROP_REQUEST_ARMED: u8 = 3;
const DROPPED: u8 = 4;

pub struct Proxy {
    port: u16,
    state: Arc<AtomicU8>,
    /// Requests still to pass before an armed answer drop applies.
    passing: Arc<AtomicU32>,
}

impl Proxy {
    /// Listens on a free local port and relays every connection to the
    /// server's TCP `upstream_port` on 127.0.0.1.
    pub fn start(upstream_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(AtomicU8::new(PASS));
        let passing = Arc::new(AtomicU32::new(0));
        let (shared, shared_passing) = (state.clone(), passing.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)) else {
                    return;
                };
                relay(client, server, shared.clone(), shared_passing.clone());
            }
        });
        Proxy {
            port,
            state,
            passing,
        }
    }

    /// The local port the proxy listens on (for URLs of its own making,
    /// e.g. with several hosts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL for `database` through the proxy. No TLS or GSS negotiation,
    /// so every byte after the startup packet is a framed message.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{database}?sslmode=disable&gssencmode=disable",
            self.port
        )
    }

    pub fn drop_next_answer(&self) {
        self.drop_answer_of_request(1);
    }

    /// Drops the answer of the client's `n`-th request from now (1: the
    /// next). The client waits for each answer before it sends its next
    /// request, so the earlier answers are relayed before the drop arms.
    pub fn drop_answer_of_request(&self, n: u32) {
        assert!(n >= 1, "requests count from 1");
        self.passing.store(n - 1, Ordering::SeqCst);
        self.state.store(DROP_ANSWER_ARMED, Ordering::SeqCst);
    }

    pub fn drop_next_request(&self) {
        self.state.store(DROP_REQUEST_ARMED, Ordering::SeqCst);
    }

    /// Whether an armed drop has happened.
    pub fn answer_was_dropped(&self) -> bool {
        self.state.load(Ordering::SeqCst) == DROPPED
    }
}

fn relay(client: TcpStream, server: TcpStream, state: Arc<AtomicU8>, passing: Arc<AtomicU32>) {
    let (c1, c2) = (client.try_clone().unwrap(), client);
    let (s1, s2) = (server.try_clone().unwrap(), server);
    let (cx, sx) = (c1.try_clone().unwrap(), s1.try_clone().unwrap());
    let up_state = state.clone();
    // Client to server.
    std::thread::spawn(move || {
        let (mut from, mut to) = (c1, s1);
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if up_state
                .compare_exchange(
                    DROP_REQUEST_ARMED,
                    DROPPED,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_ok()
            {
                break;
            }
            // Start holding answers *before* the request can reach the
            // server: if this happened after the write, a fast answer could
            // be relayed while this thread is still descheduled between the
            // write and the state change (seen on a loaded machine). A
            // request still to pass goes through with its answer.
            if up_state.load(Ordering::SeqCst) == DROP_ANSWER_ARMED
                && passing
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                        left.checked_sub(1)
                    })
                    .is_err()
            {
                let _ = up_state.compare_exchange(
                    DROP_ANSWER_ARMED,
                    AWAITING_ANSWER,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    });
    // Server to client.
    std::thread::spawn(move || {
        let (mut from, mut to) = (s2, c2);
        let mut buf = [0u8; 16 * 1024];
        let mut held: Vec<u8> = Vec::new();
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if state.load(Ordering::SeqCst) == AWAITING_ANSWER {
                held.extend_from_slice(&buf[..n]);
                if contains_ready_for_query(&held) {
                    state.store(DROPPED, Ordering::SeqCst);
                    break;
                }
                continue;
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
        let _ = cx.shutdown(Shutdown::Both);
        let _ = sx.shutdown(Shutdown::Both);
    });
}

/// Whether the buffered server messages include a complete ReadyForQuery
/// ('Z'): each message is a type byte and a length that counts itself.
fn contains_ready_for_query(bytes: &[u8]) -> bool {
    let mut at = 0;
    while at + 5 <= bytes.len() {
        let kind = bytes[at];
        let len = u32::from_be_bytes([bytes[at + 1], bytes[at + 2], bytes[at + 3], bytes[at + 4]])
            as usize;
        if at + 1 + len > bytes.len() {
            return false;
        }
        if kind == b'Z' {
            return true;
        }
        at += 1 + len;
    }
    false
}
