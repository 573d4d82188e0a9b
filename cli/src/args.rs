//! The command line: subcommands, options and the help text (clap derive).
//!
//! Kept apart from the commands themselves so `--help` (including the
//! exit-code table scripts rely on) reads as one page of source.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::duration;

/// The exit-code table, shown at the end of `--help`. Must match
/// [`crate::failure::Exit`].
const EXIT_CODES: &str = "\
Exit codes:
  0  ok
  1  unexpected failure (e.g. the demo could not complete, stdout closed)
  2  invalid input or usage (bad duration, empty key, zero ttl, ...)
  3  denied: the key is held by another owner
  4  lapsed: the caller's grant expired (and may have been taken over)
  5  epoch mismatch: the caller holds the key under another epoch
  6  not owner: unknown or free key, or another owner's grant
  7  wait timed out: the key stayed held for the whole --wait
  8  cannot connect, database error, leasehold not installed, or a
     read-only server (a standby; list every host and add
     target_session_attrs=read-write to reach the primary)
  9  guard refusal: stale epoch, wrong lease key, epoch never granted,
     or lease not held
 10  permission denied: the role was not granted this operator action, or
     an operator bound the key's (or resource's) prefix to another role

Without --database-url or DATABASE_URL every command runs against a
throwaway local PostgreSQL that is deleted when the command exits: nothing
persists between invocations. `leasehold demo` always uses its own.";

/// Operator tool for leasehold: PostgreSQL leases with fencing epochs.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, after_help = EXIT_CODES)]
pub struct Cli {
    /// PostgreSQL URL, e.g. postgres://user@host/db, or with several hosts
    /// postgres://user@h1:5432,h2:5432/db?target_session_attrs=read-write
    /// (libpq connects to the first writable one). Without it (and without
    /// DATABASE_URL) a throwaway local server is used for this one command.
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Print machine-readable JSON on stdout (one object per result; `watch`
    /// prints one object per refresh). Errors are JSON objects too.
    #[arg(long, global = true)]
    pub json: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Install or upgrade the lease functions in the database (idempotent).
    Install,
    /// The PostgreSQL extension `leasehold` (`CREATE EXTENSION leasehold`),
    /// an alternative to `install`.
    Extension {
        /// What to do.
        #[command(subcommand)]
        action: ExtensionCommand,
    },
    /// Acquire KEY for OWNER; prints the epoch, expiry and fencing token.
    #[command(after_help = EXIT_CODES)]
    Acquire {
        /// The lease key, e.g. job-42.
        key: String,
        /// Who acquires it, e.g. worker-a1.
        owner: String,
        /// How long the grant lasts unless renewed (server clock).
        #[arg(long, value_parser = duration::parse)]
        ttl: Duration,
        /// Wait up to this long while another owner holds the key (exit 7 on
        /// timeout) instead of failing at once (exit 3).
        #[arg(long, value_parser = duration::parse)]
        wait: Option<Duration>,
    },
    /// Extend the grant (KEY, OWNER, EPOCH) by --ttl from now.
    #[command(after_help = EXIT_CODES)]
    Renew {
        /// The lease key.
        key: String,
        /// The owner of the grant.
        owner: String,
        /// The grant's epoch, as acquire printed it.
        epoch: i64,
        /// The new ttl, counted from now on the server clock.
        #[arg(long, value_parser = duration::parse)]
        ttl: Duration,
    },
    /// Release the grant (KEY, OWNER, EPOCH); its epoch becomes stale.
    #[command(after_help = EXIT_CODES)]
    Release {
        /// The lease key.
        key: String,
        /// The owner of the grant.
        owner: String,
        /// The grant's epoch.
        epoch: i64,
    },
    /// Show KEY's state: holder, epoch, expiry (advisory, may be stale).
    #[command(after_help = EXIT_CODES)]
    Inspect {
        /// The lease key.
        key: String,
    },
    /// List keys with holder, epoch and remaining time. Reads lease.leases
    /// directly, so the role needs SELECT on it (superuser or the role that
    /// installed leasehold).
    #[command(after_help = EXIT_CODES)]
    Ls(ListArgs),
    /// Like `ls`, refreshed live until Ctrl-C (or --count refreshes).
    /// Rows that changed since the previous refresh are marked with `*`.
    #[command(after_help = EXIT_CODES)]
    Watch {
        /// Which keys.
        #[command(flatten)]
        list: ListArgs,
        /// Time between refreshes.
        #[arg(long, default_value = "500ms", value_parser = duration::parse)]
        interval: Duration,
        /// Stop after this many refreshes (default: until Ctrl-C).
        #[arg(long)]
        count: Option<u64>,
    },
    /// Raise RESOURCE's guard so it refuses every epoch up to --up-to of
    /// lease --key (operator action after a holder lapsed or released).
    #[command(after_help = EXIT_CODES)]
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
    #[command(after_help = EXIT_CODES)]
    Namespace {
        /// What to do with the rules.
        #[command(subcommand)]
        action: NamespaceCommand,
    },
    /// Operator: free KEY whatever its state, as if its holder released it;
    /// prints the counter: every epoch up to it is stale from now on. Needs
    /// EXECUTE on lease.force_release(text) (granted to nobody by default).
    #[command(after_help = EXIT_CODES)]
    ForceRelease {
        /// The lease key.
        key: String,
    },
    /// The server's generation: epochs order across failover because every
    /// grant is at least (generation << 40) + 1. `show` needs no privilege;
    /// `raise` needs EXECUTE on lease.raise_generation(bigint) (granted to
    /// nobody by default).
    #[command(after_help = EXIT_CODES)]
    Generation {
        /// Show or raise.
        #[command(subcommand)]
        action: GenerationCommand,
    },
    /// Operator: remove the rows of keys FREE or LAPSED for longer than
    /// --idle, with the guard records of resources fenced only by them, in
    /// short batches. Epochs stay safe: a key that comes back starts above
    /// every epoch it had, and stale epochs stay refused. A FREE key is
    /// removed only when a prune saw it FREE at least --idle earlier (the
    /// first prune records it). Needs EXECUTE on lease.prune_keys and
    /// lease.prune_guards (granted to nobody by default).
    #[command(after_help = EXIT_CODES)]
    Prune {
        /// How long a key must have been unused, e.g. 168h.
        #[arg(long, value_parser = duration::parse)]
        idle: Duration,
        /// Change nothing; say what a prune would remove now.
        #[arg(long)]
        dry_run: bool,
    },
    /// A guided fencing scenario on its own throwaway server: two workers,
    /// a stalled holder taken over, its stale write refused, a database
    /// crash and restart with epochs intact. Takes a few seconds.
    Demo,
}

/// `leasehold namespace ...`.
#[derive(Debug, Subcommand)]
pub enum NamespaceCommand {
    /// Bind PREFIX to ROLE (or rebind it): from now on only members of ROLE
    /// (and superusers) may act on keys and resources whose longest bound
    /// prefix is PREFIX.
    #[command(after_help = EXIT_CODES)]
    Bind {
        /// The prefix of key and resource names, e.g. billing/.
        prefix: String,
        /// The role's name as stored in PostgreSQL (no quotes; case matters).
        role: String,
    },
    /// Remove the rule for exactly PREFIX (names under it fall to the next
    /// longest bound prefix, or to no rule: every role may act).
    #[command(after_help = EXIT_CODES)]
    Unbind {
        /// The bound prefix.
        prefix: String,
    },
    /// List the rules: prefix, role, when bound.
    #[command(after_help = EXIT_CODES)]
    Ls,
}

/// `leasehold generation ...`.
#[derive(Debug, Subcommand)]
pub enum GenerationCommand {
    /// Show the current generation, the timeline and the lowest epoch the
    /// next grant can get.
    #[command(after_help = EXIT_CODES)]
    Show,
    /// Operator: raise the generation to GENERATION (above the current one,
    /// at most 8388607): every grant from now on, of every key, gets an
    /// epoch of at least (GENERATION << 40) + 1.
    #[command(after_help = EXIT_CODES)]
    Raise {
        /// The new generation.
        generation: i64,
    },
}

/// `leasehold extension ...`.
#[derive(Debug, Subcommand)]
pub enum ExtensionCommand {
    /// Write the extension's control file and scripts, generated from the
    /// migrations, into DIR (created if missing; files there are
    /// replaced). Copy them into the server's extension directory
    /// (`$(pg_config --sharedir)/extension`), then run `CREATE EXTENSION
    /// leasehold` in the database. Needs no database connection.
    Generate {
        /// The directory to write into.
        #[arg(long)]
        out: std::path::PathBuf,
    },
}

/// Which keys `ls` and `watch` show.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only keys starting with this prefix (default: all keys).
    pub prefix: Option<String>,
}
