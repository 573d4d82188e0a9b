//! Connection URLs for a local server: percent-encoding for libpq.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding_keeps_paths_readable() {
        assert_eq!(percent_encode("/tmp/a b", true), "/tmp/a%20b");
        assert_eq!(percent_encode("db/x", false), "db%2Fx");
    }
}
