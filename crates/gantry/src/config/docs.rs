//! The configuration table of `docs/configuration.md`, generated from the key table, and
//! the test that keeps the page in step with it.

use std::fmt::Write;

use super::{DefaultText, KEYS};

/// The Markdown table: one row per key, in the table's order.
fn markdown_table() -> String {
    let mut table = String::from("| key | default | meaning |\n|---|---|---|\n");
    for key in KEYS {
        let default = match (key.default)() {
            DefaultText::Nothing => "—".to_owned(),
            DefaultText::Value(value) => format!("`{value}`"),
            DefaultText::Described(words) => words,
        };
        let mut meaning = key.doc.trim().to_owned();
        for also in key.also {
            write!(meaning, " Flag `--{also}` also works.").expect("writing to a String");
        }
        writeln!(
            table,
            "| `{}` | {} | {} |",
            key.name,
            default.replace('|', "\\|"),
            meaning.replace('|', "\\|")
        )
        .expect("writing to a String");
    }
    table
}

/// The page that holds the table, relative to the repository root.
const PAGE: &str = "docs/configuration.md";

/// The table on the page: the lines from its header row to the first line that is not a
/// table row.
fn page_table(page: &str) -> Option<String> {
    let start = page.find("| key | default | meaning |")?;
    Some(
        page[start..]
            .lines()
            .take_while(|line| line.starts_with('|'))
            .map(|line| format!("{line}\n"))
            .collect(),
    )
}

#[test]
fn configuration_page_table_matches_the_key_table() {
    let path = format!("{}/../../{PAGE}", env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {PAGE}: {e}"));
    let expected = markdown_table();
    let actual = page_table(&page).unwrap_or_default();
    assert!(
        actual == expected,
        "{PAGE}'s configuration table (from its `| key | default | meaning |` row to the \
         first line that is not a table row) differs from the keys declared in \
         crates/gantry/src/config/keys.rs; replace that table in {PAGE} with:\n\n{expected}"
    );
}

#[test]
fn the_generated_table_has_one_row_per_key() {
    let table = markdown_table();
    assert_eq!(table.lines().count(), KEYS.len() + 2);
    assert!(
        table.contains("| `heartbeat_interval` | `15s` |"),
        "{table}"
    );
    assert!(table.contains("| `max_request_body` | `1MiB` |"), "{table}");
    assert!(table.contains("Flag `--name` also works."), "{table}");
}
