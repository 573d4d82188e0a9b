//! leasehold's SQL as compiled into the crate: the migrations, then the files of
//! functions (every install path applies both, in that order), and the
//! installer's and the extension generator's own statements (`sql/install/`,
//! `sql/extension/`), so that no statement beyond one line is written in Rust.

use sha2::{Digest, Sha256};

/// The migrations, oldest first: directory name, `up.sql`, `down.sql`. A
/// unit test checks that this list is exactly the `migrations/` directory.
pub const MIGRATION_SQL: &[(&str, &str, &str)] = &[(
    "2026-12-01-000001_tables",
    include_str!("../migrations/2026-12-01-000001_tables/up.sql"),
    include_str!("../migrations/2026-12-01-000001_tables/down.sql"),
)];

/// `(name, text)` of each named file of `sql/functions/`.
macro_rules! function_files {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../sql/functions/", $name)))),*]
    };
}

/// The files of functions, in the order they are applied (a function must
/// exist before a `LANGUAGE sql` body that calls it is created): file name
/// under `sql/functions/` and its text. A unit test checks that this list
/// is exactly that directory, in the order of the names.
pub const FUNCTION_SQL: &[(&str, &str)] = function_files! {
    "01_rules.sql", "02_leases.sql", "03_guards.sql", "04_waiting.sql",
    "05_operator.sql", "06_pruning.sql", "07_batches.sql", "08_fenced_tables.sql",
};

/// Migration 1, which holds the server-version and schema-owner checks.
pub(crate) const MIGRATION_1: &str = MIGRATION_SQL[0].1;
/// The installer's checks beyond migration 1's, picked by [`check`].
pub(crate) const INSTALL_CHECKS: &str = include_str!("../sql/install/checks.sql");
/// The installer's bookkeeping table.
pub(crate) const BOOKKEEPING: &str = include_str!("../sql/install/bookkeeping.sql");
/// What undoes the files of functions: the functions step's `down`.
pub(crate) const DROP_FUNCTIONS: &str = include_str!("../sql/install/drop_functions.sql");
/// The extension's control file, `@VERSION@` standing for its version.
pub(crate) const EXTENSION_CONTROL: &str = include_str!("../sql/extension/leasehold.control");
/// The extension's refusals beyond migration 1's, picked by [`check`].
pub(crate) const EXTENSION_CHECKS: &str = include_str!("../sql/extension/checks.sql");
/// What ends every extension script: dump marks, the lineage-restore trigger,
/// the owner part and the hand-over to the owner.
pub(crate) const EXTENSION_END: &str = include_str!("../sql/extension/end.sql");

/// The version of a migration directory `YYYY-MM-DD-NNNNNN_<what>`: its digits.
pub fn version_of(dir: &str) -> String {
    let stem = dir.split('_').next().unwrap_or(dir);
    stem.chars().filter(char::is_ascii_digit).collect()
}

/// The version of the functions step: the newest migration's version, a dot
/// and the first 12 hex digits of the SHA-256 of the files of functions, so
/// every install path applies the files again exactly when they change.
pub fn functions_version() -> String {
    let mut digest = Sha256::new();
    for part in FUNCTION_SQL.iter().flat_map(|(name, text)| [name, text]) {
        digest.update(part.as_bytes());
        digest.update([0]);
    }
    let hex: String = digest.finalize()[..6]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let last = MIGRATION_SQL.last().map(|(dir, _, _)| version_of(dir));
    format!("{}.{hex}", last.unwrap_or_default())
}

/// The files of functions as one script, in order.
pub fn functions_sql() -> String {
    FUNCTION_SQL.iter().map(|(_, text)| *text).collect()
}

/// The statement of `sql` that raises `constraint` (without its `;`): how
/// the installer and the generator take a check written once in SQL.
pub(crate) fn check(sql: &'static str, constraint: &str) -> Option<&'static str> {
    let needle = format!("CONSTRAINT = '{constraint}'");
    statements(sql)
        .into_iter()
        .map(|statement| statement.text)
        .find(|text| text.contains(&needle))
}

/// One top-level statement: the text before it (comments and blank lines)
/// and the statement itself, without its `;`.
pub(crate) struct Statement<'a> {
    pub(crate) preamble: &'a str,
    pub(crate) text: &'a str,
}

/// Splits SQL into top-level statements at `;` outside comments, quoted
/// strings, quoted identifiers and dollar quotes. Text after the last `;`
/// is returned as a statement with an empty text.
pub(crate) fn statements(sql: &str) -> Vec<Statement<'_>> {
    let mut out = Vec::new();
    let (mut start, mut text_start, mut i) = (0, None, 0);
    while let Some(rest) = sql.get(i..).filter(|rest| !rest.is_empty()) {
        let comment = rest.starts_with("--") || rest.starts_with("/*");
        if !comment && !rest.starts_with(|c: char| c.is_ascii_whitespace()) {
            text_start = text_start.or(Some(i));
        }
        if rest.starts_with(';') {
            let from = text_start.take().unwrap_or(i);
            let (preamble, text) = (&sql[start..from], &sql[from..i]);
            out.push(Statement { preamble, text });
            start = i + 1;
        }
        i += token_len(rest);
    }
    if start < sql.len() {
        out.push(Statement {
            preamble: &sql[start..],
            text: "",
        });
    }
    out
}

/// The length of what `rest` starts with: a comment, a quoted string or
/// identifier (a doubled quote stays inside), a dollar quote, or one character.
fn token_len(rest: &str) -> usize {
    let end = |close: &str, from: usize| {
        rest[from..]
            .find(close)
            .map_or(rest.len(), |n| from + n + close.len())
    };
    if rest.starts_with("--") {
        return end("\n", 2);
    }
    if rest.starts_with("/*") {
        return end("*/", 2);
    }
    if let Some(quote) = ["'", "\""]
        .into_iter()
        .find(|quote| rest.starts_with(quote))
    {
        let mut len = end(quote, 1);
        while rest[len..].starts_with(quote) {
            len = end(quote, len + 1);
        }
        return len;
    }
    let tag = rest
        .strip_prefix('$')
        .map(|after| after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')));
    if let Some(tag_end) = tag
        .flatten()
        .map(|n| n + 1)
        .filter(|n| rest[*n..].starts_with('$'))
    {
        return end(&rest[..=tag_end], tag_end + 1);
    }
    rest.chars().next().map_or(1, char::len_utf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(dir: &str) -> Vec<String> {
        let entries = std::fs::read_dir(format!("{}/{dir}", env!("CARGO_MANIFEST_DIR")));
        let names = entries.expect(dir).map(|e| e.expect(dir).file_name());
        let mut names: Vec<String> = names.map(|n| n.to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    /// The files compiled in are exactly those of the directories, in order.
    #[test]
    fn the_lists_are_the_directories() {
        let migrations: Vec<&str> = MIGRATION_SQL.iter().map(|(dir, _, _)| *dir).collect();
        assert_eq!(listing("migrations"), migrations);
        let functions: Vec<&str> = FUNCTION_SQL.iter().map(|(file, _)| *file).collect();
        assert_eq!(listing("sql/functions"), functions);
        let install = ["bookkeeping.sql", "checks.sql", "drop_functions.sql"];
        assert_eq!(listing("sql/install"), install);
        let extension = ["checks.sql", "end.sql", "leasehold.control"];
        assert_eq!(listing("sql/extension"), extension);
    }

    #[test]
    fn the_functions_version_follows_the_last_migration() {
        let version = functions_version();
        let (digits, hex) = version.split_once('.').expect("a dot");
        assert_eq!(
            MIGRATION_SQL.last().map(|m| version_of(m.0)),
            Some(digits.into())
        );
        assert!(hex.len() == 12 && hex.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn statements_split_outside_quotes_and_comments() {
        let sql = "-- a; comment\nSELECT 'x;y', \"a;b\";\nDO $$ BEGIN PERFORM 1; END $$;\n/* c; */ CREATE TABLE t (a int);\n-- tail";
        let texts: Vec<&str> = statements(sql).iter().map(|s| s.text).collect();
        let expected = [
            "SELECT 'x;y', \"a;b\"",
            "DO $$ BEGIN PERFORM 1; END $$",
            "CREATE TABLE t (a int)",
            "",
        ];
        assert_eq!(texts, expected);
    }
}
