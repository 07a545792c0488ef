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

use axum::body::Body;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use gantry_store::{Change, ChangeKind};
use gantry_types::{ErrorCode, ErrorDetail, WatchEvent};
use serde::Serialize;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

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

/// Starts a watch stream. `select` picks the changes this watcher cares about (the
/// resource and the list's filters) and returns the event's kind and object; it may keep
/// state between changes (the assignment stream remembers what it sent).
pub fn respond<T, F>(
    state: &AppState,
    changes: Changes,
    initial: Vec<T>,
    timeout: Option<std::time::Duration>,
    mut select: F,
) -> Response
where
    T: Serialize + Send + 'static,
    F: FnMut(&Change) -> Option<(ChangeKind, T)> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let shutdown = state.shutdown.clone();
    let period = state.config.watch_heartbeat;
    state.tasks.spawn(async move {
        // Sends one chunk unless the server shuts down or the client went away first.
        let send = |bytes: Bytes| {
            let tx = tx.clone();
            let shutdown = shutdown.clone();
            async move {
                tokio::select! {
                    () = shutdown.cancelled() => false,
                    sent = tx.send(Ok(bytes)) => sent.is_ok(),
                }
            }
        };
        let mut changes = changes;
        for object in initial {
            if !send(line(&WatchEvent::Created { object })).await {
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
                        send(line(&error)).await;
                        return;
                    }
                    Err(Missed::Closed) => return,
                },
            };
            if !send(next).await {
                return;
            }
        }
    });
    (
        [(CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(ReceiverStream::new(rx)),
    )
        .into_response()
}
