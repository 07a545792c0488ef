//! A TEST DOUBLE of the Hugging Face Hub's HTTP protocol, for tests of code that downloads
//! models: an in-process server on `127.0.0.1:0` that answers the requests a download makes
//! the way huggingface.co answers them, closely enough that the official `huggingface_hub`
//! Python client downloads from it (`tests/hub_double.rs` proves that with the real client).
//! It is not a hub: repositories are fixed when it starts and nothing can be uploaded.
//!
//! What it implements, for model repositories whose ids are `owner/name`:
//! - `GET /api/models/{owner}/{name}` and `…/revision/{revision}`: the model info, with the
//!   commit as `sha` and the files as `siblings` (with `size`, `blobId` and `lfs` when asked
//!   with `?blobs=true`, as the hub does).
//! - `GET /api/models/{owner}/{name}/tree/{revision}[/{dir}]`, `?recursive=true`: files with
//!   their git blob id as `oid`, their size, and for LFS files `lfs: {oid: sha256, size,
//!   pointerSize}` (the `oid` of an LFS file is then the git id of its pointer file, as on the
//!   hub); directories as `type: "directory"` entries.
//! - `HEAD` and `GET /{owner}/{name}/resolve/{revision}/{path}`, where the revision is `main`
//!   or the commit. A regular file is answered in place with `ETag: "<git blob id>"` and
//!   `X-Repo-Commit`. An LFS file is answered, as on the hub, with a `302` to a CDN, carrying
//!   `X-Linked-Etag: "<sha256>"`, `X-Linked-Size`, `X-Repo-Commit` and `ETag`.
//! - The CDN: a second listener (so a second origin, as `cdn-lfs.hf.co` is for the hub: the
//!   client then reads the file's metadata from the redirect itself and does not send its
//!   token on), serving `/repos/{owner}/{name}/{sha256}/{path}` with `ETag: "<sha256>"`.
//! - `Range: bytes=a-b`, `bytes=a-` and `bytes=-n` on every file body: `206` with
//!   `Content-Range`, `416` with `Content-Range: bytes */size` when unsatisfiable.
//! - Errors as the client expects them: a JSON `{"error": …}` body and the `X-Error-Code`
//!   header (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`) the client turns into its
//!   typed exceptions. A repository with a token is private: without a token it answers `401
//!   RepoNotFound` (as the hub does for private, gated and unknown repositories alike when no
//!   token is sent), with another valid token `404 RepoNotFound`, and any request carrying a
//!   token that no repository has is `401 Invalid credentials in Authorization header`.
//!
//! What a test can do with it: count the file bytes actually handed to each connection
//! ([`HubDouble::bytes_served`], counted chunk by chunk, so an interrupted transfer counts
//! what went out and not the whole file), read the request log, slow file bodies down
//! ([`HubDouble::set_throttle`]), serve bytes that do not match the listed hashes
//! ([`HubDouble::corrupt`]), see how many bodies of one file were sent at once
//! ([`HubDouble::most_concurrent`]) and ignore `Range` headers the way some plain HTTP
//! servers do ([`HubDouble::set_ranges`]).
//!
//! What it does not do: datasets and spaces, repository ids without an owner, branches and
//! tags other than `main`, `refs/pr/*`, gated repositories (a token makes a repository
//! private, nothing more), Xet storage (no `X-Xet-Hash`, so the client falls back to plain
//! HTTP), uploads and every other API, pagination of tree listings (the hub pages at 1000
//! entries), `expand=true` details (`lastCommit`, security scans), compression, signed or
//! expiring CDN links (the CDN serves anyone who knows the link), and renamed repositories
//! (the hub's relative redirects). Directory `oid`s are stable identifiers, not real git tree
//! ids, and the commit is derived from the contents, not a real git commit.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::header::{
    AUTHORIZATION, CONTENT_DISPOSITION, CONTENT_RANGE, CONTENT_TYPE, ETAG, LOCATION,
};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use sha1::Digest as _;

use crate::double::{
    assert_commit, derived_commit, flag, header_value, listed_under, owner_and_name, quoted,
    Contents, RangeNotSatisfiable, RepoFile, Running, Serving, Tree,
};

const X_REPO_COMMIT: HeaderName = HeaderName::from_static("x-repo-commit");
const X_LINKED_ETAG: HeaderName = HeaderName::from_static("x-linked-etag");
const X_LINKED_SIZE: HeaderName = HeaderName::from_static("x-linked-size");
const X_ERROR_CODE: HeaderName = HeaderName::from_static("x-error-code");
const X_ERROR_MESSAGE: HeaderName = HeaderName::from_static("x-error-message");

/// The only branch the double knows; the commit id is the other accepted revision.
const MAIN_BRANCH: &str = "main";
/// The date every repository claims for its creation and last change.
const REPO_DATE: &str = "2024-01-01T00:00:00.000Z";
/// One file of a repository, as a test defines it. An LFS file is listed with its sha256
/// and served through the CDN redirect.
pub type HubFile = RepoFile;

/// One model repository with a single commit, which `main` points at.
#[derive(Debug, Clone)]
pub struct HubRepo {
    /// `owner/name`.
    pub id: String,
    /// 40 lowercase hex digits: the hub's commit id, what `main` resolves to.
    pub commit: String,
    pub files: Vec<HubFile>,
    /// When set the repository is private: every request for it must send
    /// `Authorization: Bearer <token>`.
    pub token: Option<String>,
}

impl HubRepo {
    /// A public repository whose commit is derived from its id and contents, so the same
    /// repository always has the same commit and different contents a different one (a
    /// client's cache, keyed by commit, then never mixes two tests' files up).
    pub fn new(id: impl Into<String>, files: Vec<HubFile>) -> Self {
        let id = id.into();
        let commit = derived_commit(
            b"gantry hub double commit\0",
            &id,
            &files,
            HubDouble::git_blob_oid,
        );
        Self {
            id,
            commit,
            files,
            token: None,
        }
    }

    /// Makes the repository private, readable with `token` only.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }
}

/// The running double: a hub origin ([`HubDouble::endpoint`], what `HF_ENDPOINT` is set to)
/// and a CDN origin. Both stop when it is dropped (or, awaited, with
/// [`HubDouble::shutdown`]); transfers still going then end early.
pub struct HubDouble {
    endpoint: String,
    cdn_endpoint: String,
    hub: Arc<Hub>,
    running: Running,
}

impl std::fmt::Debug for HubDouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubDouble")
            .field("endpoint", &self.endpoint)
            .field("cdn_endpoint", &self.cdn_endpoint)
            .finish_non_exhaustive()
    }
}

impl HubDouble {
    /// Starts serving `repos`. Panics on a malformed repository (an id without exactly one
    /// `/`, a commit that is not 40 lowercase hex digits, two files at one path, a path with
    /// an empty segment) or when it cannot listen: it is a test fixture.
    pub async fn start(repos: Vec<HubRepo>) -> HubDouble {
        let serving = Serving::new("hub double");
        let (hub_listener, endpoint) = serving.bind_loopback().await;
        let (cdn_listener, cdn_endpoint) = serving.bind_loopback().await;
        let hub = Arc::new(Hub::new(repos, cdn_endpoint.clone(), serving.clone()));
        let running = serving.serve([
            ("hub", hub_listener, hub_router(hub.clone())),
            ("cdn", cdn_listener, cdn_router(hub.clone())),
        ]);
        HubDouble {
            endpoint,
            cdn_endpoint,
            hub,
            running,
        }
    }

    /// The hub's base URL, `http://127.0.0.1:PORT`: what `HF_ENDPOINT` is set to.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// The CDN's base URL, where the hub redirects LFS downloads.
    pub fn cdn_endpoint(&self) -> String {
        self.cdn_endpoint.clone()
    }

    /// The bytes of the file's body handed to client connections so far, through the hub and
    /// the CDN together. Counted chunk by chunk as each is sent, so an interrupted transfer
    /// counts what went out (which may exceed what the client read by what the connection and
    /// the sockets buffer). Panics on a file the double does not hold.
    pub fn bytes_served(&self, repo_id: &str, path: &str) -> u64 {
        self.file(repo_id, path).contents.bytes_served()
    }

    /// The most bodies of the file that were being sent at the same time.
    pub fn most_concurrent(&self, repo_id: &str, path: &str) -> u64 {
        self.file(repo_id, path).contents.most_concurrent()
    }

    /// `false`: from now on `Range` headers are ignored and every file request gets the
    /// whole body with `200` and no `Accept-Ranges` (what a server without range support
    /// does); `true` (the default) honours them again.
    pub fn set_ranges(&self, honoured: bool) {
        self.hub.ranges_ignored.store(!honoured, Ordering::Relaxed);
    }

    fn file(&self, repo_id: &str, path: &str) -> &Arc<File> {
        self.hub
            .repos
            .get(repo_id)
            .and_then(|repo| repo.tree.files.get(path))
            .unwrap_or_else(|| panic!("the hub double holds no file {path:?} in {repo_id:?}"))
    }

    /// The file body bytes handed to client connections, over all files.
    pub fn total_bytes_served(&self) -> u64 {
        self.hub.serving.total_bytes_served()
    }

    /// Every request received so far, in order, by the hub and the CDN alike: the method, the
    /// path with its query as sent, and the `Range` header when there was one, e.g.
    /// `"GET /repos/org/model/<sha256>/model.gguf bytes=100-"`. CDN paths start `/repos/`.
    pub fn requests(&self) -> Vec<String> {
        self.hub.serving.requests()
    }

    /// From the next chunk on, sends file bodies at about `bytes_per_second` (in chunks of a
    /// tenth of a second's worth, pausing between them); `None` sends at full speed.
    pub fn set_throttle(&self, bytes_per_second: Option<u64>) {
        self.hub.serving.set_throttle(bytes_per_second);
    }

    /// From now on serves different bytes of the same length for the file, while listings,
    /// `ETag`s and `X-Linked-Etag`s still name the original contents: what a broken disk or
    /// a truncated-then-padded upload would look like. Panics on an unknown or empty file.
    pub fn corrupt(&self, repo_id: &str, path: &str) {
        self.file(repo_id, path).contents.corrupt();
    }

    /// The lowercase hex sha256 of `bytes`: an LFS file's `X-Linked-Etag` and `lfs.oid`.
    pub fn sha256(bytes: &[u8]) -> String {
        crate::double::sha256(bytes)
    }

    /// The git blob id of `bytes` (sha1 of `blob <len>\0<bytes>`): a regular file's `ETag`
    /// and tree `oid`.
    pub fn git_blob_oid(bytes: &[u8]) -> String {
        let mut hasher = sha1::Sha1::new();
        hasher.update(format!("blob {}\0", bytes.len()).as_bytes());
        hasher.update(bytes);
        hex::encode(hasher.finalize())
    }

    /// Stops both listeners and waits until every connection has closed.
    pub async fn shutdown(self) {
        self.running.shutdown().await;
    }
}

/// What the handlers share.
struct Hub {
    repos: HashMap<String, Repo>,
    /// Every repository's token: a request presenting anything else is refused outright.
    known_tokens: HashSet<String>,
    cdn_endpoint: String,
    /// Whether `Range` headers are ignored ([`HubDouble::set_ranges`]).
    ranges_ignored: AtomicBool,
    serving: Arc<Serving>,
}

struct Repo {
    id: String,
    commit: String,
    token: Option<String>,
    tree: Tree<File>,
}

struct File {
    path: String,
    /// What the listings and hashes describe, what is sent, and how much of it went out.
    contents: Arc<Contents>,
    /// The git blob id of the contents (regular files) or of the LFS pointer (LFS files).
    git_oid: String,
    lfs: Option<LfsObject>,
}

struct LfsObject {
    sha256: String,
    pointer_size: u64,
}

impl Hub {
    fn new(repos: Vec<HubRepo>, cdn_endpoint: String, serving: Arc<Serving>) -> Self {
        let mut by_id = HashMap::new();
        let mut known_tokens = HashSet::new();
        for repo in repos {
            let repo = Repo::new(repo);
            if let Some(token) = &repo.token {
                known_tokens.insert(token.clone());
            }
            let id = repo.id.clone();
            assert!(
                by_id.insert(id.clone(), repo).is_none(),
                "two repositories named {id:?}"
            );
        }
        Self {
            repos: by_id,
            known_tokens,
            cdn_endpoint,
            ranges_ignored: AtomicBool::new(false),
            serving,
        }
    }

    /// The repository a request may read, checked the way the hub checks: a token no one
    /// holds is refused first; then a repository that is unknown or private answers as not
    /// found, `401` without a token and `404` with another repository's.
    fn readable_repo(
        &self,
        headers: &HeaderMap,
        owner: &str,
        name: &str,
    ) -> Result<&Repo, HubError> {
        let presented = bearer_token(headers);
        if let Some(token) = presented {
            if !self.known_tokens.contains(token) {
                return Err(HubError::InvalidCredentials);
            }
        }
        match (self.repos.get(&format!("{owner}/{name}")), presented) {
            (Some(repo), _) if repo.token.is_none() => Ok(repo),
            (Some(repo), Some(token)) if repo.token.as_deref() == Some(token) => Ok(repo),
            (_, None) => Err(HubError::RepoNotFoundUnauthenticated),
            (_, Some(_)) => Err(HubError::RepoNotFound),
        }
    }

    /// The response carrying `file`'s served bytes (or the asked range of them, unless
    /// ranges are ignored), with `headers` added; its body counts what it sends.
    fn file_response(
        &self,
        method: &Method,
        request_headers: &HeaderMap,
        file: &File,
        headers: HeaderMap,
    ) -> Result<Response, HubError> {
        let ranges = !self.ranges_ignored.load(Ordering::Relaxed);
        self.serving
            .file_response(method, request_headers, &file.contents, ranges, headers)
            .map_err(|RangeNotSatisfiable { size }| HubError::RangeNotSatisfiable { size })
    }
}

impl Repo {
    fn new(repo: HubRepo) -> Self {
        let HubRepo {
            id,
            commit,
            files,
            token,
        } = repo;
        owner_and_name(&id);
        assert_commit(&id, &commit);
        let tree = Tree::new(&id, files, File::new);
        Self {
            id,
            commit,
            token,
            tree,
        }
    }

    fn check_revision(&self, revision: &str) -> Result<(), HubError> {
        if revision == MAIN_BRANCH || revision == self.commit {
            Ok(())
        } else {
            Err(HubError::RevisionNotFound {
                revision: revision.to_owned(),
            })
        }
    }

    fn file(&self, path: &str) -> Result<&Arc<File>, HubError> {
        self.tree
            .files
            .get(path)
            .ok_or_else(|| HubError::EntryNotFound {
                commit: self.commit.clone(),
            })
    }

    fn model_info(&self, with_blobs: bool) -> ModelInfo {
        let (owner, _) = owner_and_name(&self.id);
        ModelInfo {
            mongo_id: self.commit[..24].to_owned(),
            id: self.id.clone(),
            model_id: self.id.clone(),
            author: owner.to_owned(),
            sha: self.commit.clone(),
            private: self.token.is_some(),
            gated: false,
            disabled: false,
            last_modified: REPO_DATE,
            created_at: REPO_DATE,
            tags: Vec::new(),
            siblings: self
                .tree
                .files
                .values()
                .map(|file| Sibling {
                    rfilename: file.path.clone(),
                    size: with_blobs.then_some(file.contents.listed.len() as u64),
                    blob_id: with_blobs.then(|| file.git_oid.clone()),
                    lfs: with_blobs
                        .then(|| file.lfs.as_ref())
                        .flatten()
                        .map(|lfs| SiblingLfs {
                            sha256: lfs.sha256.clone(),
                            size: file.contents.listed.len() as u64,
                            pointer_size: lfs.pointer_size,
                        }),
                })
                .collect(),
        }
    }

    /// The entries under `directory` ("" for the root): its children, or with `recursive`
    /// everything below it, directories included as the hub includes them.
    fn tree(&self, directory: &str, recursive: bool) -> Result<Vec<TreeEntry>, HubError> {
        if !self.tree.has_directory(directory) {
            return Err(HubError::EntryNotFound {
                commit: self.commit.clone(),
            });
        }
        let wanted = listed_under(directory, recursive);
        let mut entries: Vec<TreeEntry> = self
            .tree
            .directories
            .iter()
            .filter(|path| wanted(path))
            .map(|path| TreeEntry::Directory {
                oid: self.directory_oid(path),
                size: 0,
                path: path.clone(),
            })
            .chain(
                self.tree
                    .files
                    .values()
                    .filter(|file| wanted(&file.path))
                    .map(|file| TreeEntry::File {
                        oid: file.git_oid.clone(),
                        size: file.contents.listed.len() as u64,
                        path: file.path.clone(),
                        lfs: file.lfs.as_ref().map(|lfs| TreeLfs {
                            oid: lfs.sha256.clone(),
                            size: file.contents.listed.len() as u64,
                            pointer_size: lfs.pointer_size,
                        }),
                    }),
            )
            .collect();
        entries.sort_by(|a, b| a.path().cmp(b.path()));
        Ok(entries)
    }

    /// A stable id for a directory, changing with what it holds (not a real git tree id).
    fn directory_oid(&self, directory: &str) -> String {
        let prefix = format!("{directory}/");
        let mut hasher = sha1::Sha1::new();
        hasher.update(b"tree\0");
        for file in self
            .tree
            .files
            .values()
            .filter(|file| file.path.starts_with(&prefix))
        {
            hasher.update(file.path.as_bytes());
            hasher.update(b"\0");
            hasher.update(file.git_oid.as_bytes());
        }
        hex::encode(hasher.finalize())
    }
}

impl File {
    fn new(file: HubFile) -> Self {
        let lfs_and_oid = file.lfs.then(|| {
            let sha256 = HubDouble::sha256(&file.bytes);
            let pointer = lfs_pointer(&sha256, file.bytes.len() as u64);
            let object = LfsObject {
                sha256,
                pointer_size: pointer.len() as u64,
            };
            (object, HubDouble::git_blob_oid(pointer.as_bytes()))
        });
        let (lfs, git_oid) = match lfs_and_oid {
            Some((object, pointer_oid)) => (Some(object), pointer_oid),
            None => (None, HubDouble::git_blob_oid(&file.bytes)),
        };
        Self {
            path: file.path,
            contents: Contents::new(file.bytes),
            git_oid,
            lfs,
        }
    }
}

/// The pointer file git stores in place of an LFS file.
fn lfs_pointer(sha256: &str, size: u64) -> String {
    format!("version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n")
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// Percent-encodes a repository path for a URL, keeping `/` (Python's `quote(path)`).
fn encode_path(path: &str) -> String {
    let mut encoded = String::with_capacity(path.len());
    for byte in path.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// Every way a request fails, and the one place that turns each into the hub's answer.
#[derive(Debug)]
enum HubError {
    /// Unknown or private, asked without a token: the hub says 401 and does not tell which.
    RepoNotFoundUnauthenticated,
    /// Unknown, or private to another token.
    RepoNotFound,
    /// A token no repository has.
    InvalidCredentials,
    RevisionNotFound {
        revision: String,
    },
    EntryNotFound {
        commit: String,
    },
    RangeNotSatisfiable {
        size: u64,
    },
    /// A CDN link that names no file.
    NoSuchObject,
    /// A path the double has no route for.
    NoSuchRoute,
}

impl IntoResponse for HubError {
    fn into_response(self) -> Response {
        let mut headers = HeaderMap::new();
        let (status, code, message) = match &self {
            HubError::RepoNotFoundUnauthenticated => (
                StatusCode::UNAUTHORIZED,
                Some("RepoNotFound"),
                "Invalid username or password.".to_owned(),
            ),
            HubError::RepoNotFound => (
                StatusCode::NOT_FOUND,
                Some("RepoNotFound"),
                "Repository not found".to_owned(),
            ),
            HubError::InvalidCredentials => (
                StatusCode::UNAUTHORIZED,
                None,
                "Invalid credentials in Authorization header".to_owned(),
            ),
            HubError::RevisionNotFound { revision } => (
                StatusCode::NOT_FOUND,
                Some("RevisionNotFound"),
                format!("Invalid rev id: {revision}"),
            ),
            HubError::EntryNotFound { commit } => {
                // The client caches "this file does not exist at this commit" from it.
                headers.insert(X_REPO_COMMIT, header_value(commit));
                (
                    StatusCode::NOT_FOUND,
                    Some("EntryNotFound"),
                    "Entry not found".to_owned(),
                )
            }
            HubError::RangeNotSatisfiable { size } => {
                headers.insert(CONTENT_RANGE, header_value(&format!("bytes */{size}")));
                (
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    None,
                    "Requested range not satisfiable".to_owned(),
                )
            }
            HubError::NoSuchObject => (StatusCode::NOT_FOUND, None, "NoSuchKey".to_owned()),
            HubError::NoSuchRoute => (StatusCode::NOT_FOUND, None, "Not Found".to_owned()),
        };
        if let Some(code) = code {
            headers.insert(X_ERROR_CODE, HeaderValue::from_static(code));
        }
        if let Ok(value) = HeaderValue::from_str(&message) {
            headers.insert(X_ERROR_MESSAGE, value);
        }
        (status, headers, Json(ErrorBody { error: message })).into_response()
    }
}

#[derive(Serialize)]
struct ErrorBody {
    error: String,
}

/// `GET /api/models/{id}[/revision/{revision}]`, the fields the client reads.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ModelInfo {
    #[serde(rename = "_id")]
    mongo_id: String,
    id: String,
    model_id: String,
    author: String,
    sha: String,
    private: bool,
    gated: bool,
    disabled: bool,
    last_modified: &'static str,
    created_at: &'static str,
    tags: Vec<String>,
    siblings: Vec<Sibling>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Sibling {
    rfilename: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    blob_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lfs: Option<SiblingLfs>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SiblingLfs {
    sha256: String,
    size: u64,
    pointer_size: u64,
}

/// One entry of `GET /api/models/{id}/tree/{revision}`.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum TreeEntry {
    File {
        oid: String,
        size: u64,
        path: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        lfs: Option<TreeLfs>,
    },
    Directory {
        oid: String,
        size: u64,
        path: String,
    },
}

impl TreeEntry {
    fn path(&self) -> &str {
        match self {
            TreeEntry::File { path, .. } | TreeEntry::Directory { path, .. } => path,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TreeLfs {
    oid: String,
    size: u64,
    pointer_size: u64,
}

/// The query flags the double reads; the client sends Python booleans as `true`/`false`.
#[derive(Deserialize)]
struct ListingQuery {
    recursive: Option<String>,
    blobs: Option<String>,
}

fn hub_router(hub: Arc<Hub>) -> Router {
    Router::new()
        .route("/api/models/{owner}/{name}", get(model_info_at_main))
        .route(
            "/api/models/{owner}/{name}/revision/{revision}",
            get(model_info),
        )
        .route("/api/models/{owner}/{name}/tree/{revision}", get(tree_root))
        .route(
            "/api/models/{owner}/{name}/tree/{revision}/{*directory}",
            get(tree_directory),
        )
        .route(
            "/{owner}/{name}/resolve/{revision}/{*path}",
            get(resolve).head(resolve),
        )
        .fallback(no_such_route)
        .with_state(hub)
}

fn cdn_router(hub: Arc<Hub>) -> Router {
    Router::new()
        .route(
            "/repos/{owner}/{name}/{sha256}/{*path}",
            get(cdn_object).head(cdn_object),
        )
        .fallback(no_such_route)
        .with_state(hub)
}

async fn no_such_route() -> HubError {
    HubError::NoSuchRoute
}

async fn model_info_at_main(
    State(hub): State<Arc<Hub>>,
    Path((owner, name)): Path<(String, String)>,
    Query(query): Query<ListingQuery>,
    headers: HeaderMap,
) -> Result<Json<ModelInfo>, HubError> {
    let repo = hub.readable_repo(&headers, &owner, &name)?;
    Ok(Json(repo.model_info(flag(query.blobs.as_ref()))))
}

async fn model_info(
    State(hub): State<Arc<Hub>>,
    Path((owner, name, revision)): Path<(String, String, String)>,
    Query(query): Query<ListingQuery>,
    headers: HeaderMap,
) -> Result<Json<ModelInfo>, HubError> {
    let repo = hub.readable_repo(&headers, &owner, &name)?;
    repo.check_revision(&revision)?;
    Ok(Json(repo.model_info(flag(query.blobs.as_ref()))))
}

async fn tree_root(
    State(hub): State<Arc<Hub>>,
    Path((owner, name, revision)): Path<(String, String, String)>,
    Query(query): Query<ListingQuery>,
    headers: HeaderMap,
) -> Result<Json<Vec<TreeEntry>>, HubError> {
    let repo = hub.readable_repo(&headers, &owner, &name)?;
    repo.check_revision(&revision)?;
    Ok(Json(repo.tree("", flag(query.recursive.as_ref()))?))
}

async fn tree_directory(
    State(hub): State<Arc<Hub>>,
    Path((owner, name, revision, directory)): Path<(String, String, String, String)>,
    Query(query): Query<ListingQuery>,
    headers: HeaderMap,
) -> Result<Json<Vec<TreeEntry>>, HubError> {
    let repo = hub.readable_repo(&headers, &owner, &name)?;
    repo.check_revision(&revision)?;
    let directory = directory.trim_end_matches('/');
    Ok(Json(repo.tree(directory, flag(query.recursive.as_ref()))?))
}

/// `HEAD`/`GET /{owner}/{name}/resolve/{revision}/{path}`: a regular file in place, an LFS
/// file as a redirect to the CDN carrying the file's metadata.
async fn resolve(
    State(hub): State<Arc<Hub>>,
    method: Method,
    Path((owner, name, revision, path)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, HubError> {
    let repo = hub.readable_repo(&headers, &owner, &name)?;
    repo.check_revision(&revision)?;
    let file = repo.file(&path)?;
    let mut answer = HeaderMap::new();
    answer.insert(X_REPO_COMMIT, header_value(&repo.commit));
    answer.insert(ETAG, quoted(&file.git_oid));
    let Some(lfs) = &file.lfs else {
        return hub.file_response(&method, &headers, file, answer);
    };
    let location = format!(
        "{}/repos/{owner}/{name}/{}/{}",
        hub.cdn_endpoint,
        lfs.sha256,
        encode_path(&file.path)
    );
    answer.insert(X_LINKED_ETAG, quoted(&lfs.sha256));
    answer.insert(X_LINKED_SIZE, HeaderValue::from(file.contents.listed.len()));
    answer.insert(LOCATION, header_value(&location));
    answer.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    let body = format!("Found. Redirecting to {location}");
    Ok((StatusCode::FOUND, answer, body).into_response())
}

/// `HEAD`/`GET` of a CDN link the hub handed out. Like a CDN's signed links, it needs no
/// token (the double's links are not signed).
async fn cdn_object(
    State(hub): State<Arc<Hub>>,
    method: Method,
    Path((owner, name, sha256, path)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, HubError> {
    let file = hub
        .repos
        .get(&format!("{owner}/{name}"))
        .and_then(|repo| repo.tree.files.get(&path))
        .filter(|file| file.lfs.as_ref().is_some_and(|lfs| lfs.sha256 == sha256))
        .ok_or(HubError::NoSuchObject)?;
    let basename = encode_path(path.rsplit('/').next().unwrap_or(&path));
    let mut answer = HeaderMap::new();
    answer.insert(ETAG, quoted(&sha256));
    answer.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    answer.insert(
        CONTENT_DISPOSITION,
        header_value(&format!(
            "inline; filename*=UTF-8''{basename}; filename=\"{basename}\";"
        )),
    );
    hub.file_response(&method, &headers, file, answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_blob_oid_matches_git_hash_object() {
        // `printf 'hello\n' | git hash-object --stdin`
        assert_eq!(
            HubDouble::git_blob_oid(b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        // The empty blob.
        assert_eq!(
            HubDouble::git_blob_oid(b""),
            "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
        );
    }

    #[test]
    fn lfs_pointer_has_the_size_the_hub_lists_for_a_hundred_megabyte_file() {
        let pointer = lfs_pointer(&"a".repeat(64), 123_456_789);
        assert_eq!(pointer.len(), 134);
    }

    #[test]
    fn paths_are_encoded_as_python_quote_does() {
        assert_eq!(
            encode_path("sub dir/model+v1.gguf"),
            "sub%20dir/model%2Bv1.gguf"
        );
        assert_eq!(
            encode_path("model-00001-of-00002.gguf"),
            "model-00001-of-00002.gguf"
        );
    }

    #[test]
    fn a_repository_commit_depends_on_its_contents() {
        let a = HubRepo::new("org/model", vec![HubFile::regular("a", "1")]);
        let same = HubRepo::new("org/model", vec![HubFile::regular("a", "1")]);
        let other = HubRepo::new("org/model", vec![HubFile::regular("a", "2")]);
        assert_eq!(a.commit, same.commit);
        assert_ne!(a.commit, other.commit);
        assert_eq!(a.commit.len(), 40);
    }

    #[test]
    fn tree_lists_children_or_everything_below() {
        let repo = Repo::new(HubRepo::new(
            "org/model",
            vec![
                HubFile::regular("config.json", "{}"),
                HubFile::lfs("weights/a.gguf", "aaaa"),
                HubFile::lfs("weights/deep/b.gguf", "bbbb"),
            ],
        ));
        let paths = |entries: Vec<TreeEntry>| {
            entries
                .iter()
                .map(|entry| entry.path().to_owned())
                .collect::<Vec<_>>()
        };
        let root = repo.tree("", false).expect("the root exists");
        assert_eq!(paths(root), ["config.json", "weights"]);
        let all = repo.tree("", true).expect("the root exists");
        assert_eq!(
            paths(all),
            [
                "config.json",
                "weights",
                "weights/a.gguf",
                "weights/deep",
                "weights/deep/b.gguf"
            ]
        );
        let weights = repo.tree("weights", false).expect("weights exists");
        assert_eq!(paths(weights), ["weights/a.gguf", "weights/deep"]);
        assert!(matches!(
            repo.tree("nothing", false),
            Err(HubError::EntryNotFound { .. })
        ));
    }
}
