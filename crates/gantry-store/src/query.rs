//! A small builder for filtered, paginated SELECTs with `$n` placeholders, which both
//! engines accept.

use gantry_types::query::{Condition, ListFilter, Value};
use sqlx::any::AnyArguments;
use sqlx::Arguments;

/// Which slice of a list to return. `page` is 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    pub page: u32,
    pub per_page: u32,
}

impl Page {
    pub fn offset(self) -> i64 {
        i64::from(self.page.saturating_sub(1)) * i64::from(self.per_page)
    }
}

/// A bound value.
#[derive(Debug, Clone)]
pub(crate) enum Arg {
    Int(i64),
    Text(String),
}

/// Collects `WHERE` clauses and their arguments.
#[derive(Debug, Default)]
pub(crate) struct Filter {
    clauses: Vec<String>,
    args: Vec<Arg>,
}

impl Filter {
    /// Adds `<column> = <value>`; `column` must be a trusted identifier.
    pub(crate) fn eq(&mut self, column: &str, value: Arg) {
        self.args.push(value);
        self.clauses
            .push(format!("{column} = ${}", self.args.len()));
    }

    /// Adds "`<column>` contains `needle`, ignoring ASCII case" (`LOWER(column) LIKE
    /// %needle%`, with the needle lowered the same way and its wildcards escaped).
    pub(crate) fn contains(&mut self, column: &str, needle: &str) {
        let escaped = needle
            .to_ascii_lowercase()
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        self.args.push(Arg::Text(format!("%{escaped}%")));
        self.clauses.push(format!(
            "LOWER({column}) LIKE ${} ESCAPE '\\'",
            self.args.len()
        ));
    }

    /// The `WHERE` of a list filter's conditions: the same conditions a watch applies
    /// with [`ListFilter::matches`]. Each condition's column is the table's column of that
    /// name, prefixed with `table_alias.` when given.
    pub(crate) fn of<F: ListFilter>(filter: &F, table_alias: Option<&str>) -> Self {
        let mut f = Filter::default();
        let qualified = |column: &str| match table_alias {
            Some(alias) => format!("{alias}.{column}"),
            None => column.to_owned(),
        };
        for condition in filter.conditions() {
            match condition {
                Condition::Equals { column, value } => {
                    let arg = match value {
                        Value::Int(v) => Arg::Int(v),
                        Value::Text(v) => Arg::Text(v.to_owned()),
                    };
                    f.eq(&qualified(column), arg);
                }
                Condition::Contains { column, text } => f.contains(&qualified(column), text),
            }
        }
        f
    }

    pub(crate) fn where_sql(&self) -> String {
        if self.clauses.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", self.clauses.join(" AND "))
        }
    }

    /// Placeholders for `LIMIT $a OFFSET $b`, appended after the filter's own.
    pub(crate) fn limit_sql(&self) -> String {
        let n = self.args.len();
        format!(" LIMIT ${} OFFSET ${}", n + 1, n + 2)
    }

    pub(crate) fn arguments(&self) -> AnyArguments<'static> {
        let mut arguments = AnyArguments::default();
        for arg in &self.args {
            // Adding an i64 or a String to AnyArguments cannot fail: both are
            // supported by every engine.
            let _ = match arg {
                Arg::Int(v) => arguments.add(*v),
                Arg::Text(v) => arguments.add(v.clone()),
            };
        }
        arguments
    }

    pub(crate) fn arguments_with_page(&self, page: Page) -> AnyArguments<'static> {
        let mut arguments = self.arguments();
        let _ = arguments.add(i64::from(page.per_page));
        let _ = arguments.add(page.offset());
        arguments
    }
}
