//! `leasehold local start|stop|status|env`: the persistent development
//! server (see `leasehold_local::DevServer` for where it lives and why).

use clap::Subcommand;
use leasehold_local::{DevServer, DevStatus};

use crate::connect;
use crate::context::Context;
use crate::failure::{report, CliError};
use crate::help::SEE_EXIT_CODES;
use crate::json::Json;

/// A persistent PostgreSQL for development on this machine, with
/// leasehold installed: `leasehold local start`, then every command
/// without --database-url uses it. Its data lives in
/// $XDG_DATA_HOME/leasehold/local (~/.local/share/leasehold/local;
/// /var/lib/leasehold/local for root; LEASEHOLD_LOCAL_DIR overrides).
#[derive(Debug, Subcommand)]
#[command(after_help = SEE_EXIT_CODES)]
pub enum Action {
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

/// Runs one `local` action; needs no database but the one it manages.
pub fn run(action: Action, ctx: &Context) -> Result<(), CliError> {
    let out = ctx.out;
    let server = DevServer::from_env()?;
    let dir = server.root().display().to_string();
    match action {
        Action::Start => {
            let url = server.start()?;
            // Installed on every start (idempotent), so commands and an
            // application can use it at once, also after an upgrade.
            let mut conn = connect::establish(&url)?;
            leasehold::install(&mut conn).map_err(|error| CliError::Database(report(&error)))?;
            let text = format!(
                "development server running at {url} (data in {dir}), leasehold installed\n\
                 commands without --database-url use it; for other programs: eval \"$(leasehold local env)\""
            );
            Ok(out.emit(&text, &fields("running", &url, &dir))?)
        }
        Action::Stop => {
            let was_running = server.stop()?;
            let text = if was_running {
                format!("development server in {dir} stopped (its data stays; `leasehold local start` starts it again)")
            } else {
                format!("development server in {dir} was not running")
            };
            Ok(out.emit(&text, &fields("stopped", "", &dir))?)
        }
        Action::Status => match server.status()? {
            DevStatus::Running { url } => Ok(out.emit(
                &format!("running at {url} (data in {dir})"),
                &fields("running", &url, &dir),
            )?),
            _ => Err(CliError::LocalNotRunning { dir }),
        },
        Action::Env => match server.status()? {
            DevStatus::Running { url } => Ok(out.emit(
                &format!("export DATABASE_URL='{url}'"),
                &fields("running", &url, &dir),
            )?),
            _ => Err(CliError::LocalNotRunning { dir }),
        },
    }
}

fn fields(status: &str, url: &str, dir: &str) -> Json {
    Json::Object(vec![
        ("status", Json::str(status)),
        ("url", Json::str(url)),
        ("dir", Json::str(dir)),
    ])
}
