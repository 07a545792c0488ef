//! `?watch=true` on list endpoints: a streaming NDJSON response that first sends every
//! matching object as `CREATED`, then live `CREATED`/`UPDATED`/`DELETED` events, and a
//! `HEARTBEAT` line whenever the stream has been idle for the heartbeat interval.
//!
//! The change subscription is taken before the initial list is read, so no change
//! between the two is lost (a change may arrive twice; events are level-triggered
//! snapshots, so that is harmless). A watcher that falls too far behind is sent an
//! `ERROR` line and disconnected; clients re-list and watch again.

use std::sync::Arc;

use axum::body::Body;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use gantry_store::{Change, ChangeKind};
use gantry_types::{WatchEvent, WatchEventType};
use serde::Serialize;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::state::AppState;

/// Maps a change kind to the wire event type.
pub fn event_type(kind: ChangeKind) -> WatchEventType {
    match kind {
        ChangeKind::Created => WatchEventType::Created,
        ChangeKind::Updated => WatchEventType::Updated,
        ChangeKind::Deleted => WatchEventType::Deleted,
    }
}

fn line<T: Serialize>(event: &WatchEvent<T>) -> Bytes {
    let mut bytes = serde_json::to_vec(event).unwrap_or_else(|_| b"{}".to_vec());
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// Starts a watch stream. `select` picks the changes this watcher cares about (the
/// resource and the list's filters) and returns the object to send.
pub fn respond<T, F>(
    state: &AppState,
    changes: broadcast::Receiver<Arc<Change>>,
    initial: Vec<T>,
    select: F,
) -> Response
where
    T: Serialize + Send + 'static,
    F: Fn(&Change) -> Option<(ChangeKind, T)> + Send + 'static,
{
    respond_with(state, changes, initial, move |change: Arc<Change>| {
        let selected: Vec<(ChangeKind, T)> = select(&change).into_iter().collect();
        std::future::ready(selected)
    })
}

/// Starts a watch stream whose selection may keep state between changes and read the
/// store: each change yields zero or more events.
pub fn respond_with<T, F, Fut>(
    state: &AppState,
    changes: broadcast::Receiver<Arc<Change>>,
    initial: Vec<T>,
    mut select: F,
) -> Response
where
    T: Serialize + Send + 'static,
    F: FnMut(Arc<Change>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Vec<(ChangeKind, T)>> + Send,
{
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let shutdown = state.shutdown.clone();
    let period = state.config.watch_heartbeat;
    state.tasks.spawn(async move {
        let mut changes = changes;
        for object in initial {
            let event = WatchEvent {
                event_type: WatchEventType::Created,
                object: Some(object),
            };
            if tx.send(Ok(line(&event))).await.is_err() {
                return;
            }
        }
        let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            let next = tokio::select! {
                () = shutdown.cancelled() => return,
                _ = heartbeat.tick() => line(&WatchEvent::<T> {
                    event_type: WatchEventType::Heartbeat,
                    object: None,
                }),
                change = changes.recv() => match change {
                    Ok(change) => {
                        let events = select(change).await;
                        if events.is_empty() {
                            continue;
                        }
                        heartbeat.reset();
                        let mut lines = Vec::new();
                        for (kind, object) in events {
                            lines.extend_from_slice(&line(&WatchEvent { event_type: event_type(kind), object: Some(object) }));
                        }
                        Bytes::from(lines)
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "watch stream fell behind; closing it");
                        let error = serde_json::json!({
                            "type": "ERROR",
                            "error": {"code": "watch_lagged", "message": format!("the stream fell {missed} events behind; list again and re-watch")},
                        });
                        let _ = tx.send(Ok(Bytes::from(format!("{error}\n")))).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            };
            if tx.send(Ok(next)).await.is_err() {
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
