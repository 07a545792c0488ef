//! Resolving a Hugging Face source through the hub's HTTP API: the commit of the
//! revision (`GET /api/models/{repo}/revision/{revision}`), then the file tree at that
//! commit (`GET /api/models/{repo}/tree/{commit}?recursive=true`, every page), with each
//! file's size and, for LFS files, its SHA-256. Files are downloaded from
//! `{endpoint}/{repo}/resolve/{commit}/{path}`, so every replica gets the same commit
//! even when the branch moves.
//!
//! Which files of a listing a source stands for ([`choose`]: a name, a glob, every part of
//! a split GGUF, or what the backend loads) is decided here for every hub: ModelScope's
//! resolver (`modelscope.rs`) calls it with its own listing.

use gantry_types::BackendKind;
use serde::Deserialize;

use crate::error::unavailable;
use crate::glob;
use crate::{RemoteFile, Resolved, SourceError, Sources, META_TIMEOUT};

#[derive(Deserialize)]
struct ModelInfo {
    sha: Option<String>,
}

#[derive(Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    lfs: Option<Lfs>,
}

#[derive(Deserialize)]
struct Lfs {
    oid: String,
    size: u64,
}

/// A file of a repository's listing, as [`choose`] reads it.
pub(crate) trait ListedFile {
    /// Its path in the repository, `/`-separated.
    fn path(&self) -> &str;
}

impl ListedFile for TreeEntry {
    fn path(&self) -> &str {
        &self.path
    }
}

/// What vLLM and SGLang need of a repository when no file is named.
const ENGINE_FILES: &[&str] = &[
    "*.safetensors",
    "*.json",
    "tokenizer.model",
    "*.tiktoken",
    "merges.txt",
    "vocab.txt",
    "*.jinja",
];

pub(crate) async fn resolve(
    sources: &Sources,
    repo_id: &str,
    file: Option<&str>,
    revision: &str,
    backend: BackendKind,
) -> Result<Resolved, SourceError> {
    let endpoint = sources.config.hf_endpoint.trim_end_matches('/');
    let what = format!("{repo_id}@{revision}");
    let info_url = format!(
        "{endpoint}/api/models/{repo_id}/revision/{}",
        encode_segment(revision)
    );
    let info: ModelInfo = get_json(sources, &info_url, &what).await?;
    let commit = info.sha.ok_or_else(|| {
        SourceError::Unavailable(format!(
            "{info_url} did not say which commit {what} is at; is hf_endpoint a Hugging Face hub?"
        ))
    })?;

    let mut entries: Vec<TreeEntry> = Vec::new();
    let mut next = Some(format!(
        "{endpoint}/api/models/{repo_id}/tree/{commit}?recursive=true"
    ));
    while let Some(url) = next.take() {
        let response = send(sources, &url, &what).await?;
        next = next_page(response.headers());
        let page: Vec<TreeEntry> = response
            .json()
            .await
            .map_err(|e| SourceError::Unavailable(format!("{url}: unreadable file list: {e}")))?;
        entries.extend(page);
    }
    let files: Vec<&TreeEntry> = entries.iter().filter(|e| e.kind == "file").collect();
    let chosen = choose(&files, file, backend, &what)?;
    Ok(Resolved {
        key: format!("hf/{repo_id}/{commit}"),
        commit: Some(commit.clone()),
        files: chosen
            .into_iter()
            .map(|entry| RemoteFile {
                path: entry.path.clone(),
                url: format!(
                    "{endpoint}/{repo_id}/resolve/{commit}/{}",
                    entry
                        .path
                        .split('/')
                        .map(encode_segment)
                        .collect::<Vec<_>>()
                        .join("/")
                ),
                size: entry.lfs.as_ref().map(|l| l.size).or(entry.size),
                sha256: entry.lfs.as_ref().map(|l| l.oid.to_ascii_lowercase()),
                hub_auth: true,
                ..Default::default()
            })
            .collect(),
    })
}

/// The files of a hub repository that the source stands for, sorted by path (so the parts
/// of a split GGUF come first part first). `files` are the repository's files (no
/// directories); `what` names the repository and revision in errors.
pub(crate) fn choose<'a, F: ListedFile>(
    files: &[&'a F],
    file: Option<&str>,
    backend: BackendKind,
    what: &str,
) -> Result<Vec<&'a F>, SourceError> {
    let ggufs = || -> String {
        let names: Vec<&str> = files
            .iter()
            .map(|f| f.path())
            .filter(|p| p.ends_with(".gguf"))
            .take(12)
            .collect();
        if names.is_empty() {
            "it has no .gguf files".to_owned()
        } else {
            format!("its .gguf files include {}", names.join(", "))
        }
    };
    let mut chosen: Vec<&F> = match file {
        Some(pattern) => {
            let matched: Vec<&F> = files
                .iter()
                .copied()
                .filter(|f| {
                    if glob::is_glob(pattern) {
                        glob::matches(pattern, f.path())
                    } else {
                        f.path() == pattern
                    }
                })
                .collect();
            if matched.is_empty() {
                return Err(SourceError::Invalid(format!(
                    "no file of {what} matches source.file {pattern:?}; {}",
                    ggufs()
                )));
            }
            // A split GGUF brings all its parts, whichever part was named.
            let mut with_parts = matched.clone();
            for entry in &matched {
                if let Some((prefix, total)) = split_part(entry.path()) {
                    with_parts.extend(files.iter().copied().filter(|f| {
                        split_part(f.path()).is_some_and(|(p, t)| p == prefix && t == total)
                    }));
                }
            }
            with_parts
        }
        None if backend == BackendKind::LlamaCpp => files
            .iter()
            .copied()
            .filter(|f| f.path().ends_with(".gguf"))
            .collect(),
        None => {
            let picked: Vec<&F> = files
                .iter()
                .copied()
                .filter(|f| !f.path().starts_with("original/"))
                .filter(|f| ENGINE_FILES.iter().any(|p| glob::matches(p, f.path())))
                .collect();
            if !picked.iter().any(|f| f.path().ends_with(".safetensors")) {
                return Err(SourceError::Invalid(format!(
                    "{what} has no *.safetensors weights, which {} loads; name the files \
                     with source.file",
                    backend.as_str()
                )));
            }
            picked
        }
    };
    chosen.sort_by(|a, b| a.path().cmp(b.path()));
    chosen.dedup_by(|a, b| a.path() == b.path());
    if backend == BackendKind::LlamaCpp {
        let mut models: Vec<String> = chosen
            .iter()
            .filter(|f| f.path().ends_with(".gguf") && !is_projector(f.path()))
            .map(|f| {
                split_part(f.path())
                    .map_or_else(|| f.path().to_owned(), |(prefix, _)| prefix.to_owned())
            })
            .collect();
        models.dedup();
        match models.len() {
            0 => {
                return Err(SourceError::Invalid(format!(
                    "llama.cpp needs a .gguf file and {what} gives none here; {}",
                    ggufs()
                )))
            }
            1 => {}
            _ => {
                return Err(SourceError::Invalid(format!(
                    "{what} has several GGUF models ({}); pick one with source.file (a name or \
                     a glob such as \"*Q4_K_M.gguf\")",
                    models
                        .iter()
                        .take(12)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
        }
    }
    Ok(chosen)
}

/// A multimodal projector, which travels beside the model rather than being one.
fn is_projector(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|name| name.starts_with("mmproj"))
}

/// `(prefix, total)` of a split GGUF part `<prefix>-00001-of-00003.gguf`.
pub(crate) fn split_part(path: &str) -> Option<(&str, &str)> {
    let stem = path.strip_suffix(".gguf")?;
    let (rest, total) = stem.rsplit_once("-of-")?;
    let (prefix, index) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.chars().all(|c| c.is_ascii_digit());
    (digits(index) && digits(total)).then_some((prefix, total))
}

/// Percent-encodes one path segment (everything but RFC 3986's unreserved characters).
pub(crate) fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The `rel="next"` URL of a `Link` header (the hub pages long file lists).
fn next_page(headers: &reqwest::header::HeaderMap) -> Option<String> {
    let link = headers.get(reqwest::header::LINK)?.to_str().ok()?;
    link.split(',').find_map(|part| {
        let (url, params) = part.split_once(';')?;
        params.contains("rel=\"next\"").then(|| {
            url.trim()
                .trim_start_matches('<')
                .trim_end_matches('>')
                .to_owned()
        })
    })
}

async fn send(sources: &Sources, url: &str, what: &str) -> Result<reqwest::Response, SourceError> {
    let response = sources
        .get(url, true)
        .timeout(META_TIMEOUT)
        .send()
        .await
        .map_err(|e| unavailable(url, &e))?;
    check_status(response, url, what, sources.config.hf_token.is_some()).await
}

async fn get_json<T: serde::de::DeserializeOwned>(
    sources: &Sources,
    url: &str,
    what: &str,
) -> Result<T, SourceError> {
    send(sources, url, what)
        .await?
        .json()
        .await
        .map_err(|e| SourceError::Unavailable(format!("{url}: unreadable answer: {e}")))
}

/// Turns the hub's error answers into errors naming the repository and what to do.
pub(crate) async fn check_status(
    response: reqwest::Response,
    url: &str,
    what: &str,
    has_token: bool,
) -> Result<reqwest::Response, SourceError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let code = response
        .headers()
        .get("x-error-code")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.text().await.unwrap_or_default();
    let detail: String = body.chars().take(300).collect();
    Err(match status.as_u16() {
        401 | 403 if has_token => SourceError::Unauthorized(format!(
            "the hub refused the configured hf_token for {what} ({status}{}); check that the \
             token may read this repository (gated repositories need their terms accepted)",
            if code.is_empty() {
                String::new()
            } else {
                format!(", {code}")
            }
        )),
        401 | 403 => SourceError::Unauthorized(format!(
            "{what} is private, gated or does not exist ({status}{}); if it exists, set \
             hf_token to a token that may read it",
            if code.is_empty() {
                String::new()
            } else {
                format!(", {code}")
            }
        )),
        404 => SourceError::Invalid(match code.as_str() {
            "RevisionNotFound" => format!("{what}: no such revision (branch, tag or commit)"),
            "EntryNotFound" => format!("{what}: no such file ({url})"),
            _ => format!("{what}: no such repository on the hub ({url})"),
        }),
        _ => SourceError::Unavailable(format!("{url} answered {status}: {detail}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str) -> TreeEntry {
        TreeEntry {
            kind: "file".into(),
            path: path.into(),
            size: Some(1),
            lfs: None,
        }
    }

    fn chosen(
        paths: &[&str],
        file: Option<&str>,
        backend: BackendKind,
    ) -> Result<Vec<String>, SourceError> {
        let entries: Vec<TreeEntry> = paths.iter().map(|p| entry(p)).collect();
        let refs: Vec<&TreeEntry> = entries.iter().collect();
        choose(&refs, file, backend, "org/repo@main")
            .map(|c| c.iter().map(|e| e.path.clone()).collect())
    }

    const REPO: &[&str] = &[
        "README.md",
        "config.json",
        "model-Q4_K_M.gguf",
        "model-Q8_0.gguf",
        "big-Q4_K_M-00002-of-00003.gguf",
        "big-Q4_K_M-00001-of-00003.gguf",
        "big-Q4_K_M-00003-of-00003.gguf",
        "mmproj-model-f16.gguf",
    ];

    #[test]
    fn a_name_a_glob_and_split_parts_choose_the_files() {
        let llama = BackendKind::LlamaCpp;
        assert_eq!(
            chosen(REPO, Some("model-Q8_0.gguf"), llama).unwrap(),
            ["model-Q8_0.gguf"]
        );
        assert_eq!(
            chosen(REPO, Some("model-*Q8*"), llama).unwrap(),
            ["model-Q8_0.gguf"]
        );
        // Naming any part brings every part, first part first.
        assert_eq!(
            chosen(REPO, Some("big-Q4_K_M-00002-of-00003.gguf"), llama).unwrap(),
            [
                "big-Q4_K_M-00001-of-00003.gguf",
                "big-Q4_K_M-00002-of-00003.gguf",
                "big-Q4_K_M-00003-of-00003.gguf"
            ]
        );
        // A glob matching two models is ambiguous, and says which.
        let SourceError::Invalid(message) = chosen(REPO, Some("*Q4_K_M*"), llama).unwrap_err()
        else {
            panic!()
        };
        assert!(
            message.contains("big-Q4_K_M") && message.contains("model-Q4_K_M"),
            "{message}"
        );
        // Nothing matched: the GGUF files are listed.
        let SourceError::Invalid(message) = chosen(REPO, Some("*Q2_K*"), llama).unwrap_err() else {
            panic!()
        };
        assert!(message.contains("model-Q8_0.gguf"), "{message}");
        // Without a file, llama.cpp needs the repository to hold one GGUF model.
        assert!(chosen(REPO, None, llama).is_err());
        assert_eq!(
            chosen(&["a.md", "only.gguf"], None, llama).unwrap(),
            ["only.gguf"]
        );
    }

    #[test]
    fn engines_get_weights_configs_and_tokenizer_files() {
        let repo = [
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "tokenizer.json",
            "tokenizer.model",
            "original/consolidated.00.pth",
            "original/params.json",
            "pytorch_model.bin",
            "README.md",
        ];
        assert_eq!(
            chosen(&repo, None, BackendKind::Vllm).unwrap(),
            [
                "config.json",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
                "model.safetensors.index.json",
                "tokenizer.json",
                "tokenizer.model"
            ]
        );
        assert!(chosen(
            &["config.json", "pytorch_model.bin"],
            None,
            BackendKind::Vllm
        )
        .is_err());
    }

    #[test]
    fn split_parts_and_segments_are_read_strictly() {
        assert_eq!(
            split_part("dir/m-Q4-00001-of-00003.gguf"),
            Some(("dir/m-Q4", "00003"))
        );
        assert_eq!(split_part("m-1-of-3.gguf"), None);
        assert_eq!(split_part("m.gguf"), None);
        assert_eq!(encode_segment("refs/pr/1"), "refs%2Fpr%2F1");
        assert_eq!(encode_segment("a b+c.gguf"), "a%20b%2Bc.gguf");
    }
}
