//! Clusters: sets of workers, each with its own registration token, into which models are
//! deployed. A fresh gantry, and every database upgraded from before clusters existed,
//! has one default cluster holding every worker and model.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::time::Timestamp;
use crate::validate::{check_name, check_text, FieldError, Validate};

/// The id of the default cluster: the first row of the table, made by the migration that
/// added clusters and never deleted. Models that name no cluster go there, and so does
/// everything from before clusters existed.
pub const DEFAULT_CLUSTER_ID: i64 = 1;

pub(crate) fn default_cluster_id() -> i64 {
    DEFAULT_CLUSTER_ID
}

/// A cluster id a request names, when it names one: ids start at 1.
pub fn check_cluster_id(field: &str, id: Option<i64>) -> Result<(), FieldError> {
    match id {
        Some(id) if id < 1 => Err(FieldError::new(
            field,
            "must be a cluster's id (1 or more; GET /api/v1/clusters lists them)",
        )),
        _ => Ok(()),
    }
}

/// Where a cluster's machines come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClusterProvider {
    /// Machines you bring: each joins by running the cluster's join command.
    Custom,
    /// GPU nodes of a Kubernetes cluster, joined by the worker DaemonSet the cluster's
    /// registration answer holds.
    Kubernetes,
}

impl ClusterProvider {
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterProvider::Custom => "custom",
            ClusterProvider::Kubernetes => "kubernetes",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "custom" => Some(ClusterProvider::Custom),
            "kubernetes" => Some(ClusterProvider::Kubernetes),
            _ => None,
        }
    }
}

/// Whether a cluster can run models: derived from its workers each time it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClusterState {
    /// No worker of the cluster is ready (none has joined yet, or all are down).
    Pending,
    /// Machines are being created for the cluster and none is ready yet.
    Provisioning,
    /// At least one worker is ready.
    Ready,
}

impl ClusterState {
    /// The state as the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterState::Pending => "pending",
            ClusterState::Provisioning => "provisioning",
            ClusterState::Ready => "ready",
        }
    }
}

/// How many workers, GPUs and models a cluster has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterCounts {
    /// Registered workers, in any state.
    pub workers: u64,
    /// Workers in state `ready`.
    pub ready_workers: u64,
    /// GPUs the cluster's workers report (simulated ones included).
    pub gpus: u64,
    /// Models deployed into the cluster.
    pub models: u64,
    /// Machines its worker pools are making whose workers have not registered yet.
    #[serde(default)]
    pub machines_on_the_way: u64,
}

/// A cluster as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct Cluster {
    pub id: i64,
    pub name: String,
    pub description: String,
    pub provider: ClusterProvider,
    /// The cluster models go to when they name none; it cannot be deleted.
    pub is_default: bool,
    pub state: ClusterState,
    /// What the state means for this cluster and what to do next.
    pub state_message: String,
    pub counts: ClusterCounts,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl Cluster {
    /// The state and its message for a cluster with `counts`.
    pub fn state_of(id: i64, counts: &ClusterCounts) -> (ClusterState, String) {
        if counts.ready_workers > 0 {
            let message = if counts.ready_workers == counts.workers {
                format!(
                    "{} of {} workers ready",
                    counts.ready_workers, counts.workers
                )
            } else {
                format!(
                    "{} of {} workers ready; the others are shown on the workers page",
                    counts.ready_workers, counts.workers
                )
            };
            return (ClusterState::Ready, message);
        }
        if counts.machines_on_the_way > 0 {
            return (
                ClusterState::Provisioning,
                format!(
                    "{} machine(s) of its worker pools are being made; the cluster is ready \
                     once one of their workers registers",
                    counts.machines_on_the_way
                ),
            );
        }
        let message = if counts.workers == 0 {
            format!(
                "no worker has joined yet: run the cluster's join command \
                 (GET /api/v1/clusters/{id}/registration-token) on a GPU machine"
            )
        } else {
            format!(
                "none of its {} workers is ready; see the workers page for why",
                counts.workers
            )
        };
        (ClusterState::Pending, message)
    }
}

/// `POST /api/v1/clusters`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterCreate {
    #[schema(min_length = 1, max_length = 63, pattern = r"^[a-z0-9][a-z0-9._-]*$")]
    pub name: String,
    #[serde(default)]
    #[schema(max_length = 500, pattern = r"^[^\x00-\x08\x0B-\x1F\x7F-\x9F]*$")]
    pub description: String,
    #[serde(default = "default_provider", deserialize_with = "provider_not_null")]
    pub provider: ClusterProvider,
}

impl ClusterCreate {
    /// A cluster of machines you bring, without a description.
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            description: String::new(),
            provider: ClusterProvider::Custom,
        }
    }
}

fn default_provider() -> ClusterProvider {
    ClusterProvider::Custom
}

fn provider_not_null<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<ClusterProvider, D::Error> {
    ClusterProvider::deserialize(deserializer)
}

impl Validate for ClusterCreate {
    fn validate(&self) -> Result<(), FieldError> {
        check_name("name", &self.name)?;
        check_text("description", &self.description, 500)
    }
}

/// `PATCH /api/v1/clusters/{id}`: absent fields stay as they are.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterUpdate {
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(
        nullable = false,
        min_length = 1,
        max_length = 63,
        pattern = r"^[a-z0-9][a-z0-9._-]*$"
    )]
    pub name: Option<String>,
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(
        nullable = false,
        max_length = 500,
        pattern = r"^[^\x00-\x08\x0B-\x1F\x7F-\x9F]*$"
    )]
    pub description: Option<String>,
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false)]
    pub provider: Option<ClusterProvider>,
}

impl Validate for ClusterUpdate {
    fn validate(&self) -> Result<(), FieldError> {
        if let Some(name) = &self.name {
            check_name("name", name)?;
        }
        if let Some(description) = &self.description {
            check_text("description", description, 500)?;
        }
        Ok(())
    }
}

/// `GET` (and, to rotate it, `POST`) `/api/v1/clusters/{id}/registration-token`: how a
/// machine joins the cluster as a worker.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ClusterRegistration {
    pub cluster_id: i64,
    pub cluster_name: String,
    /// The cluster's registration token. Any server answers it; registered workers keep
    /// working when it is rotated.
    pub token: String,
    /// The active servers' URLs, for the worker's `--server-url`.
    pub server_urls: Vec<String>,
    /// The `gantry worker` command line that joins a machine to this cluster.
    pub command: String,
    /// For a `kubernetes` cluster: the manifests (YAML, several documents) of a
    /// namespace, the token as a Secret and a worker DaemonSet on the GPU nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_manifests: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_is_ready_once_a_worker_is() {
        let none = ClusterCounts::default();
        let (state, message) = Cluster::state_of(4, &none);
        assert_eq!(state, ClusterState::Pending);
        assert!(
            message.contains("/clusters/4/registration-token"),
            "{message}"
        );
        let down = ClusterCounts { workers: 2, ..none };
        let (state, message) = Cluster::state_of(4, &down);
        assert_eq!(state, ClusterState::Pending);
        assert!(message.contains("none of its 2 workers"), "{message}");
        let some = ClusterCounts {
            workers: 3,
            ready_workers: 2,
            ..none
        };
        let coming = ClusterCounts {
            machines_on_the_way: 2,
            ..none
        };
        let (state, message) = Cluster::state_of(4, &coming);
        assert_eq!(state, ClusterState::Provisioning);
        assert!(message.starts_with("2 machine(s)"), "{message}");
        let (state, message) = Cluster::state_of(4, &some);
        assert_eq!(state, ClusterState::Ready);
        assert!(message.starts_with("2 of 3 workers ready"), "{message}");
    }

    #[test]
    fn states_and_providers_are_written_as_the_api_sends_them() {
        for state in [
            ClusterState::Pending,
            ClusterState::Provisioning,
            ClusterState::Ready,
        ] {
            assert_eq!(
                serde_json::to_value(state).unwrap(),
                serde_json::json!(state.as_str())
            );
        }
        for provider in [ClusterProvider::Custom, ClusterProvider::Kubernetes] {
            assert_eq!(
                serde_json::to_value(provider).unwrap(),
                serde_json::json!(provider.as_str())
            );
            assert_eq!(ClusterProvider::parse(provider.as_str()), Some(provider));
        }
    }

    #[test]
    fn a_cluster_defaults_to_machines_you_bring_and_takes_no_null_provider() {
        let create: ClusterCreate = serde_json::from_str(r#"{"name":"east"}"#).unwrap();
        assert_eq!(create.provider, ClusterProvider::Custom);
        assert!(
            serde_json::from_str::<ClusterCreate>(r#"{"name":"east","provider":null}"#).is_err()
        );
        let bad = ClusterCreate {
            name: "East".into(),
            ..create
        };
        assert_eq!(bad.validate().unwrap_err().field, "name");
    }
}
