//! A `moto_server` (an S3-compatible test server, `pip install
//! 'moto[server]'`) on a free loopback port, for the object-store adapter's
//! S3 tests and benchmark.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long moto may take to answer after its start (it is a Python
/// program, slow to import on a loaded machine).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// The credentials and region moto accepts; any non-empty values would do.
pub const ACCESS_KEY_ID: &str = "testing";
/// See [`ACCESS_KEY_ID`].
pub const SECRET_ACCESS_KEY: &str = "testing";
/// See [`ACCESS_KEY_ID`].
pub const REGION: &str = "us-east-1";

/// A running `moto_server`, killed on drop.
#[derive(Debug)]
pub struct MotoServer {
    child: Child,
    port: u16,
}

/// Why a `moto_server` could not be started.
#[derive(Debug)]
pub enum MotoError {
    /// `moto_server` is not on `PATH`.
    NotInstalled,
    /// It exited before answering.
    Exited(ExitStatus),
    /// It did not answer within the startup timeout.
    NoAnswer(u16),
    /// Finding a port or spawning the process failed.
    Io(io::Error),
}

impl fmt::Display for MotoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MotoError::NotInstalled => f.write_str(
                "moto_server is not installed; the S3 tests need it: pip install 'moto[server]' \
                 (or set LEASEHOLD_SKIP_S3=1 to skip them)",
            ),
            MotoError::Exited(status) => {
                write!(f, "moto_server exited during startup with {status}")
            }
            MotoError::NoAnswer(port) => write!(
                f,
                "moto_server did not answer on 127.0.0.1:{port} within {STARTUP_TIMEOUT:?}"
            ),
            MotoError::Io(error) => write!(f, "could not start moto_server: {error}"),
        }
    }
}

impl std::error::Error for MotoError {}

impl MotoServer {
    /// Starts `moto_server` on a free loopback port and waits until it
    /// answers HTTP.
    pub fn start() -> Result<MotoServer, MotoError> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(MotoError::Io)?
            .port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|error| match error.kind() {
                io::ErrorKind::NotFound => MotoError::NotInstalled,
                _ => MotoError::Io(error),
            })?;
        let mut moto = MotoServer { child, port };
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Ok(Some(status)) = moto.child.try_wait() {
                return Err(MotoError::Exited(status));
            }
            if moto.request("GET", "/").is_ok() {
                return Ok(moto);
            }
            if Instant::now() >= deadline {
                return Err(MotoError::NoAnswer(port));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The endpoint URL S3 clients are pointed at (plain HTTP).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates `bucket`; an error says what moto answered instead of 200.
    pub fn create_bucket(&self, bucket: &str) -> io::Result<()> {
        let status = self.request("PUT", &format!("/{bucket}"))?;
        if status.contains(" 200 ") {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "creating bucket {bucket}: {status}"
            )))
        }
    }

    /// A minimal HTTP/1.1 request without a body; returns the status line.
    /// Enough for bucket creation and liveness, without an HTTP client.
    fn request(&self, method: &str, path: &str) -> io::Result<String> {
        let port = self.port;
        let mut stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response.lines().next().unwrap_or_default().to_owned())
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
