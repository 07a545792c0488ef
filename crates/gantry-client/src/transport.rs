//! The [`Client`] and how a call travels: to the server in use, moving on to the next
//! one when a server cannot be reached or says it is unavailable (502, 503, 504); any
//! other answer, success or error, is final and makes that server the one in use.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use gantry_types::ErrorBody;
use reqwest::{Method, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::ClientError;

/// How long a call (not a stream) may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting to a server may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A client of one gantry cluster. Cheap to clone; clones share the server in use and the
/// token.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    urls: Vec<String>,
    current: AtomicUsize,
    http: reqwest::Client,
    token: RwLock<Option<String>>,
    timeout: Duration,
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
}

impl Client {
    /// A client of the server at `url` (`http://host:port`).
    pub fn new(url: impl Into<String>) -> Self {
        Self::with_servers(vec![url.into()])
    }

    /// A client of several servers of one cluster: it uses one and moves to the next when
    /// that one fails. `urls` must not be empty.
    pub fn with_servers(urls: Vec<String>) -> Self {
        assert!(!urls.is_empty(), "a client needs at least one server URL");
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .expect("a reqwest client without TLS settings builds");
        Client {
            inner: Arc::new(Inner {
                urls: urls
                    .into_iter()
                    .map(|url| url.trim_end_matches('/').to_owned())
                    .collect(),
                current: AtomicUsize::new(0),
                http,
                token: RwLock::new(None),
                timeout: DEFAULT_TIMEOUT,
            }),
        }
    }

    /// The same servers with `token` as the bearer token of every call.
    pub fn with_token(self, token: impl Into<String>) -> Self {
        self.set_token(token);
        self
    }

    /// The bearer token of every call from now on (an API key, a session token or a
    /// worker credential).
    pub fn set_token(&self, token: impl Into<String>) {
        if let Ok(mut slot) = self.inner.token.write() {
            *slot = Some(token.into());
        }
    }

    /// The bearer token in use, if any.
    pub fn token(&self) -> Option<String> {
        self.inner.token.read().ok().and_then(|t| t.clone())
    }

    /// The server in use.
    pub fn current_url(&self) -> &str {
        let urls = &self.inner.urls;
        &urls[self.inner.current.load(Ordering::Relaxed) % urls.len()]
    }

    /// Sends a call and returns the successful response; an error answer becomes a
    /// [`ClientError`].
    pub(crate) async fn send<B, Q>(&self, call: Call<'_, B, Q>) -> Result<Response, ClientError>
    where
        B: Serialize + ?Sized,
        Q: Serialize + ?Sized,
    {
        let inner = &self.inner;
        let start = inner.current.load(Ordering::Relaxed);
        let mut last = String::new();
        for attempt in 0..inner.urls.len() {
            let index = (start + attempt) % inner.urls.len();
            let url = format!("{}{}", inner.urls[index], call.path);
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
            match request.send().await {
                Ok(response)
                    if matches!(
                        response.status(),
                        StatusCode::BAD_GATEWAY
                            | StatusCode::SERVICE_UNAVAILABLE
                            | StatusCode::GATEWAY_TIMEOUT
                    ) =>
                {
                    last = format!("{url}: {}", response.status());
                }
                Ok(response) => {
                    self.switch_to(index);
                    return if response.status().is_success() {
                        Ok(response)
                    } else {
                        Err(error_of(url, response).await)
                    };
                }
                Err(e) => last = format!("{url}: {e}"),
            }
        }
        Err(ClientError::Unreachable {
            tried: inner.urls.len(),
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
        self.send(call).await.map(drop)
    }

    fn switch_to(&self, index: usize) {
        let previous = self.inner.current.swap(index, Ordering::Relaxed);
        let urls = &self.inner.urls;
        if previous != index {
            tracing::warn!(from = %urls[previous % urls.len()], to = %urls[index], "switched to another server");
        }
    }
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
