//! The web UI as the real server serves it: the page and its assets with their content
//! types, security and cache headers; unknown UI paths answering in the API's error
//! shape; and the UI's contract with the API (the session cookie works, every API path
//! the script calls exists in the OpenAPI spec).
//!
//! The UI's static routes touch no database, so these run on SQLite only.
//!
//! The page, its assets, their headers and the session cookie are read with raw HTTP:
//! that is what the browser sees, and the typed API client does not serve assets or keep
//! cookies. The API itself is called through the typed client.
//!
//! One test drives the console in a real browser: Debian's `chromium`, through
//! Playwright's Python package (`tests/ui_browser.py`, run with `GANTRY_PYTHON`). It takes
//! a screenshot of what it checked, under `target/tmp/ui-screenshots/`.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};

use common::{assert_raw_error, expect_error, user, TestServer, ADMIN_PASSWORD};
use gantry_client::ClientError;
use gantry_testkit::TestEngine;
use gantry_types::{ClusterStatus, ErrorCode, ServerRole};
use reqwest::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, COOKIE, ETAG, IF_NONE_MATCH, SET_COOKIE,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
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
    assert!(
        urls.iter().any(|u| u.starts_with("/ui/app.js?v=")),
        "{urls:?}"
    );
    assert!(
        urls.iter().any(|u| u.starts_with("/ui/app.css?v=")),
        "{urls:?}"
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
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/app.css", "text/css; charset=utf-8"),
        ("/ui/favicon.svg", "image/svg+xml"),
    ];
    for (path, content_type) in expected {
        let versioned = urls
            .iter()
            .find(|u| u.starts_with(&format!("{path}?v=")))
            .unwrap_or_else(|| panic!("the page does not reference {path}: {urls:?}"));

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

        // Any other URL of the asset is revalidated, and an unchanged one is a 304.
        let response = get(&server, path).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(header(&response, CACHE_CONTROL), "no-cache");
        assert_eq!(header(&response, ETAG), etag);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ui_paths_are_json_404s_in_the_api_shape() {
    let server = TestServer::start(TestEngine::Sqlite).await;
    for path in ["/ui/x", "/ui/", "/ui/app.js/more", "/ui/%2e%2e/Cargo.toml"] {
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

/// Every `/api/v1/...` and `/auth/...` string in the script is a prefix of a path the
/// server documents, so the UI calls nothing that does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_path_in_the_script_exists_in_the_openapi_spec() {
    let server = TestServer::start(TestEngine::Sqlite).await;
    let page = get(&server, "/").await.text().await.unwrap();
    let script_url = asset_urls(&page)
        .into_iter()
        .find(|u| u.starts_with("/ui/app.js"))
        .unwrap();
    let script = get(&server, &script_url).await.text().await.unwrap();
    let (status, spec) = server
        .raw(Method::GET, "/api/openapi.json", None, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let paths: Vec<String> = spec["paths"].as_object().unwrap().keys().cloned().collect();

    let mut checked = 0;
    for quote in ['\'', '"'] {
        // Code between literals never starts with a path, so every piece can be looked at.
        for literal in script.split(quote) {
            if !(literal.starts_with("/api/v1/") || literal.starts_with("/auth/")) {
                continue;
            }
            let path = literal.split('?').next().unwrap();
            assert!(
                paths.iter().any(|p| p.starts_with(path)),
                "the script calls {literal}, which the API does not have"
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 10,
        "found only {checked} API paths in the script"
    );
    server.shutdown().await;
}

/// The Python that runs `tests/ui_browser.py`: `GANTRY_PYTHON`, which must have Playwright.
fn browser_python() -> std::ffi::OsString {
    let Some(python) = std::env::var_os("GANTRY_PYTHON") else {
        panic!(
            "GANTRY_PYTHON is not set. The browser test drives chromium with Playwright's \
             Python package: run the tests with scripts/test.sh, or set \
             GANTRY_PYTHON=$(scripts/python-env.sh | tail -1)."
        );
    };
    let has_playwright = std::process::Command::new(&python)
        .args(["-c", "import playwright.sync_api"])
        .status()
        .unwrap_or_else(|e| panic!("run {python:?}: {e}"));
    assert!(
        has_playwright.success(),
        "{python:?} cannot import playwright: the browser test needs Playwright's Python \
         package in the environment scripts/python-env.sh makes"
    );
    python
}

/// Debian's chromium (`GANTRY_CHROMIUM` names another): Playwright drives it through
/// `executable_path` and downloads no browser of its own.
fn chromium() -> PathBuf {
    let path = std::env::var_os("GANTRY_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    assert!(
        path.is_file(),
        "no browser at {}: install Debian's chromium (apt-get install chromium) or set \
         GANTRY_CHROMIUM",
        path.display()
    );
    path
}

/// The single test server registers itself and leads, so the servers screen shows one row
/// with the leader's mark; a user who is not an admin has no servers screen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_the_servers_and_their_leader_in_a_real_browser() {
    let python = browser_python();
    let chromium = chromium();
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

    let screenshots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots");
    std::fs::create_dir_all(&screenshots).unwrap();
    let screenshot = screenshots.join("servers.png");
    let screenshot_dark = screenshots.join("servers-dark.png");
    for old in [&screenshot, &screenshot_dark] {
        let _ = std::fs::remove_file(old);
    }
    let expected = serde_json::json!({
        "base": server.base,
        "chromium": chromium,
        "screenshot": screenshot,
        "screenshot_dark": screenshot_dark,
        "admin": {"username": "admin", "password": ADMIN_PASSWORD},
        "user": {"username": "viewer", "password": "viewer-password-1"},
        "leader": leader.server_id,
        "fencing_token": cluster.leader.fencing_token,
        "scheduling_mode": cluster.scheduling_mode,
        "server_url": leader.url,
    });
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui_browser.py");
    let output = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(expected.to_string())
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {python:?} {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "the browser checks failed ({}):\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    for taken in [&screenshot, &screenshot_dark] {
        assert!(taken.is_file(), "no screenshot at {}", taken.display());
        println!("screenshot of the servers screen: {}", taken.display());
    }
    server.shutdown().await;
}
