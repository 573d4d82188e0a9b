//! The repository's own documents: every relative link in README.md and
//! docs/**/*.md names a file that exists and, with `#anchor` into a
//! markdown file, a heading of that file (GitHub's anchors: the heading's
//! text lowercased, spaces to hyphens, punctuation other than hyphens and
//! underscores removed, `-1`, `-2`, ... for repeats); the library's doc
//! comments read on their own (`rustdoc`); its files form layers with no
//! circle (`layers`); and the sync and async faces offer the same methods
//! (`faces`). Needs no server.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

mod faces;
mod layers;
mod rustdoc;

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every `.md` under docs/, relative to the root, sorted.
fn documents() -> Vec<PathBuf> {
    fn walk(dir: &Path, into: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, into);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                into.push(path);
            }
        }
    }
    let mut found = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut found);
    found.sort();
    found
        .into_iter()
        .map(|path| path.strip_prefix(root()).unwrap().to_path_buf())
        .collect()
}

/// The lines of a markdown text, `None` for those of fenced code blocks
/// (fences included).
fn outside_fences(text: &str) -> Vec<Option<&str>> {
    let mut fence: Option<&str> = None;
    text.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            let marker = ["```", "~~~"]
                .into_iter()
                .find(|marker| trimmed.starts_with(marker));
            match (fence, marker) {
                (None, Some(marker)) => {
                    fence = Some(marker);
                    None
                }
                (Some(open), Some(marker)) if open == marker => {
                    fence = None;
                    None
                }
                (Some(_), _) => None,
                (None, None) => Some(line),
            }
        })
        .collect()
}

/// The lines of a markdown text with code left out: fenced blocks become
/// empty lines (so line numbers stay) and inline code spans vanish.
fn prose_lines(text: &str) -> Vec<String> {
    outside_fences(text)
        .into_iter()
        .map(|line| line.map(without_code_spans).unwrap_or_default())
        .collect()
}

/// `line` without its inline code spans (`like this`).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        let ticks = rest[start..].len() - rest[start..].trim_start_matches('`').len();
        let delimiter = &rest[start..start + ticks];
        out.push_str(&rest[..start]);
        let after = &rest[start + ticks..];
        match after.find(delimiter) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The link targets of one line: inline links and images `[text](target)`
/// and reference definitions `[label]: target`.
fn targets(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let inner = after.split(')').next().unwrap_or("").trim();
        let inner = inner.strip_prefix('<').unwrap_or(inner);
        let target = inner.split([' ', '>']).next().unwrap_or("");
        if !target.is_empty() {
            found.push(target.to_owned());
        }
        rest = after;
    }
    let trimmed = line.trim_start();
    if let Some(definition) = trimmed.strip_prefix('[') {
        if let Some((_, target)) = definition.split_once("]:") {
            if let Some(target) = target.split_whitespace().next() {
                found.push(target.to_owned());
            }
        }
    }
    found
}

/// GitHub's anchor for a heading's text.
fn slug(heading: &str) -> String {
    // A link in a heading contributes its text only.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after
            .find("](")
            .and_then(|close| after[close..].find(')').map(|end| (close, close + end + 1)))
        {
            Some((close, end)) => {
                text.push_str(&after[..close]);
                rest = &after[end..];
            }
            None => {
                text.push('[');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown text's ATX headings (`#` to `######`).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let mut anchors = BTreeSet::new();
    for line in outside_fences(text).into_iter().flatten() {
        let hashes = line.len() - line.trim_start_matches('#').len();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with([' ', '\t']) {
            continue;
        }
        let title = line[hashes..].trim().trim_end_matches('#').trim_end();
        let base = slug(title);
        let count = seen.entry(base.clone()).or_insert(0);
        anchors.insert(if *count == 0 {
            base
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    anchors
}

/// `path` with `.` and `..` resolved lexically (None if it climbs out of
/// the repository).
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            other => out.push(other),
        }
    }
    Some(out)
}

/// Every broken relative link of `document` (relative to the root):
/// `file:line: target: why`.
fn broken_links(document: &Path, text: &str) -> Vec<String> {
    let mut broken = Vec::new();
    for (number, line) in prose_lines(text).iter().enumerate() {
        for target in targets(line) {
            let scheme = target.split_once(':').is_some_and(|(scheme, _)| {
                !scheme.is_empty()
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
            });
            if scheme || target.starts_with("//") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let at = format!("{}:{}: {target}", document.display(), number + 1);
            let linked = if file.is_empty() {
                Some(document.to_path_buf())
            } else if let Some(absolute) = file.strip_prefix('/') {
                normalize(Path::new(absolute))
            } else {
                normalize(&document.parent().unwrap_or(Path::new("")).join(file))
            };
            let Some(linked) = linked else {
                broken.push(format!("{at}: leaves the repository"));
                continue;
            };
            let on_disk = root().join(&linked);
            if !on_disk.exists() {
                broken.push(format!("{at}: no file {}", linked.display()));
                continue;
            }
            if let Some(anchor) = anchor.filter(|_| linked.extension().is_some_and(|e| e == "md")) {
                let headings = if linked == document {
                    anchors(text)
                } else {
                    anchors(&std::fs::read_to_string(&on_disk).unwrap())
                };
                if !headings.contains(anchor) {
                    broken.push(format!(
                        "{at}: no heading #{anchor} in {}",
                        linked.display()
                    ));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let documents = documents();
    assert!(documents.len() > 10, "{documents:?}");
    let mut broken = Vec::new();
    for document in &documents {
        let text = std::fs::read_to_string(root().join(document)).unwrap();
        broken.extend(broken_links(document, &text));
    }
    assert!(
        broken.is_empty(),
        "broken links (paths are relative to the linking file's directory; \
         anchors follow GitHub's heading slugs):\n{}",
        broken.join("\n")
    );
}

#[test]
fn anchors_follow_github_slugs() {
    let text = "# Getting started\n\
                ## `leasehold run`: jobs, cron & CI\n\
                ```sh\n# not a heading\n```\n\
                ### Getting started\n\
                #### A [linked](x.md) heading — with_underscores ###\n\
                #no-space\n";
    let found: Vec<String> = anchors(text).into_iter().collect();
    assert_eq!(
        found,
        [
            "a-linked-heading--with_underscores",
            "getting-started",
            "getting-started-1",
            "leasehold-run-jobs-cron--ci",
        ]
    );
}

#[test]
fn links_are_found_outside_code_and_judged() {
    let text = "See [a](README.md), [b](nowhere.md) and `[c](code.md)`.\n\
                ```\n[d](fenced.md)\n```\n\
                [e](https://example.invalid/x) [f](#top) [g](#missing)\n\
                [h]: docs/guide/operations.md#command-line-leasehold\n\
                # Top\n";
    let broken = broken_links(Path::new("README.md"), text);
    assert_eq!(
        broken,
        [
            "README.md:1: nowhere.md: no file nowhere.md",
            "README.md:5: #missing: no heading #missing in README.md",
        ]
    );
}
