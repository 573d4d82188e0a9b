//! Just enough HTTP/1.1 for Patroni's REST API and etcd's health endpoint:
//! one request per connection (`Connection: close`), loopback only.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

/// How long one request may take; Patroni answers in milliseconds unless
/// its node is being killed, and a dead node refuses at once.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// `method path` on `127.0.0.1:port` with an optional JSON body; the status
/// code and the body.
pub fn request(
    method: &str,
    port: u16,
    path: &str,
    body: Option<&str>,
) -> io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let body = body.unwrap_or("");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no end of headers"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad status line in {head:?}"),
            )
        })?;
    let body = if head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:")
            && l.to_ascii_lowercase().contains("chunked")
    }) {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

/// `GET path` parsed as JSON, whatever the status (Patroni answers its
/// health endpoints with 503 and a JSON body); `None` if the node does not
/// answer or the body is not JSON.
pub fn get_json(port: u16, path: &str) -> Option<Value> {
    let (_, body) = request("GET", port, path, None).ok()?;
    serde_json::from_str(&body).ok()
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}
