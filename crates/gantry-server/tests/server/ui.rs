//! The web UI as the real server serves it: the page and its assets with their content
//! types, security and cache headers; every module the page imports, followed from the
//! entry as the browser does; unknown UI paths answering in the API's error shape; and the
//! UI's contract with the API (the session cookie works, every API path the modules call
//! exists in the OpenAPI spec).
//!
//! The UI's static routes touch no database, so these run on SQLite only.
//!
//! The page, its assets, their headers and the session cookie are read with raw HTTP:
//! that is what the browser sees, and the typed API client does not serve assets or keep
//! cookies. The API itself is called through the typed client.
//!
//! Three tests drive the console in a real browser: Debian's `chromium`, through
//! Playwright's Python package (`tests/ui_browser.py`, run with `GANTRY_PYTHON`): the
//! servers screen; the progress of downloads with the model files screen; and uploading a
//! file on the model files screen to deploy it as a model's source. They take screenshots
//! of what they checked, under `target/tmp/ui-screenshots/`.
//!
//! The model files screen lists what the server reads from each worker's own API. This
//! crate's tests cannot start the real worker (`gantry-worker`; the end-to-end tests of
//! the `gantry` crate do), so a stand-in serves that API here ([`CacheDouble`]): the same
//! routes and token, answering with the contract's own type, `CachedModelFile`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use crate::common::{
    assert_raw_error, expect_error, model, simulated_worker, user, TestServer, ADMIN_PASSWORD,
};
use axum::extract::{Path as UrlPath, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gantry_client::{Client, ClientError};
use gantry_testkit::TestEngine;
use gantry_types::{
    CachedModelFile, ClusterStatus, ErrorCode, InstancePatch, ModelFileState, ModelQuery,
    ModelSource, ServerRole, Timestamp, UploadList, UploadState, WorkerRegister,
};
use reqwest::header::{
    AUTHORIZATION, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, COOKIE, ETAG,
    IF_NONE_MATCH, SET_COOKIE, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use reqwest::{Method, StatusCode};
use serde_json::Value;

async fn get(server: &TestServer, path: &str) -> reqwest::Response {
    server
        .http
        .get(format!("{}{path}", server.base))
        .send()
        .await
        .unwrap()
}

fn header(response: &reqwest::Response, name: reqwest::header::HeaderName) -> &str {
    response
        .headers()
        .get(&name)
        .unwrap_or_else(|| panic!("{} has no {name} header", response.url()))
        .to_str()
        .unwrap()
}

/// The `src` or `href` values in the page that point at `/ui/`.
fn asset_urls(page: &str) -> Vec<String> {
    let mut urls = Vec::new();
    for attribute in ["src=\"", "href=\""] {
        for part in page.split(attribute).skip(1) {
            let url = &part[..part.find('"').unwrap()];
            if url.starts_with("/ui/") {
                urls.push(url.to_string());
            }
        }
    }
    urls
}

/// The versioned URL the page names for `file` (`/ui/v/<version>/<file>`).
fn versioned_url<'a>(urls: &'a [String], file: &str) -> &'a str {
    urls.iter()
        .find(|u| u.starts_with("/ui/v/") && u.ends_with(&format!("/{file}")))
        .unwrap_or_else(|| panic!("the page names no versioned {file}: {urls:?}"))
}

/// The modules a module imports statically (`import … from './x.js'`, also across lines,
/// and `import './x.js'`), as written. JSDoc `@import` tags are comments, which the
/// browser does not load.
fn imports_of(script: &str) -> Vec<String> {
    let mut specifiers = Vec::new();
    let mut in_import = false;
    for line in script.lines() {
        let line = line.trim_start();
        if line.starts_with("import ") {
            in_import = true;
        }
        if !in_import {
            continue;
        }
        // The specifier is the statement's last quoted string; the statement ends with it.
        if let Some(end) = line.rfind(['\'', '"']) {
            let quote = line.as_bytes()[end] as char;
            if let Some(start) = line[..end].rfind(quote) {
                if line[..start].ends_with("from ") || line.starts_with("import ") {
                    specifiers.push(line[start + 1..end].to_string());
                    in_import = false;
                }
            }
        }
    }
    specifiers
}

/// Every module the page loads: the entry it names, then every module imported from one
/// already found, resolved against the importer's URL as the browser resolves it. Answers
/// each module's URL path with its response's headers and text.
async fn page_modules(server: &TestServer) -> Vec<(String, reqwest::header::HeaderMap, String)> {
    let page = get(server, "/").await.text().await.unwrap();
    let entry = versioned_url(&asset_urls(&page), "app.js").to_string();
    let base = reqwest::Url::parse(&server.base).unwrap();
    let mut modules = Vec::new();
    let mut queue = vec![entry];
    while let Some(path) = queue.pop() {
        if modules.iter().any(|(seen, _, _)| *seen == path) {
            continue;
        }
        let response = get(server, &path).await;
        assert_eq!(response.status(), StatusCode::OK, "{path} is not served");
        let headers = response.headers().clone();
        let script = response.text().await.unwrap();
        let url = base.join(&path).unwrap();
        for specifier in imports_of(&script) {
            // The browser resolves only URLs without an import map: relative ones, with
            // their file name.
            assert!(
                (specifier.starts_with("./") || specifier.starts_with("../"))
                    && specifier.ends_with(".js"),
                "{path} imports {specifier}, which the browser cannot resolve"
            );
            queue.push(url.join(&specifier).unwrap().path().to_string());
        }
        modules.push((path, headers, script));
    }
    modules
}

fn assert_strict_csp(response: &reqwest::Response) {
    let csp = header(response, CONTENT_SECURITY_POLICY);
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "CSP lacks {directive}: {csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert!(!csp.contains("unsafe-eval"), "{csp}");
    assert!(
        !csp.contains("http"),
        "the UI must load nothing from elsewhere: {csp}"
    );
    assert_eq!(header(response, X_CONTENT_TYPE_OPTIONS), "nosniff");
    assert_eq!(header(response, X_FRAME_OPTIONS), "DENY");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_serves_the_page_with_its_script_and_a_strict_csp() {
    let server = TestServer::start(TestEngine::Sqlite).await;
    let response = get(&server, "/").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, CONTENT_TYPE), "text/html; charset=utf-8");
    assert_strict_csp(&response);
    // The page names versioned assets, so it must itself be revalidated every time.
    assert_eq!(header(&response, CACHE_CONTROL), "no-cache");
    assert!(header(&response, ETAG).starts_with('"'));
    let page = response.text().await.unwrap();
    assert!(page.starts_with("<!doctype html>"), "{page}");
    let urls = asset_urls(&page);
    let script = versioned_url(&urls, "app.js");
    versioned_url(&urls, "app.css");
    // The entry is an ES module, which imports the others.
    assert!(
        page.contains(&format!(
            "<script type=\"module\" src=\"{script}\"></script>"
        )),
        "{page}"
    );
    // No inline script or style: the CSP would block them.
    for script in page.split("<script").skip(1) {
        let end = script.find('>').unwrap();
        assert!(script[..end].contains("src="), "inline script in {page}");
        assert!(script[end + 1..].starts_with("</script>"), "{page}");
    }
    assert!(!page.contains("<style"), "{page}");
    assert!(!page.contains("style=\""), "{page}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assets_have_their_content_types_and_cache_headers() {
    let server = TestServer::start(TestEngine::Sqlite).await;
    let page = get(&server, "/").await.text().await.unwrap();
    let urls = asset_urls(&page);
    let expected = [
        ("app.js", "text/javascript; charset=utf-8"),
        ("app.css", "text/css; charset=utf-8"),
        ("favicon.svg", "image/svg+xml"),
    ];
    for (file, content_type) in expected {
        let versioned = versioned_url(&urls, file);
        let path = &format!("/ui/{file}");

        // The versioned URL the page uses may be kept for good.
        let response = get(&server, versioned).await;
        assert_eq!(response.status(), StatusCode::OK, "{versioned}");
        assert_eq!(header(&response, CONTENT_TYPE), content_type, "{versioned}");
        assert_strict_csp(&response);
        assert_eq!(
            header(&response, CACHE_CONTROL),
            "public, max-age=31536000, immutable"
        );
        let etag = header(&response, ETAG).to_string();
        assert!(!response.bytes().await.unwrap().is_empty());

        // Any other URL of the asset is revalidated (the unversioned one, and the URL of
        // another version: a page from another server of the cluster), and an unchanged
        // one is a 304.
        let other_version = format!("/ui/v/0123456789abcdef/{file}");
        for url in [path, &other_version] {
            let response = get(&server, url).await;
            assert_eq!(response.status(), StatusCode::OK, "{url}");
            assert_eq!(header(&response, CONTENT_TYPE), content_type, "{url}");
            assert_eq!(header(&response, CACHE_CONTROL), "no-cache", "{url}");
            assert_eq!(header(&response, ETAG), etag, "{url}");
        }
        let response = server
            .http
            .get(format!("{}{path}", server.base))
            .header(IF_NONE_MATCH, &etag)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_MODIFIED, "{path}");
        assert_eq!(header(&response, ETAG), etag);
        assert!(response.bytes().await.unwrap().is_empty());
    }
    server.shutdown().await;
}

/// Every module the page can import answers, from the same versioned path, as JavaScript
/// that may be kept for good: a regression test for a module the server does not embed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_module_the_page_imports_is_served_versioned_and_immutable() {
    let server = TestServer::start(TestEngine::Sqlite).await;
    let page = get(&server, "/").await.text().await.unwrap();
    let entry = versioned_url(&asset_urls(&page), "app.js").to_string();
    let prefix = &entry[..entry.len() - "app.js".len()];
    let modules = page_modules(&server).await;
    for (path, headers, script) in &modules {
        assert!(path.starts_with(prefix), "{path} is outside {prefix}");
        let value =
            |name: reqwest::header::HeaderName| headers.get(&name).unwrap().to_str().unwrap();
        assert_eq!(
            value(CONTENT_TYPE),
            "text/javascript; charset=utf-8",
            "{path}"
        );
        assert_eq!(
            value(CACHE_CONTROL),
            "public, max-age=31536000, immutable",
            "{path}"
        );
        assert!(
            value(CONTENT_SECURITY_POLICY).contains("script-src 'self'"),
            "{path}"
        );
        assert!(
            script.starts_with("// @ts-check\n"),
            "{path} is not type-checked"
        );
    }
    let screens = modules
        .iter()
        .filter(|(path, _, _)| path.contains("/screens/"))
        .count();
    assert!(
        modules.len() >= 20 && screens >= 14,
        "found only {} modules ({screens} screens) from {entry}",
        modules.len()
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ui_paths_are_json_404s_in_the_api_shape() {
    let server = TestServer::start(TestEngine::Sqlite).await;
    let page = get(&server, "/").await.text().await.unwrap();
    let entry = versioned_url(&asset_urls(&page), "app.js").to_string();
    let prefix = &entry[..entry.len() - "app.js".len()];
    let unknown_versioned = [
        format!("{prefix}nothing.js"),
        format!("{prefix}lib/nothing.js"),
        // The type checker's files are not served.
        format!("{prefix}lib/api-types.d.ts"),
        format!("{prefix}index.html"),
        format!("{prefix}app.js/more"),
        prefix.to_string(),
    ];
    let fixed = [
        "/ui/x",
        "/ui/",
        "/ui/app.js/more",
        "/ui/%2e%2e/Cargo.toml",
        "/ui/v/",
        "/ui/v/app.js",
        "/ui/v/1/2/app.js",
        "/ui/lib/api-types.d.ts",
        "/ui/tsconfig.json",
    ];
    for path in fixed
        .iter()
        .copied()
        .chain(unknown_versioned.iter().map(String::as_str))
    {
        let response = get(&server, path).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
        assert!(
            header(&response, CONTENT_TYPE).starts_with("application/json"),
            "{path}"
        );
        let body: Value = response.json().await.unwrap();
        assert_raw_error(StatusCode::NOT_FOUND, &body, 404, ErrorCode::NotFound);
    }
    let (status, body) = server.raw(Method::POST, "/", None, None).await;
    assert_raw_error(status, &body, 405, ErrorCode::MethodNotAllowed);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_public_but_the_api_behind_it_needs_the_session_cookie() {
    let server = TestServer::start(TestEngine::Sqlite).await;
    expect_error(server.anonymous().me().await, 401, ErrorCode::Unauthorized);

    // What the UI does: log in, keep only the cookie, call the API with it.
    let response = server
        .http
        .post(format!("{}/auth/login", server.base))
        .json(&serde_json::json!({"username": "admin", "password": ADMIN_PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let set_cookie = header(&response, SET_COOKIE).to_string();
    assert!(set_cookie.contains("HttpOnly"), "{set_cookie}");
    let cookie = set_cookie.split(';').next().unwrap().to_string();
    assert!(cookie.starts_with("gantry_session="), "{cookie}");
    for path in ["/auth/me", "/api/v1/models", "/api/v1/model-instances"] {
        let response = server
            .http
            .get(format!("{}{path}", server.base))
            .header(COOKIE, &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
    server.shutdown().await;
}

/// Every `/api/v1/...` and `/auth/...` string in the modules the page loads is a prefix
/// of a path the server documents, so the UI calls nothing that does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_path_in_the_script_exists_in_the_openapi_spec() {
    let server = TestServer::start(TestEngine::Sqlite).await;
    let modules = page_modules(&server).await;
    let (status, spec) = server
        .raw(Method::GET, "/api/openapi.json", None, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let paths: Vec<String> = spec["paths"].as_object().unwrap().keys().cloned().collect();

    let mut checked = 0;
    for (module, _, script) in &modules {
        for quote in ['\'', '"'] {
            // Code between literals never starts with a path, so every piece can be looked at.
            for literal in script.split(quote) {
                if !(literal.starts_with("/api/v1/") || literal.starts_with("/auth/")) {
                    continue;
                }
                let path = literal.split('?').next().unwrap();
                assert!(
                    paths.iter().any(|p| p.starts_with(path)),
                    "{module} calls {literal}, which the API does not have"
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 40,
        "found only {checked} API paths in {} modules",
        modules.len()
    );
    server.shutdown().await;
}

/// Runs `tests/ui_browser.py` with what the page must show, and checks that it passed and
/// took its screenshots.
async fn run_browser_checks(expected: &serde_json::Value, screenshots: &[PathBuf]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui_browser.py");
    gantry_testkit::browser::run_checks(&script, expected, screenshots).await;
}

fn screenshot_paths(names: &[&str]) -> Vec<PathBuf> {
    gantry_testkit::browser::screenshot_paths(Path::new(env!("CARGO_TARGET_TMPDIR")), names)
}

/// The single test server registers itself and leads, so the servers screen shows one row
/// with the leader's mark; a user who is not an admin has no servers screen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_the_servers_and_their_leader_in_a_real_browser() {
    let chromium = gantry_testkit::browser::chromium();
    let server = TestServer::start(TestEngine::Sqlite).await;
    server
        .client()
        .create_user(&user("viewer", "viewer-password-1"))
        .await
        .unwrap();

    // What the page must show, as the API says it (the typed client has no call for it).
    let token = server.client().token().unwrap();
    let cluster: ClusterStatus = server
        .wait_for(
            "the server to register itself and lead",
            || async {
                let (status, body) = server
                    .raw(
                        Method::GET,
                        "/api/v1/coordinator/cluster",
                        Some(&token),
                        None,
                    )
                    .await;
                assert_eq!(status, StatusCode::OK, "{body}");
                Ok::<_, ClientError>(serde_json::from_value::<ClusterStatus>(body).unwrap())
            },
            |cluster| {
                cluster.leader.server_id.is_some()
                    && cluster
                        .servers
                        .iter()
                        .any(|s| s.role == ServerRole::Leader && s.active)
            },
        )
        .await;
    assert_eq!(cluster.servers.len(), 1, "{cluster:?}");
    let leader = &cluster.servers[0];
    assert_eq!(cluster.leader.server_id.as_deref(), Some("test-server"));

    let screenshots = screenshot_paths(&["servers", "servers-dark"]);
    let expected = serde_json::json!({
        "checks": "servers",
        "base": server.base,
        "chromium": chromium,
        "screenshot": screenshots[0],
        "screenshot_dark": screenshots[1],
        "admin": {"username": "admin", "password": ADMIN_PASSWORD},
        "user": {"username": "viewer", "password": "viewer-password-1"},
        "leader": leader.server_id,
        "fencing_token": cluster.leader.fencing_token,
        "scheduling_mode": cluster.scheduling_mode,
        "server_url": leader.url,
    });
    run_browser_checks(&expected, &screenshots).await;
    server.shutdown().await;
}

/// How far the stand-in's download grows at each read of the list.
const DOUBLE_DOWNLOAD_STEP: u64 = 96 << 20;

/// A worker's own API for the model cache, as the server calls it
/// (`GET /v1/model-files`, `DELETE /v1/model-files/{blob}`, the worker's API token as
/// bearer), over a fixed list of files. Like the worker it refuses to delete a file in use
/// or being downloaded (409) and an unknown one (404). Its download grows at every read,
/// so the page's refresh can be seen.
#[derive(Clone)]
struct CacheDouble {
    files: Arc<Mutex<Vec<CachedModelFile>>>,
    /// The token the server issued at the worker's registration, which comes after the
    /// stand-in listens (its address is part of the registration).
    api_token: Arc<OnceLock<String>>,
}

impl CacheDouble {
    /// Serves `files` on 127.0.0.1; answers its address and the serving task.
    async fn start(
        files: Vec<CachedModelFile>,
    ) -> (Self, std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let double = Self {
            files: Arc::new(Mutex::new(files)),
            api_token: Arc::new(OnceLock::new()),
        };
        let app = axum::Router::new()
            .route("/v1/model-files", axum::routing::get(Self::list))
            .route(
                "/v1/model-files/{blob}",
                axum::routing::delete(Self::delete),
            )
            .with_state(double.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (double, address, task)
    }

    fn authorised(&self, headers: &axum::http::HeaderMap) -> bool {
        let token = self.api_token.get().expect("the worker is registered");
        headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok())
            == Some(format!("Bearer {token}").as_str())
    }

    fn refuse(status: StatusCode, message: String) -> Response {
        (status, message).into_response()
    }

    async fn list(State(double): State<Self>, headers: axum::http::HeaderMap) -> Response {
        if !double.authorised(&headers) {
            return Self::refuse(StatusCode::UNAUTHORIZED, "invalid worker API token".into());
        }
        let mut files = double.files.lock().unwrap();
        for file in files
            .iter_mut()
            .filter(|f| f.state == ModelFileState::Downloading)
        {
            file.bytes_done = (file.bytes_done + DOUBLE_DOWNLOAD_STEP).min(file.size - 1);
        }
        Json(files.clone()).into_response()
    }

    async fn delete(
        State(double): State<Self>,
        UrlPath(blob): UrlPath<String>,
        headers: axum::http::HeaderMap,
    ) -> Response {
        if !double.authorised(&headers) {
            return Self::refuse(StatusCode::UNAUTHORIZED, "invalid worker API token".into());
        }
        let mut files = double.files.lock().unwrap();
        let Some(at) = files.iter().position(|f| f.blob == blob) else {
            return Self::refuse(
                StatusCode::NOT_FOUND,
                format!("this worker has no cached file {blob}"),
            );
        };
        if !files[at].models.is_empty() {
            let users = files[at].models.join(", ");
            return Self::refuse(
                StatusCode::CONFLICT,
                format!(
                    "model file {blob} is used by {users}; delete or move those instances first"
                ),
            );
        }
        if files[at].state == ModelFileState::Downloading {
            return Self::refuse(
                StatusCode::CONFLICT,
                format!(
                    "model file {blob} is being downloaded; delete the models that need it first"
                ),
            );
        }
        files.remove(at);
        StatusCode::NO_CONTENT.into_response()
    }

    fn blobs(&self) -> Vec<String> {
        let files = self.files.lock().unwrap();
        files.iter().map(|f| f.blob.clone()).collect()
    }
}

/// A file of the stand-in's cache.
fn cached_file(
    blob: &str,
    name: &str,
    state: ModelFileState,
    size: u64,
    bytes_done: u64,
    models: &[&str],
    used_ago: Duration,
) -> CachedModelFile {
    CachedModelFile {
        blob: blob.into(),
        names: vec![name.into()],
        state,
        size,
        bytes_done,
        error: None,
        models: models.iter().map(|m| (*m).to_string()).collect(),
        last_used_at: Some(Timestamp::from(SystemTime::now() - used_ago)),
    }
}

/// Registers a worker whose API is at `address`; answers it, a client with its credential
/// and the token the server will present to its API.
async fn register_worker(
    server: &TestServer,
    name: &str,
    address: String,
) -> (gantry_types::Worker, Client, String) {
    let registration = WorkerRegister {
        address,
        ..simulated_worker(name, 1)
    };
    let (registered, created) = server
        .anonymous()
        .register_worker(&server.registration_token(), &registration)
        .await
        .unwrap();
    assert!(created);
    let credential = registered.credential.unwrap();
    (
        registered.worker,
        server.client_for(&credential),
        registered.api_token.unwrap(),
    )
}

/// A downloading instance shows a progress bar (percent, bytes, speed, time left) in the
/// instances list, the overview and the models list, and it follows the worker's reports
/// live. The model files screen lists a worker's cache with the state of each file (its
/// download growing at every refresh), says which worker did not answer, shows the
/// worker's refusal to delete a file in use and deletes one that is not.
///
/// The instance's progress is what a worker reports through the agent API
/// (`POST /api/v1/worker/instances/{id}/state`, sent by the browser script with the worker's
/// credential while it watches the page). The files come through the server from
/// [`CacheDouble`] (worker `gpu-1`); worker `gpu-2` is registered at an address where
/// nothing listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_download_progress_and_model_files_in_a_real_browser() {
    let chromium = gantry_testkit::browser::chromium();
    let server = TestServer::start(TestEngine::Sqlite).await;
    let admin = server.client();

    let hour = Duration::from_secs(3600);
    let ready = cached_file(
        "sha256-6a1a2eb6d15622bf3c96857206351ba97e1af16c30d7a74ee38970e434e9407e",
        "hf/Qwen/Qwen2.5-0.5B-Instruct-GGUF/9217f5db79a29953eb74d5343926648285ec7e67/qwen2.5-0.5b-instruct-q4_k_m.gguf",
        ModelFileState::Ready,
        491_400_032,
        491_400_032,
        &[],
        2 * hour,
    );
    let downloading = cached_file(
        "sha256-7b064f5842bf9532c91456deda288a1b672397a54fa729aa665952863033557c",
        "hf/bartowski/Meta-Llama-3-8B-Instruct-GGUF/4ebc4aa83d60a5d6f9e1e1e9272a4d6306d770c1/Meta-Llama-3-8B-Instruct-Q4_K_M.gguf",
        ModelFileState::Downloading,
        4_920_733_984,
        1_288_490_188,
        &["llama-3-8b"],
        Duration::from_secs(20),
    );
    let partial = cached_file(
        "url-3f9a0c2e8d7b41f5a6c9e0d1b2a3f4e5",
        "url/3f9a0c2e8d7b41f5/mistral-7b-instruct-v0.3.Q5_K_M.gguf",
        ModelFileState::Partial,
        5_135_890_720,
        2_147_483_648,
        &[],
        26 * hour,
    );
    let failed = CachedModelFile {
        error: Some(
            "HTTP 403 from the S3 store for models/phi-3/phi-3-mini-4k-instruct-q4.gguf: \
             the access key may not read this object"
                .into(),
        ),
        ..cached_file(
            "id-5c1e7f20a9b34d86",
            "s3/models/phi-3/8d41c0e7/phi-3-mini-4k-instruct-q4.gguf",
            ModelFileState::Error,
            2_393_232_672,
            0,
            &[],
            3 * hour,
        )
    };
    let (double, address, double_task) = CacheDouble::start(vec![
        downloading.clone(),
        ready.clone(),
        failed.clone(),
        partial.clone(),
    ])
    .await;
    let (gpu1, gpu1_agent, api_token) =
        register_worker(&server, "gpu-1", address.to_string()).await;
    double.api_token.set(api_token).unwrap();
    let gpu1_credential = gpu1_agent.token().unwrap();
    let (gpu2, gpu2_agent, _) = register_worker(&server, "gpu-2", "127.0.0.1:1".into()).await;
    // Both keep beating, as workers do, so neither turns unreachable while the page is
    // looked at (the server does not ask unreachable workers for their files).
    let heartbeats = tokio::spawn(async move {
        loop {
            for agent in [&gpu1_agent, &gpu2_agent] {
                agent.heartbeat().await.unwrap();
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    });

    // The instance whose download the browser script reports, placed on gpu-1 by hand.
    // The server refuses a local path it cannot find; the file need hold no model, since
    // the instance is placed by hand.
    let llama_path = server
        .data_dir
        .path()
        .join("Meta-Llama-3-8B-Instruct-Q4_K_M.gguf");
    std::fs::write(&llama_path, b"").unwrap();
    let llama = admin
        .create_model(&model("llama-3-8b", &llama_path.display().to_string(), 1))
        .await
        .unwrap();
    let instance = server.instances_of(llama.id, 1).await.remove(0);
    let placement = InstancePatch {
        worker_id: Some(Some(gpu1.id)),
        gpu_indexes: Some(vec![0]),
    };
    admin.place_instance(instance.id, &placement).await.unwrap();

    let file_id = |file: &CachedModelFile| format!("{}/{}", gpu1.id, file.blob);
    let screenshots = screenshot_paths(&[
        "instance-download",
        "instance-download-dark",
        "overview-download",
        "models-download",
        "model-files",
        "model-files-dark",
    ]);
    let expected = serde_json::json!({
        "checks": "downloads",
        "base": server.base,
        "chromium": chromium,
        "screenshots": {
            "instances": screenshots[0],
            "instances_dark": screenshots[1],
            "overview": screenshots[2],
            "models": screenshots[3],
            "model_files": screenshots[4],
            "model_files_dark": screenshots[5],
        },
        "admin": {"username": "admin", "password": ADMIN_PASSWORD},
        "worker_credential": gpu1_credential,
        "instance": {"id": instance.id, "name": instance.name},
        "model": llama.name,
        "worker": gpu1.name,
        "unreachable_worker": {"id": gpu2.id, "name": gpu2.name},
        "files": {
            "ready": file_id(&ready),
            "downloading": file_id(&downloading),
            "partial": file_id(&partial),
            "error": file_id(&failed),
        },
    });
    run_browser_checks(&expected, &screenshots).await;

    // The page's deletes reached the worker: the partial download is gone, the file in
    // use is kept.
    let left = double.blobs();
    assert!(!left.contains(&partial.blob), "{left:?}");
    assert!(left.contains(&downloading.blob), "{left:?}");
    assert_eq!(left.len(), 3, "{left:?}");

    heartbeats.abort();
    double_task.abort();
    server.shutdown().await;
}

/// The bytes of one `PATCH` of the console's uploads (`UPLOAD_CHUNK_BYTES` in
/// `lib/transfers.js`):
/// the browser script checks where each chunk started.
const UI_UPLOAD_CHUNK: u64 = 8 << 20;

/// The model files screen uploads a file in chunks with its progress shown live, sends a
/// failed chunk again from where the server says it stopped, shows the server's refusal of
/// a wrong SHA-256, resumes an upload begun elsewhere once its file is picked again, and
/// deletes an upload nobody uses; the new-model form offers the complete uploads as a
/// source, and the screen shows why the server keeps the upload that model uses.
///
/// The browser script makes the files (deterministic bytes of the sizes given here); this
/// test then checks what the page left on the server, in the API's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_uploads_a_model_file_and_deploys_it_in_a_real_browser() {
    let chromium = gantry_testkit::browser::chromium();
    let server = TestServer::start(TestEngine::Sqlite).await;
    let screenshots = screenshot_paths(&[
        "uploads-progress",
        "uploads-refused",
        "uploads",
        "uploads-dark",
        "model-upload-source",
    ]);
    // Three chunks, the last a short one; a resumed file whose start the script sends
    // through the API; a small file sent with a wrong SHA-256, then deleted.
    let deployed_size = 2 * UI_UPLOAD_CHUNK + 123_457;
    let resumed_size = UI_UPLOAD_CHUNK + 65_536;
    let expected = serde_json::json!({
        "checks": "uploads",
        "base": server.base,
        "chromium": chromium,
        "screenshots": {
            "progress": screenshots[0],
            "refused": screenshots[1],
            "uploads": screenshots[2],
            "uploads_dark": screenshots[3],
            "model_source": screenshots[4],
        },
        "admin": {"username": "admin", "password": ADMIN_PASSWORD},
        "chunk_size": UI_UPLOAD_CHUNK,
        "model": "tiny-llama",
        "deployed": {"name": "tiny-llama.Q4_K_M.gguf", "size": deployed_size},
        "resumed": {"name": "resume.gguf", "size": resumed_size, "sent_first": 300_000},
        "wrong_digest": {"name": "wrong.gguf", "size": 1000},
    });
    run_browser_checks(&expected, &screenshots).await;

    // The two complete uploads are left (the wrong one was deleted), and the model the
    // page created deploys the first.
    let token = server.client().token().unwrap();
    let (status, body) = server
        .raw(
            Method::GET,
            "/api/v1/model-files/uploads",
            Some(&token),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let uploads: UploadList = serde_json::from_value(body).unwrap();
    let summary: Vec<_> = uploads
        .items
        .iter()
        .map(|u| (u.name.as_str(), u.size, u.bytes_received, u.state))
        .collect();
    assert_eq!(
        summary,
        [
            (
                "resume.gguf",
                resumed_size,
                resumed_size,
                UploadState::Ready
            ),
            (
                "tiny-llama.Q4_K_M.gguf",
                deployed_size,
                deployed_size,
                UploadState::Ready
            ),
        ],
    );
    let models = server
        .client()
        .list_models(&ModelQuery::default())
        .await
        .unwrap()
        .items;
    assert_eq!(models.len(), 1, "{models:?}");
    assert_eq!(models[0].name, "tiny-llama");
    assert_eq!(
        models[0].source,
        ModelSource::Upload {
            id: uploads.items[1].id
        }
    );
    server.shutdown().await;
}
