//! The [`Client`] and how a call travels: to the server in use, moving on to the next
//! one when a server cannot be reached or says it is unavailable (502, 503, 504); any
//! other answer, success or error, is final and makes that server the one in use. A 502
//! in which the server itself reports a worker or a model provider it could not reach or
//! that failed (`worker_unreachable`, `worker_error`, `provider_error`) is such a final
//! answer too: another server would reach the same worker or provider.
//!
//! A successful answer must carry the status the call expects (201 for a creation, 204
//! for an answer without a body, 200 otherwise); another one means that client and server
//! disagree on the API, and is an error.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use gantry_types::{ErrorBody, ErrorCode};
use reqwest::{Method, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::ClientError;

/// How long a call (not a stream) may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting to a server may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A client of one gantry cluster. Cheap to clone; clones share the server in use and the
/// token. [`Client::for_token`] makes a client of the same servers with a token of its own.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
    token: Arc<RwLock<Option<String>>>,
}

#[derive(Debug)]
struct Inner {
    servers: RwLock<Servers>,
    http: reqwest::Client,
    timeout: Duration,
}

/// The servers of the cluster, best first, and the one in use.
#[derive(Debug, Clone)]
struct Servers {
    urls: Vec<String>,
    current: usize,
}

/// One request, before it is sent.
pub(crate) struct Call<'a, B: Serialize + ?Sized, Q: Serialize + ?Sized> {
    pub method: Method,
    pub path: &'a str,
    pub query: Option<&'a Q>,
    pub body: Option<&'a B>,
    /// `None` for streams, which stay open.
    pub timeout: Option<Duration>,
    /// Overrides the client's token for this call.
    pub bearer: Option<&'a str>,
    /// The statuses of a successful answer.
    pub success: &'static [StatusCode],
    /// A protocol to ask the server to switch the connection to (`Upgrade`); a `101
    /// Switching Protocols` answer is then a success too.
    pub upgrade: Option<&'static str>,
}

impl<'a> Call<'a, (), ()> {
    pub(crate) fn new(method: Method, path: &'a str) -> Self {
        Call {
            method,
            path,
            query: None,
            body: None,
            timeout: None,
            bearer: None,
            success: &[StatusCode::OK],
            upgrade: None,
        }
    }
}

impl<'a, B: Serialize + ?Sized, Q: Serialize + ?Sized> Call<'a, B, Q> {
    pub(crate) fn body<B2: Serialize + ?Sized>(self, body: &'a B2) -> Call<'a, B2, Q> {
        Call {
            method: self.method,
            path: self.path,
            query: self.query,
            body: Some(body),
            timeout: self.timeout,
            bearer: self.bearer,
            success: self.success,
            upgrade: self.upgrade,
        }
    }

    pub(crate) fn query<Q2: Serialize + ?Sized>(self, query: &'a Q2) -> Call<'a, B, Q2> {
        Call {
            method: self.method,
            path: self.path,
            query: Some(query),
            body: self.body,
            timeout: self.timeout,
            bearer: self.bearer,
            success: self.success,
            upgrade: self.upgrade,
        }
    }

    pub(crate) fn bearer(mut self, token: &'a str) -> Self {
        self.bearer = Some(token);
        self
    }

    pub(crate) fn streaming(mut self) -> Self {
        self.timeout = None;
        self
    }

    /// Asks the server to switch the connection to `protocol`; it may answer `101
    /// Switching Protocols` or, not knowing it, as usual.
    pub(crate) fn upgrading(mut self, protocol: &'static str) -> Self {
        self.upgrade = Some(protocol);
        self
    }

    /// A successful answer is 201 Created.
    pub(crate) fn creating(self) -> Self {
        self.answering(&[StatusCode::CREATED])
    }

    /// The statuses of a successful answer (200 unless said otherwise).
    pub(crate) fn answering(mut self, statuses: &'static [StatusCode]) -> Self {
        self.success = statuses;
        self
    }
}

impl Client {
    /// A client of the server at `url` (`http://host:port`).
    pub fn new(url: impl Into<String>) -> Self {
        Self::with_servers(vec![url.into()])
    }

    /// A client of several servers of one cluster: it uses one and moves to the next when
    /// that one fails. `urls` must not be empty.
    pub fn with_servers(urls: Vec<String>) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .expect("a reqwest client without TLS settings builds");
        Self::over(urls, http)
    }

    /// Like [`Client::with_servers`], trusting the certificates in `ca_pem` (PEM, one or
    /// more) as well as the system's roots: for `https://` servers whose certificate a
    /// private CA issued, or a self-signed one (`server_ca_file`). Fails when `ca_pem`
    /// holds no usable certificate.
    pub fn with_servers_trusting(urls: Vec<String>, ca_pem: &[u8]) -> Result<Self, reqwest::Error> {
        let mut builder = reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT);
        for certificate in reqwest::Certificate::from_pem_bundle(ca_pem)? {
            builder = builder.add_root_certificate(certificate);
        }
        Ok(Self::over(urls, builder.build()?))
    }

    fn over(urls: Vec<String>, http: reqwest::Client) -> Self {
        assert!(!urls.is_empty(), "a client needs at least one server URL");
        Client {
            inner: Arc::new(Inner {
                servers: RwLock::new(Servers {
                    urls: urls
                        .into_iter()
                        .map(|url| url.trim_end_matches('/').to_owned())
                        .collect(),
                    current: 0,
                }),
                http,
                timeout: DEFAULT_TIMEOUT,
            }),
            token: Arc::new(RwLock::new(None)),
        }
    }

    /// The same servers with `token` as the bearer token of every call. Clones of this
    /// client share the token; [`Client::for_token`] does not.
    pub fn with_token(self, token: impl Into<String>) -> Self {
        self.set_token(token);
        self
    }

    /// A client of the same servers, sharing their connections and the server in use,
    /// that sends `token` instead: another user, an API key, a worker's credential.
    pub fn for_token(&self, token: impl Into<String>) -> Self {
        Client {
            inner: Arc::clone(&self.inner),
            token: Arc::new(RwLock::new(Some(token.into()))),
        }
    }

    /// The bearer token of every call from now on (an API key, a session token or a
    /// worker credential).
    pub fn set_token(&self, token: impl Into<String>) {
        if let Ok(mut slot) = self.token.write() {
            *slot = Some(token.into());
        }
    }

    /// The bearer token in use, if any.
    pub fn token(&self) -> Option<String> {
        self.token.read().ok().and_then(|t| t.clone())
    }

    /// The server in use.
    pub fn current_url(&self) -> String {
        let servers = self.servers();
        servers.urls[servers.current % servers.urls.len()].clone()
    }

    /// Every server this client knows, best first.
    pub fn server_urls(&self) -> Vec<String> {
        self.servers().urls
    }

    /// Replaces the servers this client knows (a fresh list from the registry, best
    /// first). The server in use stays in use while it is listed; a call that fails there
    /// then tries the others in this order, so a (re)connection goes to the best one.
    /// An empty list changes nothing.
    pub fn set_servers(&self, urls: Vec<String>) {
        let urls: Vec<String> = urls
            .into_iter()
            .map(|url| url.trim_end_matches('/').to_owned())
            .collect();
        if urls.is_empty() {
            return;
        }
        let mut servers = self
            .inner
            .servers
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let in_use = servers.urls[servers.current % servers.urls.len()].clone();
        servers.current = urls.iter().position(|u| *u == in_use).unwrap_or(0);
        servers.urls = urls;
    }

    fn servers(&self) -> Servers {
        self.inner
            .servers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Sends a call and returns the successful response; an error answer becomes a
    /// [`ClientError`].
    pub(crate) async fn send<B, Q>(&self, call: Call<'_, B, Q>) -> Result<Response, ClientError>
    where
        B: Serialize + ?Sized,
        Q: Serialize + ?Sized,
    {
        let inner = &self.inner;
        let servers = self.servers();
        let start = servers.current % servers.urls.len();
        // The server in use first, then the others best first.
        let order = std::iter::once(start).chain((0..servers.urls.len()).filter(|i| *i != start));
        let mut last = String::new();
        for index in order {
            let base = &servers.urls[index];
            let url = format!("{base}{}", call.path);
            let mut request = inner.http.request(call.method.clone(), &url);
            if let Some(timeout) = call.timeout {
                request = request.timeout(timeout);
            }
            if let Some(query) = call.query {
                request = request.query(query);
            }
            let token = call.bearer.map(str::to_owned).or_else(|| self.token());
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            if let Some(body) = call.body {
                request = request.json(body);
            }
            if let Some(protocol) = call.upgrade {
                request = request
                    .header(reqwest::header::CONNECTION, "upgrade")
                    .header(reqwest::header::UPGRADE, protocol);
            }
            match request.send().await {
                Ok(response)
                    if response.status().is_success()
                        || (call.upgrade.is_some()
                            && response.status() == StatusCode::SWITCHING_PROTOCOLS) =>
                {
                    self.switch_to(base);
                    return if call.success.contains(&response.status())
                        || response.status() == StatusCode::SWITCHING_PROTOCOLS
                    {
                        Ok(response)
                    } else {
                        Err(ClientError::Decode {
                            url,
                            message: format!(
                                "answered {} where the call expects {:?}",
                                response.status(),
                                call.success
                            ),
                        })
                    };
                }
                Ok(response) => {
                    let status = response.status();
                    let error = error_of(url.clone(), response).await;
                    if server_unavailable(status, &error) {
                        last = format!("{url}: {error}");
                        continue;
                    }
                    self.switch_to(base);
                    return Err(error);
                }
                Err(e) => last = format!("{url}: {}", with_causes(&e)),
            }
        }
        Err(ClientError::Unreachable {
            tried: servers.urls.len(),
            last,
        })
    }

    /// Sends a call with the default timeout and decodes the JSON answer.
    pub(crate) async fn json<T, B, Q>(&self, mut call: Call<'_, B, Q>) -> Result<T, ClientError>
    where
        T: DeserializeOwned,
        B: Serialize + ?Sized,
        Q: Serialize + ?Sized,
    {
        call.timeout = call.timeout.or(Some(self.inner.timeout));
        let response = self.send(call).await?;
        decode(response).await
    }

    /// Sends a call with the default timeout and expects no body (204).
    pub(crate) async fn empty<B, Q>(&self, mut call: Call<'_, B, Q>) -> Result<(), ClientError>
    where
        B: Serialize + ?Sized,
        Q: Serialize + ?Sized,
    {
        call.timeout = call.timeout.or(Some(self.inner.timeout));
        call.success = &[StatusCode::NO_CONTENT];
        self.send(call).await.map(drop)
    }

    fn switch_to(&self, url: &str) {
        let mut servers = self
            .inner
            .servers
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let Some(index) = servers.urls.iter().position(|u| u == url) else {
            return; // the list changed meanwhile
        };
        let previous = servers.urls[servers.current % servers.urls.len()].clone();
        servers.current = index;
        if previous != url {
            tracing::warn!(from = %previous, to = %url, "switched to another server");
        }
    }
}

/// Whether an error answer says that this server cannot serve the call, so that another
/// server should be tried: 502, 503 and 504, except the server's own report of a worker
/// or a model provider it could not reach or that failed, which every server would give.
fn server_unavailable(status: StatusCode, error: &ClientError) -> bool {
    let gateway_status = matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    );
    let upstream_failure = matches!(
        error.code(),
        Some(ErrorCode::WorkerUnreachable | ErrorCode::WorkerError | ErrorCode::ProviderError)
    );
    gateway_status && !upstream_failure
}

/// Decodes a JSON answer.
pub(crate) async fn decode<T: DeserializeOwned>(response: Response) -> Result<T, ClientError> {
    let url = response.url().to_string();
    let bytes = response.bytes().await.map_err(|e| ClientError::Decode {
        url: url.clone(),
        message: e.to_string(),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode {
        url,
        message: e.to_string(),
    })
}

/// The error of an error answer: gantry's error body when it is one.
async fn error_of(url: String, response: Response) -> ClientError {
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    match serde_json::from_str::<ErrorBody>(&body) {
        Ok(ErrorBody { error }) => ClientError::Api { url, status, error },
        Err(_) => ClientError::Status { url, status, body },
    }
}

/// An error with every cause under it (`a: b: c`): reqwest's own message names only the
/// URL, and the reason — refused, timed out, a certificate not trusted — is in the
/// causes. A cause whose message its parent already includes is left out.
fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let message = e.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        cause = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1
                .as_deref()
                .map(|e| e as &(dyn std::error::Error + 'static))
        }
    }

    fn api_error(status: u16, code: ErrorCode) -> ClientError {
        ClientError::Api {
            url: "http://a/api/v1/x".into(),
            status,
            error: gantry_types::ErrorDetail {
                code,
                message: "m".into(),
            },
        }
    }

    #[test]
    fn a_failed_worker_or_provider_is_final_but_an_unavailable_server_is_not() {
        for code in [
            ErrorCode::WorkerUnreachable,
            ErrorCode::WorkerError,
            ErrorCode::ProviderError,
        ] {
            assert!(
                !server_unavailable(StatusCode::BAD_GATEWAY, &api_error(502, code)),
                "{code}"
            );
        }
        assert!(server_unavailable(
            StatusCode::SERVICE_UNAVAILABLE,
            &api_error(503, ErrorCode::Unavailable)
        ));
    }

    #[test]
    fn an_error_is_shown_with_its_causes_once_each() {
        let error = Layer(
            "error sending request",
            Some(Box::new(Layer(
                "client error (Connect)",
                Some(Box::new(Layer(
                    "Connect",
                    Some(Box::new(Layer(
                        "invalid peer certificate: UnknownIssuer",
                        None,
                    ))),
                ))),
            ))),
        );
        assert_eq!(
            with_causes(&error),
            "error sending request: client error (Connect): invalid peer certificate: UnknownIssuer"
        );
    }
}
