//! `leasehold extension generate`: writes the extension files without a
//! database, and they are exactly the files the library generates.
//! `leasehold extension install`: writes the same files into the extension
//! directory a (here: fake) `pg_config` names, or prints the command that
//! does, and refuses with a typed error where it cannot write.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::support::{command, run, Run, BIN};

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
fn generate_writes_exactly_the_files_the_library_generates() {
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
    let mut expected: Vec<(String, String)> = leasehold::admin::extension_files()
        .unwrap()
        .into_iter()
        .map(|file| (file.name, file.contents))
        .collect();
    expected.sort();
    assert!(
        expected == generated,
        "the command wrote other files than the library generates"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A scratch directory of one test, emptied first.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leasehold-cli-ext-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A `pg_config` in `bin` that answers `--sharedir` with `sharedir` (and
/// fails on anything else, as the command asks for nothing else).
fn fake_pg_config(bin: &Path, sharedir: &Path) -> PathBuf {
    std::fs::create_dir_all(bin).unwrap();
    let path = bin.join("pg_config");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n[ \"$1\" = --sharedir ] || exit 1\necho '{}'\n",
            sharedir.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The files `extension generate` writes, generated afresh.
fn generated(scratch: &Path) -> Vec<(String, String)> {
    let dir = scratch.join("generated");
    let out = dir.to_string_lossy().into_owned();
    let result = run(&["extension", "generate", "--out", &out]);
    assert_eq!(result.code, 0, "{result:?}");
    files_of(&dir)
}

/// Runs the binary with `bin` first on PATH.
fn run_with_path(bin: &Path, args: &[&str]) -> Run {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![bin.to_path_buf()];
    dirs.extend(std::env::split_paths(&path));
    let mut child = command(args);
    child.env("PATH", std::env::join_paths(dirs).unwrap());
    let output = child.output().unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[test]
fn install_writes_exactly_the_generated_files_into_the_sharedir_of_pg_config_on_path() {
    let tmp = scratch("install");
    let share = tmp.join("share");
    fake_pg_config(&tmp.join("bin"), &share);
    let result = run_with_path(&tmp.join("bin"), &["extension", "install"]);
    assert_eq!(result.code, 0, "{result:?}");
    let dir = share.join("extension");
    assert!(
        result.stdout.contains(&format!("into {}", dir.display())),
        "{result:?}"
    );
    assert!(
        result.stdout.contains("CREATE EXTENSION leasehold"),
        "{result:?}"
    );
    let installed = files_of(&dir);
    assert!(!installed.is_empty());
    assert!(
        installed == generated(&tmp),
        "install wrote other files than generate"
    );
    // Nothing beside the extension directory.
    assert_eq!(std::fs::read_dir(&share).unwrap().count(), 1);
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn install_print_prints_a_command_that_writes_the_files_and_writes_nothing() {
    let tmp = scratch("print");
    let share = tmp.join("share");
    let pg_config = fake_pg_config(&tmp.join("bin"), &share);
    let pg_config = pg_config.to_string_lossy().into_owned();
    let dir = share.join("extension");
    let result = run(&["extension", "install", "--pg-config", &pg_config, "--print"]);
    assert_eq!(result.code, 0, "{result:?}");
    let printed = result.stdout.trim_end();
    assert_eq!(
        printed,
        format!(
            "sudo {} extension generate --out {}",
            std::fs::canonicalize(BIN).unwrap().display(),
            dir.display()
        ),
        "{result:?}"
    );
    assert!(!share.exists(), "--print wrote something");
    let (code, json) = {
        let result = run(&[
            "--json",
            "extension",
            "install",
            "--pg-config",
            &pg_config,
            "--print",
        ]);
        (result.code, result.json())
    };
    assert_eq!(code, 0);
    assert_eq!(json["command"], printed);
    assert_eq!(json["dir"], dir.display().to_string());
    // The command works (here without sudo: the directory is ours).
    let without_sudo = printed.strip_prefix("sudo ").unwrap();
    let output = std::process::Command::new("sh")
        .args(["-c", without_sudo])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(files_of(&dir) == generated(&tmp));
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn install_where_it_cannot_write_exits_10_naming_the_command() {
    let tmp = scratch("unwritable");
    // A sharedir under a regular file: creating `<sharedir>/extension`
    // fails for every user, root included.
    let file = tmp.join("file");
    std::fs::write(&file, "not a directory").unwrap();
    let pg_config = fake_pg_config(&tmp.join("bin"), &file.join("share"));
    let pg_config = pg_config.to_string_lossy().into_owned();
    let result = run(&["extension", "install", "--pg-config", &pg_config]);
    assert_eq!(result.code, 10, "{result:?}");
    assert!(
        result
            .stderr
            .contains("cannot write the extension files into"),
        "{result:?}"
    );
    assert!(
        result.stderr.contains("extension generate --out"),
        "names the command: {result:?}"
    );
    let result = run(&["--json", "extension", "install", "--pg-config", &pg_config]);
    assert_eq!(result.code, 10, "{result:?}");
    let json = result.json();
    assert_eq!(json["error"], "extension_dir_not_writable");
    assert_eq!(json["exit_code"], 10);
    assert_eq!(
        json["dir"],
        file.join("share/extension").display().to_string()
    );
    assert!(json["command"].as_str().unwrap().starts_with("sudo "));

    // A directory without write permission: only where permission bits
    // stop this user (root writes anyway, so this part is skipped there).
    let locked = tmp.join("locked");
    std::fs::create_dir_all(locked.join("extension")).unwrap();
    std::fs::set_permissions(
        locked.join("extension"),
        std::fs::Permissions::from_mode(0o555),
    )
    .unwrap();
    if std::fs::write(locked.join("extension/probe"), "").is_err() {
        let pg_config = fake_pg_config(&tmp.join("bin2"), &locked);
        let pg_config = pg_config.to_string_lossy().into_owned();
        let result = run(&["extension", "install", "--pg-config", &pg_config]);
        assert_eq!(result.code, 10, "{result:?}");
        assert!(result.stderr.contains("ermission denied"), "{result:?}");
    }
    std::fs::set_permissions(
        locked.join("extension"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn install_without_pg_config_exits_2_and_says_how_to_name_one() {
    let tmp = scratch("no-pg-config");
    let missing = tmp.join("no-such-pg_config");
    let missing = missing.to_string_lossy().into_owned();
    let result = run(&["--json", "extension", "install", "--pg-config", &missing]);
    assert_eq!(result.code, 2, "{result:?}");
    let json = result.json();
    assert_eq!(json["error"], "pg_config");
    assert!(json["message"].as_str().unwrap().contains("--pg-config"));
    let _ = std::fs::remove_dir_all(&tmp);
}
