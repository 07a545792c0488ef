//! A small builder for filtered, paginated SELECTs with `$n` placeholders, which both
//! engines accept.

use futures_util::TryStreamExt;
use gantry_types::query::{Condition, ListFilter, Value};
use sqlx::any::{AnyArguments, AnyRow};
use sqlx::Arguments;

use crate::{Store, StoreError};

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

    /// Adds `<column> IN (values…)`, or a clause nothing passes when `values` is empty;
    /// `column` must be a trusted identifier. The values are integers, written inline.
    pub(crate) fn one_of(&mut self, column: &str, values: &[i64]) {
        if values.is_empty() {
            self.clauses.push("1 = 0".to_owned());
            return;
        }
        let list: Vec<String> = values.iter().map(i64::to_string).collect();
        self.clauses
            .push(format!("{column} IN ({})", list.join(", ")));
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
                Condition::OneOf { column, values } => f.one_of(&qualified(column), values),
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

/// How one list endpoint's rows are read: one page of them, and how many there are.
pub(crate) struct Listing<T> {
    /// The selected columns.
    pub columns: &'static str,
    /// `<table> [<alias> <joins>]`.
    pub from: &'static str,
    /// `<table> [<alias>]`, what the count reads.
    pub count_from: &'static str,
    /// The alias the filter's columns are qualified with, when the select joins.
    pub alias: Option<&'static str>,
    /// The ordering column (`id`, or `<alias>.id`).
    pub order_by: &'static str,
    pub decode: fn(&AnyRow) -> Result<T, StoreError>,
    /// The id of a decoded item (the ordering column's value).
    pub id_of: fn(&T) -> i64,
}

impl Store {
    /// One page of the rows `filter` selects, oldest first, and the count of all of them.
    pub(crate) async fn list_page<T, F: ListFilter>(
        &self,
        listing: &Listing<T>,
        filter: &F,
        page: Page,
    ) -> Result<(Vec<T>, u64), StoreError> {
        let f = Filter::of(filter, listing.alias);
        if page.page <= 1 && page.per_page == u32::MAX {
            // Every row (what the controllers read): one query, joins and all, and the
            // count is what it returned. Without a LIMIT there is no OFFSET to walk, so
            // the page statement below would only add a count and, for a list that
            // joins, a walk of its ids. Each
            // row is decoded as it arrives (the raw rows are never all held at once),
            // and the items put in order here, by id: the database has no wide joined
            // rows to sort.
            let sql = format!(
                "SELECT {} FROM {}{}",
                listing.columns,
                listing.from,
                f.where_sql(),
            );
            let mut rows = sqlx::query_with(&sql, f.arguments()).fetch(&self.reads);
            let mut items: Vec<T> = Vec::new();
            while let Some(row) = rows.try_next().await? {
                items.push((listing.decode)(&row)?);
            }
            items.sort_by_key(|item| (listing.id_of)(item));
            let total = items.len() as u64;
            return Ok((items, total));
        }
        // One statement for the page and the count of all the rows it is a page of
        // (the count a scalar subquery, computed once, on every row): one round trip,
        // one connection and one snapshot, so the total always agrees with the page.
        // The count and the page read on two connections at once, then the joined rows
        // by id, cost two waits for the database per page and a wake-up of this process
        // for each; on a busy machine each one is a wait for a CPU.
        let sql = page_statement(listing, &f);
        let rows = sqlx::query_with(&sql, f.arguments_with_page(page))
            .fetch_all(&self.reads)
            .await?;
        let total = match rows.first() {
            Some(row) => crate::rows::int(row, "listing", LIST_TOTAL)?,
            // An empty first page counts nothing; past the last page, count apart.
            None if page.offset() == 0 && page.per_page > 0 => 0,
            None => {
                return Ok((Vec::new(), self.count(listing.count_from, &f).await?));
            }
        };
        let items = rows.iter().map(listing.decode).collect::<Result<_, _>>()?;
        Ok((items, u64::try_from(total).unwrap_or(0)))
    }
}

/// The statement of one page of `listing` with `f`'s conditions: its rows and, in the
/// column [`LIST_TOTAL`] of each, the count of all the rows the page is part of. Its
/// arguments are `f.arguments_with_page(page)`.
pub(crate) fn page_statement<T>(listing: &Listing<T>, f: &Filter) -> String {
    let where_sql = f.where_sql();
    let total = format!(
        "(SELECT COUNT(*) FROM {}{where_sql}) AS {LIST_TOTAL}",
        listing.count_from
    );
    if listing.from == listing.count_from {
        format!(
            "SELECT {total}, {} FROM {}{where_sql} ORDER BY {}{}",
            listing.columns,
            listing.from,
            listing.order_by,
            f.limit_sql()
        )
    } else {
        // A listing that joins: the page's ids are walked in its own table alone (the
        // primary key; on SQLite the index of ids), and only those rows are joined.
        // Selecting the joined rows with OFFSET would make PostgreSQL join every row
        // before the page only to skip them.
        format!(
            "SELECT {total}, {} FROM {} WHERE {order} IN \
             (SELECT {order} FROM {}{where_sql} ORDER BY {order}{}) ORDER BY {order}",
            listing.columns,
            listing.from,
            listing.count_from,
            f.limit_sql(),
            order = listing.order_by,
        )
    }
}

/// The column a page's statement returns its list's count in.
const LIST_TOTAL: &str = "list_total";

/// A list filter the store can list: one page of its items and their count.
pub trait Listed: ListFilter + Sync {
    fn list<'a>(
        &'a self,
        store: &'a Store,
        page: Page,
    ) -> impl std::future::Future<Output = Result<(Vec<Self::Item>, u64), StoreError>> + Send + 'a;
}

macro_rules! listed {
    ($($filter:ty => $method:ident,)*) => {
        $(
            impl Listed for $filter {
                fn list<'a>(
                    &'a self,
                    store: &'a Store,
                    page: Page,
                ) -> impl std::future::Future<Output = Result<(Vec<Self::Item>, u64), StoreError>>
                       + Send
                       + 'a {
                    store.$method(self, page)
                }
            }
        )*
    };
}

listed! {
    gantry_types::ModelFilter => list_models,
    gantry_types::InstanceFilter => list_instances,
    gantry_types::WorkerFilter => list_workers,
    gantry_types::UserFilter => list_users,
    gantry_types::ApiKeyFilter => list_api_keys,
}

/// How many ids one `IN (…)` list holds: well under the bind-parameter limits of both
/// engines (SQLite 32,766, PostgreSQL 65,535).
const IDS_PER_READ: usize = 500;

/// The rows of `select` (`SELECT … FROM … WHERE <id column> IN`, completed here with the
/// list) for `ids`, decoded, in no particular order; read on `connection` (inside a
/// transaction, to see its own writes).
pub(crate) async fn by_ids<T>(
    connection: &mut sqlx::AnyConnection,
    select: &str,
    ids: &[i64],
    decode: fn(&AnyRow) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let mut items = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(IDS_PER_READ) {
        let placeholders = (1..=chunk.len())
            .map(|n| format!("${n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!("{select} ({placeholders})");
        let query = chunk
            .iter()
            .fold(sqlx::query(&sql), |query, id| query.bind(*id));
        for row in query.fetch_all(&mut *connection).await? {
            items.push(decode(&row)?);
        }
    }
    Ok(items)
}
