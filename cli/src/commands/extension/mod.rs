//! `leasehold extension generate` and `leasehold extension install`: write
//! the PostgreSQL extension files that `leasehold::admin::extension_files`
//! generates from the library's SQL, into a directory of the caller's choice or into the
//! extension directory of the server `pg_config` describes.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Subcommand;

use crate::context::Context;
use crate::failure::CliError;
use crate::help::SEE_EXIT_CODES;
use crate::json::Json;
use crate::output::Printer;
use leasehold::admin;

/// The PostgreSQL extension `leasehold` (`CREATE EXTENSION leasehold`),
/// an alternative to `install`.
#[derive(Debug, Subcommand)]
#[command(after_help = SEE_EXIT_CODES)]
pub enum Action {
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

/// Runs one `extension` action; needs no database connection.
pub fn run(action: Action, ctx: &Context) -> Result<(), CliError> {
    match action {
        Action::Generate { out: dir } => generate(&dir, ctx.out),
        Action::Install { pg_config, print } => install(pg_config.as_deref(), print, ctx.out),
    }
}

/// `leasehold extension generate --out DIR`.
fn generate(dir: &Path, out: Printer) -> Result<(), CliError> {
    let names = write_files(dir).map_err(|error| match error {
        WriteError::Generate(error) => error,
        WriteError::Io(message) => CliError::Extension(message),
    })?;
    let text = format!(
        "{}\nthen run CREATE EXTENSION leasehold; the server loads them from \
         $(pg_config --sharedir)/extension, where `leasehold extension install` writes them",
        wrote(&names, dir)
    );
    Ok(out.emit(&text, &written_json(&names, dir))?)
}

/// `leasehold extension install [--pg-config PATH] [--print]`: the files
/// into `$(pg_config --sharedir)/extension`, or with `print` the one
/// command that writes them there (printed also, in the error, when that
/// directory is not writable).
fn install(pg_config: Option<&Path>, print: bool, out: Printer) -> Result<(), CliError> {
    let dir = extension_dir(pg_config.unwrap_or(Path::new("pg_config")))?;
    let command = install_command(&dir);
    if print {
        let json = Json::Object(vec![
            ("dir", Json::str(dir.display().to_string())),
            ("command", Json::str(&command)),
        ]);
        return Ok(out.emit(&command, &json)?);
    }
    let names = write_files(&dir).map_err(|error| match error {
        WriteError::Generate(error) => error,
        WriteError::Io(reason) => CliError::ExtensionDirNotWritable {
            dir: dir.display().to_string(),
            reason,
            command: command.clone(),
        },
    })?;
    let text = format!(
        "{}\nnow run CREATE EXTENSION leasehold in the database (or ALTER EXTENSION leasehold \
         UPDATE where an older version is installed)",
        wrote(&names, &dir)
    );
    Ok(out.emit(&text, &written_json(&names, &dir))?)
}

/// Why [`write_files`] failed.
enum WriteError {
    /// The files could not be generated from the migrations.
    Generate(CliError),
    /// The directory could not be created or a file not written: what the
    /// operating system said, with the path.
    Io(String),
}

/// Generates the files and writes them into `dir` (created if missing;
/// files there are replaced); their names.
fn write_files(dir: &Path) -> Result<Vec<String>, WriteError> {
    let files = admin::extension_files().map_err(|error| {
        WriteError::Generate(CliError::Extension(crate::failure::report(&error)))
    })?;
    fs::create_dir_all(dir)
        .map_err(|error| WriteError::Io(format!("create {}: {error}", dir.display())))?;
    let mut names = Vec::new();
    for file in &files {
        let path = dir.join(&file.name);
        fs::write(&path, &file.contents)
            .map_err(|error| WriteError::Io(format!("write {}: {error}", path.display())))?;
        names.push(file.name.clone());
    }
    Ok(names)
}

/// The first line of the report: how many files, which version, where.
fn wrote(names: &[String], dir: &Path) -> String {
    format!(
        "wrote {} files for extension leasehold version {} into {}: {}",
        names.len(),
        admin::extension_version(),
        dir.display(),
        names.join(", ")
    )
}

/// The `--json` form of a successful write.
fn written_json(names: &[String], dir: &Path) -> Json {
    Json::Object(vec![
        ("version", Json::str(admin::extension_version())),
        ("dir", Json::str(dir.display().to_string())),
        ("files", Json::Array(names.iter().map(Json::str).collect())),
    ])
}

/// `<sharedir>/extension` of the server `pg_config` belongs to.
fn extension_dir(pg_config: &Path) -> Result<PathBuf, CliError> {
    let failed = |message: String| CliError::PgConfig {
        program: pg_config.display().to_string(),
        message,
    };
    let output = Command::new(pg_config)
        .arg("--sharedir")
        .output()
        .map_err(|error| failed(error.to_string()))?;
    if !output.status.success() {
        return Err(failed(format!(
            "`--sharedir` ended with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let sharedir = String::from_utf8(output.stdout)
        .map_err(|_| failed("`--sharedir` printed a path that is not UTF-8".to_owned()))?;
    let sharedir = sharedir.trim_end_matches(['\n', '\r']);
    if sharedir.is_empty() {
        return Err(failed("`--sharedir` printed nothing".to_owned()));
    }
    Ok(Path::new(sharedir).join("extension"))
}

/// The command that writes the files into `dir` as root: this very binary
/// by its full path (`sudo` does not search the caller's PATH, where a
/// `cargo install`ed binary lives) and the directory already resolved (root
/// may find another `pg_config`, or none).
fn install_command(dir: &Path) -> String {
    let program = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("leasehold"));
    format!(
        "sudo {} extension generate --out {}",
        shell_quote(program.as_os_str()),
        shell_quote(dir.as_os_str())
    )
}

/// `text` as one word for a POSIX shell: as is when it holds only
/// characters no shell treats specially, else in single quotes.
fn shell_quote(text: &OsStr) -> String {
    let text = text.to_string_lossy();
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+,:=@%".contains(c));
    if plain {
        text.into_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::shell_quote;
    use std::ffi::OsStr;

    #[test]
    fn shell_quote_leaves_plain_paths_and_quotes_the_rest() {
        assert_eq!(
            shell_quote(OsStr::new("/usr/share/postgresql/16/extension")),
            "/usr/share/postgresql/16/extension"
        );
        assert_eq!(shell_quote(OsStr::new("/a b/c")), "'/a b/c'");
        assert_eq!(shell_quote(OsStr::new("/it's")), r"'/it'\''s'");
        assert_eq!(shell_quote(OsStr::new("$HOME")), "'$HOME'");
        assert_eq!(shell_quote(OsStr::new("")), "''");
    }
}
