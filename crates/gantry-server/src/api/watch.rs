//! `?watch=true` on list endpoints: a streaming NDJSON response of [`WatchEvent`]s that
//! first sends every matching object as `CREATED`, then live `CREATED`/`UPDATED`/`DELETED`
//! events, and a `HEARTBEAT` line whenever the stream has been idle for the heartbeat
//! interval.
//!
//! The change subscription is taken before the initial list is read, so no change
//! between the two is lost (a change may arrive twice; events are level-triggered
//! snapshots, so that is harmless). A watcher that falls too far behind is sent an
//! `ERROR` line and disconnected; clients re-list and watch again.
//!
//! Every wait of the streaming task, sending included, also waits for the server's
//! shutdown, so a client that stops reading cannot hold the server up.

use std::sync::Arc;

use std::future::Future;

use axum::body::Body;
use axum::http::header::{CONNECTION, CONTENT_TYPE, UPGRADE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use gantry_store::{Change, ChangeKind};
use gantry_types::{ErrorCode, ErrorDetail, WatchEvent};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::feeds::{Feed, FeedEnd, FEED_CAPACITY};
use crate::state::AppState;

fn line<T: Serialize>(event: &WatchEvent<T>) -> Bytes {
    let mut bytes = serde_json::to_vec(event).unwrap_or_else(|_| b"{}".to_vec());
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// Where a watch stream's changes come from.
pub enum Changes {
    /// Every change of the server (the store's broadcast channel).
    All(broadcast::Receiver<Arc<Change>>),
    /// Only the changes routed to one worker's assignment stream.
    Routed(Feed),
}

/// Why a change source gave no change.
enum Missed {
    /// The stream fell behind (by this many changes, when known).
    Lagged(Option<u64>),
    Closed,
}

impl Changes {
    async fn recv(&mut self) -> Result<Arc<Change>, Missed> {
        match self {
            Changes::All(receiver) => receiver.recv().await.map_err(|e| match e {
                broadcast::error::RecvError::Lagged(missed) => Missed::Lagged(Some(missed)),
                broadcast::error::RecvError::Closed => Missed::Closed,
            }),
            Changes::Routed(feed) => feed.recv().await.map_err(|e| match e {
                FeedEnd::Lagged => Missed::Lagged(None),
                FeedEnd::Closed => Missed::Closed,
            }),
        }
    }
}

/// The `Upgrade` protocol a client names to receive a watch on the bare connection:
/// the server answers `101 Switching Protocols` and then writes the same NDJSON lines
/// straight onto the socket (no chunked framing); the stream ends when the connection
/// closes. For the worker agent's assignment watch, which every worker holds for as long
/// as it runs: an HTTP/1.1 connection keeps two 8 KiB buffers for its whole life (about
/// 21 KiB with its task, measured with 10,000 idle connections), an upgraded one only
/// its socket.
pub const UPGRADE_PROTOCOL: &str = "gantry-watch";

/// The connection of a request that asked for [`UPGRADE_PROTOCOL`] (`Connection:
/// upgrade` and `Upgrade: gantry-watch`), when the server can hand it over; `None` for
/// every other request, which gets the ordinary streaming response.
pub struct WatchUpgrade(pub Option<OnUpgrade>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for WatchUpgrade {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let asked = header_has_token(&parts.headers, CONNECTION, "upgrade")
            && header_has_token(&parts.headers, UPGRADE, UPGRADE_PROTOCOL);
        Ok(Self(if asked {
            parts.extensions.remove::<OnUpgrade>()
        } else {
            None
        }))
    }
}

/// Whether a comma-separated header lists `token` (case-insensitive).
fn header_has_token(headers: &HeaderMap, name: HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|item| item.trim().eq_ignore_ascii_case(token))
}

/// Where a watch stream's lines go.
trait Lines: Send {
    /// Sends one line; `false` when the client is gone.
    fn send(&mut self, line: Bytes) -> impl Future<Output = bool> + Send;
    /// Resolves when the client is gone.
    fn gone(&mut self) -> impl Future<Output = ()> + Send;
}

/// The body of an ordinary streaming response.
struct Chunks(mpsc::Sender<Result<Bytes, std::io::Error>>);

impl Lines for Chunks {
    async fn send(&mut self, line: Bytes) -> bool {
        self.0.send(Ok(line)).await.is_ok()
    }

    async fn gone(&mut self) {
        self.0.closed().await;
    }
}

/// An upgraded connection.
struct Socket(TokioIo<Upgraded>);

impl Lines for Socket {
    async fn send(&mut self, line: Bytes) -> bool {
        self.0.write_all(&line).await.is_ok()
    }

    async fn gone(&mut self) {
        // The client sends nothing after its request; reading returns when it closes (0
        // bytes or an error). Whatever it might send is read and ignored.
        let mut scratch = [0u8; 64];
        while let Ok(1..) = self.0.read(&mut scratch).await {}
    }
}

/// Starts a watch stream. `select` picks the changes this watcher cares about (the
/// resource and the list's filters) and returns the event's kind and object; it may keep
/// state between changes (the assignment stream remembers what it sent). With `upgrade`
/// (see [`WatchUpgrade`]) the answer is `101 Switching Protocols` and the lines go
/// straight onto the connection.
pub fn respond<T, F>(
    state: &AppState,
    changes: Changes,
    initial: Vec<T>,
    timeout: Option<std::time::Duration>,
    select: F,
    upgrade: Option<OnUpgrade>,
) -> Response
where
    T: Serialize + Send + 'static,
    F: FnMut(&Change) -> Option<(ChangeKind, T)> + Send + 'static,
{
    let stream = Stream {
        changes,
        initial,
        timeout,
        period: state.config.watch_heartbeat,
        shutdown: state.shutdown.clone(),
    };
    if let Some(upgrade) = upgrade {
        state.tasks.spawn(async move {
            match upgrade.await {
                Ok(upgraded) => stream.run(select, Socket(TokioIo::new(upgraded))).await,
                Err(e) => {
                    tracing::debug!(error = %e, "a watch connection closed before its upgrade")
                }
            }
        });
        return (
            StatusCode::SWITCHING_PROTOCOLS,
            [
                (CONNECTION, "upgrade"),
                (UPGRADE, UPGRADE_PROTOCOL),
                (CONTENT_TYPE, "application/x-ndjson"),
            ],
        )
            .into_response();
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    state.tasks.spawn(stream.run(select, Chunks(tx)));
    (
        [(CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(ReceiverStream::new(rx)),
    )
        .into_response()
}

/// Sends one line unless the server shuts down or the client went away first.
async fn send(shutdown: &CancellationToken, lines: &mut impl Lines, line: Bytes) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => false,
        sent = lines.send(line) => sent,
    }
}

/// One watch stream's source and limits.
struct Stream<T> {
    changes: Changes,
    initial: Vec<T>,
    timeout: Option<std::time::Duration>,
    period: std::time::Duration,
    shutdown: CancellationToken,
}

impl<T: Serialize + Send> Stream<T> {
    async fn run<F>(self, mut select: F, mut lines: impl Lines)
    where
        F: FnMut(&Change) -> Option<(ChangeKind, T)> + Send,
    {
        let Stream {
            mut changes,
            initial,
            timeout,
            period,
            shutdown,
        } = self;
        for object in initial {
            if !send(&shutdown, &mut lines, line(&WatchEvent::Created { object })).await {
                return;
            }
        }
        let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        // The client's `timeout_seconds`: the stream ends then, as if the server stopped.
        let ends = async {
            match timeout {
                Some(timeout) => tokio::time::sleep(timeout).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(ends);
        loop {
            let next = tokio::select! {
                () = shutdown.cancelled() => return,
                () = &mut ends => return,
                () = lines.gone() => return,
                _ = heartbeat.tick() => line(&WatchEvent::<T>::Heartbeat),
                change = changes.recv() => match change {
                    Ok(change) => {
                        let Some((kind, object)) = select(&change) else {
                            continue;
                        };
                        heartbeat.reset();
                        line(&WatchEvent::of(kind, object))
                    }
                    Err(Missed::Lagged(missed)) => {
                        let behind = missed.map_or_else(
                            || format!("more than {FEED_CAPACITY}"),
                            |n| n.to_string(),
                        );
                        tracing::warn!(missed = %behind, "watch stream fell behind; closing it");
                        let error = WatchEvent::<T>::Error {
                            error: ErrorDetail {
                                code: ErrorCode::WatchLagged,
                                message: format!(
                                    "the stream fell {behind} events behind; list again and re-watch"
                                ),
                            },
                        };
                        send(&shutdown, &mut lines, line(&error)).await;
                        return;
                    }
                    Err(Missed::Closed) => return,
                },
            };
            if !send(&shutdown, &mut lines, next).await {
                return;
            }
        }
    }
}
