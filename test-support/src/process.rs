//! Signals to other processes, through kill(2) itself: the tests must not
//! depend on a `kill` program being installed (Debian's minimal systems
//! have none; it comes with procps).

use std::io;

pub use libc::{SIGCONT, SIGKILL, SIGSTOP, SIGTERM};

/// Sends `signal` to the process `pid`.
pub fn send_signal(pid: u32, signal: libc::c_int) -> io::Result<()> {
    kill(pid, signal, false)
}

/// Sends `signal` to the process group led by `pid`.
pub fn signal_group(pid: u32, signal: libc::c_int) -> io::Result<()> {
    kill(pid, signal, true)
}

fn kill(pid: u32, signal: libc::c_int, group: bool) -> io::Result<()> {
    let pid = i32::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    let target = if group { -pid } else { pid };
    // SAFETY: kill(2) has no memory-safety preconditions.
    let result = unsafe { libc::kill(target, signal) };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
