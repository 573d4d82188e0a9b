//! A `moto_server` (an S3-compatible test server, `pip install
//! 'moto[server]'`) on a free loopback port, for the object-store adapter's
//! S3 tests and benchmark.
//!
//! Two ways to run it:
//!
//! * [`MotoServer::start`]: moto as shipped, `moto_server`, which serves
//!   each request on its own thread. Its conditional PUT is **not atomic**:
//!   it checks `If-Match`, then stores the body without a lock, so two PUTs
//!   on the same ETag can both succeed once bodies take a while to store
//!   (a few MiB). Use it to show that something notices.
//! * [`MotoServer::start_serialized`]: the same moto application, served by
//!   werkzeug's `run_simple(..., threaded=False)` in a Python process of its
//!   own: one request at a time, start to finish, so every conditional PUT
//!   is atomic (check and store happen with no other request in between).
//!   A non-threaded werkzeug server answers HTTP/1.0 and closes each
//!   connection after its response, so an idle keep-alive connection cannot
//!   hold the server. Use it for tests that rely on compare-and-swap.

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

/// The serialised runner: moto's own WSGI application (the one
/// `moto_server` builds) served without threads. Arguments: host, port.
const SERIALIZED_MOTO: &str = r#"
import os, sys
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
host, port = sys.argv[1], int(sys.argv[2])
os.environ.setdefault("MOTO_PORT", str(port))
run_simple(host, port, DomainDispatcherApplication(create_backend_app), threaded=False)
"#;

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
    /// Starts `moto_server` as shipped (threaded, conditional PUT not
    /// atomic; see the module docs) on a free loopback port and waits until
    /// it answers HTTP.
    pub fn start() -> Result<MotoServer, MotoError> {
        Self::start_with(|port| {
            let mut command = Command::new("moto_server");
            command.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
            command
        })
    }

    /// Starts moto serving one request at a time, so its conditional PUT is
    /// atomic (see the module docs), with the Python that runs
    /// `moto_server` (`python3`, or `LEASEHOLD_MOTO_PYTHON` if set).
    pub fn start_serialized() -> Result<MotoServer, MotoError> {
        let python = std::env::var("LEASEHOLD_MOTO_PYTHON").unwrap_or_else(|_| "python3".into());
        if !on_path("moto_server") {
            return Err(MotoError::NotInstalled);
        }
        Self::start_with(|port| {
            let mut command = Command::new(&python);
            command.args(["-c", SERIALIZED_MOTO, "127.0.0.1", &port.to_string()]);
            command
        })
    }

    fn start_with(command: impl FnOnce(u16) -> Command) -> Result<MotoServer, MotoError> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(MotoError::Io)?
            .port();
        let child = command(port)
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

/// Whether `program` is an executable file in one of `PATH`'s directories.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
