//! Resolving a ModelScope source through the hub's `/api/v1` HTTP API, the one its official
//! Python client (`modelscope`, through `modelscope_hub`) downloads with:
//!
//! - `GET /api/v1/models/{repo}/repo/files?Revision={revision}&Recursive=True`: the file
//!   tree at a branch, tag or commit, in the hub's envelope (`{"Code": 200, "Success": true,
//!   "Data": {"Files": [...], "LatestCommitter": {...}}}`), with each file's `Size` and
//!   `Sha256`, and the commit the revision is at as `LatestCommitter.Id`.
//! - `GET /api/v1/models/{repo}/revisions`: the branches and tags, asked only to explain a
//!   listing that came back empty — the hub answers a revision it does not have with an
//!   empty success, not an error.
//! - Files are downloaded from `GET /api/v1/models/{repo}/repo?Revision={commit}&FilePath=
//!   {path}` (the hub redirects LFS files to its object store, where ranges work; files it
//!   serves in place ignore ranges, which the cache and the header reads take as a whole
//!   answer), at the commit when the listing names one, so every replica gets the same
//!   files even when the branch moves. The cache key is `ms/<repo>/<commit>`
//!   (`ms/<repo>/<revision>` when the hub named no commit; the SHA-256s still pin every
//!   file's bytes).
//!
//! Which files the source stands for is decided by the selection shared with Hugging Face
//! ([`hub::choose`]). No ModelScope token is sent: private models are not supported, and
//! their errors say so.

use gantry_types::BackendKind;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::unavailable;
use crate::hub::{self, encode_segment, ListedFile};
use crate::{RemoteFile, Resolved, SourceError, Sources, META_TIMEOUT};

/// The hub's answer to every `/api/v1` call: `Code` is 200 and `Success` true when it
/// worked; `Data` holds the answer.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Envelope<T> {
    code: Option<serde_json::Value>,
    success: Option<bool>,
    message: Option<String>,
    data: Option<T>,
}

/// `Data` of `repo/files`. `Files` is `null` for a revision the model does not have.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Listing {
    #[serde(default)]
    files: Option<Vec<ListingEntry>>,
    #[serde(default)]
    latest_committer: Option<Committer>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListingEntry {
    path: String,
    /// `blob` for a file, `tree` for a directory.
    #[serde(rename = "Type")]
    kind: String,
    #[serde(default)]
    size: Option<u64>,
    /// Lowercase hex; empty for directories.
    #[serde(default)]
    sha256: Option<String>,
}

impl ListedFile for ListingEntry {
    fn path(&self) -> &str {
        &self.path
    }
}

/// The last commit of the revision listed.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Committer {
    /// The full commit id; some answers leave it empty.
    #[serde(default)]
    id: Option<String>,
}

/// `Data` of `revisions`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Revisions {
    #[serde(default)]
    revision_map: Option<RevisionMap>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RevisionMap {
    #[serde(default)]
    branches: Option<Vec<RevisionEntry>>,
    #[serde(default)]
    tags: Option<Vec<RevisionEntry>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RevisionEntry {
    revision: String,
}

pub(crate) async fn resolve(
    sources: &Sources,
    repo_id: &str,
    file: Option<&str>,
    revision: &str,
    backend: BackendKind,
) -> Result<Resolved, SourceError> {
    let endpoint = sources.config.modelscope_endpoint.trim_end_matches('/');
    let model_api = format!("{endpoint}/api/v1/models/{repo_id}");
    // Commit ids are lowercase on the hub, as in git.
    let revision = if is_commit(revision) {
        revision.to_ascii_lowercase()
    } else {
        revision.to_owned()
    };
    let revision = revision.as_str();
    let what = format!("{repo_id}@{revision} on ModelScope");
    let listing_url = format!(
        "{model_api}/repo/files?Revision={}&Recursive=True",
        encode_segment(revision)
    );
    let listing: Listing = get_data(sources, &listing_url, repo_id, endpoint).await?;
    let entries = listing.files.unwrap_or_default();
    let files: Vec<&ListingEntry> = entries.iter().filter(|e| e.kind != "tree").collect();
    if files.is_empty() {
        return Err(explain_empty_listing(sources, &model_api, repo_id, revision, endpoint).await);
    }
    let commit = if is_commit(revision) {
        Some(revision.to_owned())
    } else {
        listing
            .latest_committer
            .and_then(|c| c.id)
            .filter(|id| is_commit(id))
            .map(|id| id.to_ascii_lowercase())
    };
    let pinned = commit.as_deref().unwrap_or(revision);
    let chosen = hub::choose(&files, file, backend, &what)?;
    let files = chosen
        .into_iter()
        .map(|entry| RemoteFile {
            path: entry.path.clone(),
            url: format!(
                "{model_api}/repo?Revision={}&FilePath={}",
                encode_segment(pinned),
                encode_segment(&entry.path)
            ),
            size: entry.size,
            sha256: entry
                .sha256
                .as_deref()
                .filter(|digest| is_sha256(digest))
                .map(str::to_ascii_lowercase),
            ..Default::default()
        })
        .collect();
    Ok(Resolved {
        key: format!("ms/{repo_id}/{}", encode_segment(pinned)),
        files,
        commit,
    })
}

/// Why a listing had no files: the revision is not a branch or tag of the model (the hub
/// answers those with an empty success), or the model has no files there.
async fn explain_empty_listing(
    sources: &Sources,
    model_api: &str,
    repo_id: &str,
    revision: &str,
    endpoint: &str,
) -> SourceError {
    let url = format!("{model_api}/revisions");
    let revisions: Revisions = match get_data(sources, &url, repo_id, endpoint).await {
        Ok(revisions) => revisions,
        Err(e) => return e,
    };
    let map = revisions.revision_map.unwrap_or_default();
    let names = |entries: Option<Vec<RevisionEntry>>| -> Vec<String> {
        entries
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.revision)
            .collect()
    };
    let (branches, tags) = (names(map.branches), names(map.tags));
    if branches.iter().chain(&tags).any(|name| name == revision) {
        return SourceError::Invalid(format!(
            "{repo_id}@{revision} on ModelScope has no files; pick another revision with \
             source.revision"
        ));
    }
    let known = format!(
        "its branches are {}; its tags are {}",
        list_or_none(&branches),
        list_or_none(&tags)
    );
    if revision.len() >= 7 && revision.bytes().all(|b| b.is_ascii_hexdigit()) {
        SourceError::Invalid(format!(
            "{repo_id} on ModelScope has no files at commit {revision}; check that the commit \
             belongs to this model, or name a branch or tag ({known})"
        ))
    } else {
        SourceError::Invalid(format!(
            "{repo_id} on ModelScope has no revision {revision:?}; set source.revision to a \
             branch, tag or commit of the model ({known})"
        ))
    }
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// A full commit id: 40 hex digits.
fn is_commit(text: &str) -> bool {
    text.len() == 40 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_sha256(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The `Data` of a successful `/api/v1` answer; an error answer (the HTTP status or the
/// envelope's `Code`) becomes an error naming the model and what to do.
async fn get_data<T: DeserializeOwned>(
    sources: &Sources,
    url: &str,
    repo_id: &str,
    endpoint: &str,
) -> Result<T, SourceError> {
    let response = sources
        .get(url, false)
        .timeout(META_TIMEOUT)
        .send()
        .await
        .map_err(|e| unavailable(url, &e))?;
    let status = response.status();
    let body = response.bytes().await.map_err(|e| unavailable(url, &e))?;
    let envelope: Option<Envelope<T>> = serde_json::from_slice(&body).ok();
    let message = envelope
        .as_ref()
        .and_then(|e| e.message.clone())
        .unwrap_or_else(|| String::from_utf8_lossy(&body).chars().take(300).collect());
    if !status.is_success() {
        return Err(status_error(status, url, repo_id, endpoint, &message));
    }
    let Some(envelope) = envelope else {
        return Err(SourceError::Unavailable(format!(
            "{url}: unreadable answer (not the ModelScope API's JSON); is modelscope_endpoint \
             a ModelScope hub?"
        )));
    };
    let code_ok = envelope
        .code
        .as_ref()
        .is_none_or(|code| code.as_u64() == Some(200) || code.as_str() == Some("200"));
    if !code_ok || envelope.success == Some(false) {
        let code = envelope.code.map(|c| c.to_string()).unwrap_or_default();
        return Err(SourceError::Unavailable(format!(
            "{url} answered code {code}: {message}"
        )));
    }
    envelope.data.ok_or_else(|| {
        SourceError::Unavailable(format!(
            "{url}: the answer has no Data; is modelscope_endpoint a ModelScope hub?"
        ))
    })
}

/// An error status of the model's API, as an error that says what to do.
fn status_error(
    status: reqwest::StatusCode,
    url: &str,
    repo_id: &str,
    endpoint: &str,
    message: &str,
) -> SourceError {
    match status.as_u16() {
        404 => SourceError::Invalid(format!(
            "ModelScope has no model {repo_id} ({url} answered {status}: {message}); check \
             source.repo_id against the model's page, {endpoint}/models/{repo_id} (gantry sends \
             no ModelScope token, so private models are not found either)"
        )),
        401 | 403 => SourceError::Unauthorized(format!(
            "ModelScope refused {repo_id} ({status}: {message}); gantry sends no ModelScope \
             token, so only public models can be used: make the model public, or download it \
             and use a url or local_path source"
        )),
        _ => SourceError::Unavailable(format!("{url} answered {status}: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_read_the_hubs_envelope() {
        let body = r#"{"Code":200,"Message":"success","RequestId":"r","Success":true,
            "Data":{"Files":[
                {"Name":"m.gguf","Path":"m.gguf","Type":"blob","Size":3,"IsLFS":true,
                 "Sha256":"AB","Revision":"c"},
                {"Name":"d","Path":"d","Type":"tree","Size":0,"Sha256":""}],
              "LatestCommitter":{"Id":"0123456789abcdef0123456789abcdef01234567","ShortId":"01234567"},
              "IsVisual":0}}"#;
        let envelope: Envelope<Listing> =
            serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}"));
        let listing = envelope.data.unwrap_or_else(|| panic!("no data"));
        let files = listing.files.unwrap_or_default();
        assert_eq!(files.len(), 2);
        assert_eq!((files[0].path(), files[0].size), ("m.gguf", Some(3)));
        assert_eq!(files[1].kind, "tree");
        let id = listing
            .latest_committer
            .and_then(|c| c.id)
            .unwrap_or_default();
        assert!(is_commit(&id));

        // The answer to a revision the model does not have.
        let empty: Envelope<Listing> =
            serde_json::from_str(r#"{"Code":200,"Success":true,"Data":{"Files":null}}"#)
                .unwrap_or_else(|e| panic!("{e}"));
        assert!(empty.data.and_then(|d| d.files).is_none());
    }

    #[test]
    fn commits_and_digests_are_read_strictly() {
        assert!(is_commit("0123456789abcdef0123456789ABCDEF01234567"));
        assert!(!is_commit("master"));
        assert!(!is_commit("0123456"));
        assert!(is_sha256(&"a".repeat(64)));
        assert!(!is_sha256(""));
        assert!(!is_sha256(&"g".repeat(64)));
    }
}
