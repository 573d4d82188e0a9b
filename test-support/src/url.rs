//! Connection URLs of an external server (`DATABASE_URL`).

/// Replaces the database name in a `postgres://` URL, keeping the user,
/// host, port and query parameters: the URL of a sibling database on the
/// same server.
pub fn url_with_database(url: &str, database: &str) -> String {
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
    fn replaces_only_the_database() {
        assert_eq!(
            url_with_database("postgres://u:p@h:5432/app?sslmode=disable", "t1"),
            "postgres://u:p@h:5432/t1?sslmode=disable"
        );
        assert_eq!(url_with_database("postgres://h", "t2"), "postgres://h/t2");
    }
}
