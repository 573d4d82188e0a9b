//! Connection URLs: percent-encoding for libpq, and another database on
//! the server a URL names.

/// Percent-encodes everything but RFC 3986 unreserved characters (and `/`
/// when `keep_slash`, which libpq accepts raw in query values, so socket
/// paths stay readable in logs).
pub(crate) fn percent_encode(text: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        let keep = byte.is_ascii_alphanumeric()
            || matches!(byte, b'-' | b'.' | b'_' | b'~')
            || (keep_slash && byte == b'/');
        if keep {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Replaces the database name in a `postgres://` URL, keeping the user,
/// host, port and query parameters: the URL of a sibling database on the
/// same server.
pub(crate) fn url_with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map_or(base.len(), |i| authority_start + i);
    let mut out = format!("{}/{}", &base[..path_start], database);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding_keeps_paths_readable() {
        assert_eq!(percent_encode("/tmp/a b", true), "/tmp/a%20b");
        assert_eq!(percent_encode("db/x", false), "db%2Fx");
    }

    #[test]
    fn url_with_database_replaces_only_the_database() {
        assert_eq!(
            url_with_database("postgres://u:p@h:5432/app?sslmode=disable", "t1"),
            "postgres://u:p@h:5432/t1?sslmode=disable"
        );
        assert_eq!(url_with_database("postgres://h", "t2"), "postgres://h/t2");
        // Several hosts (a DATABASE_URL naming a primary and its standby)
        // all stay.
        assert_eq!(
            url_with_database(
                "postgres://u@h1:5432,h2:5433/app?target_session_attrs=read-write",
                "t3"
            ),
            "postgres://u@h1:5432,h2:5433/t3?target_session_attrs=read-write"
        );
    }
}
