//! Model instances: one replica of a model, placed on a worker and GPUs — the observed
//! state that the scheduler and the worker move forward.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::time::Timestamp;
use crate::validate::{FieldError, Validate};

/// Instance lifecycle: `pending → analyzing → scheduled → starting → running`, plus
/// `error` and `unreachable` (set by the server when the worker is lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    Pending,
    Analyzing,
    Scheduled,
    /// The worker is downloading the model's files (see `download`).
    Downloading,
    Starting,
    Running,
    Error,
    Unreachable,
}

impl InstanceState {
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Pending => "pending",
            InstanceState::Analyzing => "analyzing",
            InstanceState::Scheduled => "scheduled",
            InstanceState::Downloading => "downloading",
            InstanceState::Starting => "starting",
            InstanceState::Running => "running",
            InstanceState::Error => "error",
            InstanceState::Unreachable => "unreachable",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "pending" => Some(InstanceState::Pending),
            "analyzing" => Some(InstanceState::Analyzing),
            "scheduled" => Some(InstanceState::Scheduled),
            "downloading" => Some(InstanceState::Downloading),
            "starting" => Some(InstanceState::Starting),
            "running" => Some(InstanceState::Running),
            "error" => Some(InstanceState::Error),
            "unreachable" => Some(InstanceState::Unreachable),
            _ => None,
        }
    }
}

/// A model instance as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ModelInstance {
    pub id: i64,
    /// `<model name>-<replica>`; unique.
    pub name: String,
    pub model_id: i64,
    pub model_name: String,
    /// The replica number within its model, the lowest free one at creation.
    pub replica: u32,
    pub worker_id: Option<i64>,
    pub worker_name: Option<String>,
    /// GPU indexes on the worker; empty for CPU-only placement.
    pub gpu_indexes: Vec<u32>,
    /// Port of the (first) backend process on the worker.
    pub port: Option<u16>,
    /// `host:port` the gateway sends requests to, once `running`.
    pub address: Option<String>,
    pub state: InstanceState,
    /// Why the instance is in its state: the scheduler's reason while pending, the
    /// backend's last stderr lines on error.
    pub state_message: String,
    /// How the instance was placed: what its worker runs (the model's launch settings
    /// when it was placed, plus the flags the placement adds) and what the scheduler
    /// reserved for it. `None` while unplaced, and when the stored record cannot be read
    /// (the server logs that; the scheduler keeps the instance's GPUs booked and rolls it
    /// onto a fresh placement).
    pub placement: Option<crate::placement::PlacementRecord>,
    /// While `downloading`: how far the worker is with the model's files.
    #[serde(default)]
    pub download: Option<DownloadProgress>,
    pub restart_count: u32,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// How far a worker is with downloading an instance's model files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DownloadProgress {
    /// Bytes on disk, across every file (those already in the worker's cache included).
    pub bytes_done: u64,
    /// Bytes of every file; `None` while a size is unknown.
    pub bytes_total: Option<u64>,
    /// Recent download speed.
    pub bytes_per_second: u64,
}

/// `PATCH /api/v1/model-instances/{id}` (admin): manual placement until the scheduler
/// places instances itself. `worker_id: null` unplaces the instance; an unset `worker_id`
/// (`None`) is left out when the patch is serialised, so it keeps the worker.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InstancePatch {
    #[serde(
        default,
        with = "crate::instance::double_option_i64",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<i64>)]
    pub worker_id: Option<Option<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_indexes: Option<Vec<u32>>,
}

impl Validate for InstancePatch {
    fn validate(&self) -> Result<(), FieldError> {
        if let Some(indexes) = &self.gpu_indexes {
            if indexes.len() > 64 {
                return Err(FieldError::new("gpu_indexes", "at most 64 GPU indexes"));
            }
            let mut sorted = indexes.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if sorted.len() != indexes.len() {
                return Err(FieldError::new("gpu_indexes", "must not repeat an index"));
            }
        }
        if self.worker_id.is_none() && self.gpu_indexes.is_none() {
            return Err(FieldError::new(
                "worker_id",
                "give worker_id and/or gpu_indexes",
            ));
        }
        Ok(())
    }
}

pub(crate) mod double_option_i64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<Option<i64>>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(Some(v)) => s.serialize_i64(*v),
            _ => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<i64>>, D::Error> {
        Option::<i64>::deserialize(d).map(Some)
    }
}

/// What a worker reports about an instance placed on it
/// (`POST /api/v1/worker/instances/{id}/state`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InstanceStateReport {
    /// `downloading`, `starting`, `running` or `error`; the server sets the others.
    pub state: InstanceState,
    #[serde(default)]
    pub state_message: String,
    /// Port of the (first) backend process.
    #[serde(default)]
    pub port: Option<u16>,
    /// `host:port` the gateway should use, once running.
    #[serde(default)]
    pub address: Option<String>,
    /// Restarts since the instance was placed on this worker.
    #[serde(default)]
    pub restart_count: u32,
    /// With `downloading`: the progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download: Option<DownloadProgress>,
}

impl Validate for InstanceStateReport {
    fn validate(&self) -> Result<(), FieldError> {
        if !matches!(
            self.state,
            InstanceState::Downloading
                | InstanceState::Starting
                | InstanceState::Running
                | InstanceState::Error
        ) {
            return Err(FieldError::new(
                "state",
                "workers report downloading, starting, running or error",
            ));
        }
        if self.download.is_some() && self.state != InstanceState::Downloading {
            return Err(FieldError::new(
                "download",
                "only a downloading instance has download progress",
            ));
        }
        if self.state == InstanceState::Running && self.address.is_none() {
            return Err(FieldError::new(
                "address",
                "a running instance needs an address",
            ));
        }
        crate::validate::check_text("state_message", &self.state_message, 16_384)
    }
}

/// Query of the log endpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LogQuery {
    /// Last N lines (default 100, at most 100000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<u32>,
    /// Keep the response open and send new lines as they are written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow: Option<bool>,
}

impl Validate for LogQuery {
    fn validate(&self) -> Result<(), FieldError> {
        if self.tail.is_some_and(|t| t > 100_000) {
            return Err(FieldError::new("tail", "must be at most 100000"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_of_the_gpus_alone_keeps_the_worker_on_the_wire() {
        let gpus_only = InstancePatch {
            worker_id: None,
            gpu_indexes: Some(vec![1]),
        };
        let json = serde_json::to_string(&gpus_only).expect("serialisable");
        assert_eq!(json, r#"{"gpu_indexes":[1]}"#);
        let read: InstancePatch = serde_json::from_str(&json).expect("decodable");
        assert_eq!(read.worker_id, None);

        let unplace = InstancePatch {
            worker_id: Some(None),
            gpu_indexes: None,
        };
        let json = serde_json::to_string(&unplace).expect("serialisable");
        assert_eq!(json, r#"{"worker_id":null}"#);
        let read: InstancePatch = serde_json::from_str(&json).expect("decodable");
        assert_eq!(read.worker_id, Some(None));
    }
}
