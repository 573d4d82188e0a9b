//! `leasehold extension generate`: writes the extension files without a
//! database, and they are exactly the files committed under `extension/`.

use std::path::Path;

use crate::support::run;

/// The files of a directory, sorted by name.
fn files_of(dir: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("read {}: {error}", dir.display()))
        .map(|entry| {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(entry.path()).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn generate_writes_exactly_the_committed_extension_files() {
    let dir = std::env::temp_dir().join(format!("leasehold-cli-ext-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.to_string_lossy().into_owned();
    let result = run(&["--json", "extension", "generate", "--out", &out]);
    assert_eq!(result.code, 0, "{result:?}");
    let json = result.json();
    assert_eq!(json["version"], crate::support::newest_migration_version());
    let generated = files_of(&dir);
    let names: Vec<&str> = generated.iter().map(|(name, _)| name.as_str()).collect();
    let mut listed: Vec<&str> = json["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| name.as_str().unwrap())
        .collect();
    listed.sort_unstable();
    assert_eq!(listed, names);
    let committed = files_of(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../extension"));
    assert!(
        committed == generated,
        "extension/ differs from what the generator produces; regenerate it with \
         `cargo run -p leasehold-cli -- extension generate --out extension` (never edit the files by hand)"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
