//! The worker's HTTP client for the servers. It knows every server URL and sticks to
//! one until it fails (connection error or 502/503/504), then moves to the next; the
//! instances the worker runs are not touched by a switch.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::RwLock;
use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response, StatusCode};

/// Why a call to the servers failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no server answered ({tried} tried): {last}")]
    Unreachable { tried: usize, last: String },
    #[error("server {url} answered {status}: {message}")]
    Status {
        url: String,
        status: StatusCode,
        message: String,
    },
}

impl ClientError {
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            ClientError::Unreachable { .. } => None,
        }
    }
}

/// Talks to whichever server is up.
#[derive(Debug)]
pub struct ServerClient {
    urls: Vec<String>,
    current: AtomicUsize,
    http: reqwest::Client,
    credential: RwLock<Option<String>>,
}

impl ServerClient {
    pub fn new(urls: Vec<String>) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .expect("a reqwest client with default TLS-less settings builds");
        Self {
            urls,
            current: AtomicUsize::new(0),
            http,
            credential: RwLock::new(None),
        }
    }

    /// The bearer token used from now on.
    pub fn set_credential(&self, credential: &str) {
        if let Ok(mut slot) = self.credential.write() {
            *slot = Some(credential.to_string());
        }
    }

    /// The server in use.
    pub fn current_url(&self) -> &str {
        &self.urls[self.current.load(Ordering::Relaxed) % self.urls.len()]
    }

    /// Sends a request to the current server, moving on to the next ones when a server
    /// cannot be reached or says it is unavailable. `timeout` bounds each attempt
    /// (`None` for streams). `bearer` overrides the stored credential.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        timeout: Option<Duration>,
        bearer: Option<&str>,
    ) -> Result<Response, ClientError> {
        let start = self.current.load(Ordering::Relaxed);
        let mut last = String::new();
        for attempt in 0..self.urls.len() {
            let index = (start + attempt) % self.urls.len();
            let url = format!("{}{path}", self.urls[index]);
            let mut request: RequestBuilder = self.http.request(method.clone(), &url);
            if let Some(timeout) = timeout {
                request = request.timeout(timeout);
            }
            let token = bearer
                .map(str::to_string)
                .or_else(|| self.credential.read().ok().and_then(|c| c.clone()));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            if let Some(body) = body {
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
                Ok(response) if response.status().is_success() => {
                    self.switch_to(index);
                    return Ok(response);
                }
                Ok(response) => {
                    self.switch_to(index);
                    let status = response.status();
                    let text = response.text().await.unwrap_or_default();
                    let message = serde_json::from_str::<serde_json::Value>(&text)
                        .ok()
                        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                        .unwrap_or(text);
                    return Err(ClientError::Status {
                        url,
                        status,
                        message,
                    });
                }
                Err(e) => last = format!("{url}: {e}"),
            }
        }
        Err(ClientError::Unreachable {
            tried: self.urls.len(),
            last,
        })
    }

    /// `send` with a JSON answer.
    pub async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        bearer: Option<&str>,
    ) -> Result<T, ClientError> {
        let response = self
            .send(method, path, body, Some(Duration::from_secs(30)), bearer)
            .await?;
        let url = response.url().to_string();
        let status = response.status();
        response.json().await.map_err(|e| ClientError::Status {
            url,
            status,
            message: format!("unreadable answer: {e}"),
        })
    }

    fn switch_to(&self, index: usize) {
        let previous = self.current.swap(index, Ordering::Relaxed);
        if previous != index {
            tracing::warn!(from = %self.urls[previous % self.urls.len()], to = %self.urls[index], "switched to another server");
        }
    }
}
