//! Reading the end of the server log, which is where PostgreSQL explains
//! why it did not start.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Lines of the server log quoted in errors.
pub(crate) const LOG_TAIL_LINES: usize = 20;

/// The last `lines` lines of the log written after byte `from` (empty if
/// unreadable). Reads at most the last 64 KiB, so a long-running server's
/// log is never loaded whole.
pub(crate) fn read_log_tail(path: &Path, from: u64, lines: usize) -> String {
    const MAX_BYTES: u64 = 64 * 1024;
    let Ok(mut file) = fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = from.max(len.saturating_sub(MAX_BYTES));
    if file.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut bytes = Vec::new();
    if file.read_to_end(&mut bytes).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
