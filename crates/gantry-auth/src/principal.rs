//! Who is calling: a person (through a session token or an API key), a worker agent
//! (through the credential it received at registration) or a server of the cluster
//! (through its server credential, for the coordinator API).

use std::sync::Arc;

use gantry_types::{Role, User};

/// The authenticated caller. Cheap to clone: the user is shared with the credential
/// cache, not copied per request.
#[derive(Debug, Clone)]
pub enum Principal {
    /// A person, through a session token (`api_key_id` is `None`) or an API key.
    User {
        user: Arc<User>,
        api_key_id: Option<i64>,
    },
    /// A worker agent, through the credential it received at registration.
    Worker { worker_id: i64, worker_name: String },
    /// A server of the cluster, through the credential the cluster's secret made for it.
    Server { server_id: String },
}

/// The caller may not do this; the message says why (a 403 for HTTP callers).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Forbidden(pub &'static str);

const WORKERS_ONLY_CALL_WORKER_ENDPOINTS: Forbidden =
    Forbidden("worker credentials can only call worker endpoints");
const SERVERS_ONLY_CALL_COORDINATOR_ENDPOINTS: Forbidden =
    Forbidden("server credentials can only call the coordinator endpoints");

impl Principal {
    /// The user if they are an admin.
    pub fn require_admin(&self) -> Result<&User, Forbidden> {
        match self {
            Principal::User { user, .. } if user.role == Role::Admin => Ok(user),
            Principal::User { .. } => Err(Forbidden("this action needs the admin role")),
            Principal::Worker { .. } => Err(WORKERS_ONLY_CALL_WORKER_ENDPOINTS),
            Principal::Server { .. } => Err(SERVERS_ONLY_CALL_COORDINATOR_ENDPOINTS),
        }
    }

    /// An admin or a server of the cluster (the coordinator API); returns who, for logs.
    pub fn require_admin_or_server(&self) -> Result<String, Forbidden> {
        match self {
            Principal::Server { server_id } => Ok(format!("server {server_id}")),
            _ => self
                .require_admin()
                .map(|user| format!("user {}", user.username))
                .map_err(|e| match self {
                    Principal::User { .. } => {
                        Forbidden("this action needs the admin role or a server credential")
                    }
                    _ => e,
                }),
        }
    }

    /// An admin, or the administrator of cluster `cluster_id`.
    pub fn require_cluster_admin(&self, cluster_id: i64) -> Result<&User, Forbidden> {
        match self {
            Principal::User { user, .. }
                if user.role == Role::Admin || user.cluster_admin_of.contains(&cluster_id) =>
            {
                Ok(user)
            }
            Principal::User { .. } => Err(Forbidden(
                "this action needs the admin role or the administration of the cluster it \
                 concerns; an admin can grant it (cluster_admin_of on your user)",
            )),
            Principal::Worker { .. } => Err(WORKERS_ONLY_CALL_WORKER_ENDPOINTS),
            Principal::Server { .. } => Err(SERVERS_ONLY_CALL_COORDINATOR_ENDPOINTS),
        }
    }

    /// An admin, or a user who administers at least one cluster: what may call a
    /// cluster-scoped endpoint at all (which cluster is checked once the request says).
    pub fn require_any_cluster_admin(&self) -> Result<&User, Forbidden> {
        match self {
            Principal::User { user, .. }
                if user.role == Role::Admin || !user.cluster_admin_of.is_empty() =>
            {
                Ok(user)
            }
            Principal::User { .. } => Err(Forbidden(
                "this action needs the admin role or the administration of a cluster",
            )),
            Principal::Worker { .. } => Err(WORKERS_ONLY_CALL_WORKER_ENDPOINTS),
            Principal::Server { .. } => Err(SERVERS_ONLY_CALL_COORDINATOR_ENDPOINTS),
        }
    }

    /// The clusters whose workers and settings the caller may see: `None` for an admin
    /// (every cluster), else the ones they administer (none for most users).
    pub fn visible_clusters(&self) -> Option<Vec<i64>> {
        match self {
            Principal::User { user, .. } if user.role == Role::Admin => None,
            Principal::User { user, .. } => Some(user.cluster_admin_of.clone()),
            _ => Some(Vec::new()),
        }
    }

    /// Any person; refused for workers.
    pub fn require_user(&self) -> Result<&User, Forbidden> {
        match self {
            Principal::User { user, .. } => Ok(user),
            Principal::Worker { .. } => Err(WORKERS_ONLY_CALL_WORKER_ENDPOINTS),
            Principal::Server { .. } => Err(SERVERS_ONLY_CALL_COORDINATOR_ENDPOINTS),
        }
    }

    /// A short description for log lines.
    pub fn describe(&self) -> String {
        match self {
            Principal::User {
                user,
                api_key_id: Some(key),
            } => format!("user {} (api key {key})", user.username),
            Principal::User { user, .. } => format!("user {}", user.username),
            Principal::Worker { worker_name, .. } => format!("worker {worker_name}"),
            Principal::Server { server_id } => format!("server {server_id}"),
        }
    }
}
