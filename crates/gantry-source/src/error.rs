//! Why a source could not be resolved, read or downloaded. Each message names the
//! source and what to do.

/// A failure of a model source.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// The source, as given, cannot work (no such repository, file or revision; a glob
    /// that matches nothing; an ambiguous choice). Retrying will not help.
    #[error("{0}")]
    Invalid(String),
    /// The source refused the credentials (or their absence).
    #[error("{0}")]
    Unauthorized(String),
    /// The network or the remote side failed; a later try may work.
    #[error("{0}")]
    Unavailable(String),
    /// The bytes received are not the ones expected.
    #[error("{0}")]
    Corrupt(String),
    /// The worker's disk: no space, or a file it cannot write.
    #[error("{0}")]
    Disk(String),
    /// The download was cancelled (the instance went away).
    #[error("cancelled")]
    Cancelled,
}

impl SourceError {
    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, SourceError::Unavailable(_))
    }
}

/// Turns a failed request into an [`SourceError::Unavailable`] naming the URL.
pub(crate) fn unavailable(url: &str, error: &reqwest::Error) -> SourceError {
    // reqwest's own text names the URL again; a signed URL's query is a credential.
    let text = match error.url() {
        Some(full) => error
            .to_string()
            .replace(full.as_str(), &shown_url(full.as_str())),
        None => error.to_string(),
    };
    let mut message = format!("{}: {text}", shown_url(url));
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    SourceError::Unavailable(message)
}

/// A URL as messages and logs show it: without its query, which for a signed (S3
/// presigned) URL is a credential.
pub(crate) fn shown_url(url: &str) -> String {
    match url.split_once('?') {
        Some((base, _)) => format!("{base}?…"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_urls_drop_their_query() {
        assert_eq!(
            shown_url("http://s3/b/k.gguf?X-Amz-Signature=secret"),
            "http://s3/b/k.gguf?…"
        );
        assert_eq!(shown_url("https://h/m.gguf"), "https://h/m.gguf");
    }
}
