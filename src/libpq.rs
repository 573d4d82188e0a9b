//! A minimal libpq connection for the waiters' listener. Diesel never blocks on
//! notifications nor exposes the socket, and the `postgres` crate would bring an
//! async runtime; this uses diesel's own `pq-sys` so the listener can `poll(2)`.
//! All of the crate's unsafe code is here: libpq pointers are NULL-checked,
//! results freed by an RAII guard, a [`PqConn`] used by one thread at a time.

use std::ffi::{CStr, CString};
use std::io::ErrorKind;
use std::os::raw::{c_char, c_int};
use std::ptr::{self, NonNull};
use std::time::Duration;

use pq_sys as pq;

/// One NOTIFY received on the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Notification {
    /// The channel named in NOTIFY / pg_notify.
    pub(crate) channel: String,
    /// The payload ('' when none was given).
    pub(crate) payload: String,
}

/// Why a statement failed; SQLSTATE and `CONSTRAINT` only when the server
/// answered, so a refused statement is told from a lost session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PqError {
    /// The error message, without its trailing newline.
    pub(crate) message: String,
    /// The SQLSTATE of a server error; `None` when no answer came.
    pub(crate) sqlstate: Option<String>,
    /// The `CONSTRAINT` field of a server error, when set.
    pub(crate) constraint: Option<String>,
}

impl PqError {
    fn client(message: String) -> Self {
        PqError {
            message,
            sqlstate: None,
            constraint: None,
        }
    }
}

impl std::fmt::Display for PqError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// An open libpq connection. Closed (PQfinish) on drop.
pub(crate) struct PqConn {
    raw: NonNull<pq::PGconn>,
}

// SAFETY: libpq forbids only concurrent use, which `&mut self` rules out.
unsafe impl Send for PqConn {}

/// Frees a PGresult when it goes out of scope.
struct PqResult(NonNull<pq::PGresult>);

impl Drop for PqResult {
    fn drop(&mut self) {
        // SAFETY: the pointer came from PQexecParams and is freed only here.
        unsafe { pq::PQclear(self.0.as_ptr()) }
    }
}

fn c_string(what: &str, text: &str) -> Result<CString, String> {
    CString::new(text).map_err(|_| format!("{what} contains a NUL byte"))
}

/// Copies a C string owned by libpq; NULL becomes "".
///
/// # Safety
/// `text` must be NULL or point to a NUL-terminated string that stays valid
/// for the duration of the call.
unsafe fn copy_c_str(text: *const c_char) -> String {
    if text.is_null() {
        return String::new();
    }
    // SAFETY: non-NULL and NUL-terminated per the caller's contract.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

/// Connect timeout when neither the URL nor `PGCONNECT_TIMEOUT` sets one: libpq
/// would otherwise wait as long as the OS does, which looks like a hang.
pub(crate) const DEFAULT_CONNECT_TIMEOUT_SECS: u32 = 5;

/// `url` with `connect_timeout` set to [`DEFAULT_CONNECT_TIMEOUT_SECS`] unless
/// the URL or `PGCONNECT_TIMEOUT` sets one (or libpq cannot parse it).
pub(crate) fn with_connect_timeout(url: &str) -> String {
    if std::env::var_os("PGCONNECT_TIMEOUT").is_some() || sets_connect_timeout(url) != Some(false) {
        return url.to_owned();
    }
    let seconds = DEFAULT_CONNECT_TIMEOUT_SECS;
    if url.starts_with("postgresql://") || url.starts_with("postgres://") {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}connect_timeout={seconds}")
    } else {
        format!("{url} connect_timeout={seconds}")
    }
}

/// Whether `url` sets `connect_timeout`; `None` if libpq cannot parse it.
fn sets_connect_timeout(url: &str) -> Option<bool> {
    let [timeout] = conninfo_values(url, [c"connect_timeout"])?;
    Some(timeout.is_some())
}

/// The values the connection string `url` itself sets for `keywords` (no
/// defaults or environment); `None` if libpq cannot parse it.
fn conninfo_values<const N: usize>(url: &str, keywords: [&CStr; N]) -> Option<[Option<String>; N]> {
    let url = CString::new(url).ok()?;
    let mut error: *mut c_char = ptr::null_mut();
    // SAFETY: `url` is NUL-terminated; libpq allocates the options array
    // (or an error message) and we free whichever it returns.
    let options = unsafe { pq::PQconninfoParse(url.as_ptr(), &mut error) };
    if options.is_null() {
        if !error.is_null() {
            // SAFETY: allocated by libpq for this call.
            unsafe { pq::PQfreemem(error.cast()) };
        }
        return None;
    }
    let mut found: [Option<String>; N] = std::array::from_fn(|_| None);
    let mut option = options;
    // SAFETY: the array ends with a NULL keyword; its strings are copied out
    // before PQconninfoFree.
    unsafe {
        while !(*option).keyword.is_null() {
            let keyword = CStr::from_ptr((*option).keyword);
            if let Some(slot) = keywords.iter().position(|wanted| *wanted == keyword) {
                let value = copy_c_str((*option).val);
                found[slot] = (!value.is_empty()).then_some(value);
            }
            option = option.add(1);
        }
        pq::PQconninfoFree(options);
    }
    Some(found)
}

/// How long one attempt to connect to `url` may take, as libpq bounds it:
/// the sync face's rule applied to the async face's connections.
#[cfg(feature = "async")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConnectBound {
    /// `connect_timeout` times the hosts listed; `None` for no bound.
    pub(crate) total: Option<Duration>,
    /// `connect_timeout` itself; `None` for no bound.
    pub(crate) each: Option<Duration>,
    /// The setting and its source, e.g. `connect_timeout=2 from the URL`.
    pub(crate) setting: String,
    /// The servers the URL names, `host:port`, in libpq's order.
    pub(crate) servers: String,
}

#[cfg(feature = "async")]
impl ConnectBound {
    /// The bound for `url` as the caller gave it, so the default is told apart.
    pub(crate) fn of(url: &str) -> Self {
        let values = conninfo_values(url, [c"connect_timeout", c"host", c"hostaddr", c"port"]);
        let [timeout, host, hostaddr, port] = values.unwrap_or_default();
        let (seconds, origin) = match (timeout, std::env::var("PGCONNECT_TIMEOUT")) {
            (Some(seconds), _) => (seconds, "from the URL"),
            (None, Ok(seconds)) if !seconds.trim().is_empty() => {
                (seconds, "from PGCONNECT_TIMEOUT")
            }
            _ => (DEFAULT_CONNECT_TIMEOUT_SECS.to_string(), "by default"),
        };
        let servers = servers(host.or(hostaddr).as_deref(), port.as_deref());
        let hosts = u32::try_from(servers.len()).unwrap_or(u32::MAX).max(1);
        let each = per_host_timeout(&seconds);
        Self {
            total: each.map(|each| each.saturating_mul(hosts)),
            each,
            setting: format!("connect_timeout={} {origin}", seconds.trim()),
            servers: servers.join(", "),
        }
    }
}

/// libpq's reading of a `connect_timeout` value (zero or negative: no bound;
/// 1 raised to 2); a value libpq would refuse gets the default.
#[cfg(feature = "async")]
fn per_host_timeout(seconds: &str) -> Option<Duration> {
    match seconds.trim().parse::<i64>() {
        Ok(seconds) if seconds <= 0 => None,
        Ok(seconds) => Some(Duration::from_secs(seconds.unsigned_abs().max(2))),
        Err(_) => Some(Duration::from_secs(u64::from(DEFAULT_CONNECT_TIMEOUT_SECS))),
    }
}

/// `host:port` per host of `hosts` and `ports`, with libpq's defaults.
#[cfg(feature = "async")]
fn servers(hosts: Option<&str>, ports: Option<&str>) -> Vec<String> {
    let hosts: Vec<&str> = hosts.unwrap_or("localhost").split(',').collect();
    let ports: Vec<&str> = ports.unwrap_or("5432").split(',').collect();
    hosts
        .iter()
        .enumerate()
        .map(|(n, host)| {
            let host = if host.is_empty() { "localhost" } else { host };
            let port = if ports.len() == 1 {
                ports.first()
            } else {
                ports.get(n)
            };
            let port = port
                .copied()
                .filter(|port| !port.is_empty())
                .unwrap_or("5432");
            if host.contains(':') && !host.starts_with('/') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            }
        })
        .collect()
}

/// A libpq notice processor that drops the notice.
unsafe extern "C" fn ignore_notice(_arg: *mut std::os::raw::c_void, _message: *const c_char) {}

impl PqConn {
    /// Connects to `url` (libpq picks among several hosts), naming the session
    /// `application_name` for pg_stat_activity.
    pub(crate) fn connect(url: &str, application_name: &str) -> Result<Self, String> {
        let keys = [c"dbname", c"application_name"];
        let url = c_string("the database URL", &with_connect_timeout(url))?;
        let name = c_string("the application name", application_name)?;
        let values = [url.as_c_str(), name.as_c_str()];
        let mut key_ptrs: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
        let mut value_ptrs: Vec<*const c_char> = values.iter().map(|v| v.as_ptr()).collect();
        key_ptrs.push(ptr::null());
        value_ptrs.push(ptr::null());
        // SAFETY: both arrays are NULL-terminated and outlive the call;
        // expand_dbname = 1 lets `dbname` carry a whole URL.
        let raw = unsafe { pq::PQconnectdbParams(key_ptrs.as_ptr(), value_ptrs.as_ptr(), 1) };
        let raw =
            NonNull::new(raw).ok_or_else(|| "libpq could not allocate a connection".to_owned())?;
        let conn = PqConn { raw };
        // SAFETY: `raw` is a live connection object.
        if unsafe { pq::PQstatus(conn.raw.as_ptr()) } != pq::ConnStatusType::CONNECTION_OK {
            return Err(conn.error_message());
        }
        // libpq prints notices to stderr by default; the listener reports through its status.
        // SAFETY: the processor ignores its arguments and never unwinds.
        unsafe {
            pq::PQsetNoticeProcessor(conn.raw.as_ptr(), Some(ignore_notice), ptr::null_mut());
        }
        Ok(conn)
    }

    /// libpq's last error message for this connection.
    fn error_message(&self) -> String {
        // SAFETY: the connection is live; the message is copied at once.
        unsafe { copy_c_str(pq::PQerrorMessage(self.raw.as_ptr())) }
            .trim_end()
            .to_owned()
    }

    /// Whether libpq still considers the connection usable.
    pub(crate) fn is_ok(&self) -> bool {
        // SAFETY: the connection is live.
        unsafe { pq::PQstatus(self.raw.as_ptr()) == pq::ConnStatusType::CONNECTION_OK }
    }

    /// Whether the server accepts only reads (hot standby or
    /// `default_transaction_read_only`), as reported at connect and after changes
    /// (PostgreSQL 14+; no round trip). An older server shows it as 25006 on write.
    pub(crate) fn server_read_only(&self) -> bool {
        [c"in_hot_standby", c"default_transaction_read_only"]
            .iter()
            .any(|name| {
                // SAFETY: the connection is live; the value is copied at once.
                let value =
                    unsafe { copy_c_str(pq::PQparameterStatus(self.raw.as_ptr(), name.as_ptr())) };
                value == "on"
            })
    }

    /// Runs one statement with text parameters; rows as text (NULL as `None`).
    pub(crate) fn query(
        &mut self,
        sql: &str,
        params: &[&str],
    ) -> Result<Vec<Vec<Option<String>>>, PqError> {
        let sql = c_string("the statement", sql).map_err(PqError::client)?;
        let params = params
            .iter()
            .map(|p| c_string("a statement parameter", p))
            .collect::<Result<Vec<_>, _>>()
            .map_err(PqError::client)?;
        let param_ptrs: Vec<*const c_char> = params.iter().map(|p| p.as_ptr()).collect();
        let count = c_int::try_from(param_ptrs.len())
            .map_err(|_| PqError::client("too many parameters".to_owned()))?;
        // SAFETY: the strings outlive the call; NULL types/lengths/formats mean text.
        let result = unsafe {
            pq::PQexecParams(
                self.raw.as_ptr(),
                sql.as_ptr(),
                count,
                ptr::null(),
                if params.is_empty() {
                    ptr::null()
                } else {
                    param_ptrs.as_ptr()
                },
                ptr::null(),
                ptr::null(),
                0,
            )
        };
        let Some(result) = NonNull::new(result).map(PqResult) else {
            return Err(PqError::client(self.error_message()));
        };
        // SAFETY: `result` is a live PGresult until the guard drops.
        let status = unsafe { pq::PQresultStatus(result.0.as_ptr()) };
        match status {
            pq::ExecStatusType::PGRES_COMMAND_OK => Ok(Vec::new()),
            pq::ExecStatusType::PGRES_TUPLES_OK => {
                // SAFETY: as above; indices stay within ntuples/nfields.
                let rows = unsafe { pq::PQntuples(result.0.as_ptr()) };
                let fields = unsafe { pq::PQnfields(result.0.as_ptr()) };
                let mut out = Vec::new();
                for row in 0..rows {
                    let mut values = Vec::new();
                    for field in 0..fields {
                        // SAFETY: in range; the value is copied at once.
                        let value = unsafe {
                            if pq::PQgetisnull(result.0.as_ptr(), row, field) != 0 {
                                None
                            } else {
                                Some(copy_c_str(pq::PQgetvalue(result.0.as_ptr(), row, field)))
                            }
                        };
                        values.push(value);
                    }
                    out.push(values);
                }
                Ok(out)
            }
            _ => {
                // SAFETY: as above; the fields are copied before the result is freed.
                let (message, sqlstate, constraint) = unsafe {
                    let raw = result.0.as_ptr();
                    let field = |code: u8| {
                        let value = pq::PQresultErrorField(raw, c_int::from(code));
                        (!value.is_null()).then(|| copy_c_str(value))
                    };
                    (
                        copy_c_str(pq::PQresultErrorMessage(raw)),
                        field(pq::PG_DIAG_SQLSTATE),
                        field(pq::PG_DIAG_CONSTRAINT_NAME),
                    )
                };
                let message = if message.trim().is_empty() {
                    self.error_message()
                } else {
                    message.trim_end().to_owned()
                };
                // libpq makes up SQLSTATEs for its own errors (08006 for a lost connection):
                // only an answer on a usable connection is the server's.
                let sqlstate = sqlstate.filter(|_| self.is_ok());
                Err(PqError {
                    message,
                    sqlstate,
                    constraint,
                })
            }
        }
    }

    /// The socket to poll for readability (-1 when there is none).
    pub(crate) fn socket(&self) -> c_int {
        // SAFETY: the connection is live.
        unsafe { pq::PQsocket(self.raw.as_ptr()) }
    }

    /// The server process id of this session.
    pub(crate) fn backend_pid(&self) -> i32 {
        // SAFETY: the connection is live.
        unsafe { pq::PQbackendPID(self.raw.as_ptr()) }
    }

    /// Reads what the server sent (socket readable); an error means the connection is gone.
    pub(crate) fn consume_input(&mut self) -> Result<(), String> {
        // SAFETY: the connection is live and used by this thread only.
        if unsafe { pq::PQconsumeInput(self.raw.as_ptr()) } == 0 || !self.is_ok() {
            return Err(self.error_message());
        }
        Ok(())
    }

    /// The notifications libpq has buffered, oldest first.
    pub(crate) fn take_notifications(&mut self) -> Vec<Notification> {
        let mut out = Vec::new();
        loop {
            // SAFETY: the connection is live; each PGnotify is copied, then PQfreemem'd.
            let notify = unsafe { pq::PQnotifies(self.raw.as_ptr()) };
            let Some(notify) = NonNull::new(notify) else {
                return out;
            };
            unsafe {
                let n = notify.as_ref();
                out.push(Notification {
                    channel: copy_c_str(n.relname),
                    payload: copy_c_str(n.extra),
                });
                pq::PQfreemem(notify.as_ptr().cast());
            }
        }
    }
}

impl Drop for PqConn {
    fn drop(&mut self) {
        // SAFETY: the connection is live and never used after this.
        unsafe { pq::PQfinish(self.raw.as_ptr()) }
    }
}

/// Polls `fds` for readability; one flag per fd. Here so that this module
/// holds all of the unsafe code.
pub(crate) fn wait_readable(fds: &[i32], timeout: Option<Duration>) -> Result<Vec<bool>, String> {
    let mut pollfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let timeout_ms = timeout.map_or(-1, |t| {
        // Round up so a sub-millisecond timeout does not spin.
        let ms = t.as_micros().div_ceil(1000);
        libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
    });
    loop {
        // SAFETY: `pollfds` is a valid array of `pollfds.len()` entries.
        let n = unsafe {
            libc::poll(
                pollfds.as_mut_ptr(),
                pollfds.len() as libc::nfds_t,
                timeout_ms,
            )
        };
        if n >= 0 {
            return Ok(pollfds.iter().map(|p| p.revents != 0).collect());
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != ErrorKind::Interrupted {
            return Err(format!("poll failed: {error}"));
        }
    }
}

#[cfg(all(test, feature = "async"))]
mod tests {
    use super::*;

    #[test]
    fn the_connect_bound_is_read_as_libpq_reads_connect_timeout() {
        let bound = ConnectBound::of("postgres://u@h1:5433,h2/db?connect_timeout=3");
        assert_eq!(bound.total, Some(Duration::from_secs(6)), "per host");
        assert_eq!(bound.each, Some(Duration::from_secs(3)));
        assert_eq!(bound.servers, "h1:5433, h2:5432");
        assert_eq!(bound.setting, "connect_timeout=3 from the URL");
        let bound = ConnectBound::of("host=/run/pg port=5499 connect_timeout=1");
        assert_eq!(
            bound.total,
            Some(Duration::from_secs(2)),
            "1 is raised to 2"
        );
        assert_eq!(bound.servers, "/run/pg:5499");
        assert_eq!(
            ConnectBound::of("postgres://u@h/db?connect_timeout=0").total,
            None
        );
        if std::env::var_os("PGCONNECT_TIMEOUT").is_none() {
            let bound = ConnectBound::of("postgres://u@[::1]/db");
            assert_eq!(bound.total, Some(Duration::from_secs(5)));
            assert_eq!(bound.setting, "connect_timeout=5 by default");
            assert_eq!(bound.servers, "[::1]:5432");
        }
    }
}
/// An error and its sources, `: `-separated, as one line.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    Chain(error).to_string()
}

/// An error and its sources, `: `-separated.
struct Chain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // libpq's messages span lines: joined with spaces, the chain stays one line.
        let one_line = |error: &dyn std::error::Error| {
            error
                .to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        write!(f, "{}", one_line(self.0))?;
        let mut source = self.0.source();
        while let Some(error) = source {
            write!(f, ": {}", one_line(error))?;
            source = error.source();
        }
        Ok(())
    }
}
