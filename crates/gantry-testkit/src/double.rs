//! What the two model-hub doubles ([`crate::hub`] and [`crate::modelscope`]) do the same
//! way: the files a test defines, the commit derived from them, the checks on a repository's
//! shape, and the serving machinery (two loopback origins, the request log, file bodies with
//! `Range` support, counted chunk by chunk, throttled, cut short at shutdown).
//!
//! Each double keeps what makes it that hub: its routes, listings, envelopes, error codes,
//! the identifiers its clients verify and its public API. Only code that is the same for
//! both lives here.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{ACCEPT_RANGES, CONTENT_LENGTH, CONTENT_RANGE, RANGE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use sha1::Digest as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::range::{parse_range, ByteRange};

/// Unthrottled file bodies go out in chunks of this size.
const FULL_SPEED_CHUNK: usize = 64 * 1024;
/// Throttled bodies go out in chunks of a tenth of a second's worth, within these bounds.
const SMALLEST_THROTTLED_CHUNK: usize = 1024;
const LARGEST_THROTTLED_CHUNK: usize = 64 * 1024;

/// One file of a repository, as a test defines it for either double
/// ([`crate::hub::HubFile`], [`crate::modelscope::ModelscopeFile`]).
#[derive(Debug, Clone)]
pub struct RepoFile {
    /// The path in the repository, `/`-separated, without a leading `/`.
    pub path: String,
    pub bytes: Bytes,
    /// Stored with Git LFS: downloaded through the hub's redirect to a second origin (the
    /// Hugging Face CDN, ModelScope's object store).
    pub lfs: bool,
}

impl RepoFile {
    /// A file stored in git itself (a `config.json`, a README).
    pub fn regular(path: impl Into<String>, bytes: impl Into<Bytes>) -> Self {
        Self {
            path: path.into(),
            bytes: bytes.into(),
            lfs: false,
        }
    }

    /// A file stored with Git LFS (model weights).
    pub fn lfs(path: impl Into<String>, bytes: impl Into<Bytes>) -> Self {
        Self {
            path: path.into(),
            bytes: bytes.into(),
            lfs: true,
        }
    }
}

/// A commit id (40 lowercase hex digits) derived from a repository's id and contents, so
/// the same repository always has the same commit and different contents a different one
/// (a client's cache, keyed by commit, then never mixes two tests' files up). `salt` keeps
/// the doubles' commits apart; `content_id` is how the double names a file's contents.
pub(crate) fn derived_commit(
    salt: &[u8],
    id: &str,
    files: &[RepoFile],
    content_id: fn(&[u8]) -> String,
) -> String {
    let mut hasher = sha1::Sha1::new();
    hasher.update(salt);
    hasher.update(id.as_bytes());
    let mut sorted: Vec<&RepoFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    for file in sorted {
        hasher.update(b"\0");
        hasher.update(file.path.as_bytes());
        hasher.update(b"\0");
        hasher.update(content_id(&file.bytes).as_bytes());
        hasher.update(if file.lfs { b"\0lfs" } else { b"\0git" });
    }
    hex::encode(hasher.finalize())
}

/// The lowercase hex SHA-256 of `bytes`.
pub(crate) fn sha256(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The owner and name of a repository id; panics unless it is `owner/name`.
pub(crate) fn owner_and_name(id: &str) -> (&str, &str) {
    id.split_once('/')
        .filter(|(owner, name)| !owner.is_empty() && !name.is_empty() && !name.contains('/'))
        .unwrap_or_else(|| panic!("a repository id is owner/name, not {id:?}"))
}

/// Panics unless `commit` is 40 lowercase hex digits.
pub(crate) fn assert_commit(id: &str, commit: &str) {
    assert!(
        commit.len() == 40
            && commit
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "the commit of {id} is not 40 lowercase hex digits: {commit:?}"
    );
}

/// A repository's files by path and the directories that hold them.
pub(crate) struct Tree<F> {
    /// By path.
    pub(crate) files: BTreeMap<String, Arc<F>>,
    /// Every directory that holds a file, at any depth; the top is not listed.
    pub(crate) directories: BTreeSet<String>,
}

impl<F> Tree<F> {
    /// Indexes `files`, each made into the double's own `F`. Panics on two files at one
    /// path, a path with an empty segment, or a path that is both a file and a directory.
    pub(crate) fn new(id: &str, files: Vec<RepoFile>, mut make: impl FnMut(RepoFile) -> F) -> Self {
        let mut by_path = BTreeMap::new();
        let mut directories = BTreeSet::new();
        for file in files {
            assert!(
                file.path.split('/').all(|segment| !segment.is_empty()),
                "the path {:?} in {id} has an empty segment",
                file.path
            );
            let mut parts: Vec<&str> = file.path.split('/').collect();
            parts.pop();
            for depth in 1..=parts.len() {
                directories.insert(parts[..depth].join("/"));
            }
            let path = file.path.clone();
            assert!(
                by_path.insert(path.clone(), Arc::new(make(file))).is_none(),
                "two files at {path:?} in {id}"
            );
        }
        for directory in &directories {
            assert!(
                !by_path.contains_key(directory),
                "{directory:?} in {id} is both a file and a directory"
            );
        }
        Self {
            files: by_path,
            directories,
        }
    }

    /// Whether `directory` ("" for the top) is one to list.
    pub(crate) fn has_directory(&self, directory: &str) -> bool {
        directory.is_empty() || self.directories.contains(directory)
    }
}

/// Whether a path belongs in the listing of `directory` ("" for the top): a child of it, or
/// with `recursive` anything below it.
pub(crate) fn listed_under(directory: &str, recursive: bool) -> impl Fn(&str) -> bool {
    let prefix = if directory.is_empty() {
        String::new()
    } else {
        format!("{directory}/")
    };
    move |path: &str| {
        path.strip_prefix(&prefix)
            .is_some_and(|rest| recursive || !rest.contains('/'))
    }
}

/// A query flag; the clients send Python booleans (`true`, `True`) or `1`.
pub(crate) fn flag(value: Option<&String>) -> bool {
    value.is_some_and(|value| value.eq_ignore_ascii_case("true") || value == "1")
}

pub(crate) fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).expect("the double only builds visible-ASCII header values")
}

/// An `ETag` value: the tag in double quotes.
pub(crate) fn quoted(etag: &str) -> HeaderValue {
    header_value(&format!("\"{etag}\""))
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The data behind these locks stays consistent whatever panicked while holding one.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The bytes of one file and what has been sent of them.
pub(crate) struct Contents {
    /// The contents the listings and hashes describe.
    pub(crate) listed: Bytes,
    /// The contents sent: `listed` until [`Contents::corrupt`] replaces them.
    served: Mutex<Bytes>,
    bytes_served: AtomicU64,
    /// Bodies being sent now, and the most at once.
    concurrent: AtomicU64,
    most_concurrent: AtomicU64,
}

impl Contents {
    pub(crate) fn new(bytes: Bytes) -> Arc<Self> {
        Arc::new(Self {
            served: Mutex::new(bytes.clone()),
            listed: bytes,
            bytes_served: AtomicU64::new(0),
            concurrent: AtomicU64::new(0),
            most_concurrent: AtomicU64::new(0),
        })
    }

    pub(crate) fn bytes_served(&self) -> u64 {
        self.bytes_served.load(Ordering::Relaxed)
    }

    pub(crate) fn most_concurrent(&self) -> u64 {
        self.most_concurrent.load(Ordering::Relaxed)
    }

    /// From now on serves different bytes of the same length, while what describes the
    /// file still names the original contents. Panics on an empty file.
    pub(crate) fn corrupt(&self) {
        assert!(
            !self.listed.is_empty(),
            "an empty file cannot be served with different bytes of the same length"
        );
        // Every byte changes, so any read of any range sees the corruption.
        let corrupted: Vec<u8> = self.listed.iter().map(|byte| byte ^ 0x5a).collect();
        *lock(&self.served) = Bytes::from(corrupted);
    }
}

/// A `Range` that asks for nothing of a body of `size` bytes: the double answers it with
/// `416` and `Content-Range: bytes */size`, each in its own way.
#[derive(Debug)]
pub(crate) struct RangeNotSatisfiable {
    pub(crate) size: u64,
}

/// What the handlers of both origins of one double share for serving files.
pub(crate) struct Serving {
    /// The double's name in messages: "hub double".
    double: &'static str,
    total_bytes_served: AtomicU64,
    /// Bytes per second for file bodies; 0 is full speed.
    throttle: AtomicU64,
    requests: Mutex<Vec<String>>,
    /// Cancelled when the double stops: listeners stop accepting, transfers end.
    shutdown: CancellationToken,
}

impl Serving {
    pub(crate) fn new(double: &'static str) -> Arc<Self> {
        Arc::new(Self {
            double,
            total_bytes_served: AtomicU64::new(0),
            throttle: AtomicU64::new(0),
            requests: Mutex::new(Vec::new()),
            shutdown: CancellationToken::new(),
        })
    }

    /// A listener on a free loopback port, and its base URL `http://127.0.0.1:PORT`.
    pub(crate) async fn bind_loopback(&self) -> (TcpListener, String) {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .await
            .unwrap_or_else(|e| panic!("bind a loopback port for the {}: {e}", self.double));
        let address = listener
            .local_addr()
            .expect("a bound listener has a local address");
        (listener, format!("http://{address}"))
    }

    /// Serves each origin's router on its listener, every request logged, until the double
    /// stops.
    pub(crate) fn serve(
        self: &Arc<Self>,
        origins: [(&'static str, TcpListener, Router); 2],
    ) -> Running {
        let tasks = TaskTracker::new();
        for (origin, listener, router) in origins {
            let router = router.layer(middleware::from_fn_with_state(self.clone(), record_request));
            let serve = axum::serve(listener, router)
                .with_graceful_shutdown(self.shutdown.clone().cancelled_owned());
            let double = self.double;
            tasks.spawn(async move {
                if let Err(e) = serve.await {
                    eprintln!("{double}: the {origin} listener failed: {e:#}");
                }
            });
        }
        tasks.close();
        Running {
            serving: self.clone(),
            tasks,
        }
    }

    pub(crate) fn total_bytes_served(&self) -> u64 {
        self.total_bytes_served.load(Ordering::Relaxed)
    }

    pub(crate) fn requests(&self) -> Vec<String> {
        lock(&self.requests).clone()
    }

    /// From the next chunk on, sends file bodies at about `bytes_per_second`; `None` sends
    /// at full speed.
    pub(crate) fn set_throttle(&self, bytes_per_second: Option<u64>) {
        let value = bytes_per_second.map_or(0, |rate| {
            assert!(
                rate > 0,
                "a throttle of 0 bytes per second would never finish"
            );
            rate
        });
        self.throttle.store(value, Ordering::Relaxed);
    }

    fn throttle(&self) -> Option<u64> {
        match self.throttle.load(Ordering::Relaxed) {
            0 => None,
            rate => Some(rate),
        }
    }

    /// The response carrying the file's served bytes, with `headers` added: the range the
    /// request asks of them when `ranges` (and then `Accept-Ranges: bytes`), else all of
    /// them. Its body counts what it sends.
    pub(crate) fn file_response(
        self: &Arc<Self>,
        method: &Method,
        request_headers: &HeaderMap,
        contents: &Arc<Contents>,
        ranges: bool,
        mut headers: HeaderMap,
    ) -> Result<Response, RangeNotSatisfiable> {
        let bytes = lock(&contents.served).clone();
        let size = bytes.len() as u64;
        let range = request_headers
            .get(RANGE)
            .and_then(|value| value.to_str().ok())
            .filter(|_| ranges);
        if ranges {
            headers.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        }
        let (status, body) = match parse_range(range, size) {
            ByteRange::Whole => (StatusCode::OK, bytes),
            ByteRange::Part { first, last } => {
                headers.insert(
                    CONTENT_RANGE,
                    header_value(&format!("bytes {first}-{last}/{size}")),
                );
                (
                    StatusCode::PARTIAL_CONTENT,
                    bytes.slice(to_index(first)..=to_index(last)),
                )
            }
            ByteRange::Unsatisfiable => return Err(RangeNotSatisfiable { size }),
        };
        headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        let body = if method == Method::HEAD {
            Body::empty()
        } else {
            Transfer::body(self.clone(), contents.clone(), body)
        };
        Ok((status, headers, body).into_response())
    }
}

/// The listeners of a running double. Dropping it stops them; [`Running::shutdown`] also
/// waits until every connection has closed. Transfers still going then end early.
pub(crate) struct Running {
    serving: Arc<Serving>,
    tasks: TaskTracker,
}

impl Running {
    pub(crate) async fn shutdown(self) {
        self.serving.shutdown.cancel();
        self.tasks.wait().await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.serving.shutdown.cancel();
    }
}

/// Logs every request: the method, the path with its query as sent, and the `Range` header
/// when there was one.
async fn record_request(
    State(serving): State<Arc<Serving>>,
    request: Request,
    next: Next,
) -> Response {
    let target = request
        .uri()
        .path_and_query()
        .map_or_else(|| request.uri().path().to_owned(), ToString::to_string);
    let mut line = format!("{} {target}", request.method());
    if let Some(range) = request.headers().get(RANGE).and_then(|v| v.to_str().ok()) {
        line.push(' ');
        line.push_str(range);
    }
    lock(&serving.requests).push(line);
    next.run(request).await
}

fn to_index(offset: u64) -> usize {
    usize::try_from(offset).expect("a file held in memory has offsets that fit in usize")
}

/// A file body on its way out: sent chunk by chunk, each counted as it is handed to the
/// connection, with pauses between chunks while a throttle is set; cut short when the
/// double stops.
struct Transfer {
    serving: Arc<Serving>,
    contents: Arc<Contents>,
    remaining: Bytes,
    pause: Option<Duration>,
    _sending: Sending,
}

/// Counts a body of the file as being sent while it lives.
struct Sending(Arc<Contents>);

impl Sending {
    fn new(contents: Arc<Contents>) -> Self {
        let now = contents.concurrent.fetch_add(1, Ordering::AcqRel) + 1;
        contents.most_concurrent.fetch_max(now, Ordering::AcqRel);
        Self(contents)
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        self.0.concurrent.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Transfer {
    fn body(serving: Arc<Serving>, contents: Arc<Contents>, bytes: Bytes) -> Body {
        let transfer = Transfer {
            serving,
            _sending: Sending::new(contents.clone()),
            contents,
            remaining: bytes,
            pause: None,
        };
        Body::from_stream(futures_util::stream::unfold(transfer, Transfer::next_chunk))
    }

    async fn next_chunk(mut self) -> Option<(std::io::Result<Bytes>, Self)> {
        if self.remaining.is_empty() {
            return None;
        }
        let shutdown = self.serving.shutdown.clone();
        let stopped = match self.pause.take() {
            Some(pause) => tokio::select! {
                () = tokio::time::sleep(pause) => false,
                () = shutdown.cancelled() => true,
            },
            None => shutdown.is_cancelled(),
        };
        if stopped {
            self.remaining.clear();
            let message = format!("the {} stopped mid-transfer", self.serving.double);
            return Some((Err(std::io::Error::other(message)), self));
        }
        let throttle = self.serving.throttle();
        let chunk_len = match throttle {
            None => FULL_SPEED_CHUNK,
            Some(rate) => usize::try_from(rate / 10)
                .unwrap_or(usize::MAX)
                .clamp(SMALLEST_THROTTLED_CHUNK, LARGEST_THROTTLED_CHUNK),
        }
        .min(self.remaining.len());
        let chunk = self.remaining.split_to(chunk_len);
        self.pause = throttle.map(|rate| Duration::from_secs_f64(chunk_len as f64 / rate as f64));
        self.contents
            .bytes_served
            .fetch_add(chunk_len as u64, Ordering::Relaxed);
        self.serving
            .total_bytes_served
            .fetch_add(chunk_len as u64, Ordering::Relaxed);
        Some((Ok(chunk), self))
    }
}
