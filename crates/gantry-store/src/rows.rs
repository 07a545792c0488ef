//! Decoding helpers shared by the per-table modules: typed column reads whose errors
//! name the table and column.

use serde::de::DeserializeOwned;
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::StoreError;

pub(crate) fn int(row: &AnyRow, table: &'static str, column: &str) -> Result<i64, StoreError> {
    row.try_get::<i64, _>(column)
        .map_err(|e| StoreError::corrupt(table, format!("column {column}: {e}")))
}

pub(crate) fn opt_int(
    row: &AnyRow,
    table: &'static str,
    column: &str,
) -> Result<Option<i64>, StoreError> {
    row.try_get::<Option<i64>, _>(column)
        .map_err(|e| StoreError::corrupt(table, format!("column {column}: {e}")))
}

pub(crate) fn text(row: &AnyRow, table: &'static str, column: &str) -> Result<String, StoreError> {
    row.try_get::<String, _>(column)
        .map_err(|e| StoreError::corrupt(table, format!("column {column}: {e}")))
}

pub(crate) fn opt_text(
    row: &AnyRow,
    table: &'static str,
    column: &str,
) -> Result<Option<String>, StoreError> {
    row.try_get::<Option<String>, _>(column)
        .map_err(|e| StoreError::corrupt(table, format!("column {column}: {e}")))
}

pub(crate) fn json<T: DeserializeOwned>(
    row: &AnyRow,
    table: &'static str,
    column: &str,
) -> Result<T, StoreError> {
    let raw = text(row, table, column)?;
    serde_json::from_str(&raw)
        .map_err(|e| StoreError::corrupt(table, format!("column {column}: {e}")))
}

pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> String {
    // Serialising the project's own plain data types (maps, vectors, enums) to JSON
    // cannot fail; fall back to null rather than panic if that ever changes.
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_string())
}

pub(crate) fn u32_of(value: i64, table: &'static str, column: &str) -> Result<u32, StoreError> {
    u32::try_from(value)
        .map_err(|_| StoreError::corrupt(table, format!("column {column}: {value} out of range")))
}

pub(crate) fn parse_enum<T>(
    value: &str,
    parse: impl Fn(&str) -> Option<T>,
    table: &'static str,
    column: &str,
) -> Result<T, StoreError> {
    parse(value).ok_or_else(|| {
        StoreError::corrupt(table, format!("column {column}: unknown value {value:?}"))
    })
}
