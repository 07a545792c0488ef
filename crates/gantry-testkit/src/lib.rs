//! Helpers shared by the integration tests of several crates: a store on either engine
//! and the macro that runs one test body against both.
//!
//! PostgreSQL tests need `GANTRY_TEST_POSTGRES_URL`, which `scripts/with-postgres.sh`
//! (and so `scripts/test.sh`) sets. Without it they fail with a message saying so:
//! they never skip silently.

use gantry_store::{Store, StoreConfig};

/// The database engines every store-backed test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestEngine {
    Sqlite,
    Postgres,
}

/// A database for one test. Keeps the SQLite directory alive while the test runs.
#[derive(Debug)]
pub struct TestDatabase {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestDatabase {
    /// A fresh, empty database on the engine.
    pub async fn new(engine: TestEngine) -> Self {
        match engine {
            TestEngine::Sqlite => {
                let dir = tempfile::tempdir().expect("create a temporary directory");
                let url = format!("sqlite://{}/gantry.db", dir.path().display());
                Self {
                    url,
                    _dir: Some(dir),
                }
            }
            TestEngine::Postgres => {
                let base = std::env::var("GANTRY_TEST_POSTGRES_URL").unwrap_or_else(|_| {
                    panic!(
                        "GANTRY_TEST_POSTGRES_URL is not set: run the tests with scripts/test.sh \
                         (it starts a throwaway PostgreSQL), or wrap the command in \
                         scripts/with-postgres.sh"
                    )
                });
                let url = gantry_store::testing::fresh_postgres_database(&base)
                    .await
                    .expect("create a test database on the PostgreSQL server");
                Self { url, _dir: None }
            }
        }
    }

    pub async fn open(&self) -> Store {
        Store::open(&StoreConfig {
            url: self.url.clone(),
            max_connections: 8,
        })
        .await
        .expect("open the test store")
    }
}

/// Runs `async fn $name(engine: TestEngine)` as two tests, `sqlite::$name` and
/// `postgres::$name`.
#[macro_export]
macro_rules! test_both_engines {
    ($($name:ident),+ $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::TestEngine::Sqlite).await;
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::TestEngine::Postgres).await;
                }
            )+
        }
    };
}
