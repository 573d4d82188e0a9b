//! A PgBouncer (Debian package `pgbouncer`, 1.18 or later) on a free
//! loopback port in front of a local test server, for the connection
//! pooler tests and the cost measurement of statement caching.
//!
//! Its configuration lives in a temporary directory of its own: every
//! database of the server through a wildcard entry, `auth_type = trust`
//! with a userlist naming the server's superuser, and the pool mode asked
//! for. PgBouncer refuses to run as root, so a root test process runs it
//! as `postgres` (the user the local server runs as then). Dropping the
//! handle, also while a panic unwinds, kills it and removes the directory;
//! a watchdog does the same when the test process dies without unwinding.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use leasehold_local::LocalPostgres;

/// How long PgBouncer may take to accept a first query.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// What to install when the binary is missing.
const INSTALL_HINT: &str = "pgbouncer is not installed; the connection pooler tests need \
     PgBouncer 1.18 or later: apt-get install pgbouncer (Debian/Ubuntu), or put a \
     `pgbouncer` binary on PATH";

/// PgBouncer's `pool_mode`: when a server connection goes back to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// When the client disconnects: a client keeps one server session.
    Session,
    /// After every transaction (an autocommitted statement is one): a
    /// client's next transaction may run on another server session.
    Transaction,
}

impl PoolMode {
    fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        }
    }
}

impl fmt::Display for PoolMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A running PgBouncer, killed (and its directory removed) on drop.
#[derive(Debug)]
pub struct PgBouncer {
    child: Child,
    /// Closing it lets the watchdog exit without killing anything.
    watchdog: Option<(Child, ChildStdin)>,
    dir: PathBuf,
    port: u16,
    mode: PoolMode,
}

impl PgBouncer {
    /// Starts PgBouncer in `mode` in front of `server` with up to
    /// `pool_size` server connections per database, and waits until a
    /// query through it succeeds. Panics with what to install when the
    /// binary is missing, and with PgBouncer's log when it fails to start.
    pub fn start(server: &LocalPostgres, mode: PoolMode, pool_size: u32) -> PgBouncer {
        let binary = find_binary().unwrap_or_else(|| panic!("{INSTALL_HINT}"));
        let run_as = if effective_uid() == Some(0) {
            Some(postgres_ids().unwrap_or_else(|| {
                panic!("running as root, PgBouncer needs the `postgres` system user to run as")
            }))
        } else {
            None
        };
        let dir = private_dir();
        let port = free_port();
        let userlist = dir.join("userlist.txt");
        write_file(&userlist, "\"postgres\" \"\"\n");
        let ini = dir.join("pgbouncer.ini");
        write_file(
            &ini,
            &format!(
                "[databases]\n\
                 * = host={socket} port={pg_port} user=postgres\n\
                 \n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {userlist}\n\
                 admin_users = postgres\n\
                 pool_mode = {mode}\n\
                 default_pool_size = {pool_size}\n\
                 max_client_conn = 500\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 logfile = {log}\n\
                 pidfile = {pid}\n",
                socket = server.socket_dir().display(),
                pg_port = server.port(),
                userlist = userlist.display(),
                log = dir.join("pgbouncer.log").display(),
                pid = dir.join("pgbouncer.pid").display(),
            ),
        );
        if let Some((uid, gid)) = run_as {
            chown_tree(&dir, uid, gid);
        }
        let mut command = Command::new(&binary);
        command
            .arg(&ini)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some((uid, gid)) = run_as {
            command.uid(uid).gid(gid);
        }
        let child = command.spawn().unwrap_or_else(|error| match error.kind() {
            io::ErrorKind::NotFound => panic!("{INSTALL_HINT}"),
            _ => panic!("cannot start {}: {error}", binary.display()),
        });
        let watchdog = start_watchdog(child.id(), &dir);
        let bouncer = PgBouncer {
            child,
            watchdog,
            dir,
            port,
            mode,
        };
        bouncer.wait_ready()
    }

    fn wait_ready(mut self) -> PgBouncer {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let url = self.url_for("postgres");
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "pgbouncer exited during startup with {status}; its log:\n{}",
                    self.log()
                );
            }
            let answered = PgConnection::establish(&url)
                .ok()
                .is_some_and(|mut conn| diesel::sql_query("SELECT 1").execute(&mut conn).is_ok());
            match answered {
                true => return self,
                false if Instant::now() >= deadline => panic!(
                    "pgbouncer did not answer on 127.0.0.1:{} within {STARTUP_TIMEOUT:?}; its log:\n{}",
                    self.port,
                    self.log()
                ),
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// The URL of `database` through this PgBouncer, as `postgres`.
    pub fn url_for(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The pool mode it runs in.
    pub fn mode(&self) -> PoolMode {
        self.mode
    }

    /// The port it listens on (127.0.0.1 only).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// PgBouncer's log so far (for failure messages).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some((mut watchdog, stdin)) = self.watchdog.take() {
            drop(stdin);
            let _ = watchdog.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A shell that waits for its stdin to close: when this process exits
/// without dropping the handle (killed, or the handle kept in a static),
/// the pipe closes at EOF and the shell kills PgBouncer and removes its
/// directory. A normal drop kills PgBouncer first, so the watchdog's kill
/// then finds nothing (pids are not reused that fast).
fn start_watchdog(pid: u32, dir: &Path) -> Option<(Child, ChildStdin)> {
    let script = format!(
        "read _ ; kill -9 {pid} 2>/dev/null; rm -rf '{}'",
        dir.display()
    );
    let mut child = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let stdin = child.stdin.take()?;
    Some((child, stdin))
}

fn find_binary() -> Option<PathBuf> {
    let from_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("pgbouncer"))
            .find(|path| path.is_file())
    });
    // Debian installs it in /usr/sbin, which a non-root PATH may lack.
    from_path.or_else(|| {
        ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .iter()
            .map(PathBuf::from)
            .find(|path| path.is_file())
    })
}

fn private_dir() -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "leasehold-pgbouncer-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap_or_else(|e| panic!("find a free port for pgbouncer: {e}"))
        .port()
}

fn write_file(path: &Path, text: &str) {
    fs::File::create(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn chown_tree(dir: &Path, uid: u32, gid: u32) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for path in entries.flatten().map(|entry| entry.path()) {
        std::os::unix::fs::chown(&path, Some(uid), Some(gid))
            .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    }
    std::os::unix::fs::chown(dir, Some(uid), Some(gid))
        .unwrap_or_else(|e| panic!("chown {}: {e}", dir.display()));
}

fn effective_uid() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// The uid and gid of the `postgres` system user.
fn postgres_ids() -> Option<(u32, u32)> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        if fields.next()? != "postgres" {
            return None;
        }
        let _password = fields.next()?;
        Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
    })
}
