//! The command line: subcommands, options and the help text (clap derive).
//!
//! Kept apart from the commands themselves so `--help` (including the
//! exit-code table scripts rely on) reads as one page of source. The table
//! is shown by `leasehold --help` only; every subcommand's help ends with
//! [`SEE_EXIT_CODES`] (or, for `run`, [`RUN_EXIT_CODES`]), pointing to it.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::duration;

/// The exit-code table, shown at the end of the top-level `--help` (and
/// there only). Must match [`crate::failure::Exit`].
const EXIT_CODES: &str = "\
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
const SEE_EXIT_CODES: &str = "Exit codes: see `leasehold --help`.";

/// The end of `run --help`: its own status rule, the rest in one place.
const RUN_EXIT_CODES: &str = "\
Exit codes: CMD's own status (128 + N when signal N ended it) once it ran
under the lease; 3, 7 and 8 when it never got the lease; 4 when the lease
was lost while CMD ran. The others: see `leasehold --help`.";

/// Operator tool for leasehold: PostgreSQL leases with fencing epochs.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, after_help = EXIT_CODES)]
pub struct Cli {
    /// PostgreSQL URL, e.g. postgres://user@host/db, or with several hosts
    /// postgres://user@h1:5432,h2:5432/db?target_session_attrs=read-write
    /// (libpq connects to the first writable one). Every command but
    /// `demo`, `extension` and `local` needs it, DATABASE_URL, a running
    /// `leasehold local` server, or --throwaway.
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Run this one command against a throwaway local PostgreSQL, deleted
    /// when the command exits (nothing persists between invocations). Only
    /// when no database URL is given.
    #[arg(long, global = true)]
    pub throwaway: bool,

    /// Print machine-readable JSON on stdout (one object per result; `watch`
    /// prints one object per refresh, `watch --events` one per event).
    /// Errors are JSON objects too.
    #[arg(long, global = true)]
    pub json: bool,

    /// Let spans and events carry lease keys and guarded resource names
    /// (hidden by default: they are the application's own names). Matters
    /// only with LEASEHOLD_LOG set.
    #[arg(long, global = true)]
    pub trace_keys: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Install or upgrade the lease functions in the database (idempotent).
    #[command(after_help = SEE_EXIT_CODES)]
    Install,
    /// A persistent PostgreSQL for development on this machine, with
    /// leasehold installed: `leasehold local start`, then every command
    /// without --database-url uses it. Its data lives in
    /// $XDG_DATA_HOME/leasehold/local (~/.local/share/leasehold/local;
    /// /var/lib/leasehold/local for root; LEASEHOLD_LOCAL_DIR overrides).
    #[command(after_help = SEE_EXIT_CODES)]
    Local {
        /// What to do.
        #[command(subcommand)]
        action: LocalCommand,
    },
    /// The PostgreSQL extension `leasehold` (`CREATE EXTENSION leasehold`),
    /// an alternative to `install`.
    #[command(after_help = SEE_EXIT_CODES)]
    Extension {
        /// What to do.
        #[command(subcommand)]
        action: ExtensionCommand,
    },
    /// Acquire KEY for OWNER; prints the epoch, expiry and fencing token.
    #[command(after_help = SEE_EXIT_CODES)]
    Acquire {
        /// The lease key, e.g. job-42.
        key: String,
        /// Who acquires it, e.g. worker-a1.
        owner: String,
        /// How long the grant lasts unless renewed (server clock).
        #[arg(long, value_parser = duration::parse, allow_hyphen_values = true)]
        ttl: Duration,
        /// Wait up to this long while another owner holds the key (exit 7 on
        /// timeout) instead of failing at once (exit 3).
        #[arg(long, value_parser = duration::parse, allow_hyphen_values = true)]
        wait: Option<Duration>,
    },
    /// Extend the grant (KEY, OWNER, EPOCH), or the grant of --token, by
    /// --ttl from now.
    #[command(after_help = SEE_EXIT_CODES)]
    Renew {
        /// The lease key (or give --token).
        #[arg(required_unless_present = "token", conflicts_with = "token")]
        key: Option<String>,
        /// The owner of the grant.
        #[arg(required_unless_present = "token", conflicts_with = "token")]
        owner: Option<String>,
        /// The grant's epoch, as acquire printed it.
        #[arg(required_unless_present = "token", conflicts_with = "token")]
        epoch: Option<i64>,
        /// The fencing token acquire printed (or LEASEHOLD_TOKEN under
        /// `leasehold run`): key, owner and epoch in one argument.
        #[arg(long, value_parser = parse_token)]
        token: Option<leasehold::FencingToken>,
        /// The new ttl, counted from now on the server clock.
        #[arg(long, value_parser = duration::parse, allow_hyphen_values = true)]
        ttl: Duration,
    },
    /// Release the grant (KEY, OWNER, EPOCH), or the grant of --token; its
    /// epoch becomes stale. Releasing a grant released already (by its
    /// holder or an operator), with the key still free, answers `released`
    /// or `force_released` (exit 0): running it twice is harmless. Operator: `release --force KEY --epoch N` ends exactly
    /// grant N of KEY, whoever holds it, and never a newer one (exit 5 if
    /// the key is held under a newer epoch, 6 if epoch N was never
    /// granted); needs EXECUTE on lease.force_release(text, bigint)
    /// (granted to nobody by default).
    #[command(after_help = SEE_EXIT_CODES)]
    Release {
        /// The lease key (or give --token).
        #[arg(required_unless_present = "token")]
        key: Option<String>,
        /// The owner of the grant (not with --force or --token).
        #[arg(required_unless_present_any = ["force", "token"], conflicts_with_all = ["force", "token"])]
        owner: Option<String>,
        /// The grant's epoch (not with --force, which takes --epoch).
        #[arg(required_unless_present_any = ["force", "token"], conflicts_with_all = ["force", "token"])]
        epoch: Option<i64>,
        /// The fencing token acquire printed: key, owner and epoch in one
        /// argument.
        #[arg(long, value_parser = parse_token, conflicts_with_all = ["force", "key"])]
        token: Option<leasehold::FencingToken>,
        /// Operator: end the grant at --epoch whoever holds it.
        #[arg(long, requires = "force_epoch")]
        force: bool,
        /// With --force: the epoch of the grant to end (as `ls` or
        /// `inspect` showed it).
        #[arg(long = "epoch", requires = "force", value_name = "N")]
        force_epoch: Option<i64>,
    },
    /// Run CMD while holding KEY: acquire it (or --wait for it), keep it
    /// alive while CMD runs, stop CMD (SIGTERM, then SIGKILL after --grace)
    /// if the lease is lost, and release it when CMD ends (or hold it until
    /// --hold-at-least after it began). CMD gets LEASEHOLD_KEY,
    /// LEASEHOLD_OWNER, LEASEHOLD_EPOCH and LEASEHOLD_TOKEN; SIGINT, SIGTERM
    /// and SIGHUP sent to `run` are passed on to it.
    #[command(after_help = RUN_EXIT_CODES)]
    Run {
        /// The lease key, e.g. nightly-billing.
        key: String,
        /// Who acquires it (default: HOST:PID of this process).
        #[arg(long)]
        owner: Option<String>,
        /// The grant's ttl; the keeper renews it every ttl/3 and treats it
        /// as lost ttl/10 before it would lapse.
        #[arg(long, value_parser = duration::parse, default_value = "30s", allow_hyphen_values = true)]
        ttl: Duration,
        /// Wait up to this long while another owner holds the key (exit 7
        /// on timeout) instead of failing at once (exit 3).
        #[arg(long, value_parser = duration::parse, allow_hyphen_values = true)]
        wait: Option<Duration>,
        /// Keep the grant until this long after it began even if CMD ends
        /// sooner, so no other runner starts the job again meanwhile.
        #[arg(long, value_parser = duration::parse, allow_hyphen_values = true)]
        hold_at_least: Option<Duration>,
        /// After a loss, how long CMD has between SIGTERM and SIGKILL
        /// (default: the keeper's margin, ttl/10, so SIGKILL lands no later
        /// than the server's expiry of the last renewed grant).
        #[arg(long, value_parser = duration::parse, allow_hyphen_values = true)]
        grace: Option<Duration>,
        /// The command and its arguments, after --.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<std::ffi::OsString>,
    },
    /// Show KEY's state: holder, epoch, expiry (advisory, may be stale).
    #[command(after_help = SEE_EXIT_CODES)]
    Inspect {
        /// The lease key.
        key: String,
    },
    /// List keys with holder, epoch and remaining time. Reads lease.leases
    /// and lease.groups directly, so the role needs SELECT on them
    /// (superuser or the role that installed leasehold).
    #[command(after_help = SEE_EXIT_CODES)]
    Ls(ListArgs),
    /// Like `ls`, refreshed live until Ctrl-C (or --count refreshes).
    /// Rows that changed since the previous refresh are marked with `*`.
    /// With --events: one line per wake-up, grant and loss instead.
    #[command(after_help = SEE_EXIT_CODES)]
    Watch {
        /// Which keys.
        #[command(flatten)]
        list: ListArgs,
        /// Time between refreshes.
        #[arg(long, default_value = "500ms", value_parser = duration::parse, allow_hyphen_values = true)]
        interval: Duration,
        /// Stop after this many refreshes, or with --events this many
        /// events (default: until Ctrl-C).
        #[arg(long)]
        count: Option<u64>,
        /// Print events instead of tables, one line each (with --json one
        /// object per line) as they happen: `wake` (a release notification
        /// woke the key's waiters), `acquired`, and the losses `lapsed`,
        /// `released`, `taken_over`; `removed` when a key's row is pruned.
        /// The first line (`watching`) says how many keys are watched.
        /// Registers the watched keys for release notifications (as a
        /// waiter does). --owner keeps the events that concern that owner.
        #[arg(long, conflicts_with_all = ["state", "sort", "limit"])]
        events: bool,
    },
    /// Raise RESOURCE's guard so it refuses every epoch up to --up-to of
    /// lease --key (operator action after a holder lapsed or released).
    #[command(after_help = SEE_EXIT_CODES)]
    Fence {
        /// The guarded resource's name, as the application uses it.
        resource: String,
        /// The lease key whose epochs fence the resource.
        #[arg(long)]
        key: String,
        /// Refuse this epoch and every lower one from now on.
        #[arg(long)]
        up_to: i64,
    },
    /// Operator: bind key prefixes to roles, so that only a role's members
    /// may use the keys and resources under a prefix. Needs EXECUTE on the
    /// lease.*_namespace functions (granted to nobody by default).
    #[command(after_help = SEE_EXIT_CODES)]
    Namespace {
        /// What to do with the rules.
        #[command(subcommand)]
        action: NamespaceCommand,
    },
    /// Operator: free KEY whatever its state, as if its holder released it;
    /// prints the counter: every epoch up to it is stale from now on. Needs
    /// EXECUTE on lease.force_release(text) (granted to nobody by default).
    #[command(after_help = SEE_EXIT_CODES)]
    ForceRelease {
        /// The lease key.
        key: String,
    },
    /// The server's generation: epochs order across failover because every
    /// grant is at least (generation << 40) + 1. `show` needs no privilege;
    /// `raise` needs EXECUTE on lease.raise_generation(bigint) (granted to
    /// nobody by default).
    #[command(after_help = SEE_EXIT_CODES)]
    Generation {
        /// Show or raise.
        #[command(subcommand)]
        action: GenerationCommand,
    },
    /// Check this database and role for leasehold: install path, version
    /// and pending upgrades, privileges (act, operate, list),
    /// synchronous_commit, standby, pooler, listener, clock difference,
    /// table sizes and prunable rows. Each finding says what to do. Exit 0
    /// healthy, 11 warnings, 12 failures (8 when it cannot connect).
    #[command(after_help = SEE_EXIT_CODES)]
    Doctor {
        /// Lapsed rows whose grant expired longer ago than this count as
        /// prunable (free rows always do: no release time is stored).
        #[arg(long, default_value = "168h", value_parser = duration::parse, allow_hyphen_values = true)]
        idle: Duration,
    },
    /// Operator: remove the rows of keys FREE or LAPSED for longer than
    /// --idle, with the guard records of resources fenced only by them, in
    /// short batches. Epochs stay safe: a key that comes back starts above
    /// every epoch it had, and stale epochs stay refused. A FREE key is
    /// removed only when a prune saw it FREE at least --idle earlier (the
    /// first prune records it). Needs EXECUTE on lease.prune_keys and
    /// lease.prune_guards (granted to nobody by default).
    #[command(after_help = SEE_EXIT_CODES)]
    Prune {
        /// How long a key must have been unused, e.g. 168h.
        #[arg(long, value_parser = duration::parse, allow_hyphen_values = true)]
        idle: Duration,
        /// Change nothing; say what a prune would remove now.
        #[arg(long)]
        dry_run: bool,
    },
    /// A guided fencing scenario on its own throwaway server: two workers,
    /// a stalled holder taken over, its stale write refused, a database
    /// crash and restart with epochs intact. Takes a few seconds.
    #[command(after_help = SEE_EXIT_CODES)]
    Demo,
}

/// `leasehold namespace ...`.
#[derive(Debug, Subcommand)]
pub enum NamespaceCommand {
    /// Bind PREFIX to ROLE (or rebind it): from now on only members of ROLE
    /// (and superusers) may act on keys and resources whose longest bound
    /// prefix is PREFIX.
    #[command(after_help = SEE_EXIT_CODES)]
    Bind {
        /// The prefix of key and resource names, e.g. billing/.
        prefix: String,
        /// The role's name as stored in PostgreSQL (no quotes; case matters).
        role: String,
    },
    /// Remove the rule for exactly PREFIX (names under it fall to the next
    /// longest bound prefix, or to no rule: every role may act).
    #[command(after_help = SEE_EXIT_CODES)]
    Unbind {
        /// The bound prefix.
        prefix: String,
    },
    /// List the rules: prefix, role, when bound.
    #[command(after_help = SEE_EXIT_CODES)]
    Ls,
}

/// `leasehold generation ...`.
#[derive(Debug, Subcommand)]
pub enum GenerationCommand {
    /// Show the current generation, the timeline and the lowest epoch the
    /// next grant can get.
    #[command(after_help = SEE_EXIT_CODES)]
    Show,
    /// Operator: raise the generation to GENERATION (above the current one,
    /// at most 8388607): every grant from now on, of every key, gets an
    /// epoch of at least (GENERATION << 40) + 1.
    #[command(after_help = SEE_EXIT_CODES)]
    Raise {
        /// The new generation.
        generation: i64,
    },
}

/// `leasehold local ...`.
#[derive(Debug, Subcommand)]
pub enum LocalCommand {
    /// Create (the first time) and start the development server; prints
    /// its URL. Its data stays between starts.
    #[command(after_help = SEE_EXIT_CODES)]
    Start,
    /// Stop the development server (its data stays).
    #[command(after_help = SEE_EXIT_CODES)]
    Stop,
    /// Whether the development server runs (exit 0) or not (exit 14), and
    /// its URL.
    #[command(after_help = SEE_EXIT_CODES)]
    Status,
    /// Print `export DATABASE_URL=...` for the running development server:
    /// `eval "$(leasehold local env)"`.
    #[command(after_help = SEE_EXIT_CODES)]
    Env,
}

/// `leasehold extension ...`.
#[derive(Debug, Subcommand)]
pub enum ExtensionCommand {
    /// Write the extension's control file and scripts, generated from the
    /// migrations, into DIR (created if missing; files there are
    /// replaced). `extension install` writes them where the server looks
    /// for them instead. Needs no database connection.
    #[command(after_help = SEE_EXIT_CODES)]
    Generate {
        /// The directory to write into.
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Write the extension's files into the server's extension directory,
    /// `$(pg_config --sharedir)/extension`; then run `CREATE EXTENSION
    /// leasehold` in the database. That directory usually belongs to root:
    /// when it is not writable this exits 10 and names the one command
    /// (with sudo) that writes the files there; --print prints that
    /// command instead of writing. Needs no database connection.
    #[command(after_help = SEE_EXIT_CODES)]
    Install {
        /// The pg_config of the PostgreSQL installation that is to load the
        /// extension (default: pg_config on PATH).
        #[arg(long, value_name = "PATH")]
        pg_config: Option<std::path::PathBuf>,
        /// Print the command that writes the files (with sudo) instead of
        /// writing them.
        #[arg(long)]
        print: bool,
    },
}

/// Which keys `ls` and `watch` show, and in which order.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only keys starting with this prefix (default: all keys); the same
    /// as --prefix.
    #[arg(value_name = "PREFIX", conflicts_with = "prefix")]
    pub positional_prefix: Option<String>,
    /// Only keys starting with this prefix.
    #[arg(long)]
    pub prefix: Option<String>,
    /// Only keys in these states (comma-separated or repeated): held,
    /// lapsed (the grant expired; anyone may take the key), free (released).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub state: Vec<KeyState>,
    /// Only keys whose current or lapsed grant belongs to this owner
    /// (exact match).
    #[arg(long)]
    pub owner: Option<String>,
    /// Order of the rows: key (byte order), expires (soonest expiry first,
    /// free keys last) or epoch (highest first); ties by key.
    #[arg(long, value_enum, default_value_t = SortBy::Key)]
    pub sort: SortBy,
    /// Show at most this many rows (after filtering and sorting).
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    pub limit: Option<i64>,
}

impl ListArgs {
    /// The prefix, from either spelling ("" for all keys).
    pub fn prefix(&self) -> &str {
        self.prefix
            .as_deref()
            .or(self.positional_prefix.as_deref())
            .unwrap_or("")
    }
}

/// A key's state as `ls` shows it (decided on the server's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyState {
    /// A live grant.
    Held,
    /// A grant whose ttl passed: anyone may acquire the key.
    Lapsed,
    /// Released (or force-released): no grant.
    Free,
}

impl KeyState {
    /// The library's name for the state.
    pub fn as_library(self) -> leasehold::admin::KeyState {
        match self {
            KeyState::Held => leasehold::admin::KeyState::Held,
            KeyState::Lapsed => leasehold::admin::KeyState::Lapsed,
            KeyState::Free => leasehold::admin::KeyState::Free,
        }
    }
}

/// How `ls` orders its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SortBy {
    /// By key, byte order.
    Key,
    /// Soonest expiry first (lapsed ones, longest lapsed, before held
    /// ones); free keys last.
    Expires,
    /// Highest epoch first.
    Epoch,
}

/// Parses a fencing token as `acquire` prints it.
fn parse_token(text: &str) -> Result<leasehold::FencingToken, String> {
    text.parse()
        .map_err(|error| format!("not a fencing token as acquire prints it: {error}"))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::{Cli, EXIT_CODES, RUN_EXIT_CODES, SEE_EXIT_CODES};

    /// Every subcommand, at any depth, with its path (`namespace bind`).
    fn subcommands(command: &clap::Command, path: &str, into: &mut Vec<(String, clap::Command)>) {
        for sub in command.get_subcommands() {
            let name = format!("{path} {}", sub.get_name()).trim().to_owned();
            subcommands(sub, &name, into);
            into.push((name, sub.clone()));
        }
    }

    #[test]
    fn the_exit_code_table_is_on_the_top_level_help_only() {
        let cli = Cli::command();
        assert_eq!(
            cli.get_after_help().map(ToString::to_string).as_deref(),
            Some(EXIT_CODES)
        );
        let mut all = Vec::new();
        subcommands(&cli, "", &mut all);
        assert!(all.len() > 20, "{}", all.len());
        for (name, sub) in all {
            // clap's own `help` subcommands.
            if name == "help" || name.ends_with(" help") || name.starts_with("help ") {
                continue;
            }
            let after = sub.get_after_help().map(ToString::to_string);
            let expected = if name == "run" {
                RUN_EXIT_CODES
            } else {
                SEE_EXIT_CODES
            };
            assert_eq!(
                after.as_deref(),
                Some(expected),
                "`leasehold {name} --help`"
            );
            assert!(
                sub.get_after_long_help().is_none(),
                "`leasehold {name} --help` has a long after-help"
            );
        }
    }
}
