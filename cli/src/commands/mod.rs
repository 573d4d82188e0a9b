//! The subcommands, one module each. A module owns its arguments (`Args`,
//! whose doc comment is the subcommand's help, or `Action` for the ones
//! with subcommands of their own) and its execution (`run`); [`run`] is
//! the one place that sends a parsed subcommand to its module. Adding a
//! subcommand is a module, a variant of [`Command`] and an arm.

mod acquire;
mod demo;
mod doctor;
mod extension;
mod fence;
mod fenced_table;
mod force_release;
mod generation;
mod inspect;
mod install;
mod local;
mod ls;
mod namespace;
mod prune;
mod release;
mod renew;
mod run;
mod watch;

use clap::Subcommand;

use crate::context::Context;
use crate::failure::{CliError, Exit};

/// The subcommands, in the order `leasehold --help` lists them.
#[derive(Debug, Subcommand)]
pub enum Command {
    Install(install::Args),
    #[command(subcommand)]
    Local(local::Action),
    #[command(subcommand)]
    Extension(extension::Action),
    Acquire(acquire::Args),
    Renew(renew::Args),
    Release(release::Args),
    Run(run::Args),
    Inspect(inspect::Args),
    Ls(ls::Args),
    Watch(watch::Args),
    Fence(fence::Args),
    #[command(subcommand)]
    Table(fenced_table::Action),
    #[command(subcommand)]
    Namespace(namespace::Action),
    ForceRelease(force_release::Args),
    #[command(subcommand)]
    Generation(generation::Action),
    Doctor(doctor::Args),
    Prune(prune::Args),
    Demo(demo::Args),
}

/// Runs `command`; returns the process's exit code. Most commands exit 0
/// when they did what was asked; `doctor` says how healthy the database is
/// in its code, and `run` passes on its CMD's status.
pub fn run(command: Command, ctx: &Context) -> Result<u8, CliError> {
    let done = |()| Exit::Ok.code();
    match command {
        Command::Install(args) => install::run(args, ctx).map(done),
        Command::Local(action) => local::run(action, ctx).map(done),
        Command::Extension(action) => extension::run(action, ctx).map(done),
        Command::Acquire(args) => acquire::run(args, ctx).map(done),
        Command::Renew(args) => renew::run(args, ctx).map(done),
        Command::Release(args) => release::run(args, ctx).map(done),
        Command::Run(args) => run::run(args, ctx),
        Command::Inspect(args) => inspect::run(args, ctx).map(done),
        Command::Ls(args) => ls::run(args, ctx).map(done),
        Command::Watch(args) => watch::run(args, ctx).map(done),
        Command::Fence(args) => fence::run(args, ctx).map(done),
        Command::Table(action) => fenced_table::run(action, ctx).map(done),
        Command::Namespace(action) => namespace::run(action, ctx).map(done),
        Command::ForceRelease(args) => force_release::run(args, ctx).map(done),
        Command::Generation(action) => generation::run(action, ctx).map(done),
        Command::Doctor(args) => doctor::run(args, ctx).map(Exit::code),
        Command::Prune(args) => prune::run(args, ctx).map(done),
        Command::Demo(args) => demo::run(args, ctx).map(done),
    }
}
