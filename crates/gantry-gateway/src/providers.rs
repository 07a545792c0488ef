//! Model providers as the gateway reaches them: an external OpenAI-compatible endpoint
//! becomes a [`Backend`] like an instance — same connection pool, same passive ejection,
//! same balancer — with what differs kept in a [`ProviderEndpoint`]: TLS for `https://`,
//! the base URL's path, the `Authorization` header made from the opened API key (marked
//! sensitive, never logged), extra headers and the first-byte timeout.

use std::sync::Arc;
use std::time::Duration;

use axum::http::header::{self, HeaderName};
use axum::http::uri::Authority;
use axum::http::{HeaderValue, StatusCode};
use gantry_types::ModelProvider;
use rustls_pki_types::ServerName;

use crate::h1;
use crate::routing::Backend;
use crate::upstream::{Outgoing, UpstreamConnection};

/// What a request to a provider adds to a request to an instance.
#[derive(Debug)]
pub struct ProviderEndpoint {
    pub id: i64,
    pub name: Arc<str>,
    /// For `https://` base URLs: the name the certificate must carry.
    pub tls_name: Option<ServerName<'static>>,
    /// The base URL's path without its trailing `/` (`/v1`); OpenAI paths are appended
    /// without their own `/v1`.
    pub path_prefix: String,
    /// `Bearer <key>`, marked sensitive.
    authorization: Option<HeaderValue>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub timeout: Duration,
    /// The provider's `updated_at`: a reload keeps the backend (and its connections)
    /// while this is unchanged.
    pub version: i64,
}

/// A provider whose definition cannot be used (the reason, for the log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("model provider {provider}: {reason}")]
pub struct UnusableProvider {
    pub provider: String,
    pub reason: String,
}

impl ProviderEndpoint {
    /// The request path for an OpenAI path such as `/v1/chat/completions`.
    pub fn path_for(&self, openai_path: &str) -> String {
        let rest = openai_path.strip_prefix("/v1").unwrap_or(openai_path);
        format!("{}{rest}", self.path_prefix)
    }

    /// A request's headers (`name: value\r\n` lines) with the provider's extra headers
    /// and credentials in place of any of the same name.
    pub fn with_headers(&self, client: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(client.len() + 256);
        let replaced = |name: &[u8]| {
            self.headers
                .iter()
                .any(|(n, _)| n.as_str().as_bytes().eq_ignore_ascii_case(name))
        };
        for line in client.split_inclusive(|b| *b == b'\n') {
            let name = line.split(|b| *b == b':').next().unwrap_or_default();
            if !replaced(name.trim_ascii()) {
                out.extend_from_slice(line);
            }
        }
        for (name, value) in &self.headers {
            h1::put_header(&mut out, name.as_str().as_bytes(), value.as_bytes());
        }
        if let Some(authorization) = &self.authorization {
            h1::put_header(
                &mut out,
                header::AUTHORIZATION.as_str().as_bytes(),
                authorization.as_bytes(),
            );
        }
        out
    }
}

/// The backend that sends requests to `provider`, with `api_key` opened.
pub fn backend(
    provider: &ModelProvider,
    api_key: Option<&str>,
) -> Result<Arc<Backend>, UnusableProvider> {
    let unusable = |reason: String| UnusableProvider {
        provider: provider.name.clone(),
        reason,
    };
    let (tls, rest) = if let Some(rest) = provider.base_url.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = provider.base_url.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(unusable("base_url is not http:// or https://".into()));
    };
    let (host_port, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, ""),
    };
    let authority: Authority = host_port
        .parse()
        .map_err(|e| unusable(format!("base_url's host {host_port:?}: {e}")))?;
    let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let host = authority.host();
    let address = format!("{host}:{port}");
    let tls_name = if tls {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        Some(
            ServerName::try_from(bare.to_string())
                .map_err(|e| unusable(format!("{host:?} is not a TLS server name: {e}")))?,
        )
    } else {
        None
    };
    let authorization = match api_key {
        Some(key) => {
            let mut value = HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| unusable("the API key cannot be sent as a header".into()))?;
            value.set_sensitive(true);
            Some(value)
        }
        None => None,
    };
    let mut headers = Vec::with_capacity(provider.headers.len());
    for (name, value) in &provider.headers {
        let name = HeaderName::try_from(name.as_str())
            .map_err(|_| unusable(format!("header name {name:?} is not valid")))?;
        let mut value = HeaderValue::from_str(value)
            .map_err(|_| unusable(format!("header {name}'s value is not valid")))?;
        value.set_sensitive(true);
        headers.push((name, value));
    }
    let endpoint = ProviderEndpoint {
        id: provider.id,
        name: Arc::from(provider.name.as_str()),
        tls_name,
        path_prefix: path.trim_end_matches('/').to_string(),
        authorization,
        headers,
        timeout: Duration::from_secs(provider.timeout_seconds.max(1)),
        version: provider.updated_at.as_millis(),
    };
    let host_header = HeaderValue::from_str(host_port)
        .map_err(|_| unusable(format!("host {host_port:?} is not a valid Host header")))?;
    Backend::for_provider(Arc::new(endpoint), address, authority, host_header)
        .map(Arc::new)
        .map_err(unusable)
}

/// Largest `GET /models` answer read.
const MAX_MODELS_BODY: usize = 8 * 1024 * 1024;

/// Asks a provider which models it offers (`GET {base_url}/models`, OpenAI's list
/// shape). The error says what went wrong in words fit for an API answer; it never
/// holds the key.
pub async fn discover_models(backend: &Backend) -> Result<Vec<String>, String> {
    let Some(endpoint) = backend.provider.as_ref() else {
        return Err("not a provider".into());
    };
    let path = endpoint.path_for("/v1/models");
    let headers = endpoint.with_headers(b"accept: application/json\r\n");
    let work = async {
        let mut connection: UpstreamConnection =
            backend.connect().await.map_err(|e| e.to_string())?;
        let head = connection
            .send(Outgoing {
                method: "GET",
                path: &path,
                query: None,
                host: backend.host_header.as_bytes(),
                headers: &headers,
                body: b"",
            })
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        let status = StatusCode::from_u16(head.status).unwrap_or(StatusCode::BAD_GATEWAY);
        let mut body = Vec::new();
        while let Some(data) = std::future::poll_fn(|cx| connection.poll_body(cx)).await {
            let data = data.map_err(|e| format!("reading the answer failed: {e}"))?;
            if body.len() + data.len() > MAX_MODELS_BODY {
                return Err(format!(
                    "reading the answer failed: longer than {MAX_MODELS_BODY} bytes"
                ));
            }
            body.extend_from_slice(&data);
        }
        Ok::<_, String>((status, body))
    };
    let (status, body) = tokio::time::timeout(endpoint.timeout, work)
        .await
        .map_err(|_| format!("no answer within {} s", endpoint.timeout.as_secs()))??;
    if status != StatusCode::OK {
        let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
        return Err(format!("GET /models answered {status}: {text}"));
    }
    #[derive(serde::Deserialize)]
    struct List {
        data: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        id: String,
    }
    let list: List = serde_json::from_slice(&body).map_err(|e| {
        format!(
            "GET /models did not answer an OpenAI model list ({{\"data\": [{{\"id\": …}}]}}): {e}"
        )
    })?;
    Ok(list.data.into_iter().map(|entry| entry.id).collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use gantry_types::Timestamp;

    use super::*;

    fn provider(base_url: &str) -> ModelProvider {
        ModelProvider {
            id: 7,
            name: "hosted".into(),
            description: String::new(),
            base_url: base_url.into(),
            has_api_key: true,
            headers: BTreeMap::from([("x-org".into(), "team".into())]),
            timeout_seconds: 30,
            models: vec![],
            created_at: Timestamp::from_millis(0),
            updated_at: Timestamp::from_millis(5),
        }
    }

    #[test]
    fn a_provider_url_becomes_address_host_path_and_tls_name() {
        let b = backend(&provider("https://api.example.com/v1/"), Some("sk-1")).unwrap();
        let endpoint = b.provider.as_ref().unwrap();
        assert_eq!(b.address, "api.example.com:443");
        assert_eq!(b.host_header, "api.example.com");
        assert!(endpoint.tls_name.is_some());
        assert_eq!(
            endpoint.path_for("/v1/chat/completions"),
            "/v1/chat/completions"
        );
        assert_eq!(b.instance_id, -7);

        let b = backend(&provider("http://127.0.0.1:8080/openai/v1"), None).unwrap();
        let endpoint = b.provider.as_ref().unwrap();
        assert_eq!(b.address, "127.0.0.1:8080");
        assert!(endpoint.tls_name.is_none());
        assert_eq!(endpoint.path_for("/v1/embeddings"), "/openai/v1/embeddings");

        let b = backend(&provider("http://host"), None).unwrap();
        assert_eq!(b.address, "host:80");
        assert_eq!(
            b.provider.as_ref().unwrap().path_for("/v1/models"),
            "/models"
        );
    }

    #[test]
    fn the_key_goes_in_the_provider_headers_and_never_in_debug_output() {
        let b = backend(&provider("https://api.example.com/v1"), Some("sk-secret-1")).unwrap();
        let client = b"accept: */*\r\nx-org: mine\r\n";
        let headers = b.provider.as_ref().unwrap().with_headers(client);
        let headers = String::from_utf8(headers).unwrap();
        assert!(
            headers.contains("authorization: Bearer sk-secret-1\r\n"),
            "{headers}"
        );
        assert!(headers.contains("x-org: team\r\n"), "{headers}");
        assert!(
            !headers.contains("x-org: mine"),
            "the provider's header replaces the client's: {headers}"
        );
        assert!(headers.starts_with("accept: */*\r\n"), "{headers}");
        assert!(!format!("{b:?}").contains("sk-secret-1"));
    }
}
