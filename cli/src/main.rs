//! `leasehold`: the operator command for leasehold's PostgreSQL leases.
//!
//! Install the SQL side, acquire / renew / release / inspect leases, list
//! and watch keys, fence a guarded resource, bind key namespaces to roles,
//! force a release, and run a guided demo of the fencing story. See `leasehold --help` for usage and the exit codes.
//!
//! This binary is the crate `leasehold-cli`, kept out of the library so
//! that depending on `leasehold` pulls neither clap nor a server supervisor.
//! It uses only the library's public functions, except `ls`/`watch`, which
//! read the lease table directly (see `listing.rs` for why), and
//! `leasehold-local` for the embedded default database and the demo.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod args;
mod commands;
mod connect;
mod demo;
mod duration;
mod extension;
mod failure;
mod json;
mod listing;
mod operator;
mod output;
mod prune;
mod table;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command, ExtensionCommand, GenerationCommand, NamespaceCommand};
use crate::connect::Needs;
use crate::failure::{CliError, Exit};
use crate::output::Printer;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let out = Printer::new(cli.json);
    match run(cli, out) {
        Ok(()) => ExitCode::from(Exit::Ok.code()),
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

fn run(cli: Cli, out: Printer) -> Result<(), CliError> {
    let url = cli.database_url.as_deref();
    let needs = match cli.command {
        Command::Install => Needs::Nothing,
        Command::Extension { action } => {
            return match action {
                ExtensionCommand::Generate { out: dir } => extension::generate(&dir, out),
            }
        }
        Command::Demo => {
            if url.is_some_and(|u| !u.is_empty()) {
                eprintln!(
                    "note: demo ignores --database-url / DATABASE_URL: it crashes and restarts \
                     its database, so it always runs on its own throwaway local PostgreSQL"
                );
            }
            return demo::run(out);
        }
        _ => Needs::Installed,
    };
    let mut session = connect::open(url, needs)?;
    let session_url = session.url.clone();
    let conn = &mut session.conn;
    match cli.command {
        Command::Install => commands::install(conn, out),
        Command::Acquire {
            key,
            owner,
            ttl,
            wait,
        } => commands::acquire(conn, &session_url, out, &key, &owner, ttl, wait),
        Command::Renew {
            key,
            owner,
            epoch,
            ttl,
        } => commands::renew(conn, out, &key, &owner, epoch, ttl),
        Command::Release { key, owner, epoch } => commands::release(conn, out, &key, &owner, epoch),
        Command::Inspect { key } => commands::inspect(conn, out, &key),
        Command::Ls(list) => listing::ls(conn, out, list.prefix.as_deref()),
        Command::Watch {
            list,
            interval,
            count,
        } => listing::watch(conn, out, list.prefix.as_deref(), interval, count),
        Command::Fence {
            resource,
            key,
            up_to,
        } => commands::fence(conn, out, &resource, &key, up_to),
        Command::Namespace { action } => match action {
            NamespaceCommand::Bind { prefix, role } => operator::bind(conn, out, &prefix, &role),
            NamespaceCommand::Unbind { prefix } => operator::unbind(conn, out, &prefix),
            NamespaceCommand::Ls => operator::list(conn, out),
        },
        Command::ForceRelease { key } => operator::force_release(conn, out, &key),
        Command::Generation { action } => match action {
            GenerationCommand::Show => operator::show_generation(conn, out),
            GenerationCommand::Raise { generation } => {
                operator::raise_generation(conn, out, generation)
            }
        },
        Command::Prune { idle, dry_run } => prune::prune(conn, out, idle, dry_run),
        Command::Demo => demo::run(out),
        Command::Extension { .. } => Ok(()),
    }
}
