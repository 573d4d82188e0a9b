//! `leasehold`: the operator command for leasehold's PostgreSQL leases.
//!
//! Install the SQL side, acquire / renew / release / inspect leases, list
//! and watch keys, fence a guarded resource, bind key namespaces to roles,
//! force a release, check a deployment (`doctor`), and run a guided demo of
//! the fencing story. See `leasehold --help` for usage and the exit codes.
//!
//! This binary is the crate `leasehold-cli`, kept out of the library so
//! that depending on `leasehold` pulls neither clap nor a server supervisor.
//! It uses only the library's public functions, except `ls`/`watch`, which
//! read the lease table directly (see `listing.rs` for why), `watch
//! --events`, which registers as a waiter and listens itself (`events.rs`),
//! and `doctor`, which reads the catalogs (`doctor.rs`); and
//! `leasehold-local` for the embedded default database and the demo. With
//! `LEASEHOLD_LOG` set it also shows the library's tracing spans on stderr
//! (`logging.rs`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod args;
mod commands;
mod connect;
mod demo;
mod doctor;
mod duration;
mod events;
mod extension;
mod failure;
mod json;
mod listing;
mod local;
mod logging;
mod operator;
mod output;
mod prune;
mod run;
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
    let result = match logging::install(cli.trace_keys) {
        Err(error) => Err(CliError::from(error)),
        Ok(()) => match cli.command {
            Command::Doctor { idle } => {
                doctor(cli.database_url.as_deref(), cli.throwaway, out, idle).map(Exit::code)
            }
            Command::Run {
                ref key,
                ref owner,
                ttl,
                wait,
                hold_at_least,
                grace,
                ref command,
            } => {
                let request = run::RunRequest {
                    key,
                    owner: owner.clone().unwrap_or_else(run::default_owner),
                    ttl,
                    wait,
                    hold_at_least,
                    grace,
                    command,
                };
                connect::open(cli.database_url.as_deref(), cli.throwaway, Needs::Installed)
                    .and_then(|mut session| {
                        let url = session.url.clone();
                        run::run(&mut session.conn, &url, &request)
                    })
            }
            _ => run(cli, out).map(|()| Exit::Ok.code()),
        },
    };
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

/// `leasehold doctor`: its exit code depends on what it found, and it
/// runs on a database where leasehold may be missing (that is a finding).
fn doctor(
    url: Option<&str>,
    throwaway: bool,
    out: Printer,
    idle: std::time::Duration,
) -> Result<Exit, CliError> {
    let mut session = connect::open(url, throwaway, Needs::Nothing)?;
    let session_url = session.url.clone();
    doctor::run(
        &mut session.conn,
        out,
        &doctor::Options {
            url: &session_url,
            idle,
        },
    )
}

fn run(cli: Cli, out: Printer) -> Result<(), CliError> {
    let url = cli.database_url.as_deref();
    let needs = match cli.command {
        Command::Install | Command::Doctor { .. } => Needs::Nothing,
        Command::Local { action } => return local::run(action, out),
        Command::Extension { action } => {
            return match action {
                ExtensionCommand::Generate { out: dir } => extension::generate(&dir, out),
                ExtensionCommand::Install { pg_config, print } => {
                    extension::install(pg_config.as_deref(), print, out)
                }
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
    let mut session = connect::open(url, cli.throwaway, needs)?;
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
            token,
            ttl,
        } => match (token, key, owner, epoch) {
            (Some(token), ..) => commands::renew(
                conn,
                out,
                token.key(),
                token.owner(),
                token.epoch().get(),
                ttl,
            ),
            (None, Some(key), Some(owner), Some(epoch)) => {
                commands::renew(conn, out, &key, &owner, epoch, ttl)
            }
            // clap's requires/conflicts rules make any other mix a usage
            // error before this point.
            _ => Err(CliError::InvalidInput(
                "pass either KEY OWNER EPOCH, or --token TOKEN".into(),
            )),
        },
        Command::Release {
            key,
            owner,
            epoch,
            token,
            force,
            force_epoch,
        } => match (force, force_epoch, token, key, owner, epoch) {
            (true, Some(epoch), None, Some(key), _, _) => {
                operator::force_release_epoch(conn, out, &key, epoch)
            }
            (false, None, Some(token), None, None, None) => {
                commands::release(conn, out, token.key(), token.owner(), token.epoch().get())
            }
            (false, None, None, Some(key), Some(owner), Some(epoch)) => {
                commands::release(conn, out, &key, &owner, epoch)
            }
            // clap's requires/conflicts rules make any other mix a usage
            // error before this point.
            _ => Err(CliError::InvalidInput(
                "pass either KEY OWNER EPOCH, --token TOKEN, or KEY --force --epoch N".into(),
            )),
        },
        // Dispatched by main: it exits with the command's own status.
        Command::Run { .. } => Ok(()),
        Command::Inspect { key } => commands::inspect(conn, out, &key),
        Command::Ls(list) => listing::ls(conn, out, &list),
        Command::Watch {
            list,
            interval,
            count,
            events: true,
        } => events::watch_events(conn, &session_url, out, &list, interval, count),
        Command::Watch {
            list,
            interval,
            count,
            events: false,
        } => listing::watch(conn, out, &list, interval, count),
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
        // Handled before: see `doctor` and the early returns above.
        Command::Extension { .. } | Command::Doctor { .. } | Command::Local { .. } => Ok(()),
    }
}
