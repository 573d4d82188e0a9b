//! Where results go: stdout, as text for people or one JSON value per line
//! for scripts (`--json`). Writes report I/O errors instead of panicking
//! like `println!` does when the reading end of a pipe has closed.

use std::io::Write;

use crate::json::Json;

/// Prints results in the chosen form.
#[derive(Debug, Clone, Copy)]
pub struct Printer {
    json: bool,
}

impl Printer {
    /// Text unless `json`.
    pub fn new(json: bool) -> Self {
        Self { json }
    }

    /// Whether `--json` was given.
    pub fn is_json(self) -> bool {
        self.json
    }

    /// Prints `text` (which ends in a newline, or gets one) or `json`.
    pub fn emit(self, text: &str, json: &Json) -> std::io::Result<()> {
        let mut stdout = std::io::stdout().lock();
        if self.json {
            writeln!(stdout, "{json}")?;
        } else if text.ends_with('\n') {
            stdout.write_all(text.as_bytes())?;
        } else {
            writeln!(stdout, "{text}")?;
        }
        stdout.flush()
    }
}
