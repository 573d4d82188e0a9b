//! The help texts every command shares: the exit-code table, shown by
//! `leasehold --help` only, and the line that ends every subcommand's help
//! and points to it, so the codes are written down once.

/// The exit-code table, shown at the end of the top-level `--help` (and
/// there only). Must match [`crate::failure::Exit`].
pub const EXIT_CODES: &str = "\
Exit codes:
  0  ok
  1  unexpected failure (e.g. the demo could not complete, stdout closed)
  2  invalid input or usage (bad duration, empty key, zero ttl, no
     database named, no pg_config for extension install, ...)
  3  denied: the key is held by another owner
  4  lapsed: the caller's grant expired (and may have been taken over)
  5  epoch mismatch: the caller holds the key under another epoch
     (release --force: the key is held under a newer epoch, left alone)
  6  not owner: the grant was superseded, released, force-released or
     never held (the message says which; release --force: that epoch
     was never granted)
  7  wait timed out: the key stayed held for the whole --wait
  8  cannot connect, database error, leasehold not installed, or a
     read-only server (a standby; list every host and add
     target_session_attrs=read-write to reach the primary)
  9  guard refusal: stale epoch, wrong lease key, epoch never granted,
     or lease not held
 10  permission denied: the role was not granted this operator action, or
     an operator bound the key's (or resource's) prefix to another role;
     extension install: the server's extension directory is not writable
     (the message names the command that writes it)
 11  doctor: warnings (leasehold works, something should be looked at)
 12  doctor: failures (leasehold cannot work as intended here)
 13  run: the command could not be started (not found, not executable)
 14  local: the development server is not running (status, env)

`leasehold run` exits with the command's own status (128 + N when signal
N ended it) once it ran under the lease; 3, 7 and 8 when it never got the
lease; 4 when the lease was lost while the command ran (the command was
sent SIGTERM at the safe deadline, SIGKILL after --grace).

Every command but `demo`, `extension` and `local` needs a database:
--database-url, DATABASE_URL, or else the development server of
`leasehold local start` when it runs; without any of them it exits 2 and
changes nothing. --throwaway runs one command against a throwaway local
PostgreSQL, deleted when the command exits. `leasehold demo` always uses
its own.

LEASEHOLD_LOG=FILTER (e.g. leasehold=debug) writes leasehold's tracing
spans and events to stderr (stdout stays as it is); RUST_LOG is ignored.";

/// The end of every subcommand's help: the exit codes live in one place.
pub const SEE_EXIT_CODES: &str = "Exit codes: see `leasehold --help`.";

/// The end of `run --help`: its own status rule, the rest in one place.
pub const RUN_EXIT_CODES: &str = "\
Exit codes: CMD's own status (128 + N when signal N ended it) once it ran
under the lease; 3, 7 and 8 when it never got the lease; 4 when the lease
was lost while CMD ran. The others: see `leasehold --help`.";
