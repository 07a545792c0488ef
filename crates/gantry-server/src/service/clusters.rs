//! Clusters: who may see which, their state from their workers, and their registration
//! tokens — made, sealed, shown with the command that joins a machine (and, for
//! `kubernetes`, the manifests that join a cluster's GPU nodes), and rotated.

use std::collections::HashMap;
use std::path::Path;

use gantry_auth::sealed::Sealer;
use gantry_auth::Principal;
use gantry_store::{ClusterToken, Store, StoreError, StoredCluster};
use gantry_types::{
    Cluster, ClusterCounts, ClusterCreate, ClusterProvider, ClusterRegistration, ClusterUpdate,
    DEFAULT_CLUSTER_ID,
};

use crate::auth::secrets;
use crate::error::{ApiError, ApiResult};

/// A cluster as the API shows it, with its counts and the state they make.
fn shown(stored: StoredCluster, counts: &HashMap<i64, ClusterCounts>) -> Cluster {
    let counts = counts.get(&stored.id).copied().unwrap_or_default();
    let (state, state_message) = Cluster::state_of(stored.id, &counts);
    Cluster {
        id: stored.id,
        is_default: stored.is_default(),
        name: stored.name,
        description: stored.description,
        provider: stored.provider,
        state,
        state_message,
        counts,
        created_at: stored.created_at,
        updated_at: stored.updated_at,
    }
}

/// The clusters `principal` may see: every one for an admin, the ones they administer
/// for anyone else.
pub async fn list(store: &Store, principal: &Principal) -> ApiResult<Vec<Cluster>> {
    let visible = principal.visible_clusters();
    let (clusters, counts) = tokio::try_join!(store.list_clusters(), store.cluster_counts())?;
    Ok(clusters
        .into_iter()
        .filter(|c| visible.as_ref().is_none_or(|ids| ids.contains(&c.id)))
        .map(|c| shown(c, &counts))
        .collect())
}

/// One cluster, for an admin or its administrator.
pub async fn get(store: &Store, principal: &Principal, id: i64) -> ApiResult<Cluster> {
    let stored = store.get_cluster(id).await?;
    principal.require_cluster_admin(id)?;
    let counts = store.cluster_counts().await?;
    Ok(shown(stored, &counts))
}

/// A cluster `id` that exists, for a request that names it: 422 naming the field when
/// it does not (the request is what is wrong, not the URL).
pub async fn named_in_request(store: &Store, field: &str, id: i64) -> ApiResult<StoredCluster> {
    match store.get_cluster(id).await {
        Ok(cluster) => Ok(cluster),
        Err(StoreError::NotFound { .. }) => Err(ApiError::validation(format!(
            "{field}: there is no cluster {id}; GET /api/v1/clusters lists them"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// A new registration token, its digest and its sealed form.
struct NewToken {
    token: String,
    digest: String,
    sealed: String,
}

impl NewToken {
    fn generate(sealer: &Sealer) -> Self {
        let token = secrets::generate_registration_token();
        Self {
            digest: secrets::digest(&token),
            sealed: sealer.seal(&token),
            token,
        }
    }

    fn stored(&self) -> ClusterToken<'_> {
        ClusterToken {
            digest: &self.digest,
            sealed: &self.sealed,
        }
    }
}

/// Adds a cluster with a registration token of its own.
pub async fn create(store: &Store, sealer: &Sealer, request: ClusterCreate) -> ApiResult<Cluster> {
    let token = NewToken::generate(sealer);
    let stored = store
        .create_cluster(
            &request.name,
            &request.description,
            request.provider,
            token.stored(),
        )
        .await?;
    Ok(shown(stored, &HashMap::new()))
}

/// Changes a cluster's name, description or provider; absent fields stay.
pub async fn update(store: &Store, id: i64, update: ClusterUpdate) -> ApiResult<Cluster> {
    let stored = store.get_cluster(id).await?;
    let stored = store
        .update_cluster(
            id,
            stored.updated_at,
            update.name.as_deref().unwrap_or(&stored.name),
            update.description.as_deref().unwrap_or(&stored.description),
            update.provider.unwrap_or(stored.provider),
        )
        .await?;
    let counts = store.cluster_counts().await?;
    Ok(shown(stored, &counts))
}

/// Where the token of a cluster comes from when it is shown.
pub struct Joining<'a> {
    pub sealer: &'a Sealer,
    /// The active servers' URLs, the answering server's first.
    pub server_urls: Vec<String>,
    /// The answering server's data directory, which may hold the default cluster's token
    /// from before clusters existed.
    pub data_dir: &'a Path,
    /// The image the Kubernetes DaemonSet runs.
    pub image: String,
}

/// The registration token of cluster `id` with its join command (and manifests).
pub async fn registration(
    store: &Store,
    joining: &Joining<'_>,
    id: i64,
) -> ApiResult<ClusterRegistration> {
    let cluster = store.get_cluster(id).await?;
    let token = current_token(joining, &cluster)?;
    Ok(registration_of(&cluster, token, joining))
}

/// Replaces the registration token of cluster `id`: new machines join with the new one
/// only; registered workers keep their own credentials.
pub async fn rotate(
    store: &Store,
    joining: &Joining<'_>,
    id: i64,
) -> ApiResult<ClusterRegistration> {
    let token = NewToken::generate(joining.sealer);
    let cluster = store.set_cluster_token(id, token.stored()).await?;
    if cluster.is_default() {
        // `gantry start` joins its own worker with the token in its data directory.
        let path = joining
            .data_dir
            .join(crate::bootstrap::REGISTRATION_TOKEN_FILE);
        if path.exists() {
            if let Err(e) = crate::bootstrap::write_secret_file(&path, &token.token) {
                tracing::warn!(path = %path.display(), error = %e, "cannot rewrite the registration token file after the rotation");
            }
        }
    }
    Ok(registration_of(&cluster, token.token, joining))
}

/// The cluster's token in clear, opened from its sealed form. A token from before clusters
/// existed is sealed in by the server whose data directory holds it, when that server
/// starts (`bootstrap.rs`); until then no server can show it.
fn current_token(joining: &Joining<'_>, cluster: &StoredCluster) -> ApiResult<String> {
    let Some(sealed) = &cluster.token_sealed else {
        return Err(ApiError::conflict(format!(
            "cluster {}'s registration token was made before clusters existed and is known \
             only to the server whose data directory holds it, which seals it in when it \
             starts: restart that server, or rotate the token (POST \
             /api/v1/clusters/{}/registration-token) to get one every server can show",
            cluster.name, cluster.id
        )));
    };
    joining.sealer.open(sealed).map_err(|e| {
        ApiError::internal(format!(
            "cluster {}'s registration token: {e}",
            cluster.name
        ))
    })
}

fn registration_of(
    cluster: &StoredCluster,
    token: String,
    joining: &Joining<'_>,
) -> ClusterRegistration {
    let urls = joining.server_urls.join(",");
    let command = format!("gantry worker --server-url {urls} --token {token}");
    let kubernetes_manifests = (cluster.provider == ClusterProvider::Kubernetes)
        .then(|| kubernetes_manifests(&cluster.name, &urls, &token, &joining.image));
    ClusterRegistration {
        cluster_id: cluster.id,
        cluster_name: cluster.name.clone(),
        token,
        server_urls: joining.server_urls.clone(),
        command,
        kubernetes_manifests,
    }
}

/// A namespace, the token as a Secret, and a DaemonSet running `gantry worker` on every
/// GPU node (NVIDIA's GPU feature discovery labels them `nvidia.com/gpu.present=true`).
/// The worker places models on the node's GPUs itself, so it sees all of them
/// (`NVIDIA_VISIBLE_DEVICES=all` through the NVIDIA container runtime) rather than asking
/// the device plugin for some. The pods use the host's network, so servers reach each
/// worker and its backends at the node's address, and keep the worker's credential in a
/// host directory, so a restarted pod returns as the same worker instead of registering
/// anew.
pub fn kubernetes_manifests(cluster: &str, server_urls: &str, token: &str, image: &str) -> String {
    let name = format!("gantry-worker-{cluster}");
    format!(
        "# Joins the GPU nodes of a Kubernetes cluster to gantry cluster {cluster}: \
         kubectl apply -f this file.\n\
         # The image is gantry's Dockerfile built and pushed where the nodes pull from. The\n\
         # worker uses every GPU of its node: keep other GPU workloads off these nodes.\n\
         apiVersion: v1\n\
         kind: Namespace\n\
         metadata:\n  name: gantry\n\
         ---\n\
         apiVersion: v1\n\
         kind: Secret\n\
         metadata:\n  name: {name}\n  namespace: gantry\n\
         type: Opaque\n\
         stringData:\n  token: {token:?}\n\
         ---\n\
         apiVersion: apps/v1\n\
         kind: DaemonSet\n\
         metadata:\n  name: {name}\n  namespace: gantry\n  labels:\n    app.kubernetes.io/name: gantry-worker\n    gantry.dev/cluster: {cluster:?}\n\
         spec:\n\
         \x20 selector:\n    matchLabels:\n      app.kubernetes.io/name: gantry-worker\n      gantry.dev/cluster: {cluster:?}\n\
         \x20 template:\n\
         \x20   metadata:\n      labels:\n        app.kubernetes.io/name: gantry-worker\n        gantry.dev/cluster: {cluster:?}\n\
         \x20   spec:\n\
         \x20     hostNetwork: true\n\
         \x20     dnsPolicy: ClusterFirstWithHostNet\n\
         \x20     nodeSelector:\n        nvidia.com/gpu.present: \"true\"\n\
         \x20     tolerations:\n        - key: nvidia.com/gpu\n          operator: Exists\n          effect: NoSchedule\n\
         \x20     containers:\n\
         \x20       - name: worker\n\
         \x20         image: {image:?}\n\
         \x20         args: [\"worker\"]\n\
         \x20         env:\n\
         \x20           - name: GANTRY_SERVER_URLS\n              value: {server_urls:?}\n\
         \x20           - name: GANTRY_TOKEN\n              valueFrom:\n                secretKeyRef:\n                  name: {name}\n                  key: token\n\
         \x20           - name: GANTRY_WORKER_NAME\n              valueFrom:\n                fieldRef:\n                  fieldPath: spec.nodeName\n\
         \x20           - name: GANTRY_ADVERTISE_HOST\n              valueFrom:\n                fieldRef:\n                  fieldPath: status.hostIP\n\
         \x20           - name: GANTRY_DATA_DIR\n              value: /var/lib/gantry-worker\n\
         \x20           - name: NVIDIA_VISIBLE_DEVICES\n              value: all\n\
         \x20           - name: NVIDIA_DRIVER_CAPABILITIES\n              value: compute,utility\n\
         \x20         volumeMounts:\n            - name: state\n              mountPath: /var/lib/gantry-worker\n\
         \x20     volumes:\n        - name: state\n          hostPath:\n            path: /var/lib/gantry-worker/{cluster}\n            type: DirectoryOrCreate\n"
    )
}

/// Deletes an empty cluster; never the default one.
pub async fn delete(store: &Store, id: i64) -> ApiResult<StoredCluster> {
    if id == DEFAULT_CLUSTER_ID {
        return Err(ApiError::conflict(
            "the default cluster cannot be deleted: models that name no cluster go there",
        ));
    }
    Ok(store.delete_cluster(id).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifests_are_yaml_that_joins_gpu_nodes_with_the_token_as_a_secret() {
        let yaml = kubernetes_manifests(
            "east",
            "http://10.0.0.5:8080,http://10.0.0.6:8080",
            "gantryreg_abc",
            "registry.example.com/gantry:0.4.0",
        );
        let docs: Vec<serde_json::Value> = yaml
            .split("\n---\n")
            .map(|doc| serde_norway::from_str(doc).expect("each document parses"))
            .collect();
        assert_eq!(docs.len(), 3, "{yaml}");
        assert_eq!(docs[0]["kind"], "Namespace");
        assert_eq!(docs[1]["kind"], "Secret");
        assert_eq!(docs[1]["stringData"]["token"], "gantryreg_abc");
        let daemonset = &docs[2];
        assert_eq!(daemonset["kind"], "DaemonSet");
        let pod = &daemonset["spec"]["template"]["spec"];
        assert_eq!(pod["nodeSelector"]["nvidia.com/gpu.present"], "true");
        assert_eq!(pod["hostNetwork"], true);
        let container = &pod["containers"][0];
        assert_eq!(container["image"], "registry.example.com/gantry:0.4.0");
        let env: HashMap<String, serde_json::Value> = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap().to_owned(), e.clone()))
            .collect();
        assert_eq!(
            env["GANTRY_SERVER_URLS"]["value"],
            "http://10.0.0.5:8080,http://10.0.0.6:8080"
        );
        assert_eq!(
            env["GANTRY_TOKEN"]["valueFrom"]["secretKeyRef"]["name"],
            "gantry-worker-east"
        );
        assert_eq!(
            env["GANTRY_WORKER_NAME"]["valueFrom"]["fieldRef"]["fieldPath"],
            "spec.nodeName"
        );
        assert_eq!(env["NVIDIA_VISIBLE_DEVICES"]["value"], "all");
        assert_eq!(
            daemonset["spec"]["selector"]["matchLabels"],
            daemonset["spec"]["template"]["metadata"]["labels"]
        );
    }
}
