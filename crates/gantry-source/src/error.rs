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
    /// No connection could be made to `host` at all (its name does not resolve, it refuses
    /// connections, it does not answer); a later try may work.
    #[error("{host} cannot be reached ({reason}) to fetch {url}")]
    Unreachable {
        host: String,
        /// Why, in words: "its name does not resolve", "it refuses connections", ….
        reason: &'static str,
        /// The URL asked for, without its query.
        url: String,
    },
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
        matches!(
            self,
            SourceError::Unavailable(_) | SourceError::Unreachable { .. }
        )
    }
}

/// Turns a failed request into an [`SourceError::Unavailable`] naming the URL, or
/// [`SourceError::Unreachable`] when no connection could be made: that is said in words,
/// since the resolver's or socket's own text ("dns error: failed to lookup address
/// information") tells a person nothing more.
pub(crate) fn unavailable(url: &str, error: &reqwest::Error) -> SourceError {
    if error.is_connect() || error.is_timeout() {
        let host = reqwest::Url::parse(url)
            .ok()
            .and_then(|parsed| parsed.host_str().map(str::to_owned))
            .unwrap_or_else(|| shown_url(url));
        return SourceError::Unreachable {
            host,
            reason: why_unreachable(error),
            url: shown_url(url),
        };
    }
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

/// Why a connection failed, in words: the chain of causes is searched for what a
/// resolver or the socket said.
fn why_unreachable(error: &reqwest::Error) -> &'static str {
    if error.is_timeout() {
        return "it did not answer in time";
    }
    let mut causes = String::new();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        causes.push_str(&cause.to_string().to_ascii_lowercase());
        causes.push('\n');
        source = cause.source();
    }
    if causes.contains("dns error") || causes.contains("failed to lookup address") {
        "its name does not resolve"
    } else if causes.contains("connection refused") {
        "it refuses connections"
    } else if causes.contains("certificate") || causes.contains("tls") {
        "its TLS certificate is not trusted"
    } else if causes.contains("network is unreachable") || causes.contains("no route to host") {
        "there is no network route to it"
    } else {
        "the connection failed"
    }
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

    #[tokio::test]
    async fn an_unreachable_host_is_named_in_words() {
        // A port nothing listens on: bound, then released.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        drop(listener);
        let url = format!("http://127.0.0.1:{port}/api/models/org/repo?token=secret");
        let error = reqwest::get(&url).await.expect_err("nothing listens");
        let message = unavailable(&url, &error).to_string();
        assert_eq!(
            message,
            format!(
                "127.0.0.1 cannot be reached (it refuses connections) to fetch \
                 http://127.0.0.1:{port}/api/models/org/repo?…"
            )
        );
        assert!(unavailable(&url, &error).is_transient());
    }

    #[test]
    fn shown_urls_drop_their_query() {
        assert_eq!(
            shown_url("http://s3/b/k.gguf?X-Amz-Signature=secret"),
            "http://s3/b/k.gguf?…"
        );
        assert_eq!(shown_url("https://h/m.gguf"), "https://h/m.gguf");
    }
}
