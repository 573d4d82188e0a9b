//! Plain-text tables: a header row and left-aligned columns, two spaces
//! apart. No borders, so the output greps and `cut`s well.

/// Renders `rows` under `header`, each line ending in a newline.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (index, cell) in row.iter().enumerate() {
            if let Some(width) = widths.get_mut(index) {
                *width = (*width).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (index, cell) in row.iter().enumerate() {
            if index > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            let width = widths.get(index).copied().unwrap_or(0);
            line.extend(std::iter::repeat_n(
                ' ',
                width.saturating_sub(cell.chars().count()),
            ));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let text = render(
            &["KEY", "EPOCH"],
            &[
                vec!["job-1".into(), "7".into()],
                vec!["j".into(), "12".into()],
            ],
        );
        assert_eq!(text, "KEY    EPOCH\njob-1  7\nj      12\n");
    }
}
