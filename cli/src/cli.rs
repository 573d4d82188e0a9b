//! The command line's top level: the global flags, and the subcommand
//! (each one's arguments live in its module under `commands/`).
//!
//! The global flags are read once here and handed to every command as a
//! [`crate::context::Context`].

use clap::Parser;

use crate::commands::Command;
use crate::help::EXIT_CODES;

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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;
    use crate::help::{EXIT_CODES, RUN_EXIT_CODES, SEE_EXIT_CODES};

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
