//! The library's files form layers: no file of `src/` reaches another that
//! reaches it back, directly or around a circle, and none reaches a file
//! on a higher line of docs/ARCHITECTURE.md's table of layers. Every
//! `crate::` path counts, those in doc comments included, since a doc that
//! links upward is a dependency a reader follows too. Needs no server.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `src/`, keyed by its module path (`lib.rs` is the empty path).
fn modules() -> BTreeMap<Vec<String>, PathBuf> {
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
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    files
        .into_iter()
        .map(|file| {
            let relative = file.strip_prefix(&src).unwrap().with_extension("");
            let mut path: Vec<String> = relative
                .components()
                .map(|part| part.as_os_str().to_string_lossy().into_owned())
                .collect();
            if path
                .last()
                .is_some_and(|last| last == "mod" || last == "lib")
            {
                path.pop();
            }
            (path, file)
        })
        .collect()
}

/// The crate root's re-exports (`pub use a::b::{C, D};` in lib.rs): each
/// name with the path it stands for, so a `crate::C` reaches `a/b.rs`.
fn root_exports() -> BTreeMap<String, Vec<String>> {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs");
    let text = std::fs::read_to_string(lib).unwrap();
    let mut exports = BTreeMap::new();
    for line in text.lines() {
        let Some(path) = line
            .strip_prefix("pub use ")
            .and_then(|rest| rest.strip_suffix(';'))
        else {
            continue;
        };
        let (base, names) = match path.split_once("::{") {
            Some((base, names)) => (base, names.trim_end_matches('}')),
            None => path.rsplit_once("::").unwrap_or(("", path)),
        };
        let base: Vec<String> = base.split("::").map(str::to_owned).collect();
        for name in names.split(',').map(str::trim) {
            exports.insert(name.to_owned(), base.clone());
        }
    }
    exports
}

/// The module file a `crate::` path lands in: its longest prefix that is a
/// file, a root re-export followed to where it is defined.
fn target<'m>(
    modules: &'m BTreeMap<Vec<String>, PathBuf>,
    exports: &BTreeMap<String, Vec<String>>,
    segments: &[String],
) -> Option<&'m PathBuf> {
    if let Some(base) = segments.first().and_then(|first| exports.get(first)) {
        return target(modules, &BTreeMap::new(), base);
    }
    let names: Vec<String> = segments
        .iter()
        .take_while(|segment| segment.starts_with(|c: char| c.is_ascii_lowercase() || c == '_'))
        .cloned()
        .collect();
    (1..=names.len())
        .rev()
        .find_map(|length| modules.get(&names[..length]))
}

/// The `crate::` paths of `text` (outside its unit tests), braces expanded one level.
fn crate_paths(text: &str) -> Vec<Vec<String>> {
    let text = text
        .find("#[cfg(test)]\nmod tests")
        .map_or(text, |end| &text[..end]);
    let mut paths = Vec::new();
    for (start, _) in text.match_indices("crate::") {
        let rest = &text[start + "crate::".len()..];
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':' || c == '{'))
            .unwrap_or(rest.len());
        let head = &rest[..end];
        match head.split_once('{') {
            Some((base, _)) => {
                let group_end = rest.find('}').unwrap_or(rest.len());
                let base: Vec<String> = base
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect();
                for item in rest[base_len(&rest[..group_end])..group_end].split(',') {
                    let mut path = base.clone();
                    path.extend(
                        item.trim()
                            .split("::")
                            .filter(|s| !s.is_empty())
                            .map(str::to_owned),
                    );
                    paths.push(path);
                }
            }
            None => paths.push(
                head.split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
            ),
        }
    }
    paths
}

/// Where the items of a brace group begin: just after its `{`.
fn base_len(group: &str) -> usize {
    group.find('{').map_or(group.len(), |brace| brace + 1)
}

#[test]
fn no_file_of_the_library_reaches_itself_around_a_circle() {
    let modules = modules();
    let exports = root_exports();
    let mut edges: BTreeMap<&PathBuf, BTreeSet<&PathBuf>> = BTreeMap::new();
    for file in modules.values() {
        let text = std::fs::read_to_string(file).unwrap();
        let reached = edges.entry(file).or_default();
        for path in crate_paths(&text) {
            if let Some(to) = target(&modules, &exports, &path).filter(|to| *to != file) {
                reached.insert(to);
            }
        }
    }
    // A file is on a circle when it reaches itself; name each circle by one path around it.
    let mut circles = BTreeSet::new();
    for start in edges.keys() {
        let mut parent: BTreeMap<&PathBuf, &PathBuf> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([*start]);
        while let Some(at) = queue.pop_front() {
            for next in &edges[at] {
                if next == start {
                    let mut circle = vec![at];
                    let mut back = at;
                    while let Some(previous) = parent.get(back) {
                        circle.push(previous);
                        back = previous;
                    }
                    let mut names: Vec<String> = circle
                        .iter()
                        .map(|file| {
                            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
                            file.strip_prefix(&src).unwrap().display().to_string()
                        })
                        .collect();
                    names.sort();
                    circles.insert(names.join(" <-> "));
                    queue.clear();
                    break;
                }
                if !parent.contains_key(next) && next != start {
                    parent.insert(next, at);
                    queue.push_back(next);
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "files of src/ that reach each other through crate:: paths: {circles:#?}"
    );
}

/// Each file of `src/` with its line in docs/ARCHITECTURE.md's table of
/// layers (`| N | modules | job |`). In the modules cell, `dir/` followed by
/// `(a, b/)` places `dir/a.rs` and every file under `dir/b/`; `dir/` alone
/// places the whole directory; `x.rs` or `x/y.rs` a file; `name` the file
/// `name.rs`. `lib.rs` stands above every line.
fn layers(modules: &BTreeMap<Vec<String>, PathBuf>) -> BTreeMap<PathBuf, usize> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let table =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ARCHITECTURE.md"))
            .unwrap();
    let files: BTreeSet<&PathBuf> = modules.values().collect();
    let under = |prefix: &Path| -> Vec<PathBuf> {
        files
            .iter()
            .filter(|file| file.starts_with(prefix))
            .map(|file| (*file).clone())
            .collect()
    };
    let mut placed: BTreeMap<PathBuf, usize> = BTreeMap::new();
    let mut place = |files: Vec<PathBuf>, line: usize, token: &str| {
        assert!(
            !files.is_empty(),
            "layer {line}: `{token}` names no file of src/"
        );
        for file in files {
            if let Some(other) = placed.insert(file.clone(), line) {
                assert_eq!(other, line, "{} is placed on two lines", file.display());
            }
        }
    };
    for row in table.lines() {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(line) = cells.get(1).and_then(|cell| cell.parse::<usize>().ok()) else {
            continue;
        };
        let cell = cells[2];
        let mut directory: Option<PathBuf> = None;
        let mut in_group = false;
        let mut rest = cell;
        while let Some(start) = rest.find(['`', '(', ')']) {
            match rest.as_bytes()[start] {
                b'(' => in_group = true,
                b')' => {
                    in_group = false;
                    directory = None;
                }
                _ => {
                    let end = start + 1 + rest[start + 1..].find('`').unwrap();
                    let token = &rest[start + 1..end];
                    rest = &rest[end + 1..];
                    match (&directory, in_group) {
                        (Some(dir), true) if token.ends_with('/') => {
                            place(under(&dir.join(token)), line, token)
                        }
                        (Some(dir), true) => {
                            place(vec![dir.join(format!("{token}.rs"))], line, token)
                        }
                        _ if token.ends_with('/') => {
                            // A directory: listed members follow, or it is whole.
                            let dir = src.join(token);
                            if !rest.trim_start().starts_with('(') {
                                place(under(&dir), line, token);
                            }
                            directory = Some(dir);
                        }
                        _ if token.ends_with(".rs") => place(vec![src.join(token)], line, token),
                        _ => place(vec![src.join(format!("{token}.rs"))], line, token),
                    }
                    continue;
                }
            }
            rest = &rest[start + 1..];
        }
    }
    placed.insert(src.join("lib.rs"), usize::MAX);
    let unplaced: Vec<&PathBuf> = files
        .iter()
        .copied()
        .filter(|file| !placed.contains_key(*file))
        .collect();
    assert!(
        unplaced.is_empty(),
        "files of src/ on no line of the table of layers: {unplaced:#?}"
    );
    placed
}

#[test]
fn no_file_reaches_a_higher_layer() {
    let modules = modules();
    let exports = root_exports();
    let layers = layers(&modules);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut upward = BTreeSet::new();
    for file in modules.values() {
        let text = std::fs::read_to_string(file).unwrap();
        for path in crate_paths(&text) {
            if let Some(to) = target(&modules, &exports, &path).filter(|to| *to != file) {
                if layers[to] > layers[file] {
                    upward.insert(format!(
                        "{} (layer {}) -> {} (layer {}) by crate::{}",
                        file.strip_prefix(&src).unwrap().display(),
                        layers[file],
                        to.strip_prefix(&src).unwrap().display(),
                        layers[to],
                        path.join("::")
                    ));
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "paths that run up the table of layers: {upward:#?}"
    );
}
