//! Where the commands run: the database named by `--database-url` /
//! `DATABASE_URL`, or, only when asked with `--throwaway`, a throwaway local
//! server for this one command.
//!
//! Without a URL and without `--throwaway` a command refuses to run: a
//! command that silently acted on a server nobody else sees (and exited 0)
//! would tell a user that `force-release` or `fence` worked on their real
//! database. The throwaway server's state dies with the command, so it says
//! so on stderr every time, and installs leasehold into it (it is always
//! empty).

use diesel::prelude::*;
use diesel::PgConnection;
use leasehold_local::{DevServer, DevStatus, LocalPostgres};

use crate::failure::CliError;

/// An open connection, and the local server behind it when there is one
/// (kept alive, and removed on drop, with the connection).
pub struct Session {
    /// The connection the command uses. Declared first so it closes before
    /// the server stops.
    pub conn: PgConnection,
    /// The URL `conn` was opened with, for commands that need more
    /// connections (a waiting acquire opens a listener).
    pub url: String,
    _server: Option<LocalPostgres>,
}

/// Whether the command needs leasehold installed already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Any database will do (`install`).
    Nothing,
    /// The lease functions must be there; say so clearly if not.
    Installed,
}

/// Connects to `url`; without one, starts a throwaway server when
/// `throwaway` asks for one, or else uses the development server of
/// `leasehold local start` when it runs; refuses
/// ([`CliError::NoDatabase`]) otherwise.
pub fn open(url: Option<&str>, throwaway: bool, needs: Needs) -> Result<Session, CliError> {
    let local;
    let url = match url.filter(|u| !u.is_empty()) {
        Some(url) => url,
        None if throwaway => return open_embedded(),
        None => match running_url() {
            Some(found) => {
                eprintln!("note: no --database-url: using the development server at {found} (`leasehold local`)");
                local = found;
                &local
            }
            None => return Err(CliError::NoDatabase),
        },
    };
    let mut conn = establish(url)?;
    if needs == Needs::Installed && !is_installed(&mut conn)? {
        return Err(CliError::NotInstalled);
    }
    Ok(Session {
        conn,
        url: url.to_owned(),
        _server: None,
    })
}

/// The URL of the development server of `leasehold local start` when it
/// runs; `None` when it does not run or cannot be looked at.
fn running_url() -> Option<String> {
    match DevServer::from_env().ok()?.status().ok()? {
        DevStatus::Running { url } => Some(url),
        _ => None,
    }
}

fn open_embedded() -> Result<Session, CliError> {
    eprintln!(
        "note: --throwaway: using a throwaway local PostgreSQL that is deleted when this \
         command exits, so nothing persists between invocations; pass --database-url \
         postgres://... to work on a real database"
    );
    let server = LocalPostgres::start()?;
    let url = server.url();
    let mut conn = establish(&url)?;
    leasehold::install(&mut conn)
        .map_err(|error| CliError::Database(crate::failure::report(&error)))?;
    Ok(Session {
        conn,
        url,
        _server: Some(server),
    })
}

/// Opens a connection, giving up after the library's connect timeout (5 s
/// unless the URL or PGCONNECT_TIMEOUT says otherwise); the error names the
/// URL without its password.
pub fn establish(url: &str) -> Result<PgConnection, CliError> {
    let bounded = leasehold::__private::with_connect_timeout(url);
    PgConnection::establish(&bounded).map_err(|error| CliError::Connect {
        url: redact(url),
        message: error.to_string().trim().to_owned(),
    })
}

/// Whether leasehold is installed ([`leasehold::admin::is_installed`]).
fn is_installed(conn: &mut PgConnection) -> Result<bool, CliError> {
    leasehold::admin::is_installed(conn).map_err(|error| {
        CliError::Database(format!(
            "could not check whether leasehold is installed: {}; check the connection",
            crate::failure::report(&error)
        ))
    })
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`, and
/// `?password=secret` → `?password=***`. A URL may name several hosts
/// (`postgres://user:secret@h1:5432,h2:5432/db`): they all stay, only the
/// password goes. A libpq keyword/value string (`host=h1,h2 password=x`),
/// which `--database-url` accepts too, loses its password value the same
/// way.
pub fn redact(url: &str) -> String {
    if !url.contains("://") {
        return redact_keyword_value(url);
    }
    let url = redact_userinfo(url);
    match url.split_once('?') {
        Some((base, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some(("password", _)) => "password=***".to_owned(),
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{base}?{}", query.join("&"))
        }
        None => url,
    }
}

/// Redacts the `password` of a libpq keyword/value connection string
/// (`key = value` pairs separated by spaces; a value may be single-quoted,
/// with `\'` and `\\` escapes). A string that does not parse is replaced
/// whole when it mentions a password: it cannot be shown safely.
fn redact_keyword_value(conninfo: &str) -> String {
    let mut out = String::with_capacity(conninfo.len());
    let mut rest = conninfo;
    loop {
        let trimmed = rest.trim_start();
        out.push_str(&rest[..rest.len() - trimmed.len()]);
        rest = trimmed;
        if rest.is_empty() {
            return out;
        }
        let Some(eq) = rest.find('=') else {
            return unparsable(conninfo);
        };
        let key = rest[..eq].trim_end();
        if key.is_empty() || key.contains(char::is_whitespace) {
            return unparsable(conninfo);
        }
        let after_eq = &rest[eq + 1..];
        let value_start = after_eq.len() - after_eq.trim_start().len();
        let value = &after_eq[value_start..];
        let Some(value_len) = conninfo_value_len(value) else {
            return unparsable(conninfo);
        };
        out.push_str(&rest[..eq + 1 + value_start]);
        if key == "password" {
            out.push_str("***");
        } else {
            out.push_str(&value[..value_len]);
        }
        rest = &value[value_len..];
    }
}

/// The length in bytes of the keyword/value string value at the start of
/// `text`; `None` for an unterminated quoted value.
fn conninfo_value_len(text: &str) -> Option<usize> {
    let mut chars = text.char_indices();
    if text.starts_with('\'') {
        chars.next();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '\'' => return Some(i + 1),
                _ => {}
            }
        }
        return None;
    }
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            c if c.is_whitespace() => return Some(i),
            _ => {}
        }
    }
    Some(text.len())
}

fn unparsable(conninfo: &str) -> String {
    if conninfo.contains("password") {
        "(a connection string that could not be shown without its password)".to_owned()
    } else {
        conninfo.to_owned()
    }
}

fn redact_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let authority_end = url[scheme_end..]
        .find(['/', '?'])
        .map_or(url.len(), |i| scheme_end + i);
    let authority = &url[scheme_end..authority_end];
    match (authority.rfind('@'), authority.find(':')) {
        (Some(at), Some(colon)) if colon < at => format!(
            "{}{}:***{}",
            &url[..scheme_end],
            &authority[..colon],
            &url[scheme_end + at..]
        ),
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(
            redact("postgres://u:p%40ss@h:5432/db?x=1"),
            "postgres://u:***@h:5432/db?x=1"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("postgres://h:5432/db"), "postgres://h:5432/db");
        assert_eq!(redact("not a url"), "not a url");
        assert_eq!(
            redact("postgres://u@h/db?sslmode=require&password=x&a=b"),
            "postgres://u@h/db?sslmode=require&password=***&a=b"
        );
    }

    #[test]
    fn redact_keeps_every_host_of_a_multi_host_url() {
        assert_eq!(
            redact("postgres://u:pw@h1:5432,h2:5433/db?target_session_attrs=read-write"),
            "postgres://u:***@h1:5432,h2:5433/db?target_session_attrs=read-write"
        );
        assert_eq!(
            redact("postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write"),
            "postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write"
        );
        assert_eq!(
            redact("postgresql://u:p:w@[::1]:5432,h2/db"),
            "postgresql://u:***@[::1]:5432,h2/db"
        );
        assert_eq!(
            redact("postgres:///db?host=h1,h2&port=5432,5433&password=x"),
            "postgres:///db?host=h1,h2&port=5432,5433&password=***"
        );
    }

    #[test]
    fn redact_hides_the_password_of_a_keyword_value_string() {
        assert_eq!(
            redact("host=h1,h2 port=5432,5433 password=secret dbname=app"),
            "host=h1,h2 port=5432,5433 password=*** dbname=app"
        );
        assert_eq!(
            redact("password = 'se cr\\'et' user=u"),
            "password = *** user=u"
        );
        assert_eq!(redact("host=h dbname=app"), "host=h dbname=app");
        assert_eq!(
            redact("host=h password='unterminated"),
            "(a connection string that could not be shown without its password)"
        );
    }
}
