//! `leasehold local start|stop|status|env`: the persistent development
//! server (see `leasehold_local::DevServer` for where it lives and why).

use leasehold_local::{DevServer, DevStatus};

use crate::args::LocalCommand;
use crate::connect;
use crate::failure::{report, CliError};
use crate::json::Json;
use crate::output::Printer;

/// Runs one `local` action.
pub fn run(action: LocalCommand, out: Printer) -> Result<(), CliError> {
    let server = DevServer::from_env()?;
    let dir = server.root().display().to_string();
    match action {
        LocalCommand::Start => {
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
        LocalCommand::Stop => {
            let was_running = server.stop()?;
            let text = if was_running {
                format!("development server in {dir} stopped (its data stays; `leasehold local start` starts it again)")
            } else {
                format!("development server in {dir} was not running")
            };
            Ok(out.emit(&text, &fields("stopped", "", &dir))?)
        }
        LocalCommand::Status => match server.status()? {
            DevStatus::Running { url } => Ok(out.emit(
                &format!("running at {url} (data in {dir})"),
                &fields("running", &url, &dir),
            )?),
            _ => Err(CliError::LocalNotRunning { dir }),
        },
        LocalCommand::Env => match server.status()? {
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

/// The URL of the development server when it runs, for commands given no
/// database; `None` when it does not run or cannot be looked at.
pub fn running_url() -> Option<String> {
    match DevServer::from_env().ok()?.status().ok()? {
        DevStatus::Running { url } => Some(url),
        _ => None,
    }
}
