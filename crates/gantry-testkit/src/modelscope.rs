//! A TEST DOUBLE of ModelScope's HTTP API, for tests of code that downloads models from
//! ModelScope: an in-process server on `127.0.0.1:0` that answers the `/api/v1` requests a
//! download makes the way www.modelscope.cn answers them, closely enough that the official
//! `modelscope` Python client (1.40, which downloads through `modelscope_hub`) downloads from
//! it (`tests/modelscope_double.rs` proves that with the real client). It is not a hub:
//! repositories are fixed when it starts and nothing can be uploaded.
//!
//! What it implements, for model repositories whose ids are `owner/name`, each with one
//! commit that the `master` branch and the repository's tags point at:
//! - `GET /api/v1/models/{owner}/{name}`: the model's info (`Id`, `Name`, `Path` (the owner),
//!   `Visibility`, times), in the hub's envelope `{"Code": 200, "Success": true, "Message":
//!   "success", "RequestId", "Data"}`.
//! - `GET /api/v1/models/{owner}/{name}/revisions[?EndTime=…]`: `Data.RevisionMap` with
//!   `Branches` (`master`) and `Tags`, each `{Revision, CreatedAt, CreatedBy, Message}`.
//! - `GET /api/v1/models/{owner}/{name}/repo/files?Revision=…&Recursive=True[&Root=dir]`:
//!   `Data.Files`, every file and directory (`Type` `blob` or `tree`) with `Path`, `Name`,
//!   `Size`, `Sha256` (of every file, LFS or not, as the client verifies them), `IsLFS`,
//!   `Mode`, `Revision` (the commit) and commit fields; and `Data.LatestCommitter`, the commit
//!   (`Id`, `ShortId`, …; [`ModelscopeRepo::with_commit_id_hidden`] leaves `Id` empty, as
//!   some of the hub's answers do). `Recursive=False` lists the children of `Root` (or of the top).
//!   The revision is `master`, a tag or the commit; any other revision is answered, as the
//!   hub does, with a success whose `Files` is `null`.
//! - `GET`/`HEAD /api/v1/models/{owner}/{name}/repo?Revision=…&FilePath=…`: a regular file is
//!   answered in place, whole, whatever `Range` asks (the client notes that files served
//!   without a redirect ignore ranges); an LFS file with a `302` to the object store, a second
//!   listener (a second origin, as the hub's OSS and CDN hosts are).
//! - The object store: `GET`/`HEAD /lfs/{owner}/{name}/{sha256}`, with `ETag: "<sha256>"` and
//!   `X-Linked-ETag: "<sha256>"` (the client takes the object's SHA-256 from it) and ranges:
//!   `bytes=a-b`, `bytes=a-` and `bytes=-n` answer `206` with `Content-Range`, an
//!   unsatisfiable one `416` with `Content-Range: bytes */size`.
//! - Errors in the hub's envelope (`{"Code": <business code>, "Message", "RequestId",
//!   "Success": false}`): an unknown model `404` (code `10010205001`, "record not found", as
//!   measured on `revisions`), a file the revision does not have (or a revision the model
//!   does not have) `404` with code `10990101007` and the hub's own message, both measured on
//!   www.modelscope.cn. A `Root` that is not a directory is a `404` too (the client expects
//!   one; its code is not measured).
//!
//! What a test can do with it: count the file bytes actually handed to each connection
//! ([`ModelscopeDouble::bytes_served`], chunk by chunk, so an interrupted transfer counts what
//! went out), read the request log, and serve bytes that do not match the listed SHA-256
//! ([`ModelscopeDouble::corrupt`]).
//!
//! What it does not do: tokens and private models (the client sends a token as `Authorization:
//! Bearer` and an `m_session_id` cookie; the double ignores both and every model is public),
//! datasets, studios and the `/openapi/v1` surface, uploads, branches other than `master`,
//! more than one commit, the listing's truncation at 3000 entries, the intra-cloud
//! acceleration probe (`/api/v1/repos/internalAccelerationInfo` is a `404`, which the client
//! takes as "no region"), signed or expiring object-store links, and archive downloads.
//! Commits are derived from the contents, not real git commits; the commit fields' texts and
//! times are fixed.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::header::{CONTENT_RANGE, CONTENT_TYPE, ETAG, LOCATION};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::double::{
    assert_commit, derived_commit, flag, header_value, listed_under, owner_and_name, quoted,
    Contents, RangeNotSatisfiable, RepoFile, Running, Serving, Tree,
};

const X_LINKED_ETAG: HeaderName = HeaderName::from_static("x-linked-etag");
const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The only branch; tags and the commit id are the other accepted revisions.
const MASTER_BRANCH: &str = "master";
/// When every repository, branch, tag and commit was made (2024-01-01T00:00:00Z), in the
/// epoch seconds the hub uses.
const REPO_TIME: i64 = 1_704_067_200;
/// The name the double gives every commit's author, committer and branch creator.
const COMMITTER: &str = "gantry-test";
/// The hub's business codes, as measured on www.modelscope.cn.
const CODE_OK: u64 = 200;
const CODE_MODEL_NOT_FOUND: u64 = 10_010_205_001;
const CODE_FILE_NOT_FOUND: u64 = 10_990_101_007;

/// One file of a repository, as a test defines it. An LFS file is downloaded through the
/// object store's redirect.
pub type ModelscopeFile = RepoFile;

/// One model repository with a single commit, which `master` and every tag point at.
#[derive(Debug, Clone)]
pub struct ModelscopeRepo {
    /// `owner/name`.
    pub id: String,
    /// 40 lowercase hex digits: what the listing names as `LatestCommitter.Id`.
    pub commit: String,
    pub files: Vec<ModelscopeFile>,
    /// Tags, besides the `master` branch, that name the commit.
    pub tags: Vec<String>,
    /// Whether the listing's `LatestCommitter.Id` is left empty (its `ShortId` is still
    /// there), as some of the hub's answers do: a client then cannot learn the full commit.
    pub hide_commit_id: bool,
}

impl ModelscopeRepo {
    /// A repository whose commit is derived from its id and contents, so the same
    /// repository always has the same commit and different contents a different one.
    pub fn new(id: impl Into<String>, files: Vec<ModelscopeFile>) -> Self {
        let id = id.into();
        let commit = derived_commit(
            b"gantry modelscope double commit\0",
            &id,
            &files,
            ModelscopeDouble::sha256,
        );
        Self {
            id,
            commit,
            files,
            tags: Vec::new(),
            hide_commit_id: false,
        }
    }

    /// Adds a tag that names the repository's commit.
    pub fn with_tag(mut self, tag: impl Into<String>) -> Self {
        self.tags.push(tag.into());
        self
    }

    /// Leaves the listing's `LatestCommitter.Id` empty.
    pub fn with_commit_id_hidden(mut self) -> Self {
        self.hide_commit_id = true;
        self
    }
}

/// The running double: the hub's origin ([`ModelscopeDouble::endpoint`], what
/// `MODELSCOPE_ENDPOINT` is set to) and an object-store origin. Both stop when it is
/// dropped (or, awaited, with [`ModelscopeDouble::shutdown`]); transfers still going then
/// end early.
pub struct ModelscopeDouble {
    endpoint: String,
    oss_endpoint: String,
    hub: Arc<Hub>,
    running: Running,
}

impl std::fmt::Debug for ModelscopeDouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelscopeDouble")
            .field("endpoint", &self.endpoint)
            .field("oss_endpoint", &self.oss_endpoint)
            .finish_non_exhaustive()
    }
}

impl ModelscopeDouble {
    /// Starts serving `repos`. Panics on a malformed repository (an id without exactly one
    /// `/`, a commit that is not 40 lowercase hex digits, a tag named `master` or twice, two
    /// files at one path, a path with an empty segment) or when it cannot listen: it is a
    /// test fixture.
    pub async fn start(repos: Vec<ModelscopeRepo>) -> ModelscopeDouble {
        let serving = Serving::new("modelscope double");
        let (hub_listener, endpoint) = serving.bind_loopback().await;
        let (oss_listener, oss_endpoint) = serving.bind_loopback().await;
        let hub = Arc::new(Hub::new(repos, oss_endpoint.clone(), serving.clone()));
        let running = serving.serve([
            ("hub", hub_listener, hub_router(hub.clone())),
            ("object store", oss_listener, oss_router(hub.clone())),
        ]);
        ModelscopeDouble {
            endpoint,
            oss_endpoint,
            hub,
            running,
        }
    }

    /// The hub's base URL, `http://127.0.0.1:PORT`: what `MODELSCOPE_ENDPOINT` (and gantry's
    /// `modelscope_endpoint`) is set to.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// The object store's base URL, where the hub redirects LFS downloads.
    pub fn oss_endpoint(&self) -> String {
        self.oss_endpoint.clone()
    }

    /// The bytes of the file's body handed to client connections so far, in place and
    /// through the object store together; counted chunk by chunk as each is sent. Panics on
    /// a file the double does not hold.
    pub fn bytes_served(&self, repo_id: &str, path: &str) -> u64 {
        self.hub.file(repo_id, path).contents.bytes_served()
    }

    /// The file body bytes handed to client connections, over all files.
    pub fn total_bytes_served(&self) -> u64 {
        self.hub.serving.total_bytes_served()
    }

    /// Every request received so far, in order, by the hub and the object store alike: the
    /// method, the path with its query as sent, and the `Range` header when there was one,
    /// e.g. `"GET /api/v1/models/org/model/repo?Revision=master&FilePath=model.gguf"` or
    /// `"GET /lfs/org/model/<sha256> bytes=100-"`.
    pub fn requests(&self) -> Vec<String> {
        self.hub.serving.requests()
    }

    /// From now on serves different bytes of the same length for the file, while the
    /// listing and `X-Linked-ETag` still name the original contents. Panics on an unknown or
    /// empty file.
    pub fn corrupt(&self, repo_id: &str, path: &str) {
        self.hub.file(repo_id, path).contents.corrupt();
    }

    /// The lowercase hex SHA-256 of `bytes`: a file's `Sha256` in the listing.
    pub fn sha256(bytes: &[u8]) -> String {
        crate::double::sha256(bytes)
    }

    /// Stops both listeners and waits until every connection has closed.
    pub async fn shutdown(self) {
        self.running.shutdown().await;
    }
}

/// What the handlers share.
struct Hub {
    repos: HashMap<String, Repo>,
    oss_endpoint: String,
    /// Numbers the `RequestId`s of answers.
    next_request: AtomicU64,
    serving: Arc<Serving>,
}

struct Repo {
    owner: String,
    name: String,
    /// Numbers the model, as the hub's `Id` does.
    number: u64,
    commit: String,
    tags: Vec<String>,
    hide_commit_id: bool,
    tree: Tree<File>,
}

struct File {
    path: String,
    /// What the listing and hashes describe, what is sent, and how much of it went out.
    contents: Arc<Contents>,
    sha256: String,
    lfs: bool,
}

impl Hub {
    fn new(repos: Vec<ModelscopeRepo>, oss_endpoint: String, serving: Arc<Serving>) -> Self {
        let mut by_id = HashMap::new();
        for (number, repo) in (1_u64..).zip(repos) {
            let id = repo.id.clone();
            assert!(
                by_id.insert(id.clone(), Repo::new(repo, number)).is_none(),
                "two repositories named {id:?}"
            );
        }
        Self {
            repos: by_id,
            oss_endpoint,
            next_request: AtomicU64::new(1),
            serving,
        }
    }

    fn file(&self, repo_id: &str, path: &str) -> &Arc<File> {
        self.repos
            .get(repo_id)
            .and_then(|repo| repo.tree.files.get(path))
            .unwrap_or_else(|| {
                panic!("the modelscope double holds no file {path:?} in {repo_id:?}")
            })
    }

    fn repo(&self, owner: &str, name: &str) -> Result<&Repo, ModelscopeError> {
        self.repos
            .get(&format!("{owner}/{name}"))
            .ok_or(ModelscopeError::ModelNotFound)
    }

    /// A fresh id in the form of the hub's (a UUID).
    fn request_id(&self) -> String {
        let n = self.next_request.fetch_add(1, Ordering::Relaxed);
        format!("00000000-0000-4000-8000-{n:012x}")
    }

    /// A successful answer in the hub's envelope.
    fn ok<T: Serialize>(&self, data: T) -> Response {
        let envelope = Envelope {
            code: CODE_OK,
            data: Some(data),
            message: "success".to_owned(),
            request_id: self.request_id(),
            success: true,
        };
        Json(envelope).into_response()
    }

    /// The answer to a failed request.
    fn error(&self, error: ModelscopeError) -> Response {
        let request_id = self.request_id();
        let (status, code, message) = match &error {
            ModelscopeError::ModelNotFound => (
                StatusCode::NOT_FOUND,
                CODE_MODEL_NOT_FOUND,
                "获取模型信息失败，信息：record not found".to_owned(),
            ),
            ModelscopeError::FileNotFound => (
                StatusCode::NOT_FOUND,
                CODE_FILE_NOT_FOUND,
                "获取模型文件失败，文件内容为空".to_owned(),
            ),
            ModelscopeError::DirectoryNotFound { root } => (
                StatusCode::NOT_FOUND,
                CODE_FILE_NOT_FOUND,
                format!("path not found: {root}"),
            ),
            ModelscopeError::RangeNotSatisfiable { size } => {
                let headers = [(CONTENT_RANGE, header_value(&format!("bytes */{size}")))];
                return (StatusCode::RANGE_NOT_SATISFIABLE, headers).into_response();
            }
            ModelscopeError::NoSuchObject => {
                return (StatusCode::NOT_FOUND, "NoSuchKey").into_response();
            }
            ModelscopeError::NoSuchRoute => (StatusCode::NOT_FOUND, 404, "Not Found".to_owned()),
        };
        let envelope: Envelope<()> = Envelope {
            code,
            data: None,
            message,
            request_id: request_id.clone(),
            success: false,
        };
        let headers = [(X_REQUEST_ID, header_value(&request_id))];
        (status, headers, Json(envelope)).into_response()
    }

    /// The response carrying `file`'s served bytes, the range asked of them when `ranges`,
    /// with `headers` and the content type added; its body counts what it sends.
    fn file_response(
        &self,
        method: &Method,
        request_headers: &HeaderMap,
        file: &File,
        ranges: bool,
        mut headers: HeaderMap,
    ) -> Response {
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        self.serving
            .file_response(method, request_headers, &file.contents, ranges, headers)
            .unwrap_or_else(|RangeNotSatisfiable { size }| {
                self.error(ModelscopeError::RangeNotSatisfiable { size })
            })
    }
}

impl Repo {
    fn new(repo: ModelscopeRepo, number: u64) -> Self {
        let ModelscopeRepo {
            id,
            commit,
            files: repo_files,
            tags,
            hide_commit_id,
        } = repo;
        let (owner, name) = owner_and_name(&id);
        assert_commit(&id, &commit);
        let distinct: BTreeSet<&String> = tags.iter().collect();
        assert!(
            distinct.len() == tags.len() && !tags.iter().any(|tag| tag == MASTER_BRANCH),
            "the tags of {id} repeat or name the master branch: {tags:?}"
        );
        let tree = Tree::new(&id, repo_files, |file| File {
            sha256: ModelscopeDouble::sha256(&file.bytes),
            contents: Contents::new(file.bytes),
            path: file.path,
            lfs: file.lfs,
        });
        Self {
            owner: owner.to_owned(),
            name: name.to_owned(),
            number,
            commit,
            tags,
            hide_commit_id,
            tree,
        }
    }

    /// Whether the repository has the revision: `master`, a tag or the commit.
    fn has_revision(&self, revision: &str) -> bool {
        revision == MASTER_BRANCH
            || revision == self.commit
            || self.tags.iter().any(|tag| tag == revision)
    }

    fn info(&self) -> ModelInfo {
        ModelInfo {
            id: self.number,
            name: self.name.clone(),
            path: self.owner.clone(),
            chinese_name: String::new(),
            description: String::new(),
            // 5 is public on the hub (1 is private).
            visibility: 5,
            created_time: REPO_TIME,
            last_updated_time: REPO_TIME,
        }
    }

    /// The repository's one commit, as the listing's `LatestCommitter`.
    fn latest_committer(&self) -> CommitInfo {
        CommitInfo {
            id: if self.hide_commit_id {
                String::new()
            } else {
                self.commit.clone()
            },
            short_id: self.commit[..8].to_owned(),
            title: "Upload the model".to_owned(),
            message: "Upload the model".to_owned(),
            author_name: COMMITTER.to_owned(),
            author_email: format!("{COMMITTER}@example.com"),
            authored_date: REPO_TIME,
            committer_name: COMMITTER.to_owned(),
            committer_email: format!("{COMMITTER}@example.com"),
            committed_date: REPO_TIME,
            created_at: REPO_TIME,
            parent_ids: Vec::new(),
        }
    }

    /// The entries under `root` ("" for the top): its children, or with `recursive`
    /// everything below it, directories included.
    fn listing(&self, root: &str, recursive: bool) -> Result<Vec<ListingEntry>, ModelscopeError> {
        if !self.tree.has_directory(root) {
            return Err(ModelscopeError::DirectoryNotFound {
                root: root.to_owned(),
            });
        }
        let wanted = listed_under(root, recursive);
        let base_name = |path: &str| path.rsplit('/').next().unwrap_or(path).to_owned();
        let mut entries: Vec<ListingEntry> = self
            .tree
            .directories
            .iter()
            .filter(|path| wanted(path))
            .map(|path| ListingEntry {
                name: base_name(path),
                path: path.clone(),
                kind: "tree",
                size: 0,
                sha256: String::new(),
                is_lfs: false,
                mode: "040000",
                revision: self.commit.clone(),
                commit_message: "Upload the model".to_owned(),
                committer_name: COMMITTER.to_owned(),
                committed_date: REPO_TIME,
                in_check: false,
            })
            .chain(
                self.tree
                    .files
                    .values()
                    .filter(|file| wanted(&file.path))
                    .map(|file| ListingEntry {
                        name: base_name(&file.path),
                        path: file.path.clone(),
                        kind: "blob",
                        size: file.contents.listed.len() as u64,
                        sha256: file.sha256.clone(),
                        is_lfs: file.lfs,
                        mode: "100644",
                        revision: self.commit.clone(),
                        commit_message: "Upload the model".to_owned(),
                        committer_name: COMMITTER.to_owned(),
                        committed_date: REPO_TIME,
                        in_check: false,
                    }),
            )
            .collect();
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(entries)
    }
}

/// Every way a request fails; [`Hub::error`] turns each into the hub's answer.
#[derive(Debug)]
enum ModelscopeError {
    ModelNotFound,
    /// A file the revision does not have, or a revision the model does not have.
    FileNotFound,
    /// A listing's `Root` that is no directory of the revision.
    DirectoryNotFound {
        root: String,
    },
    RangeNotSatisfiable {
        size: u64,
    },
    /// An object-store link that names no file.
    NoSuchObject,
    /// A path the double has no route for.
    NoSuchRoute,
}

/// The hub's envelope around every `/api/v1` answer.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Envelope<T> {
    code: u64,
    data: Option<T>,
    message: String,
    request_id: String,
    success: bool,
}

/// `Data` of `GET /api/v1/models/{id}`: the fields the double knows.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ModelInfo {
    id: u64,
    name: String,
    path: String,
    chinese_name: String,
    description: String,
    visibility: u32,
    created_time: i64,
    last_updated_time: i64,
}

/// `Data` of `GET /api/v1/models/{id}/revisions`.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct RevisionsData {
    revision_map: RevisionMap,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct RevisionMap {
    branches: Vec<RevisionInfo>,
    tags: Vec<RevisionInfo>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct RevisionInfo {
    revision: String,
    created_at: i64,
    created_by: String,
    message: String,
}

/// `Data` of `GET /api/v1/models/{id}/repo/files`; `Files` is `null` for a revision the
/// model does not have.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ListingData {
    files: Option<Vec<ListingEntry>>,
    latest_committer: Option<CommitInfo>,
    is_visual: u32,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ListingEntry {
    name: String,
    path: String,
    #[serde(rename = "Type")]
    kind: &'static str,
    size: u64,
    sha256: String,
    #[serde(rename = "IsLFS")]
    is_lfs: bool,
    mode: &'static str,
    /// The commit.
    revision: String,
    commit_message: String,
    committer_name: String,
    committed_date: i64,
    in_check: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct CommitInfo {
    id: String,
    short_id: String,
    title: String,
    message: String,
    author_name: String,
    author_email: String,
    authored_date: i64,
    committer_name: String,
    committer_email: String,
    committed_date: i64,
    created_at: i64,
    parent_ids: Vec<String>,
}

/// The query of `repo/files`; the client sends Python booleans as `True`/`False`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListingQuery {
    revision: Option<String>,
    recursive: Option<String>,
    root: Option<String>,
}

/// The query of `repo` (a file download).
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct FileQuery {
    revision: Option<String>,
    file_path: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RevisionsQuery {
    end_time: Option<i64>,
}

fn hub_router(hub: Arc<Hub>) -> Router {
    Router::new()
        .route("/api/v1/models/{owner}/{name}", get(model_info))
        .route("/api/v1/models/{owner}/{name}/revisions", get(revisions))
        .route("/api/v1/models/{owner}/{name}/repo/files", get(repo_files))
        .route(
            "/api/v1/models/{owner}/{name}/repo",
            get(repo_file).head(repo_file),
        )
        .fallback(no_such_route)
        .with_state(hub)
}

fn oss_router(hub: Arc<Hub>) -> Router {
    Router::new()
        .route(
            "/lfs/{owner}/{name}/{sha256}",
            get(oss_object).head(oss_object),
        )
        .fallback(no_such_route)
        .with_state(hub)
}

async fn no_such_route(State(hub): State<Arc<Hub>>) -> Response {
    hub.error(ModelscopeError::NoSuchRoute)
}

async fn model_info(
    State(hub): State<Arc<Hub>>,
    Path((owner, name)): Path<(String, String)>,
) -> Response {
    match hub.repo(&owner, &name) {
        Ok(repo) => hub.ok(repo.info()),
        Err(e) => hub.error(e),
    }
}

async fn revisions(
    State(hub): State<Arc<Hub>>,
    Path((owner, name)): Path<(String, String)>,
    Query(query): Query<RevisionsQuery>,
) -> Response {
    let repo = match hub.repo(&owner, &name) {
        Ok(repo) => repo,
        Err(e) => return hub.error(e),
    };
    // Everything was made at REPO_TIME: an EndTime before it hides every revision.
    let visible = query.end_time.is_none_or(|end| end >= REPO_TIME);
    let revision = |name: &str| RevisionInfo {
        revision: name.to_owned(),
        created_at: REPO_TIME,
        created_by: COMMITTER.to_owned(),
        message: String::new(),
    };
    let (branches, tags) = if visible {
        (
            vec![revision(MASTER_BRANCH)],
            repo.tags.iter().map(|tag| revision(tag)).collect(),
        )
    } else {
        (Vec::new(), Vec::new())
    };
    hub.ok(RevisionsData {
        revision_map: RevisionMap { branches, tags },
    })
}

async fn repo_files(
    State(hub): State<Arc<Hub>>,
    Path((owner, name)): Path<(String, String)>,
    Query(query): Query<ListingQuery>,
) -> Response {
    let repo = match hub.repo(&owner, &name) {
        Ok(repo) => repo,
        Err(e) => return hub.error(e),
    };
    let revision = query.revision.as_deref().unwrap_or(MASTER_BRANCH);
    if !repo.has_revision(revision) {
        // The hub's trap: an unknown revision is a success without files.
        return hub.ok(ListingData {
            files: None,
            latest_committer: None,
            is_visual: 0,
        });
    }
    let root = query.root.as_deref().unwrap_or_default().trim_matches('/');
    match repo.listing(root, flag(query.recursive.as_ref())) {
        Ok(files) => hub.ok(ListingData {
            files: Some(files),
            latest_committer: Some(repo.latest_committer()),
            is_visual: 0,
        }),
        Err(e) => hub.error(e),
    }
}

/// `GET`/`HEAD /api/v1/models/{owner}/{name}/repo?Revision=…&FilePath=…`: a regular file in
/// place, an LFS file as a redirect to the object store.
async fn repo_file(
    State(hub): State<Arc<Hub>>,
    method: Method,
    Path((owner, name)): Path<(String, String)>,
    Query(query): Query<FileQuery>,
    headers: HeaderMap,
) -> Response {
    let repo = match hub.repo(&owner, &name) {
        Ok(repo) => repo,
        Err(e) => return hub.error(e),
    };
    let revision = query.revision.as_deref().unwrap_or(MASTER_BRANCH);
    let file = query
        .file_path
        .as_deref()
        .map(|path| path.trim_start_matches('/'))
        .and_then(|path| repo.tree.files.get(path))
        .filter(|_| repo.has_revision(revision));
    let Some(file) = file else {
        return hub.error(ModelscopeError::FileNotFound);
    };
    if !file.lfs {
        return hub.file_response(&method, &headers, file, false, HeaderMap::new());
    }
    let location = format!("{}/lfs/{owner}/{name}/{}", hub.oss_endpoint, file.sha256);
    let answer = [(LOCATION, header_value(&location))];
    (StatusCode::FOUND, answer).into_response()
}

/// `GET`/`HEAD` of an object-store link the hub handed out. Like the store's signed links,
/// it needs no credentials (the double's links are not signed).
async fn oss_object(
    State(hub): State<Arc<Hub>>,
    method: Method,
    Path((owner, name, sha256)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let file = hub.repos.get(&format!("{owner}/{name}")).and_then(|repo| {
        repo.tree
            .files
            .values()
            .find(|file| file.lfs && file.sha256 == sha256)
    });
    let Some(file) = file else {
        return hub.error(ModelscopeError::NoSuchObject);
    };
    let mut answer = HeaderMap::new();
    answer.insert(ETAG, quoted(&file.sha256));
    answer.insert(X_LINKED_ETAG, quoted(&file.sha256));
    hub.file_response(&method, &headers, file, true, answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repository_commit_depends_on_its_contents() {
        let a = ModelscopeRepo::new("org/model", vec![ModelscopeFile::regular("a", "1")]);
        let same = ModelscopeRepo::new("org/model", vec![ModelscopeFile::regular("a", "1")]);
        let other = ModelscopeRepo::new("org/model", vec![ModelscopeFile::regular("a", "2")]);
        assert_eq!(a.commit, same.commit);
        assert_ne!(a.commit, other.commit);
        assert_eq!(a.commit.len(), 40);
    }

    #[test]
    fn listings_hold_children_or_everything_below() {
        let repo = Repo::new(
            ModelscopeRepo::new(
                "org/model",
                vec![
                    ModelscopeFile::regular("config.json", "{}"),
                    ModelscopeFile::lfs("weights/a.gguf", "aaaa"),
                    ModelscopeFile::lfs("weights/deep/b.gguf", "bbbb"),
                ],
            ),
            1,
        );
        let paths = |entries: Vec<ListingEntry>| {
            entries
                .into_iter()
                .map(|entry| (entry.path, entry.kind))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            paths(repo.listing("", false).expect("the top exists")),
            [
                ("config.json".to_owned(), "blob"),
                ("weights".to_owned(), "tree")
            ]
        );
        assert_eq!(
            paths(repo.listing("weights", true).expect("weights exists")),
            [
                ("weights/a.gguf".to_owned(), "blob"),
                ("weights/deep".to_owned(), "tree"),
                ("weights/deep/b.gguf".to_owned(), "blob")
            ]
        );
        assert!(matches!(
            repo.listing("nothing", true),
            Err(ModelscopeError::DirectoryNotFound { .. })
        ));
        assert!(repo.has_revision(MASTER_BRANCH) && repo.has_revision(&repo.commit.clone()));
        assert!(!repo.has_revision("main"));
    }
}
