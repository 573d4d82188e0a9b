//! `leasehold`: the operator command for leasehold's PostgreSQL leases.
//!
//! Install the SQL side, acquire / renew / release / inspect leases, list
//! and watch keys, fence a guarded resource, bind key namespaces to roles,
//! force a release, check a deployment (`doctor`), and run a guided demo of
//! the fencing story. See `leasehold --help` for usage and the exit codes.
//!
//! This binary is the crate `leasehold-cli`, kept out of the library so
//! that depending on `leasehold` pulls neither clap nor a server supervisor.
//! It uses only the library's public functions, except `watch --events`,
//! which registers as a waiter and listens itself
//! (`commands/watch/events.rs`), and `doctor`, which reads the catalogs
//! (`commands/doctor/`); and `leasehold-local` for the embedded default
//! database and the demo. With `LEASEHOLD_LOG` set it also shows the
//! library's tracing spans on stderr (`logging.rs`).
//!
//! Laid out like cargo's: [`cli`] parses the global flags, `commands/`
//! holds one module per subcommand (its arguments and its `run`), and
//! [`commands::run`] is the one dispatch. The other modules are helpers
//! the commands share.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod cli;
mod commands;
mod connect;
mod context;
mod duration;
mod failure;
mod grant;
mod help;
mod json;
mod listing;
mod logging;
mod output;
mod privilege;
mod table;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;
use crate::context::Context;
use crate::failure::CliError;
use crate::output::Printer;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let out = Printer::new(cli.json);
    let context = Context::new(cli.database_url, cli.throwaway, out);
    let result = logging::install(cli.trace_keys)
        .map_err(CliError::from)
        .and_then(|()| commands::run(cli.command, &context));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("error: {error}");
            if out.is_json() {
                // Best effort: the exit code and stderr already tell.
                let _ = out.emit("", &error.to_json());
            }
            ExitCode::from(error.exit().code())
        }
    }
}
