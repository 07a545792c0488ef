//! The management API: sessions, users, API keys, workers, models, instances, model
//! providers, model routes, usage. Every paged list has a watch form that streams the list
//! and its changes.

use std::fmt::Write as _;

use gantry_types::usage::{UsageQuery, UsageReport};
use gantry_types::{
    ApiKey, ApiKeyCreate, ApiKeyCreated, ApiKeyQuery, ApiKeyUpdate, BackendInstallRequest,
    BackendInstallStatus, ChangePasswordRequest, Cluster, ClusterCreate, ClusterRegistration,
    ClusterUpdate, InstancePatch, InstanceQuery, ListResponse, LogQuery, LoginRequest,
    LoginResponse, Model, ModelCreate, ModelEstimate, ModelInstance, ModelProvider,
    ModelProviderCreate, ModelProviderUpdate, ModelQuery, ModelRoute, ModelRouteCreate,
    ModelRouteUpdate, ModelUpdate, PoolEvent, ProviderModels, User, UserCreate, UserQuery,
    UserUpdate, Worker, WorkerJoin, WorkerLabelsUpdate, WorkerPool, WorkerPoolCreate,
    WorkerPoolUpdate, WorkerQuery,
};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::transport::Call;

/// The query of a cluster's registration answer.
#[derive(Serialize)]
struct RegistrationQuery<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<&'a str>,
}
use crate::{Client, ClientError, WatchStream};

/// A list query, whose `watch` the client sets itself: on for the watch form of a list,
/// off for a page. (The query is sent as it is otherwise; a `watch` the caller left in it
/// must not reach the server as a second `watch` parameter.)
trait ListQuery: Serialize + Clone {
    /// This query with `watch` set to `watch`.
    fn watching(&self, watch: bool) -> Self;
}

macro_rules! list_queries {
    ($($query:ty),* $(,)?) => {
        $(
            impl ListQuery for $query {
                fn watching(&self, watch: bool) -> Self {
                    Self {
                        watch: watch.then_some(true),
                        ..self.clone()
                    }
                }
            }
        )*
    };
}

list_queries!(
    UserQuery,
    ApiKeyQuery,
    WorkerQuery,
    ModelQuery,
    InstanceQuery
);

impl Client {
    /// One page of a list.
    async fn list<T: DeserializeOwned, Q: ListQuery>(
        &self,
        path: &str,
        query: &Q,
    ) -> Result<ListResponse<T>, ClientError> {
        let query = query.watching(false);
        self.json(Call::new(Method::GET, path).query(&query)).await
    }

    /// A list and its changes.
    async fn watch<T: DeserializeOwned, Q: ListQuery>(
        &self,
        path: &str,
        query: &Q,
    ) -> Result<WatchStream<T>, ClientError> {
        let query = query.watching(true);
        let response = self
            .send(Call::new(Method::GET, path).query(&query).streaming())
            .await?;
        WatchStream::open(response).await
    }

    // Sessions.

    /// Logs in and returns the session token (not set on the client).
    pub async fn login(
        &self,
        username: &str,
        password: &str,
    ) -> Result<LoginResponse, ClientError> {
        let request = LoginRequest {
            username: username.to_owned(),
            password: password.to_owned(),
        };
        self.json(Call::new(Method::POST, "/auth/login").body(&request))
            .await
    }

    /// Changes the caller's password; the answer carries a new session token.
    pub async fn change_password(
        &self,
        request: &ChangePasswordRequest,
    ) -> Result<LoginResponse, ClientError> {
        self.json(Call::new(Method::POST, "/auth/change-password").body(request))
            .await
    }

    /// Ends every session of the caller.
    pub async fn logout(&self) -> Result<(), ClientError> {
        self.empty(Call::new(Method::POST, "/auth/logout")).await
    }

    /// The caller.
    pub async fn me(&self) -> Result<User, ClientError> {
        self.json(Call::new(Method::GET, "/auth/me")).await
    }

    // Users.

    pub async fn list_users(&self, query: &UserQuery) -> Result<ListResponse<User>, ClientError> {
        self.list("/api/v1/users", query).await
    }

    pub async fn watch_users(&self, query: &UserQuery) -> Result<WatchStream<User>, ClientError> {
        self.watch("/api/v1/users", query).await
    }

    pub async fn create_user(&self, user: &UserCreate) -> Result<User, ClientError> {
        self.json(
            Call::new(Method::POST, "/api/v1/users")
                .body(user)
                .creating(),
        )
        .await
    }

    pub async fn update_user(&self, id: i64, update: &UserUpdate) -> Result<User, ClientError> {
        let path = format!("/api/v1/users/{id}");
        self.json(Call::new(Method::PATCH, &path).body(update))
            .await
    }

    pub async fn delete_user(&self, id: i64) -> Result<(), ClientError> {
        let path = format!("/api/v1/users/{id}");
        self.empty(Call::new(Method::DELETE, &path)).await
    }

    // API keys.

    /// Creates a key for the caller; the answer is the only time its secret is shown.
    pub async fn create_api_key(&self, key: &ApiKeyCreate) -> Result<ApiKeyCreated, ClientError> {
        self.json(
            Call::new(Method::POST, "/api/v1/api-keys")
                .body(key)
                .creating(),
        )
        .await
    }

    pub async fn list_api_keys(
        &self,
        query: &ApiKeyQuery,
    ) -> Result<ListResponse<ApiKey>, ClientError> {
        self.list("/api/v1/api-keys", query).await
    }

    /// Changes a key's description and, for an admin, its gateway limits.
    pub async fn update_api_key(
        &self,
        id: i64,
        update: &ApiKeyUpdate,
    ) -> Result<ApiKey, ClientError> {
        let path = format!("/api/v1/api-keys/{id}");
        self.json(Call::new(Method::PATCH, &path).body(update))
            .await
    }

    pub async fn delete_api_key(&self, id: i64) -> Result<(), ClientError> {
        let path = format!("/api/v1/api-keys/{id}");
        self.empty(Call::new(Method::DELETE, &path)).await
    }

    // Workers.

    pub async fn list_workers(
        &self,
        query: &WorkerQuery,
    ) -> Result<ListResponse<Worker>, ClientError> {
        self.list("/api/v1/workers", query).await
    }

    pub async fn watch_workers(
        &self,
        query: &WorkerQuery,
    ) -> Result<WatchStream<Worker>, ClientError> {
        self.watch("/api/v1/workers", query).await
    }

    /// How a new machine joins as a worker: the servers, the registration token (when the
    /// server that answers holds it) and the `gantry worker` command line.
    pub async fn worker_join(&self) -> Result<WorkerJoin, ClientError> {
        self.json(Call::new(Method::GET, "/api/v1/workers/join"))
            .await
    }

    pub async fn get_worker(&self, id: i64) -> Result<Worker, ClientError> {
        let path = format!("/api/v1/workers/{id}");
        self.json(Call::new(Method::GET, &path)).await
    }

    pub async fn set_worker_labels(
        &self,
        id: i64,
        labels: &WorkerLabelsUpdate,
    ) -> Result<Worker, ClientError> {
        let path = format!("/api/v1/workers/{id}/labels");
        self.json(Call::new(Method::PUT, &path).body(labels)).await
    }

    pub async fn delete_worker(&self, id: i64) -> Result<(), ClientError> {
        let path = format!("/api/v1/workers/{id}");
        self.empty(Call::new(Method::DELETE, &path)).await
    }

    /// The backend versions on a worker: installed, installing or failed.
    pub async fn worker_backends(&self, id: i64) -> Result<Vec<BackendInstallStatus>, ClientError> {
        let path = format!("/api/v1/workers/{id}/backends");
        self.json(Call::new(Method::GET, &path)).await
    }

    /// Installs a backend version on a worker ahead of need; `installed` at once when it
    /// was, else `installing` (follow it with [`Client::worker_backends`]).
    pub async fn install_worker_backend(
        &self,
        id: i64,
        request: &BackendInstallRequest,
    ) -> Result<BackendInstallStatus, ClientError> {
        let path = format!("/api/v1/workers/{id}/backends");
        self.json(Call::new(Method::POST, &path).body(request))
            .await
    }

    /// Removes a backend version no instance on the worker uses.
    pub async fn remove_worker_backend(
        &self,
        id: i64,
        name: &str,
        version: &str,
    ) -> Result<(), ClientError> {
        let path = format!("/api/v1/workers/{id}/backends/{name}/{version}");
        self.empty(Call::new(Method::DELETE, &path)).await
    }

    // Models.

    pub async fn list_models(
        &self,
        query: &ModelQuery,
    ) -> Result<ListResponse<Model>, ClientError> {
        self.list("/api/v1/models", query).await
    }

    pub async fn watch_models(
        &self,
        query: &ModelQuery,
    ) -> Result<WatchStream<Model>, ClientError> {
        self.watch("/api/v1/models", query).await
    }

    /// Declares a model; its instances appear a moment later.
    pub async fn create_model(&self, model: &ModelCreate) -> Result<Model, ClientError> {
        self.json(
            Call::new(Method::POST, "/api/v1/models")
                .body(model)
                .creating(),
        )
        .await
    }

    /// What a model would need and where it would go, before it is created; stores
    /// nothing.
    pub async fn estimate_model(&self, model: &ModelCreate) -> Result<ModelEstimate, ClientError> {
        self.json(Call::new(Method::POST, "/api/v1/models/estimate").body(model))
            .await
    }

    pub async fn get_model(&self, id: i64) -> Result<Model, ClientError> {
        let path = format!("/api/v1/models/{id}");
        self.json(Call::new(Method::GET, &path)).await
    }

    pub async fn update_model(&self, id: i64, update: &ModelUpdate) -> Result<Model, ClientError> {
        let path = format!("/api/v1/models/{id}");
        self.json(Call::new(Method::PATCH, &path).body(update))
            .await
    }

    pub async fn delete_model(&self, id: i64) -> Result<(), ClientError> {
        let path = format!("/api/v1/models/{id}");
        self.empty(Call::new(Method::DELETE, &path)).await
    }

    // Model instances.

    pub async fn list_instances(
        &self,
        query: &InstanceQuery,
    ) -> Result<ListResponse<ModelInstance>, ClientError> {
        self.list("/api/v1/model-instances", query).await
    }

    pub async fn watch_instances(
        &self,
        query: &InstanceQuery,
    ) -> Result<WatchStream<ModelInstance>, ClientError> {
        self.watch("/api/v1/model-instances", query).await
    }

    pub async fn get_instance(&self, id: i64) -> Result<ModelInstance, ClientError> {
        let path = format!("/api/v1/model-instances/{id}");
        self.json(Call::new(Method::GET, &path)).await
    }

    /// Places an instance by hand, or unplaces it.
    pub async fn place_instance(
        &self,
        id: i64,
        patch: &InstancePatch,
    ) -> Result<ModelInstance, ClientError> {
        let path = format!("/api/v1/model-instances/{id}");
        self.json(Call::new(Method::PATCH, &path).body(patch)).await
    }

    /// Deletes an instance; the model controller creates a replacement.
    pub async fn delete_instance(&self, id: i64) -> Result<(), ClientError> {
        let path = format!("/api/v1/model-instances/{id}");
        self.empty(Call::new(Method::DELETE, &path)).await
    }

    /// The backend's output of an instance: the response, whose body is the text (with
    /// `follow`, a stream that stays open).
    pub async fn instance_logs(
        &self,
        id: i64,
        query: &LogQuery,
    ) -> Result<reqwest::Response, ClientError> {
        let path = format!("/api/v1/model-instances/{id}/logs");
        self.send(Call::new(Method::GET, &path).query(query).streaming())
            .await
    }

    // Clusters.

    /// The clusters the caller may see, by id (the list is not paged).
    pub async fn list_clusters(&self) -> Result<Vec<Cluster>, ClientError> {
        self.json(Call::new(Method::GET, "/api/v1/clusters")).await
    }

    pub async fn get_cluster(&self, id: i64) -> Result<Cluster, ClientError> {
        let path = format!("/api/v1/clusters/{id}");
        self.json(Call::new(Method::GET, &path)).await
    }

    /// Adds a cluster with a registration token of its own.
    pub async fn create_cluster(&self, cluster: &ClusterCreate) -> Result<Cluster, ClientError> {
        self.json(
            Call::new(Method::POST, "/api/v1/clusters")
                .body(cluster)
                .creating(),
        )
        .await
    }

    pub async fn update_cluster(
        &self,
        id: i64,
        update: &ClusterUpdate,
    ) -> Result<Cluster, ClientError> {
        let path = format!("/api/v1/clusters/{id}");
        self.json(Call::new(Method::PATCH, &path).body(update))
            .await
    }

    /// Deletes a cluster that holds no worker and no model.
    pub async fn delete_cluster(&self, id: i64) -> Result<(), ClientError> {
        let path = format!("/api/v1/clusters/{id}");
        self.empty(Call::new(Method::DELETE, &path)).await
    }

    /// The cluster's registration token with the command (and, for `kubernetes`, the
    /// manifests) that join a machine to it; `image` is the DaemonSet's image.
    pub async fn cluster_registration(
        &self,
        id: i64,
        image: Option<&str>,
    ) -> Result<ClusterRegistration, ClientError> {
        let path = format!("/api/v1/clusters/{id}/registration-token");
        let query = RegistrationQuery { image };
        self.json(Call::new(Method::GET, &path).query(&query)).await
    }

    /// Replaces the cluster's registration token and answers the new one.
    pub async fn rotate_cluster_token(
        &self,
        id: i64,
        image: Option<&str>,
    ) -> Result<ClusterRegistration, ClientError> {
        let path = format!("/api/v1/clusters/{id}/registration-token");
        let query = RegistrationQuery { image };
        self.json(Call::new(Method::POST, &path).query(&query))
            .await
    }

    // Worker pools.

    /// A cluster's pools with their machines.
    pub async fn list_pools(&self, cluster_id: i64) -> Result<Vec<WorkerPool>, ClientError> {
        let path = format!("/api/v1/clusters/{cluster_id}/worker-pools");
        self.json(Call::new(Method::GET, &path)).await
    }

    pub async fn get_pool(&self, cluster_id: i64, id: i64) -> Result<WorkerPool, ClientError> {
        let path = format!("/api/v1/clusters/{cluster_id}/worker-pools/{id}");
        self.json(Call::new(Method::GET, &path)).await
    }

    /// Adds a pool; its credentials are stored sealed and never shown again.
    pub async fn create_pool(
        &self,
        cluster_id: i64,
        pool: &WorkerPoolCreate,
    ) -> Result<WorkerPool, ClientError> {
        let path = format!("/api/v1/clusters/{cluster_id}/worker-pools");
        self.json(Call::new(Method::POST, &path).body(pool).creating())
            .await
    }

    pub async fn update_pool(
        &self,
        cluster_id: i64,
        id: i64,
        update: &WorkerPoolUpdate,
    ) -> Result<WorkerPool, ClientError> {
        let path = format!("/api/v1/clusters/{cluster_id}/worker-pools/{id}");
        self.json(Call::new(Method::PATCH, &path).body(update))
            .await
    }

    /// Deletes a pool: answers it as it is now, deleting its machines.
    pub async fn delete_pool(&self, cluster_id: i64, id: i64) -> Result<WorkerPool, ClientError> {
        let path = format!("/api/v1/clusters/{cluster_id}/worker-pools/{id}");
        self.json(Call::new(Method::DELETE, &path).answering(&[reqwest::StatusCode::ACCEPTED]))
            .await
    }

    /// A pool's latest decisions, newest first.
    pub async fn pool_events(
        &self,
        cluster_id: i64,
        id: i64,
    ) -> Result<Vec<PoolEvent>, ClientError> {
        let path = format!("/api/v1/clusters/{cluster_id}/worker-pools/{id}/events");
        self.json(Call::new(Method::GET, &path)).await
    }

    // Model providers.

    /// Every provider, by name (the list is not paged).
    pub async fn list_providers(&self) -> Result<Vec<ModelProvider>, ClientError> {
        self.json(Call::new(Method::GET, "/api/v1/model-providers"))
            .await
    }

    pub async fn get_provider(&self, name: &str) -> Result<ModelProvider, ClientError> {
        let path = format!("/api/v1/model-providers/{}", path_segment(name));
        self.json(Call::new(Method::GET, &path)).await
    }

    /// Adds a provider; its API key is stored sealed and never shown again.
    pub async fn create_provider(
        &self,
        provider: &ModelProviderCreate,
    ) -> Result<ModelProvider, ClientError> {
        self.json(
            Call::new(Method::POST, "/api/v1/model-providers")
                .body(provider)
                .creating(),
        )
        .await
    }

    /// Changes a provider; `api_key: Some(None)` removes its key.
    pub async fn update_provider(
        &self,
        name: &str,
        update: &ModelProviderUpdate,
    ) -> Result<ModelProvider, ClientError> {
        let path = format!("/api/v1/model-providers/{}", path_segment(name));
        self.json(Call::new(Method::PATCH, &path).body(update))
            .await
    }

    /// Deletes a provider that no route uses.
    pub async fn delete_provider(&self, name: &str) -> Result<(), ClientError> {
        let path = format!("/api/v1/model-providers/{}", path_segment(name));
        self.empty(Call::new(Method::DELETE, &path)).await
    }

    /// The models the provider offers, asked of it now (its `GET /models`).
    pub async fn provider_models(&self, name: &str) -> Result<ProviderModels, ClientError> {
        let path = format!("/api/v1/model-providers/{}/models", path_segment(name));
        self.json(Call::new(Method::GET, &path)).await
    }

    // Model routes.

    /// Every route, by name (the list is not paged).
    pub async fn list_routes(&self) -> Result<Vec<ModelRoute>, ClientError> {
        self.json(Call::new(Method::GET, "/api/v1/model-routes"))
            .await
    }

    pub async fn get_route(&self, name: &str) -> Result<ModelRoute, ClientError> {
        let path = format!("/api/v1/model-routes/{}", path_segment(name));
        self.json(Call::new(Method::GET, &path)).await
    }

    pub async fn create_route(&self, route: &ModelRouteCreate) -> Result<ModelRoute, ClientError> {
        self.json(
            Call::new(Method::POST, "/api/v1/model-routes")
                .body(route)
                .creating(),
        )
        .await
    }

    /// Changes a route's description, or replaces its targets.
    pub async fn update_route(
        &self,
        name: &str,
        update: &ModelRouteUpdate,
    ) -> Result<ModelRoute, ClientError> {
        let path = format!("/api/v1/model-routes/{}", path_segment(name));
        self.json(Call::new(Method::PATCH, &path).body(update))
            .await
    }

    pub async fn delete_route(&self, name: &str) -> Result<(), ClientError> {
        let path = format!("/api/v1/model-routes/{}", path_segment(name));
        self.empty(Call::new(Method::DELETE, &path)).await
    }

    // Usage.

    pub async fn usage(&self, query: &UsageQuery) -> Result<UsageReport, ClientError> {
        self.json(Call::new(Method::GET, "/api/v1/usage").query(query))
            .await
    }
}

/// `name` as one segment of a URL path: every byte but the unreserved ones of RFC 3986
/// percent-encoded, so that a name with `/`, `?` or `%` in it reaches the server whole
/// (which then says whether such an object exists) instead of naming another path.
fn path_segment(name: &str) -> String {
    let mut segment = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            segment.push(char::from(byte));
        } else {
            let _ = write!(segment, "%{byte:02X}");
        }
    }
    segment
}

#[cfg(test)]
mod tests {
    use gantry_types::RouteTarget;

    use super::*;

    /// What the server makes of the body the client sends for `value`.
    fn as_the_server_reads<T: serde::de::DeserializeOwned>(body: &impl Serialize) -> T {
        let json = serde_json::to_string(body).expect("bodies serialise");
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("the server refuses {json}: {e}"))
    }

    #[test]
    fn names_are_sent_as_one_path_segment() {
        assert_eq!(path_segment("hosted-1.a_b~"), "hosted-1.a_b~");
        assert_eq!(path_segment("a/b?c%"), "a%2Fb%3Fc%25");
        assert_eq!(path_segment("é"), "%C3%A9");
    }

    #[test]
    fn patch_bodies_leave_out_absent_fields_and_keep_the_nulls_that_remove() {
        let only_targets = ModelRouteUpdate {
            targets: Some(vec![RouteTarget {
                model: "tiny".into(),
                provider: None,
                weight: 3,
                priority: 0,
            }]),
            ..ModelRouteUpdate::default()
        };
        let read: ModelRouteUpdate = as_the_server_reads(&only_targets);
        assert_eq!(format!("{read:?}"), format!("{only_targets:?}"));

        let remove_key = ModelProviderUpdate {
            api_key: Some(None),
            timeout_seconds: Some(30),
            ..ModelProviderUpdate::default()
        };
        let body = &remove_key;
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"api_key":null,"timeout_seconds":30}"#
        );
        let read: ModelProviderUpdate = as_the_server_reads(&body);
        assert_eq!(format!("{read:?}"), format!("{remove_key:?}"));
        let keep_key = ModelProviderUpdate {
            description: Some("d".into()),
            ..ModelProviderUpdate::default()
        };
        let read: ModelProviderUpdate = as_the_server_reads(&keep_key);
        assert_eq!(read.api_key, None);

        let limits = ApiKeyUpdate {
            requests_per_minute: Some(Some(60)),
            tokens_per_minute: Some(None),
            allowed_routes: Some(Some(vec!["chat".into()])),
            ..ApiKeyUpdate::default()
        };
        let body = &limits;
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"allowed_routes":["chat"],"requests_per_minute":60,"tokens_per_minute":null}"#
        );
        let read: ApiKeyUpdate = as_the_server_reads(&body);
        assert_eq!(format!("{read:?}"), format!("{limits:?}"));
    }

    #[test]
    fn a_provider_without_a_key_is_created_without_one() {
        let create: ModelProviderCreate =
            serde_json::from_str(r#"{"name":"hosted","base_url":"http://h/v1"}"#).unwrap();
        let read: ModelProviderCreate = as_the_server_reads(&create);
        assert_eq!(format!("{read:?}"), format!("{create:?}"));
        let with_key = ModelProviderCreate {
            api_key: Some("sk-1".into()),
            ..create
        };
        let read: ModelProviderCreate = as_the_server_reads(&with_key);
        assert_eq!(read.api_key.as_deref(), Some("sk-1"));
    }
}
