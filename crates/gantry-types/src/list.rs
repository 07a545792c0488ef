//! Paginated lists and the `?watch=true` event stream.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

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

/// What happened to an object in a watch stream.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WatchEventType {
    Created,
    Updated,
    Deleted,
    /// Sent every 15 s on an idle stream so clients and proxies see it is alive.
    Heartbeat,
}

/// One NDJSON line of a watch stream. `object` is absent on heartbeats.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WatchEvent<T> {
    #[serde(rename = "type")]
    pub event_type: WatchEventType,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<T>,
}
