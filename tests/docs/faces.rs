//! The two faces offer the same capabilities: every public method of a sync
//! type has a method of the same name on its async twin and back, unless it
//! is listed below with the reason. Methods are read from the `impl` blocks
//! of each face's file, and from the `macro_rules!` those blocks invoke.
//! Needs no server.

use std::collections::BTreeSet;
use std::path::Path;

/// Each twin: the sync face's file and type, the async face's file and type.
const TWINS: &[(&str, &str, &str, &str)] = &[
    (
        "client.rs",
        "LeaseClient",
        "aio/client.rs",
        "AsyncLeaseClient",
    ),
    (
        "client.rs",
        "LeaseClientBuilder",
        "aio/client.rs",
        "AsyncLeaseClientBuilder",
    ),
    (
        "hold/election.rs",
        "Election",
        "aio/election.rs",
        "Election",
    ),
    (
        "hold/election.rs",
        "Leadership",
        "aio/election.rs",
        "Leadership",
    ),
    (
        "hold/election.rs",
        "LeaderWatch",
        "aio/election.rs",
        "LeaderWatch",
    ),
    ("hold/keeper.rs", "Keeper", "aio/keeper.rs", "Keeper"),
    (
        "hold/keeper.rs",
        "KeeperBuilder",
        "aio/keeper.rs",
        "KeeperBuilder",
    ),
    (
        "hold/keeper_set.rs",
        "KeeperSet",
        "aio/keeper_set.rs",
        "KeeperSet",
    ),
    (
        "hold/keeper_set.rs",
        "KeeperSetBuilder",
        "aio/keeper_set.rs",
        "KeeperSetBuilder",
    ),
    (
        "hold/worker.rs",
        "WorkContext<'_>",
        "aio/worker.rs",
        "WorkContext",
    ),
    ("wait/mod.rs", "LeaseWaiter", "aio/waiter.rs", "LeaseWaiter"),
    (
        "wait/mod.rs",
        "LeaseWaiterBuilder",
        "aio/waiter.rs",
        "LeaseWaiterBuilder",
    ),
    (
        "wait/releases.rs",
        "ReleaseWatch",
        "aio/releases.rs",
        "ReleaseWatch",
    ),
];

/// Methods one face has and the other has not, with why: (type, method, reason).
const ONE_FACE_ONLY: &[(&str, &str, &str)] = &[
    (
        "Keeper",
        "lost",
        "a future to select! beside the work; the sync face blocks in wait_for_loss",
    ),
    (
        "Leadership",
        "lost",
        "a future to select! beside the work; the sync face blocks in wait_for_loss",
    ),
    (
        "KeeperSet",
        "lost",
        "a future to select! beside the work; the sync face blocks in wait_for_loss",
    ),
    (
        "KeeperSet",
        "losses_after",
        "a future to select! beside the work; the sync face blocks in wait_for_losses",
    ),
    (
        "WorkContext",
        "stopped",
        "a future to select! in a waiting step; sync work polls should_stop or check",
    ),
];

fn source(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text between the `{` at `open` and its matching `}`.
fn block(text: &str, open: usize) -> &str {
    let mut depth = 0;
    for (at, c) in text[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &text[open + 1..open + at];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced braces")
}

/// The names of the `pub fn`s (and `pub async fn`s) written at the top level of `body`.
fn public_fns(body: &str, indent: &str) -> BTreeSet<String> {
    body.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(indent)?;
            let rest = rest
                .strip_prefix("pub async fn ")
                .or_else(|| rest.strip_prefix("pub fn "))?;
            Some(rest.split(['(', '<']).next()?.to_owned())
        })
        .collect()
}

/// The public methods a `macro_rules! name` defined anywhere under src/ writes.
fn macro_fns(name: &str) -> BTreeSet<String> {
    for file in [
        "hold/election.rs",
        "hold/keeper.rs",
        "hold/keeper_set.rs",
        "wait/mod.rs",
    ] {
        let text = source(file);
        if let Some(at) = text.find(&format!("macro_rules! {name} {{")) {
            let open = at + text[at..].find('{').unwrap();
            return public_fns(block(&text, open), "        ");
        }
    }
    panic!("macro {name} not found")
}

/// The public methods of `ty` in `file`: its `impl ty {` blocks and their macros.
fn methods(file: &str, ty: &str) -> BTreeSet<String> {
    let text = source(file);
    let header = format!("\nimpl {ty} {{");
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices(&header) {
        let body = block(&text, at + header.len() - 1);
        found.extend(public_fns(body, "    "));
        for line in body.lines() {
            if let Some(name) = line
                .strip_prefix("    ")
                .and_then(|rest| {
                    rest.strip_suffix("!();")
                        .or_else(|| rest.split_once("!(").map(|(name, _)| name))
                })
                .filter(|name| name.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            {
                found.extend(macro_fns(name));
            }
        }
    }
    assert!(
        !found.is_empty(),
        "no public methods of {ty} found in {file}"
    );
    found
}

#[test]
fn both_faces_offer_the_same_methods() {
    let mut unexplained = Vec::new();
    for &(sync_file, sync_type, async_file, async_type) in TWINS {
        let sync = methods(sync_file, sync_type);
        let tasks = methods(async_file, async_type);
        let name = async_type;
        for (face, only) in [
            ("sync", sync.difference(&tasks)),
            ("async", tasks.difference(&sync)),
        ] {
            for method in only {
                let listed = ONE_FACE_ONLY
                    .iter()
                    .any(|&(ty, listed, _)| ty == name && listed == method);
                if !listed {
                    unexplained.push(format!("{name}::{method} is on the {face} face only"));
                }
            }
        }
    }
    assert!(
        unexplained.is_empty(),
        "methods on one face only, without a listed reason: {unexplained:#?}"
    );
}

#[test]
fn every_listed_exception_still_exists() {
    for &(ty, method, _) in ONE_FACE_ONLY {
        let twin = TWINS
            .iter()
            .find(|twin| twin.3 == ty)
            .unwrap_or_else(|| panic!("{ty} is not a twin"));
        let on_either =
            methods(twin.0, twin.1).contains(method) || methods(twin.2, twin.3).contains(method);
        assert!(
            on_either,
            "{ty}::{method} is listed but exists on neither face"
        );
    }
}
