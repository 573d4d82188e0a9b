//! Options for a server before it starts, and starting it.

use std::ffi::OsString;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::binaries::find_bin_dir;
use crate::error::{io_err, LocalServerError};
use crate::replication::{BackupMode, BackupSource};
use crate::root_dir::create_root_dir;
use crate::server::LocalPostgres;
use crate::server_user::server_identity;
use crate::watchdog::Watchdog;

/// Port for socket-only servers. The socket lives in a private directory,
/// so the well-known port cannot clash with another server.
const SOCKET_ONLY_PORT: u16 = 5432;
/// How many times a TCP server is retried when its free port was taken
/// between probing and binding.
const TCP_PORT_ATTEMPTS: usize = 3;

/// Configures a [`LocalPostgres`] before starting it.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until start() is called"]
pub struct LocalPostgresBuilder {
    bin_dir: Option<PathBuf>,
    durable: bool,
    tcp: bool,
    settings: Vec<(String, String)>,
    backup: Option<BackupSource>,
}

impl Default for LocalPostgresBuilder {
    fn default() -> Self {
        Self {
            bin_dir: None,
            durable: true,
            tcp: false,
            settings: Vec::new(),
            backup: None,
        }
    }
}

impl LocalPostgresBuilder {
    /// Uses the server binaries in `dir` instead of searching for them.
    ///
    /// Without this, the search order is: the `LEASEHOLD_PG_BIN` environment
    /// variable, a `PATH` entry holding `initdb` and `postgres`,
    /// `pg_config --bindir`, and the highest version under
    /// `/usr/lib/postgresql/*/bin`. A directory qualifies only if it holds
    /// `initdb`, `postgres` and `pg_ctl`; an explicit directory (or the
    /// environment variable) that does not qualify is an error rather than
    /// silently replaced by another installation.
    pub fn bin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.bin_dir = Some(dir.into());
        self
    }

    /// Whether commits are durable (the default, `true`).
    ///
    /// Durable servers run with `fsync`, `synchronous_commit` and
    /// `full_page_writes` on, as in production, so benchmarks measure real
    /// commit costs. `false` turns all three off, which makes tests much
    /// faster; committed data still survives [`LocalPostgres::kill_postmaster`]
    /// because the OS page cache survives a process crash.
    pub fn durable(mut self, yes: bool) -> Self {
        self.durable = yes;
        self
    }

    /// Also listen on TCP at 127.0.0.1, on a free port (default: unix socket
    /// only). Needed by clients that cannot use unix sockets; see
    /// [`LocalPostgres::tcp_url_for`].
    pub fn tcp(mut self, yes: bool) -> Self {
        self.tcp = yes;
        self
    }

    /// Adds a server setting, passed as `-c name=value` after the built-in
    /// ones (so it overrides them), e.g. `("log_statement", "all")` or
    /// `("max_connections", "200")`. Do not override `port`,
    /// `listen_addresses` or `unix_socket_directories`: the URLs would be
    /// wrong.
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Makes the server from a base backup of `source` (`pg_basebackup -X
    /// stream`, run as the server user) instead of running initdb: a
    /// streaming standby, or a restore that ends on a new timeline (see
    /// [`BackupMode`]). `source` must be running; it accepts replication
    /// connections as started by this crate. The new server gets its own
    /// directory, socket and watchdog, and this builder's settings.
    pub fn from_base_backup(mut self, source: &LocalPostgres, mode: BackupMode) -> Self {
        self.backup = Some(BackupSource::of(source, mode));
        self
    }

    /// Creates the data directory, starts the server and waits until it
    /// answers queries.
    pub fn start(self) -> Result<LocalPostgres, LocalServerError> {
        let bin_dir = find_bin_dir(self.bin_dir.as_deref())?;
        let run_as = server_identity()?;
        let attempts = if self.tcp { TCP_PORT_ATTEMPTS } else { 1 };
        let mut attempt = 1;
        loop {
            match self.start_once(&bin_dir, run_as) {
                Err(LocalServerError::StartFailed { ref log_tail, .. })
                    if attempt < attempts && log_tail.contains("could not bind") =>
                {
                    // Another process took the free port between our probe
                    // and the server's bind; try another port.
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn start_once(
        &self,
        bin_dir: &Path,
        run_as: Option<(u32, u32)>,
    ) -> Result<LocalPostgres, LocalServerError> {
        let port = if self.tcp {
            free_tcp_port()?
        } else {
            SOCKET_ONLY_PORT
        };
        let root = create_root_dir(run_as, bin_dir)?;
        // The watchdog exists from here on, so the directory is removed even
        // if this process is killed during initdb.
        let watchdog = match Watchdog::spawn(&root) {
            Ok(w) => w,
            Err(e) => {
                let _ = fs::remove_dir_all(&root);
                return Err(e);
            }
        };
        let data_dir = root.join("data");
        let socket_dir = root.join("s");
        let server = LocalPostgres {
            server_args: self.server_args(&data_dir, &socket_dir, port),
            log_path: root.join("server.log"),
            data_dir,
            socket_dir,
            root,
            bin_dir: bin_dir.to_owned(),
            port,
            tcp: self.tcp,
            run_as,
            postmaster: Mutex::new(None),
            watchdog: Mutex::new(Some(watchdog)),
        };
        // From here on, an error drops `server`, which cleans up.
        match &self.backup {
            None => server.prepare()?,
            Some(source) => server.prepare_from_backup(source)?,
        }
        server.launch()?;
        if let Some(BackupSource {
            mode: BackupMode::RestoreAndPromote,
            ..
        }) = &self.backup
        {
            server.wait_out_of_recovery()?;
        }
        Ok(server)
    }

    /// The `postgres` command line: locations, then the durability
    /// settings, then the caller's settings (last, so they win).
    fn server_args(&self, data_dir: &Path, socket_dir: &Path, port: u16) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "-D".into(),
            data_dir.into(),
            "-k".into(),
            socket_dir.into(),
            "-p".into(),
            port.to_string().into(),
        ];
        let listen = if self.tcp { "127.0.0.1" } else { "" };
        let on_off = if self.durable { "on" } else { "off" };
        let mut settings: Vec<(String, String)> = vec![
            ("listen_addresses".into(), listen.into()),
            ("fsync".into(), on_off.into()),
            ("synchronous_commit".into(), on_off.into()),
            ("full_page_writes".into(), on_off.into()),
        ];
        settings.extend(self.settings.iter().cloned());
        for (name, value) in settings {
            args.push("-c".into());
            args.push(format!("{name}={value}").into());
        }
        args
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago (the server may still
/// lose it to another process; [`LocalPostgresBuilder::start`] retries).
fn free_tcp_port() -> Result<u16, LocalServerError> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(io_err("find a free TCP port on 127.0.0.1"))?;
    let port = listener
        .local_addr()
        .map_err(io_err("find a free TCP port on 127.0.0.1"))?
        .port();
    Ok(port)
}
