//! How the client commands print: an aligned plain-text table (or, for one object, its
//! fields one per line) by default, the API's JSON with `-o json`; and the few ways of
//! writing values that the tables share (ages, lists, absent values).

use std::fmt::Write as _;

use gantry_types::Timestamp;
use serde::Serialize;

/// `-o table|json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

/// What a cell shows for a value that is absent.
pub const NONE: &str = "-";

/// Rows under a header, printed with every column as wide as its widest cell.
#[derive(Debug, Clone)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; it has as many cells as the header.
    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(
            cells.len(),
            self.header.len(),
            "a row has a cell per column"
        );
        self.rows.push(cells);
    }

    /// The table as text: columns two spaces apart, no space at the ends of lines.
    pub fn render(&self) -> String {
        render_rows(std::iter::once(&self.header).chain(&self.rows))
    }
}

/// One object's fields, one per line: `NAME   value`.
pub fn fields(fields: &[(&str, String)]) -> String {
    let rows: Vec<Vec<String>> = fields
        .iter()
        .map(|(name, value)| vec![(*name).to_owned(), value.clone()])
        .collect();
    render_rows(rows.iter())
}

fn render_rows<'a>(rows: impl Iterator<Item = &'a Vec<String>> + Clone) -> String {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows.clone() {
        for (column, cell) in row.iter().enumerate() {
            let width = cell.chars().count();
            match widths.get_mut(column) {
                Some(widest) => *widest = (*widest).max(width),
                None => widths.push(width),
            }
        }
    }
    let mut text = String::new();
    for row in rows {
        let mut line = String::new();
        for (column, cell) in row.iter().enumerate() {
            if column + 1 < row.len() {
                let pad = widths[column] - cell.chars().count() + 2;
                let _ = write!(line, "{cell}{:pad$}", "");
            } else {
                line.push_str(cell);
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// Prints `value` as pretty JSON.
pub fn print_json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    println!("{text}");
    Ok(())
}

/// Prints a table, or the items as a JSON array.
pub fn print_list<T: Serialize>(
    format: OutputFormat,
    items: &[T],
    table: impl FnOnce(&[T]) -> Table,
) -> anyhow::Result<()> {
    match format {
        OutputFormat::Json => print_json(items),
        OutputFormat::Table => {
            print!("{}", table(items).render());
            Ok(())
        }
    }
}

/// How long ago `then` was, coarsely: `42s`, `5m`, `3h`, `12d`.
pub fn age(then: Timestamp, now: Timestamp) -> String {
    let seconds = (now.as_millis() - then.as_millis()).max(0) / 1000;
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m", seconds / 60),
        3600..86_400 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86_400),
    }
}

/// An optional value, or [`NONE`].
pub fn or_none<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| NONE.to_owned(), |v| v.to_string())
}

/// Items joined with commas, or [`NONE`] for none.
pub fn list<T: ToString>(items: impl IntoIterator<Item = T>) -> String {
    let text = items
        .into_iter()
        .map(|item| item.to_string())
        .collect::<Vec<_>>()
        .join(",");
    if text.is_empty() {
        NONE.to_owned()
    } else {
        text
    }
}

/// Bytes in GiB, to one decimal: `79.6GiB`.
pub fn gib(bytes: u64) -> String {
    // Display only: the precision of f64 is plenty for a tenth of a GiB.
    #[allow(clippy::cast_precision_loss)]
    let gib = bytes as f64 / (1024.0 * 1024.0 * 1024.0);
    format!("{gib:.1}GiB")
}

/// `key=value` pairs joined with commas, or [`NONE`].
pub fn labels(labels: &std::collections::BTreeMap<String, String>) -> String {
    list(labels.iter().map(|(k, v)| format!("{k}={v}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell_without_trailing_space() {
        let mut table = Table::new(&["NAME", "STATE", "GPUS"]);
        table.row(vec!["tiny-0".into(), "running".into(), "0,1".into()]);
        table.row(vec!["a-much-longer-name".into(), "é".into(), String::new()]);
        assert_eq!(
            table.render(),
            "NAME                STATE    GPUS\n\
             tiny-0              running  0,1\n\
             a-much-longer-name  é\n"
        );
    }

    #[test]
    fn an_empty_table_is_its_header() {
        assert_eq!(Table::new(&["ID", "NAME"]).render(), "ID  NAME\n");
    }

    #[test]
    fn fields_align_their_values() {
        assert_eq!(
            fields(&[("NAME", "tiny".into()), ("REPLICAS", "2".into())]),
            "NAME      tiny\nREPLICAS  2\n"
        );
    }

    #[test]
    fn ages_are_coarse() {
        let now = Timestamp::from_millis(10_000_000_000);
        let ago = |seconds: i64| age(Timestamp::from_millis(10_000_000_000 - seconds * 1000), now);
        assert_eq!(ago(0), "0s");
        assert_eq!(ago(59), "59s");
        assert_eq!(ago(60), "1m");
        assert_eq!(ago(3 * 3600 + 5), "3h");
        assert_eq!(ago(12 * 86_400), "12d");
        // A clock a little ahead of this machine's is not "in the future".
        assert_eq!(ago(-5), "0s");
    }

    #[test]
    fn absent_values_and_empty_lists_show_a_dash() {
        assert_eq!(or_none(None::<u16>), "-");
        assert_eq!(or_none(Some(8080)), "8080");
        assert_eq!(list(Vec::<u32>::new()), "-");
        assert_eq!(list([0, 1]), "0,1");
    }

    #[test]
    fn memory_is_shown_in_gib_to_a_tenth() {
        assert_eq!(gib(8 * 1024 * 1024 * 1024), "8.0GiB");
        assert_eq!(gib(85_520_809_984), "79.6GiB");
    }
}
