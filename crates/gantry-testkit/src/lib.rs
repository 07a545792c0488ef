//! Helpers shared by the integration tests of several crates: a store on either engine,
//! the macro that runs one test body against both, blocks of backend ports, and
//! [`eventually`], the one loop that waits for something the system does a moment later;
//! and [`hub`] and [`modelscope`], test doubles of the Hugging Face Hub and ModelScope to
//! download models from (what they share, [`RepoFile`] and their serving, in `double.rs`);
//! [`postgres::OwnPostgres`], a PostgreSQL server a test can stop and start; [`browser`],
//! a page checked in a real chromium by a Playwright script; [`gateway`], what the tests of
//! the OpenAI-compatible gateway share, alone or inside the server.
//!
//! PostgreSQL tests need `GANTRY_TEST_POSTGRES_URL`, which `scripts/with-postgres.sh`
//! (and so `scripts/test.sh`) sets. Without it they fail with a message saying so:
//! they never skip silently.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use gantry_store::{Store, StoreConfig};

pub mod browser;
pub mod cloud;
mod double;
pub mod gateway;
pub mod hub;
pub mod modelscope;
pub mod postgres;
mod range;
pub mod s3;

pub use double::RepoFile;

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

/// Reserves a block of `count` (at most 20) consecutive ports for backends started by
/// one test, distinct from every other test process's block: each block is claimed by
/// an exclusive lock on a file under the temporary directory, held until the process
/// exits. The blocks lie in 20000–31999, below Linux's ephemeral range, so ports the
/// kernel hands out for `bind(0)` and outgoing connections never land in them.
pub fn reserve_ports(count: u16) -> std::ops::RangeInclusive<u16> {
    use nix::fcntl::{Flock, FlockArg};
    assert!((1..=20).contains(&count), "reserve 1 to 20 ports");
    let dir = std::env::temp_dir().join("gantry-test-ports");
    std::fs::create_dir_all(&dir).expect("create the port lock directory");
    for block in 0..600u16 {
        let path = dir.join(format!("block-{block}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .expect("open a port lock file");
        if let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            // Keep the lock (and so the descriptor) for the life of the process.
            std::mem::forget(lock);
            let start = 20000 + block * 20;
            return start..=start + count - 1;
        }
    }
    panic!("all 600 test port blocks are taken");
}

/// Deterministic bytes that look like weights (no runs a cache or transport could shrink).
pub fn pseudo_random(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect()
}

/// The real llama.cpp `llama-server` that `GANTRY_LLAMA_SERVER` names: scripts/test.sh sets
/// it from scripts/build-llama-server.sh, which builds the server once (about ten minutes)
/// and caches it. Without it, or when it names no file, the test fails saying so.
pub fn llama_server() -> std::path::PathBuf {
    let Some(path) = std::env::var_os("GANTRY_LLAMA_SERVER") else {
        panic!(
            "GANTRY_LLAMA_SERVER is not set. This test needs a real llama.cpp llama-server: \
             run it with scripts/test.sh, or set \
             GANTRY_LLAMA_SERVER=$(scripts/build-llama-server.sh | tail -1)"
        );
    };
    let path = std::path::PathBuf::from(path);
    assert!(
        path.is_file(),
        "GANTRY_LLAMA_SERVER={} is not a file; run scripts/build-llama-server.sh and use the \
         path it prints",
        path.display()
    );
    path
}

/// Sends `request` and reads its answer as JSON, whatever its status; a transport error
/// or a body that is not the JSON of `T` fails the test.
pub async fn answer_json<T: serde::de::DeserializeOwned>(request: reqwest::RequestBuilder) -> T {
    request
        .send()
        .await
        .expect("the request is answered")
        .json()
        .await
        .expect("the answer is the JSON expected")
}

/// Sends `request` and reads its answer as text, whatever its status; a transport error
/// fails the test.
pub async fn answer_text(request: reqwest::RequestBuilder) -> String {
    request
        .send()
        .await
        .expect("the request is answered")
        .text()
        .await
        .expect("the answer is text")
}

/// A loopback port nothing listens on now (the kernel's choice for `bind(0)`, released
/// at once): for a server that must be told its port, or an address nobody answers at.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}

/// Asks `probe` every `every` until its answer satisfies `done`, and returns that answer:
/// for what a controller, a worker or a flusher does a moment after the test acted. After
/// `within` it fails naming `what`, with the last answer (or error) and `context()` (a log
/// tail, say).
pub async fn eventually<T, E, Fut>(
    what: &str,
    within: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Fut,
    done: impl Fn(&T) -> bool,
    context: impl FnOnce() -> String,
) -> T
where
    T: Debug,
    E: Debug,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let answer = probe().await;
        match answer {
            Ok(value) if done(&value) => return value,
            answer if tokio::time::Instant::now() > deadline => {
                panic!(
                    "waited {within:?} for {what}; the last answer: {answer:#?}\n{}",
                    context()
                )
            }
            _ => tokio::time::sleep(every).await,
        }
    }
}
