//! The web UI: a small single-page app (plain HTML, CSS and JavaScript, no framework
//! and no build step) embedded in the binary and served at `/` with its assets under
//! `/ui/`. It talks only to the management API, authenticated by the `gantry_session`
//! cookie that `POST /auth/login` sets, so it adds no endpoints of its own.
//!
//! Every response carries a strict `Content-Security-Policy`: scripts and styles come
//! only from this server (no inline script, no inline style attribute), the page
//! connects only back to this server and cannot be framed. The machines that run gantry
//! may have no internet access, so nothing is loaded from anywhere else.
//!
//! Caching: the page references its assets as `/ui/<file>?v=<version>`, where the
//! version is a hash of every asset, so a versioned asset can be cached for a year; the
//! page itself and unversioned asset URLs are revalidated on every load with an `ETag`.
//! Unknown `/ui/...` paths fall through to the API's JSON 404.

use std::sync::LazyLock;

use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, ETAG, IF_NONE_MATCH, REFERRER_POLICY,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest, Sha256};

use crate::state::AppState;

/// The policy sent with the page and every asset. `connect-src 'self'` covers the API
/// calls and watch streams; `img-src data:` allows the inline SVG icons the
/// stylesheet may use.
pub const CONTENT_SECURITY_POLICY_VALUE: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Placeholder in `index.html` replaced by [`asset_version`] at first use.
const VERSION_PLACEHOLDER: &str = "{{ASSET_VERSION}}";

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");
const FAVICON_SVG: &str = include_str!("assets/favicon.svg");

/// One embedded file with what the response needs to say about it.
struct Asset {
    body: &'static [u8],
    content_type: &'static str,
    etag: HeaderValue,
}

impl Asset {
    fn new(body: &'static [u8], content_type: &'static str) -> Self {
        let etag = HeaderValue::from_str(&format!("\"{}\"", short_hash(&[body])))
            .expect("a quoted hex digest is a valid header value");
        Self {
            body,
            content_type,
            etag,
        }
    }
}

fn short_hash(parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hex::encode(&hasher.finalize()[..8])
}

/// A hash of every asset: changes whenever any of them does, so browsers holding a
/// year-long cached copy fetch the new one after an upgrade.
pub fn asset_version() -> &'static str {
    static VERSION: LazyLock<String> = LazyLock::new(|| {
        short_hash(&[
            INDEX_HTML.as_bytes(),
            APP_JS.as_bytes(),
            APP_CSS.as_bytes(),
            FAVICON_SVG.as_bytes(),
        ])
    });
    &VERSION
}

static INDEX: LazyLock<Asset> = LazyLock::new(|| {
    let page: &'static str = INDEX_HTML
        .replace(VERSION_PLACEHOLDER, asset_version())
        .leak();
    Asset::new(page.as_bytes(), "text/html; charset=utf-8")
});
static SCRIPT: LazyLock<Asset> =
    LazyLock::new(|| Asset::new(APP_JS.as_bytes(), "text/javascript; charset=utf-8"));
static STYLESHEET: LazyLock<Asset> =
    LazyLock::new(|| Asset::new(APP_CSS.as_bytes(), "text/css; charset=utf-8"));
static FAVICON: LazyLock<Asset> =
    LazyLock::new(|| Asset::new(FAVICON_SVG.as_bytes(), "image/svg+xml"));

/// The UI's routes, merged into the server's router. They need no credentials: the
/// page asks the API who is logged in and shows the login form when nobody is.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(index))
        .route("/ui/app.js", get(script))
        .route("/ui/app.css", get(stylesheet))
        .route("/ui/favicon.svg", get(favicon))
}

async fn index(headers: HeaderMap) -> Response {
    // The page names the current asset version, so it is always revalidated.
    respond(&INDEX, &headers, false)
}

async fn script(uri: Uri, headers: HeaderMap) -> Response {
    respond(&SCRIPT, &headers, is_current_version(&uri))
}

async fn stylesheet(uri: Uri, headers: HeaderMap) -> Response {
    respond(&STYLESHEET, &headers, is_current_version(&uri))
}

async fn favicon(uri: Uri, headers: HeaderMap) -> Response {
    respond(&FAVICON, &headers, is_current_version(&uri))
}

/// True when the URL asks for exactly the version this server holds (`?v=<version>`):
/// only then may the browser keep the answer for good.
fn is_current_version(uri: &Uri) -> bool {
    uri.query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| pair.strip_prefix("v=") == Some(asset_version()))
    })
}

fn respond(asset: &Asset, request: &HeaderMap, immutable: bool) -> Response {
    let cache_control = if immutable {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    headers.insert(ETAG, asset.etag.clone());
    headers.insert(CACHE_CONTROL, HeaderValue::from_static(cache_control));
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY_VALUE),
    );
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    if etag_matches(request, &asset.etag) {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    (headers, asset.body).into_response()
}

/// `If-None-Match` holds this ETag (in a list, possibly weak) or `*`.
fn etag_matches(request: &HeaderMap, etag: &HeaderValue) -> bool {
    let Ok(etag) = etag.to_str() else {
        return false;
    };
    request
        .get_all(IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .any(|candidate| candidate == "*" || candidate.trim_start_matches("W/") == etag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_names_the_versioned_assets_and_holds_no_inline_script() {
        let page = std::str::from_utf8(INDEX.body).expect("the page is UTF-8");
        assert!(!page.contains(VERSION_PLACEHOLDER));
        assert!(page.contains(&format!("/ui/app.js?v={}", asset_version())));
        assert!(page.contains(&format!("/ui/app.css?v={}", asset_version())));
        for script in page.split("<script").skip(1) {
            let tag_end = script.find('>').expect("a closed script tag");
            assert!(
                script[..tag_end].contains("src="),
                "inline script: {script}"
            );
            assert!(script[tag_end + 1..].starts_with("</script>"));
        }
        assert!(
            !page.contains("style=\""),
            "inline styles are blocked by the CSP"
        );
    }

    #[test]
    fn if_none_match_accepts_lists_weak_tags_and_star() {
        let etag = HeaderValue::from_static("\"abc\"");
        let mut request = HeaderMap::new();
        assert!(!etag_matches(&request, &etag));
        request.insert(IF_NONE_MATCH, HeaderValue::from_static("\"x\", W/\"abc\""));
        assert!(etag_matches(&request, &etag));
        request.insert(IF_NONE_MATCH, HeaderValue::from_static("*"));
        assert!(etag_matches(&request, &etag));
        request.insert(IF_NONE_MATCH, HeaderValue::from_static("\"abcd\""));
        assert!(!etag_matches(&request, &etag));
    }

    #[test]
    fn only_the_current_version_is_cached_for_good() {
        let current: Uri = format!("/ui/app.js?v={}", asset_version())
            .parse()
            .expect("a valid URI");
        assert!(is_current_version(&current));
        let old: Uri = "/ui/app.js?v=0000".parse().expect("a valid URI");
        assert!(!is_current_version(&old));
        let bare: Uri = "/ui/app.js".parse().expect("a valid URI");
        assert!(!is_current_version(&bare));
    }
}
