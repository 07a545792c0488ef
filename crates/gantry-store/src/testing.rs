//! Support for tests: a fresh PostgreSQL database per test, and writes no product code
//! makes (a damaged placement record).
//!
//! Each PostgreSQL test gets a database of its
//! own on the throwaway server that `scripts/with-postgres.sh` starts, so tests run in
//! parallel without seeing each other's rows.

use sqlx::postgres::PgConnection;
use sqlx::Connection;

use crate::StoreError;

/// Creates an empty database with a unique name on the server at `base_url` (a URL
/// to any existing database there) and returns the URL of the new one.
pub async fn fresh_postgres_database(base_url: &str) -> Result<String, StoreError> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!(
        "gantry_test_{}_{}_{n}",
        std::process::id(),
        gantry_types::Timestamp::now().as_millis()
    );
    let mut conn = PgConnection::connect(base_url).await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    let (prefix, _) = base_url
        .rsplit_once('/')
        .ok_or_else(|| StoreError::Config(format!("no database name in {base_url}")))?;
    Ok(format!("{prefix}/{name}"))
}

/// Creates the schema as the gantry of schema `version` left it (migrations 1 to
/// `version`), for tests of upgrades: write the rows that version would have, then
/// [`crate::Store::open`] migrates the rest.
pub async fn create_schema_at(config: &crate::StoreConfig, version: i64) -> Result<(), StoreError> {
    if !(1..=crate::migrations::latest_version()).contains(&version) {
        return Err(StoreError::Config(format!(
            "schema version {version} is not one this build knows (1 to {})",
            crate::migrations::latest_version()
        )));
    }
    let store = crate::Store::open_with_schema(config, version).await?;
    store.close().await;
    Ok(())
}

impl crate::Store {
    /// Overwrites the stored placement record of an instance with `raw` text, as a damaged
    /// row or a record written by another version would read. For tests of what happens
    /// to records that do not decode; nothing in gantry writes such a record.
    pub async fn overwrite_placement_record_for_tests(
        &self,
        instance_id: i64,
        raw: &str,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE model_instances SET placement = $2 WHERE id = $1")
            .bind(instance_id)
            .bind(raw)
            .execute(&self.writes)
            .await?;
        Ok(())
    }
}

/// A list whose page statement a test can ask the plan of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PagedList {
    Workers,
    ModelInstances,
}

impl crate::Store {
    /// The steps of the query plan (SQLite's `EXPLAIN QUERY PLAN`, each step's
    /// `detail`) of the very statement that reads page 100 of 100 rows of `list`,
    /// unfiltered. SQLite only.
    pub async fn sqlite_plan_of_a_page_for_tests(
        &self,
        list: PagedList,
    ) -> Result<Vec<String>, StoreError> {
        use crate::query::{page_statement, Filter, Page};
        let filter = Filter::default();
        let statement = match list {
            PagedList::Workers => page_statement(&crate::workers::LISTING, &filter),
            PagedList::ModelInstances => page_statement(&crate::instances::LISTING, &filter),
        };
        let page = Page {
            page: 100,
            per_page: 100,
        };
        let rows = sqlx::query_with(
            &format!("EXPLAIN QUERY PLAN {statement}"),
            filter.arguments_with_page(page),
        )
        .fetch_all(&self.reads)
        .await?;
        rows.iter()
            .map(|row| sqlx::Row::try_get::<String, _>(row, "detail").map_err(StoreError::from))
            .collect()
    }
}
