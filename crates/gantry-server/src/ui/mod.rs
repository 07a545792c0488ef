//! The web UI: a small single-page app (plain HTML, CSS and JavaScript ES modules, no
//! framework and no build step) embedded in the binary and served at `/` with its assets
//! under `/ui/`. It talks only to the management API, authenticated by the
//! `gantry_session` cookie that `POST /auth/login` sets, so it adds no endpoints of its own.
//!
//! The script is one module per screen (`assets/screens/`) and the modules they share
//! (`assets/lib/`), loaded by the browser from the entry `assets/app.js` through relative
//! imports. They carry JSDoc types that `scripts/check-console.sh` checks with TypeScript's
//! compiler (`tsconfig.json` here); the server serves the files exactly as they are.
//!
//! Every response carries a strict `Content-Security-Policy`: scripts and styles come
//! only from this server (no inline script, no inline style attribute), the page
//! connects only back to this server and cannot be framed. The machines that run gantry
//! may have no internet access, so nothing is loaded from anywhere else.
//!
//! Caching: the page names its assets under a versioned path, `/ui/v/<version>/<file>`,
//! where the version is a hash of every asset. A module's relative imports
//! (`./lib/dom.js`) resolve inside the same path, so every file the page loads is
//! versioned and may be cached for a year: an upgrade changes every URL. The page itself,
//! the unversioned `/ui/<file>` URLs and the URLs of another version (a page served by an
//! older or newer server of the cluster) answer the current file, revalidated on every
//! load with an `ETag`. Only the files listed in `FILES` are served: any other `/ui/...`
//! path falls through to the API's JSON 404.

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

/// Where the versioned assets are: `/ui/v/<version>/<file>`.
const VERSIONED_PREFIX: &str = "/ui/v/";

const INDEX_HTML: &str = include_str!("assets/index.html");

/// Embeds the files named, each with its path under `assets/`.
macro_rules! embed {
    ($($path:literal),* $(,)?) => {
        &[$(($path, include_str!(concat!("assets/", $path)))),*]
    };
}

/// Every file the page loads, by its path under `assets/`, which is also its URL under
/// `/ui/` and `/ui/v/<version>/`. A module must be listed here to be served: the browser
/// gets a 404 for a forgotten one (the tests check that every file of `assets/` is here
/// and that every module the page imports answers).
const FILES: &[(&str, &str)] = embed![
    "app.js",
    "app.css",
    "favicon.svg",
    "lib/api.js",
    "lib/charts.js",
    "lib/clusters.js",
    "lib/dialogs.js",
    "lib/dom.js",
    "lib/format.js",
    "lib/live.js",
    "lib/markdown.js",
    "lib/sentence.js",
    "lib/session.js",
    "lib/theme.js",
    "lib/transfers.js",
    "lib/trouble.js",
    "lib/widgets.js",
    "screens/account.js",
    "screens/api-keys.js",
    "screens/catalog.js",
    "screens/cluster-pools.js",
    "screens/clusters.js",
    "screens/instances.js",
    "screens/login.js",
    "screens/model-files.js",
    "screens/model-form.js",
    "screens/model.js",
    "screens/models.js",
    "screens/overview.js",
    "screens/playground.js",
    "screens/providers.js",
    "screens/routes.js",
    "screens/servers.js",
    "screens/uploads.js",
    "screens/usage.js",
    "screens/users.js",
    "screens/workers.js",
];

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

/// The content type of an asset, by its extension.
fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, extension)| extension) {
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        _ => panic!("ui::FILES holds {path}, whose content type is not known"),
    }
}

/// A hash of every asset (their paths too): changes whenever any of them does, so
/// browsers holding a year-long cached copy fetch the new one after an upgrade.
pub fn asset_version() -> &'static str {
    static VERSION: LazyLock<String> = LazyLock::new(|| {
        let mut parts: Vec<&[u8]> = vec![INDEX_HTML.as_bytes()];
        for (path, body) in FILES {
            parts.extend([path.as_bytes(), b"\0", body.as_bytes(), b"\0"]);
        }
        short_hash(&parts)
    });
    &VERSION
}

static INDEX: LazyLock<Asset> = LazyLock::new(|| {
    let page: &'static str = INDEX_HTML
        .replace(VERSION_PLACEHOLDER, asset_version())
        .leak();
    Asset::new(page.as_bytes(), "text/html; charset=utf-8")
});

/// [`FILES`] as served, in the same order.
static ASSETS: LazyLock<Vec<Asset>> = LazyLock::new(|| {
    FILES
        .iter()
        .map(|(path, body)| Asset::new(body.as_bytes(), content_type(path)))
        .collect()
});

/// The UI's routes, merged into the server's router: the page, and each asset at its
/// unversioned and versioned URLs. They need no credentials: the page asks the API who is
/// logged in and shows the login form when nobody is.
pub fn routes() -> Router<AppState> {
    let mut router = Router::new().route("/", get(index));
    for ((path, _), asset) in FILES.iter().zip(ASSETS.iter()) {
        let asset: &'static Asset = asset;
        let serve = get(move |uri: Uri, headers: HeaderMap| async move {
            respond(asset, &headers, is_current_version(&uri))
        });
        router = router
            .route(&format!("/ui/{path}"), serve.clone())
            .route(&format!("{VERSIONED_PREFIX}{{version}}/{path}"), serve);
    }
    router
}

async fn index(headers: HeaderMap) -> Response {
    // The page names the current asset version, so it is always revalidated.
    respond(&INDEX, &headers, false)
}

/// True when the URL asks for exactly the version this server holds
/// (`/ui/v/<version>/...`): only then may the browser keep the answer for good.
fn is_current_version(uri: &Uri) -> bool {
    uri.path()
        .strip_prefix(VERSIONED_PREFIX)
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(version, _)| version == asset_version())
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
    use std::path::Path;

    use super::*;

    #[test]
    fn page_names_the_versioned_assets_and_holds_no_inline_script() {
        let page = std::str::from_utf8(INDEX.body).expect("the page is UTF-8");
        assert!(!page.contains(VERSION_PLACEHOLDER));
        let versioned = format!("{VERSIONED_PREFIX}{}/", asset_version());
        assert!(page.contains(&format!(
            "<script type=\"module\" src=\"{versioned}app.js\"></script>"
        )));
        assert!(page.contains(&format!("href=\"{versioned}app.css\"")));
        assert!(page.contains(&format!("href=\"{versioned}favicon.svg\"")));
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
        let uri = |text: String| -> Uri { text.parse().expect("a valid URI") };
        let version = asset_version();
        assert!(is_current_version(&uri(format!("/ui/v/{version}/app.js"))));
        assert!(is_current_version(&uri(format!(
            "/ui/v/{version}/screens/models.js"
        ))));
        assert!(!is_current_version(&uri("/ui/v/0000/app.js".into())));
        assert!(!is_current_version(&uri(format!(
            "/ui/v/{version}0/app.js"
        ))));
        assert!(!is_current_version(&uri("/ui/app.js".into())));
        // The old scheme's query names no version any more.
        assert!(!is_current_version(&uri(format!("/ui/app.js?v={version}"))));
    }

    /// A regression test for a module added to `assets/` but not to `FILES`: the page would
    /// import it and get a 404. `.d.ts` files are for the type checker only.
    #[test]
    fn every_file_under_assets_is_served_and_every_served_file_exists() {
        fn walk(dir: &Path, root: &Path, found: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).expect("read the assets directory") {
                let path = entry.expect("a directory entry").path();
                if path.is_dir() {
                    walk(&path, root, found);
                    continue;
                }
                let relative = path
                    .strip_prefix(root)
                    .expect("under the assets directory")
                    .to_str()
                    .expect("a UTF-8 file name")
                    .replace(std::path::MAIN_SEPARATOR, "/");
                if relative != "index.html" && !relative.ends_with(".d.ts") {
                    found.push(relative);
                }
            }
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/ui/assets");
        let mut on_disk = Vec::new();
        walk(&root, &root, &mut on_disk);
        on_disk.sort();
        let mut served: Vec<String> = FILES.iter().map(|(path, _)| path.to_string()).collect();
        served.sort();
        assert_eq!(on_disk, served, "ui::FILES must list every file of assets/");
        for (path, _) in FILES {
            // Panics for a file whose content type is not known.
            content_type(path);
        }
    }
}
