//! Resolving a URL source: one `HEAD` per file for its size (following redirects), the
//! file name from the URL's last path segment, the digest from the model's `sha256`.

use sha2::{Digest, Sha256};

use crate::error::unavailable;
use crate::{RemoteFile, Resolved, SourceError, Sources, META_TIMEOUT};

pub(crate) async fn resolve(
    sources: &Sources,
    urls: &[&str],
    digests: Option<&[&str]>,
) -> Result<Resolved, SourceError> {
    let mut files = Vec::with_capacity(urls.len());
    let mut key = Sha256::new();
    for (i, url) in urls.iter().enumerate() {
        key.update(url.as_bytes());
        key.update(b"\n");
        let response = sources
            .http
            .head(*url)
            .timeout(META_TIMEOUT)
            .send()
            .await
            .map_err(|e| unavailable(url, &e))?;
        let response = check_status(response, url)?;
        let size = response
            .headers()
            .get(reqwest::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        files.push(RemoteFile {
            path: file_name(url, i),
            url: (*url).to_owned(),
            size,
            sha256: digests
                .and_then(|d| d.get(i))
                .map(|d| d.to_ascii_lowercase()),
            hub_auth: false,
            ..Default::default()
        });
    }
    Ok(Resolved {
        key: format!("url/{}", &hex::encode(key.finalize())[..16]),
        commit: None,
        files,
    })
}

/// Passes a successful answer; an error answer becomes an error saying what to do.
pub(crate) fn check_status(
    response: reqwest::Response,
    url: &str,
) -> Result<reqwest::Response, SourceError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    Err(match status.as_u16() {
        401 | 403 => SourceError::Unauthorized(format!(
            "{url} answered {status}: the file is not public; make it readable without \
             credentials or use another source"
        )),
        404 | 410 => SourceError::Invalid(format!("{url} answered {status}: no such file")),
        _ => SourceError::Unavailable(format!("{url} answered {status}")),
    })
}

/// The file name of a URL: its last path segment (percent-decoded, query dropped), or
/// `file-<n>` when it has none.
fn file_name(url: &str, index: usize) -> String {
    let path = url.split(['?', '#']).next().unwrap_or_default();
    let last = path.rsplit('/').next().unwrap_or_default();
    let decoded = percent_decode(last);
    let safe = !decoded.is_empty()
        && decoded != "."
        && decoded != ".."
        && !decoded.contains(['/', '\\', '\0']);
    if safe && path.matches('/').count() > 2 {
        decoded
    } else {
        format!("file-{index}")
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(byte) = u8::from_str_radix(text.get(i + 1..i + 3).unwrap_or_default(), 16) {
                out.push(byte);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_come_from_the_last_segment() {
        assert_eq!(file_name("https://h/a/model.gguf", 0), "model.gguf");
        assert_eq!(
            file_name("https://h/a/my%20model.gguf?x=1#f", 0),
            "my model.gguf"
        );
        assert_eq!(file_name("https://h/", 2), "file-2");
        assert_eq!(file_name("https://h", 1), "file-1");
        assert_eq!(file_name("https://h/a/..", 0), "file-0");
        assert_eq!(file_name("https://h/a/%2F", 0), "file-0");
    }
}
