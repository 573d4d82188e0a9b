//! `leasehold extension generate`: writes the PostgreSQL extension files
//! that [`crate::extension_files`] generates from the migrations.

use std::fs;
use std::path::Path;

use crate::extension_files;
use crate::failure::CliError;
use crate::json::Json;
use crate::output::Printer;

/// `leasehold extension generate --out DIR`.
pub fn generate(dir: &Path, out: Printer) -> Result<(), CliError> {
    let files = extension_files::extension_files()
        .map_err(|error| CliError::Extension(crate::failure::report(&error)))?;
    fs::create_dir_all(dir)
        .map_err(|error| CliError::Extension(format!("create {}: {error}", dir.display())))?;
    let mut names = Vec::new();
    for file in &files {
        let path = dir.join(&file.name);
        fs::write(&path, &file.contents)
            .map_err(|error| CliError::Extension(format!("write {}: {error}", path.display())))?;
        names.push(file.name.clone());
    }
    let text = format!(
        "wrote {} files for extension leasehold version {} into {}: {}\n\
         copy them into $(pg_config --sharedir)/extension, then run CREATE EXTENSION leasehold",
        names.len(),
        extension_files::extension_version(),
        dir.display(),
        names.join(", ")
    );
    let json = Json::Object(vec![
        ("version", Json::str(extension_files::extension_version())),
        ("dir", Json::str(dir.display().to_string())),
        ("files", Json::Array(names.iter().map(Json::str).collect())),
    ]);
    Ok(out.emit(&text, &json)?)
}
