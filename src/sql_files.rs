//! leasehold's SQL, compiled into the crate: the migrations under
//! `migrations/` (tables, indexes, types and data; append-only once
//! released) and the files of functions under `sql/functions/`
//! (repeatable: every function, written `CREATE OR REPLACE`, applied after
//! the migrations and again whenever their text changes). Every install
//! path applies these texts in this order: `leasehold::install`, Diesel's
//! runner through `admin::MIGRATIONS`, and the PostgreSQL extension that
//! `admin::extension_files` generates.

use sha2::{Digest, Sha256};

/// The migrations, oldest first: directory name, `up.sql`, `down.sql`. A
/// unit test checks that this list is exactly the `migrations/` directory.
pub const MIGRATION_SQL: &[(&str, &str, &str)] = &[(
    "2026-12-01-000001_tables",
    include_str!("../migrations/2026-12-01-000001_tables/up.sql"),
    include_str!("../migrations/2026-12-01-000001_tables/down.sql"),
)];

/// The files of functions, in the order they are applied (a function must
/// exist before a `LANGUAGE sql` body that calls it is created): file name
/// under `sql/functions/` and its text. A unit test checks that this list
/// is exactly that directory, in the order of the names.
pub const FUNCTION_SQL: &[(&str, &str)] = &[
    (
        "01_rules.sql",
        include_str!("../sql/functions/01_rules.sql"),
    ),
    (
        "02_leases.sql",
        include_str!("../sql/functions/02_leases.sql"),
    ),
    (
        "03_guards.sql",
        include_str!("../sql/functions/03_guards.sql"),
    ),
    (
        "04_waiting.sql",
        include_str!("../sql/functions/04_waiting.sql"),
    ),
    (
        "05_operator.sql",
        include_str!("../sql/functions/05_operator.sql"),
    ),
    (
        "06_pruning.sql",
        include_str!("../sql/functions/06_pruning.sql"),
    ),
    (
        "07_batches.sql",
        include_str!("../sql/functions/07_batches.sql"),
    ),
    (
        "08_fenced_tables.sql",
        include_str!("../sql/functions/08_fenced_tables.sql"),
    ),
];

/// Migration versions of the layout before the functions moved to
/// `sql/functions/` (one migration per concern, 000002 to 000008, holding
/// functions). A database installed then has them recorded; nothing
/// applies them any more, and the functions step replaces what they
/// created.
pub const RETIRED_VERSIONS: &[&str] = &[
    "20261201000002",
    "20261201000003",
    "20261201000004",
    "20261201000005",
    "20261201000006",
    "20261201000007",
    "20261201000008",
];

/// Removes every function of schema `lease` except the migrations' own
/// `lease._drop_default_grants`, in one statement (so functions that call
/// each other go together): what undoes the files of functions.
pub const DROP_FUNCTIONS: &str = "SET LOCAL lock_timeout = '5s';
DO $$
DECLARE
    v_list text;
BEGIN
    SELECT pg_catalog.string_agg(p.oid::pg_catalog.regprocedure::pg_catalog.text, ', ') INTO v_list
      FROM pg_catalog.pg_proc AS p
     WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace('lease')
       AND p.proname OPERATOR(pg_catalog.<>) '_drop_default_grants';
    IF v_list IS NOT NULL THEN
        EXECUTE 'DROP FUNCTION ' OPERATOR(pg_catalog.||) v_list;
    END IF;
END
$$;
";

/// The version of a migration directory `YYYY-MM-DD-NNNNNN_<what>`: its
/// digits.
pub fn version_of(dir: &str) -> String {
    dir.split('_')
        .next()
        .unwrap_or(dir)
        .chars()
        .filter(char::is_ascii_digit)
        .collect()
}

/// The newest migration's version.
pub fn last_migration_version() -> String {
    MIGRATION_SQL
        .last()
        .map(|(dir, _, _)| version_of(dir))
        .unwrap_or_default()
}

/// The version of the functions step: the newest migration's version, a
/// dot, and the first 12 hex digits of the SHA-256 of the files of
/// functions. It changes whenever a file of functions or the list of
/// migrations changes, so every install path applies the files again
/// exactly then; and it sorts after the migration it follows and before
/// the next one.
pub fn functions_version() -> String {
    let mut digest = Sha256::new();
    for (name, text) in FUNCTION_SQL {
        digest.update(name.as_bytes());
        digest.update([0]);
        digest.update(text.as_bytes());
        digest.update([0]);
    }
    let hex: String = digest
        .finalize()
        .iter()
        .take(6)
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("{}.{hex}", last_migration_version())
}

/// Whether `version` has the form of a functions step's version
/// (`<14 digits>.<12 hex digits>`).
pub fn is_functions_version(version: &str) -> bool {
    version.split_once('.').is_some_and(|(digits, hex)| {
        digits.len() == 14
            && digits.chars().all(|c| c.is_ascii_digit())
            && hex.len() == 12
            && hex.chars().all(|c| c.is_ascii_hexdigit())
    })
}

/// The statement of migration 1 that raises `constraint` (its text,
/// without the closing `;`): the checks written once there, which
/// `install` and the extension generator take from it.
pub(crate) fn migration_1_check(constraint: &str) -> Option<&'static str> {
    let needle = format!("CONSTRAINT = '{constraint}'");
    statements(MIGRATION_SQL.first()?.1)
        .into_iter()
        .map(|statement| statement.text)
        .find(|text| text.contains(&needle))
}

/// The files of functions as one script, in order.
pub fn functions_sql() -> String {
    FUNCTION_SQL.iter().map(|(_, text)| *text).collect()
}

/// One top-level statement of a migration: the text before it (comments
/// and blank lines) and the statement itself, without its `;`.
pub(crate) struct Statement<'a> {
    pub(crate) preamble: &'a str,
    pub(crate) text: &'a str,
}

/// Splits SQL into top-level statements at `;` outside comments, quoted
/// strings, quoted identifiers and dollar quotes. Text after the last `;`
/// is returned as a statement with an empty text when it holds only
/// comments and blanks.
pub(crate) fn statements(sql: &str) -> Vec<Statement<'_>> {
    let bytes = sql.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    let mut text_start: Option<usize> = None;
    let mut i = 0;
    while i < bytes.len() {
        let rest = &sql[i..];
        let c = bytes[i];
        if rest.starts_with("--") {
            i += rest.find('\n').map_or(rest.len(), |n| n + 1);
            continue;
        }
        if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |n| n + 2);
            continue;
        }
        if !c.is_ascii_whitespace() && text_start.is_none() {
            text_start = Some(i);
        }
        match c {
            b'\'' | b'"' => {
                // To the closing quote; a doubled quote stays inside.
                let mut j = i + 1;
                while j < bytes.len() {
                    if bytes[j] == c {
                        if bytes.get(j + 1) != Some(&c) {
                            break;
                        }
                        j += 1;
                    }
                    j += 1;
                }
                i = j + 1;
            }
            b'$' => {
                let tag_len = rest[1..]
                    .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                    .unwrap_or(rest.len() - 1);
                if rest.as_bytes().get(tag_len + 1) == Some(&b'$') {
                    let tag = &rest[..tag_len + 2];
                    let after = &rest[tag.len()..];
                    i += tag.len() + after.find(tag).map_or(after.len(), |n| n + tag.len());
                } else {
                    i += 1;
                }
            }
            b';' => {
                let from = text_start.unwrap_or(i);
                out.push(Statement {
                    preamble: &sql[start..from],
                    text: &sql[from..i],
                });
                i += 1;
                start = i;
                text_start = None;
            }
            _ => i += 1,
        }
    }
    if start < sql.len() {
        out.push(Statement {
            preamble: &sql[start..],
            text: "",
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(dir: &str) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(format!("{}/{dir}", env!("CARGO_MANIFEST_DIR")))
                .map(|entries| {
                    entries
                        .filter_map(Result::ok)
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
        names.sort();
        names
    }

    /// The lists compiled in are exactly the two directories, in order.
    #[test]
    fn the_lists_are_the_directories() {
        let listed: Vec<String> = MIGRATION_SQL
            .iter()
            .map(|(d, _, _)| (*d).to_owned())
            .collect();
        assert_eq!(listing("migrations"), listed);
        for (dir, up, down) in MIGRATION_SQL {
            let path = format!("{}/migrations/{dir}", env!("CARGO_MANIFEST_DIR"));
            assert_eq!(
                std::fs::read_to_string(format!("{path}/up.sql"))
                    .ok()
                    .as_deref(),
                Some(*up)
            );
            assert_eq!(
                std::fs::read_to_string(format!("{path}/down.sql"))
                    .ok()
                    .as_deref(),
                Some(*down)
            );
        }
        let listed: Vec<String> = FUNCTION_SQL.iter().map(|(f, _)| (*f).to_owned()).collect();
        assert_eq!(listing("sql/functions"), listed);
    }

    /// A file of functions creates functions only with `CREATE OR REPLACE`
    /// (so applying it again is allowed), and no migration creates one but
    /// the migrations' own tool.
    #[test]
    fn functions_live_in_the_files_of_functions_only() {
        for (name, text) in FUNCTION_SQL {
            for line in text.lines() {
                let upper = line.trim_start().to_ascii_uppercase();
                assert!(
                    !upper.starts_with("CREATE FUNCTION")
                        && !upper.starts_with("CREATE TABLE")
                        && !upper.starts_with("CREATE INDEX")
                        && !upper.starts_with("ALTER TABLE"),
                    "{name}: {line}"
                );
            }
        }
        for (dir, up, _) in MIGRATION_SQL {
            for line in up.lines() {
                let upper = line.trim_start().to_ascii_uppercase();
                if upper.starts_with("CREATE FUNCTION") || upper.starts_with("CREATE OR REPLACE") {
                    assert!(
                        line.contains("lease._drop_default_grants()"),
                        "{dir} creates a function; functions belong in sql/functions/: {line}"
                    );
                }
            }
        }
    }

    /// Migration 1 seeds the lineage with the timeline expression of
    /// `lease._timeline()`, which does not exist yet when it runs.
    #[test]
    fn the_lineage_seed_uses_the_timeline_rule() {
        let rules = FUNCTION_SQL[0].1;
        let at = rules
            .find("CREATE OR REPLACE FUNCTION lease._timeline()")
            .expect("01_rules.sql defines lease._timeline()");
        let body = &rules[at..];
        let body = &body[body.find("SELECT CASE").expect("its body")..];
        let body = &body[..body.find("\n$$;").expect("its end")];
        let body = body.trim_start_matches("SELECT ");
        assert!(
            MIGRATION_SQL[0]
                .1
                .contains(&format!("FROM (SELECT {body} AS timeline) AS t;")),
            "migration 1's lineage seed no longer computes the timeline as lease._timeline() does"
        );
    }

    #[test]
    fn the_functions_version_follows_the_last_migration() {
        let version = functions_version();
        assert!(is_functions_version(&version), "{version}");
        assert!(version.starts_with(&format!("{}.", last_migration_version())));
        assert!(version.as_str() > last_migration_version().as_str());
        assert!(!is_functions_version(&last_migration_version()));
        assert!(!is_functions_version("20261201000008"));
        assert_eq!(version_of("2026-12-01-000001_tables"), "20261201000001");
    }
}
