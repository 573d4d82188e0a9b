//! The crate's rustdoc reads on its own where users read it (docs.rs): no
//! doc comment under src/ cites a section (`§`), a guarantee or invariant
//! code (`G5`, `I16`) or "the module docs", and none that docs.rs shows
//! names a file of docs/, which a reader of the published crate cannot
//! follow. Shown: every `///`, and the `//!` of the public modules' files.
//! A private module's `//!` may name a repository file for maintainers.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::root;

/// Every `.rs` file under src/, relative to the root, sorted.
fn sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, into: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, into);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                into.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(&root().join("src"), &mut found);
    found.sort();
    found
        .into_iter()
        .map(|path| path.strip_prefix(root()).unwrap().to_path_buf())
        .collect()
}

/// The file of module `name` declared in `parent` (relative to the root):
/// beside lib.rs and mod.rs, in a directory named after the parent otherwise.
fn module_file(parent: &Path, name: &str) -> PathBuf {
    let dir = match parent.file_name().and_then(|f| f.to_str()) {
        Some("lib.rs" | "mod.rs") => parent.parent().unwrap().to_path_buf(),
        _ => parent.with_extension(""),
    };
    let flat = dir.join(format!("{name}.rs"));
    if root().join(&flat).exists() {
        flat
    } else {
        dir.join(name).join("mod.rs")
    }
}

/// The files whose `//!` docs.rs shows: src/lib.rs and, through each
/// `pub mod name;` of a shown file, the file of that module.
fn public_module_files() -> BTreeSet<PathBuf> {
    let mut shown = BTreeSet::new();
    let mut pending = vec![PathBuf::from("src/lib.rs")];
    while let Some(file) = pending.pop() {
        let text = std::fs::read_to_string(root().join(&file))
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for line in text.lines() {
            let declared = line
                .trim()
                .strip_prefix("pub mod ")
                .and_then(|rest| rest.strip_suffix(';'));
            if let Some(name) = declared {
                pending.push(module_file(&file, name.trim()));
            }
        }
        shown.insert(file);
    }
    shown
}

/// Whether `c` continues a word (as regex `\w` reads it).
fn word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The guarantee and invariant codes of `text`: `G` or `I` and digits, as
/// a word of its own (`G5`, `I16`; not `I2C`, not `SIG1`).
fn codes(text: &str) -> Vec<&str> {
    let mut found = Vec::new();
    for (at, c) in text.char_indices() {
        if !matches!(c, 'G' | 'I') || text[..at].chars().next_back().is_some_and(word) {
            continue;
        }
        let rest = &text[at + 1..];
        let digits = rest.len() - rest.trim_start_matches(|d: char| d.is_ascii_digit()).len();
        if digits > 0 && !rest[digits..].chars().next().is_some_and(word) {
            found.push(&text[at..at + 1 + digits]);
        }
    }
    found
}

/// Whether `text` names a path of the repository's docs/ (`docs/...`), not
/// a URL's or another directory's (`postgresql.org/docs/`, `tests/docs/`).
fn names_docs_path(text: &str) -> bool {
    text.match_indices("docs/").any(|(at, _)| {
        !text[..at]
            .chars()
            .next_back()
            .is_some_and(|c| word(c) || matches!(c, '/' | '.' | '-' | ':'))
    })
}

/// What keeps each doc line of `file` from reading on its own on docs.rs:
/// `file:line: why: line`. `shown` says whether docs.rs shows its `//!`.
fn unreadable_docs(file: &Path, text: &str, shown: bool) -> Vec<String> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let (doc, rendered) = if let Some(doc) = trimmed.strip_prefix("//!") {
            (doc, shown)
        } else if let Some(doc) = trimmed.strip_prefix("///").filter(|d| !d.starts_with('/')) {
            (doc, true)
        } else {
            continue;
        };
        let mut why = Vec::new();
        if doc.contains('§') {
            why.push("cites a section (§)".to_owned());
        }
        for code in codes(doc) {
            why.push(format!("cites the code {code}"));
        }
        let lower = doc.to_lowercase();
        if lower.contains("module docs") || lower.contains("module documentation") {
            why.push("points at the module docs".to_owned());
        }
        if rendered && names_docs_path(doc) {
            why.push("names a file of docs/, absent from the published crate".to_owned());
        }
        for why in why {
            found.push(format!(
                "{}:{}: {why}: {}",
                file.display(),
                number + 1,
                trimmed
            ));
        }
    }
    found
}

#[test]
fn every_doc_comment_reads_on_its_own() {
    let shown = public_module_files();
    let sources = sources();
    assert!(sources.len() > 20, "{sources:?}");
    let mut found = Vec::new();
    for file in &sources {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        found.extend(unreadable_docs(file, &text, shown.contains(file)));
    }
    assert!(
        found.is_empty(),
        "doc comments a reader of docs.rs cannot follow (say the point in the \
         sentence's own words, one short clause):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_public_modules_are_found_from_lib_rs() {
    let shown = public_module_files();
    for file in [
        "src/lib.rs",
        "src/admin/mod.rs",
        "src/aio/mod.rs",
        "src/batch/mod.rs",
        "src/error.rs",
        "src/guard/mod.rs",
        "src/hold/mod.rs",
        "src/pool.rs",
        "src/telemetry.rs",
        "src/wait/mod.rs",
    ] {
        assert!(shown.contains(Path::new(file)), "{file} in {shown:?}");
    }
    for file in &shown {
        assert!(root().join(file).exists(), "{}", file.display());
    }
    // `pub(crate) mod` is not shown.
    assert!(
        !shown.contains(Path::new("src/guard/database.rs")),
        "{shown:?}"
    );
}

#[test]
fn doc_lines_are_judged() {
    let text = "//! Pruning (docs/SPECIFICATION.md has the argument).\n\
                /// Refuses a stale epoch (G2, §2); see the module docs.\n\
                /// Compiles on I2C boards, in SIG1 and under `docs.rs/leasehold`.\n\
                /// See <https://www.postgresql.org/docs/current/> and tests/docs/main.rs.\n\
                //// A plain comment: G7 docs/x.md.\n\
                // Not a doc comment either: I16.\n\
                #[doc = \"I16\"]\n\
                    /// Admits (G1–G6), as `docs/guide/guards.md` says.\n";
    let private = unreadable_docs(Path::new("src/x.rs"), text, false);
    assert_eq!(
        private,
        [
            "src/x.rs:2: cites a section (§): /// Refuses a stale epoch (G2, §2); see the module docs.",
            "src/x.rs:2: cites the code G2: /// Refuses a stale epoch (G2, §2); see the module docs.",
            "src/x.rs:2: points at the module docs: /// Refuses a stale epoch (G2, §2); see the module docs.",
            "src/x.rs:8: cites the code G1: /// Admits (G1–G6), as `docs/guide/guards.md` says.",
            "src/x.rs:8: cites the code G6: /// Admits (G1–G6), as `docs/guide/guards.md` says.",
            "src/x.rs:8: names a file of docs/, absent from the published crate: /// Admits (G1–G6), as `docs/guide/guards.md` says.",
        ]
    );
    let public = unreadable_docs(Path::new("src/x.rs"), text, true);
    assert_eq!(
        public[0],
        "src/x.rs:1: names a file of docs/, absent from the published crate: \
         //! Pruning (docs/SPECIFICATION.md has the argument)."
    );
    assert_eq!(public.len(), private.len() + 1);
}
