//! Paginated lists and the `?watch=true` event stream.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::ErrorDetail;

/// One page of a list.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ListResponse<T> {
    pub items: Vec<T>,
    pub pagination: Pagination,
}

/// Where a page sits in the whole list.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct Pagination {
    /// 1-based page number.
    pub page: u32,
    pub per_page: u32,
    /// Number of items matching the filter, over all pages.
    pub total: u64,
}

/// What happened to an object: the kind of a committed change, and of a watch event
/// that carries an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ChangeKind {
    Created,
    Updated,
    Deleted,
}

/// One NDJSON line of a watch stream (`?watch=true` on list endpoints and the worker's
/// assignment stream), the one shape the server writes and every client reads:
///
/// ```text
/// {"type":"CREATED","object":{…}}   {"type":"UPDATED","object":{…}}   {"type":"DELETED","object":{…}}
/// {"type":"HEARTBEAT"}              {"type":"ERROR","error":{"code":"watch_lagged","message":"…"}}
/// ```
///
/// A stream first sends every matching object as `CREATED`, then live changes. `HEARTBEAT`
/// comes when the stream was idle for the heartbeat interval; `ERROR` is the last line of a
/// stream the server ends (the client lists again and re-watches).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WatchEvent<T> {
    Created { object: T },
    Updated { object: T },
    Deleted { object: T },
    Heartbeat,
    Error { error: ErrorDetail },
}

impl<T> WatchEvent<T> {
    /// The event for a change of `kind` to `object`.
    pub fn of(kind: ChangeKind, object: T) -> Self {
        match kind {
            ChangeKind::Created => WatchEvent::Created { object },
            ChangeKind::Updated => WatchEvent::Updated { object },
            ChangeKind::Deleted => WatchEvent::Deleted { object },
        }
    }

    /// The change an event carries; `None` for heartbeats and errors.
    pub fn into_change(self) -> Option<(ChangeKind, T)> {
        match self {
            WatchEvent::Created { object } => Some((ChangeKind::Created, object)),
            WatchEvent::Updated { object } => Some((ChangeKind::Updated, object)),
            WatchEvent::Deleted { object } => Some((ChangeKind::Deleted, object)),
            WatchEvent::Heartbeat | WatchEvent::Error { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn watch_events_keep_their_wire_shape() {
        let created = WatchEvent::of(ChangeKind::Created, 7);
        assert_eq!(
            serde_json::to_string(&created).expect("serialisable"),
            r#"{"type":"CREATED","object":7}"#
        );
        assert_eq!(
            serde_json::to_string(&WatchEvent::<u8>::Heartbeat).expect("serialisable"),
            r#"{"type":"HEARTBEAT"}"#
        );
        let error: WatchEvent<u8> = serde_json::from_str(
            r#"{"type":"ERROR","error":{"code":"watch_lagged","message":"behind"}}"#,
        )
        .expect("decodable");
        assert_eq!(
            error,
            WatchEvent::Error {
                error: ErrorDetail {
                    code: ErrorCode::WatchLagged,
                    message: "behind".into()
                }
            }
        );
        let deleted: WatchEvent<u8> =
            serde_json::from_str(r#"{"type":"DELETED","object":3}"#).expect("decodable");
        assert_eq!(deleted.into_change(), Some((ChangeKind::Deleted, 3)));
    }
}
