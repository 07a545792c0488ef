//! What the tests of both doubles share: fixture bytes, running an official Python client's
//! driver script and reading its outcomes, and the reqwest checks that are the same on
//! both wires (headers, ranges).

use std::path::{Path, PathBuf};
use std::time::Duration;

use gantry_testkit::hub::HubDouble;
use gantry_testkit::modelscope::ModelscopeDouble;
pub use gantry_testkit::pseudo_random;
use gantry_testkit::RepoFile;
use reqwest::header::{HeaderMap, CONTENT_RANGE, RANGE};
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};

pub const CONFIG: &[u8] = br#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}"#;

/// The bytes of the fixture's file at `path`.
pub fn contents<'a>(files: &'a [RepoFile], path: &str) -> &'a [u8] {
    &files
        .iter()
        .find(|file| file.path == path)
        .unwrap_or_else(|| panic!("the fixture has no {path}"))
        .bytes
}

/// What a test reads back from either double: the bytes each file's bodies sent and the
/// request log.
pub trait Served {
    fn bytes_served(&self, repo_id: &str, path: &str) -> u64;
    fn requests(&self) -> Vec<String>;
}

impl Served for HubDouble {
    fn bytes_served(&self, repo_id: &str, path: &str) -> u64 {
        HubDouble::bytes_served(self, repo_id, path)
    }
    fn requests(&self) -> Vec<String> {
        HubDouble::requests(self)
    }
}

impl Served for ModelscopeDouble {
    fn bytes_served(&self, repo_id: &str, path: &str) -> u64 {
        ModelscopeDouble::bytes_served(self, repo_id, path)
    }
    fn requests(&self) -> Vec<String> {
        ModelscopeDouble::requests(self)
    }
}

/// Asserts that each of `paths` (files of the fixture `files` in `repo_id`) was sent
/// exactly once, whole, and that `others` were not sent at all.
pub fn assert_sent_once(
    double: &impl Served,
    repo_id: &str,
    files: &[RepoFile],
    paths: &[impl AsRef<str>],
    others: &[&str],
) {
    for path in paths {
        let path = path.as_ref();
        let size = contents(files, path).len() as u64;
        assert_eq!(double.bytes_served(repo_id, path), size, "{path}");
    }
    for path in others {
        assert_eq!(double.bytes_served(repo_id, path), 0, "{path}");
    }
}

/// Asserts that every one of `expected` is among the requests the double received.
pub fn assert_requested(double: &impl Served, expected: impl IntoIterator<Item = String>) {
    let requests = double.requests();
    for expected in expected {
        assert!(
            requests.contains(&expected),
            "no {expected:?} among {requests:#?}"
        );
    }
}

pub fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------
// The official clients, in a real process.
// ---------------------------------------------------------------------------------------

/// What one call came to: the local path, or the exception's class name and message.
#[derive(Debug, Deserialize)]
pub struct ClientOutcome {
    path: Option<PathBuf>,
    error: Option<String>,
    message: Option<String>,
}

impl ClientOutcome {
    pub fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or_else(|| {
            panic!(
                "the client raised {:?}: {}",
                self.error,
                self.message.as_deref().unwrap_or_default()
            )
        })
    }

    pub fn error(&self) -> (&str, &str) {
        match (&self.error, &self.message) {
            (Some(error), Some(message)) => (error, message),
            _ => panic!(
                "the client succeeded ({:?}), an error was expected",
                self.path
            ),
        }
    }
}

/// Runs `driver`, a Python script that makes each of `calls` (given as JSON in its first
/// argument) with the official `client` package and prints one JSON outcome per call.
/// `configure` points the client at the double and away from the machine's own settings.
pub async fn run_client_driver<Call: Serialize>(
    client: &str,
    driver: &str,
    calls: &[Call],
    configure: impl FnOnce(&mut tokio::process::Command),
) -> Vec<ClientOutcome> {
    let python = match std::env::var_os("GANTRY_PYTHON") {
        Some(python) => PathBuf::from(python),
        None => panic!(
            "GANTRY_PYTHON is not set. These tests run the official {client} Python client: \
             run the tests with scripts/test.sh, or set \
             GANTRY_PYTHON=$(scripts/python-env.sh | tail -1)."
        ),
    };
    let mut command = tokio::process::Command::new(&python);
    command
        .arg("-c")
        .arg(driver)
        .arg(serde_json::to_string(calls).unwrap())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .kill_on_drop(true);
    configure(&mut command);
    let output = tokio::time::timeout(Duration::from_secs(180), command.output())
        .await
        .unwrap_or_else(|_| panic!("the {client} client finishes within 3 minutes"))
        .unwrap_or_else(|e| panic!("run {python:?}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the client driver failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let last_line = stdout.lines().rev().find(|line| !line.trim().is_empty());
    let outcomes: Vec<ClientOutcome> = serde_json::from_str(last_line.unwrap_or_default())
        .unwrap_or_else(|e| {
            panic!("read the driver's outcomes ({e}):\n{stdout}\nstderr:\n{stderr}")
        });
    assert_eq!(outcomes.len(), calls.len(), "one outcome per call");
    outcomes
}

// ---------------------------------------------------------------------------------------
// The wire, with reqwest.
// ---------------------------------------------------------------------------------------

pub fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

pub fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header among {headers:#?}"))
        .to_str()
        .unwrap()
}

/// The status and JSON body of a `GET` of `url`.
pub async fn get_json(client: &reqwest::Client, url: &str) -> (StatusCode, serde_json::Value) {
    let response = client.get(url).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap())
}

/// The body of a `GET` of `url`, whatever its status.
pub async fn get_bytes(client: &reqwest::Client, url: &str) -> bytes::Bytes {
    let response = client.get(url).send().await.unwrap();
    response.bytes().await.unwrap()
}

/// Asks `url`, which serves `weights`, for a middle range (`bytes=1000-1999`, 1000 bytes),
/// the last 10 bytes and a range past the end: `206` with the asked bytes and
/// `Content-Range`, and `416` with `Content-Range: bytes */size`.
pub async fn assert_ranges_answered(client: &reqwest::Client, url: &str, weights: &[u8]) {
    let size = weights.len();
    let ask = |range: String| client.get(url).header(RANGE, range).send();
    let part = ask("bytes=1000-1999".to_owned()).await.unwrap();
    assert_eq!(part.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        header(part.headers(), CONTENT_RANGE.as_str()),
        format!("bytes 1000-1999/{size}")
    );
    assert_eq!(part.bytes().await.unwrap(), weights[1000..2000]);

    let tail = ask(format!("bytes={}-", size - 10)).await.unwrap();
    assert_eq!(tail.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(tail.bytes().await.unwrap(), weights[size - 10..]);

    let past_the_end = ask(format!("bytes={size}-")).await.unwrap();
    assert_eq!(past_the_end.status(), StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(
        header(past_the_end.headers(), CONTENT_RANGE.as_str()),
        format!("bytes */{size}")
    );
}
