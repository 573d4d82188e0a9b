//! `leasehold extension generate`: writes exactly the files the library
//! generates, without a database.

use crate::support::run;

#[test]
fn generate_writes_the_extension_files() {
    let dir = std::env::temp_dir().join(format!("leasehold-cli-ext-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.to_string_lossy().into_owned();
    let result = run(&["--json", "extension", "generate", "--out", &out]);
    assert_eq!(result.code, 0, "{result:?}");
    let json = result.json();
    assert_eq!(json["version"], leasehold::extension_version());
    let files = leasehold::extension_files().unwrap();
    assert_eq!(json["files"].as_array().unwrap().len(), files.len());
    for file in files {
        let written = std::fs::read_to_string(dir.join(&file.name)).unwrap();
        assert_eq!(written, file.contents, "{}", file.name);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
