//! The cleanup watchdog: a small shell process per server that shuts the
//! server down and deletes its directory once this process is gone.
//!
//! `Drop` cleans up in the ordinary case, but servers kept in a `static`
//! are never dropped and a test process may be SIGKILLed. The watchdog
//! blocks reading a pipe whose only write end this process holds; the
//! kernel closes that pipe however this process ends, and the watchdog
//! then does what `Drop` would have done.

use std::io;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};

use std::os::unix::process::CommandExt;

use crate::error::{io_err, LocalServerError};

/// Shell script run by the watchdog process; `$1` is the data directory and
/// `$2` the root directory to remove.
///
/// It waits for end-of-file on stdin (this process died or dropped the
/// server), then fast-shuts-down the postmaster named in `postmaster.pid`
/// (after checking that the pid still belongs to a process working in our
/// data directory, so a reused pid is never signalled), waits a bounded time
/// for it to exit (zombies count as exited: our orphans may be reparented to
/// an init that does not reap), and removes the directory.
const WATCHDOG_SCRIPT: &str = r#"
trap '' INT HUP QUIT PIPE
read -r line || true
data="$1"
root="$2"
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  if [ -r "/proc/$1/stat" ]; then
    state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)
    [ "$state" != Z ] || return 1
  fi
  return 0
}
ours() {
  if [ -d "/proc/$1" ]; then
    [ "$(readlink "/proc/$1/cwd" 2>/dev/null)" = "$data" ] || return 1
  fi
  return 0
}
pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null)
case "$pid" in ''|*[!0-9]*) pid= ;; esac
if [ -n "$pid" ] && alive "$pid" && ours "$pid"; then
  kill -INT "$pid" 2>/dev/null
  i=0
  while alive "$pid" && [ "$i" -lt 300 ]; do sleep 0.1; i=$((i+1)); done
  if alive "$pid"; then kill -KILL "$pid" 2>/dev/null; fi
fi
rm -rf "$root"
"#;

/// A running watchdog and the write end of its stdin pipe.
#[derive(Debug)]
pub(crate) struct Watchdog {
    child: Child,
    /// Held, never written: its closing is the signal.
    stdin: ChildStdin,
}

impl Watchdog {
    /// Spawns the watchdog for the server whose root directory is `root`
    /// (data directory `root/data`).
    pub(crate) fn spawn(root: &Path) -> Result<Watchdog, LocalServerError> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG_SCRIPT)
            .arg("sh")
            .arg(root.join("data"))
            .arg(root)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Own process group, so a terminal's Ctrl-C does not kill it
            // along with this process.
            .process_group(0)
            .spawn()
            .map_err(io_err("start the cleanup watchdog (`sh`)"))?;
        match child.stdin.take() {
            Some(stdin) => Ok(Watchdog { child, stdin }),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                Err(LocalServerError::Io {
                    action: "open the cleanup watchdog's stdin".to_owned(),
                    source: io::Error::other("no stdin pipe"),
                })
            }
        }
    }

    /// Lets the watchdog run its cleanup now and waits for it to exit; after
    /// an orderly `Drop` it finds nothing left to clean.
    pub(crate) fn dismiss(self) {
        let Watchdog { mut child, stdin } = self;
        drop(stdin);
        let _ = child.wait();
    }
}
