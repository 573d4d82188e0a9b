//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A fresh, empty directory on the real disk (under cargo's target dir, not
/// tmpfs), unique per test and process.
pub fn scratch(name: &str) -> PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("lhfs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// A self-describing payload: length and every byte derive from `epoch`, so
/// a reader can tell whether it holds exactly one whole version.
pub fn payload(epoch: i64, base_len: usize) -> Vec<u8> {
    let len = base_len + (epoch as usize * 7919) % 4096;
    let mut state = (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// The hidden temp file the guard uses next to `path`.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap().to_str().unwrap();
    path.with_file_name(format!(".{name}.lhfs-tmp"))
}
