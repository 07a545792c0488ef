//! Model instances: one replica of a model, placed on a worker and GPUs — the observed
//! state that the scheduler and the worker move forward.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::time::Timestamp;
use crate::validate::{FieldError, Validate};

/// Instance lifecycle: `pending → analyzing → scheduled → [installing] → [downloading] →
/// starting → running`, plus `unhealthy` (running, then failing its health probe: out of
/// routing while its worker restarts it), `error` and `unreachable` (set by the server when
/// the worker is lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    Pending,
    Analyzing,
    Scheduled,
    /// The worker is installing the instance's backend (see `install`).
    Installing,
    /// The worker is downloading the model's files (see `download`).
    Downloading,
    Starting,
    Running,
    /// It was running and then failed its health probe `health_failure_threshold` times in
    /// a row: taken out of routing at once, and restarted by its worker.
    Unhealthy,
    Error,
    Unreachable,
}

impl InstanceState {
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Pending => "pending",
            InstanceState::Analyzing => "analyzing",
            InstanceState::Scheduled => "scheduled",
            InstanceState::Installing => "installing",
            InstanceState::Downloading => "downloading",
            InstanceState::Starting => "starting",
            InstanceState::Running => "running",
            InstanceState::Unhealthy => "unhealthy",
            InstanceState::Error => "error",
            InstanceState::Unreachable => "unreachable",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "pending" => Some(InstanceState::Pending),
            "analyzing" => Some(InstanceState::Analyzing),
            "scheduled" => Some(InstanceState::Scheduled),
            "installing" => Some(InstanceState::Installing),
            "downloading" => Some(InstanceState::Downloading),
            "starting" => Some(InstanceState::Starting),
            "running" => Some(InstanceState::Running),
            "unhealthy" => Some(InstanceState::Unhealthy),
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
    /// The model's cluster.
    #[serde(default = "crate::cluster::default_cluster_id")]
    pub cluster_id: i64,
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
    /// While `installing`: how far the worker is with installing the backend.
    #[serde(default)]
    pub install: Option<InstallProgress>,
    /// The backend version the worker runs the instance with (the model's pin, else the
    /// newest version installed on the worker); `None` until the worker reports it, and for
    /// backends without versions.
    #[serde(default)]
    pub backend_version: Option<String>,
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

/// How far a worker is with installing a backend (`installing`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InstallProgress {
    /// The backend being installed (`llama.cpp`, `vllm`, a custom backend's name).
    pub backend: String,
    /// Its version.
    pub version: String,
    /// What the installer does now: `waiting` (another install of the same version runs),
    /// `downloading`, `configuring`, `building`, `installing packages`, `copying`.
    pub phase: String,
    /// Percent done of the phase, when the installer can tell (cmake's `[ 42%]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<u8>,
    /// Bytes downloaded so far in a `downloading` phase.
    #[serde(default)]
    pub bytes_done: u64,
    /// Bytes to download, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<u64>,
    /// The installer's last output lines (at most [`INSTALL_LOG_TAIL_LINES`]).
    #[serde(default)]
    pub log_tail: Vec<String>,
}

/// How many of the installer's last output lines an [`InstallProgress`] carries.
pub const INSTALL_LOG_TAIL_LINES: usize = 20;

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
    /// The GPUs to run on (absent: keep them); not `null`.
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false)]
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
    /// `installing`, `downloading`, `starting`, `running`, `unhealthy` or `error`; the
    /// server sets the others.
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
    /// With `installing`: the installer's progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install: Option<InstallProgress>,
    /// The backend version the instance runs with, once the worker knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_version: Option<String>,
}

impl InstanceStateReport {
    /// A report of `state` with its message and nothing else (no port, address,
    /// restarts or progress).
    pub fn new(state: InstanceState, state_message: impl Into<String>) -> Self {
        InstanceStateReport {
            state,
            state_message: state_message.into(),
            port: None,
            address: None,
            restart_count: 0,
            download: None,
            install: None,
            backend_version: None,
        }
    }
}

impl Validate for InstanceStateReport {
    fn validate(&self) -> Result<(), FieldError> {
        if !matches!(
            self.state,
            InstanceState::Installing
                | InstanceState::Downloading
                | InstanceState::Starting
                | InstanceState::Running
                | InstanceState::Unhealthy
                | InstanceState::Error
        ) {
            return Err(FieldError::new(
                "state",
                "workers report installing, downloading, starting, running, unhealthy or error",
            ));
        }
        if self.install.is_some() && self.state != InstanceState::Installing {
            return Err(FieldError::new(
                "install",
                "only an installing instance has install progress",
            ));
        }
        if let Some(install) = &self.install {
            if install.log_tail.len() > INSTALL_LOG_TAIL_LINES {
                return Err(FieldError::new(
                    "install.log_tail",
                    format!("at most {INSTALL_LOG_TAIL_LINES} lines"),
                ));
            }
            for line in &install.log_tail {
                crate::validate::check_text("install.log_tail", line, 4096)?;
            }
            crate::validate::check_text("install.phase", &install.phase, 100)?;
        }
        if let Some(version) = &self.backend_version {
            crate::validate::check_text("backend_version", version, 100)?;
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
    #[param(value_type = Option<i64>, minimum = 0, maximum = 100000)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<u32>,
    /// Keep the response open and send new lines as they are written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow: Option<bool>,
    /// With `follow=true`: end the response after this many seconds (1 to 86400);
    /// without it the response lasts until the client goes away.
    #[param(minimum = 1, maximum = 86400)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
}

impl Validate for LogQuery {
    fn validate(&self) -> Result<(), FieldError> {
        if self.tail.is_some_and(|t| t > 100_000) {
            return Err(FieldError::new("tail", "must be at most 100000"));
        }
        crate::query::check_stream_timeout(self.timeout_seconds)
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
