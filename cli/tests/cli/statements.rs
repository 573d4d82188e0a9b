//! Every statement the command sends lives in the library's SQL module
//! (`src/sql/`), reached through library calls, so that the command and the
//! library cannot disagree about a rule (a key's liveness, the waiters'
//! protocol). Two exceptions: `doctor` asks the catalog questions of its
//! own, and the demo writes its own application's table.

use std::path::{Path, PathBuf};

/// Calls that send SQL text of the caller's own.
const SENDS_SQL: [&str; 3] = ["sql_query(", "batch_execute(", "execute("];

/// The files under `dir`, recursively, but for `doctor*` and `demo*`
/// (files and directories).
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("doctor") || name.starts_with("demo") {
            continue;
        }
        if path.is_dir() {
            sources(&path, found);
        } else if name.ends_with(".rs") {
            found.push(path);
        }
    }
}

/// The places in `text` that send SQL, as `line: text` (comments skipped:
/// the documentation may name these calls).
fn sends(text: &str) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .filter(|(_, line)| SENDS_SQL.iter().any(|call| line.contains(call)))
        .map(|(at, line)| format!("{}: {}", at + 1, line.trim()))
        .collect()
}

#[test]
fn no_command_but_doctor_and_demo_sends_sql_of_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("listing.rs"))
            && files.iter().any(|f| f.ends_with("events.rs")),
        "the walk missed the command's sources: {files:?}"
    );
    let offenders: Vec<String> = files
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            sends(&text)
                .into_iter()
                .map(move |place| format!("{}:{place}", file.display()))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "statements outside the library's SQL module (add a library call instead):\n{}",
        offenders.join("\n")
    );
}

/// The check itself finds each kind of call, and skips comments.
#[test]
fn the_check_finds_every_way_of_sending_sql() {
    let found = sends(
        "let a = diesel::sql_query(\"SELECT 1\");\n\
         conn.batch_execute(\"LISTEN x\")?;\n\
         // conn.batch_execute(\"in a comment\")\n\
         diesel::sql_query(TEXT).execute(conn)?;\n\
         let b = conn.list_leases(&filter)?;",
    );
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(
        found[0].starts_with("1: ") && found[1].starts_with("2: ") && found[2].starts_with("4: ")
    );
}
