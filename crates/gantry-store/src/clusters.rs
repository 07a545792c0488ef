//! The `clusters` table: each cluster's name, provider and registration token (its digest,
//! which registration checks, and the token sealed with the server secret, which any
//! server opens to show the join command; the store never sees it in clear). Row 1 is
//! the default cluster (`gantry_types::DEFAULT_CLUSTER_ID`).

use std::collections::HashMap;

use gantry_types::{ClusterCounts, ClusterProvider, Timestamp, DEFAULT_CLUSTER_ID};
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::rows::{int, opt_text, parse_enum, text};
use crate::settings::REGISTRATION_TOKEN_DIGEST;
use crate::{Engine, Store, StoreError};

const COLUMNS: &str = "id, name, description, provider, registration_token_digest, \
     registration_token_sealed, created_at, updated_at";
const T: &str = "clusters";

/// A cluster as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCluster {
    pub id: i64,
    pub name: String,
    pub description: String,
    pub provider: ClusterProvider,
    /// The digest of the registration token workers join with; `None` before the first
    /// server of a fresh database made one.
    pub token_digest: Option<String>,
    /// The same token sealed with the server secret; `None` until a server that holds
    /// the plaintext sealed it in (a token from before clusters existed is known to the
    /// one server whose data directory holds it).
    pub token_sealed: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl StoredCluster {
    pub fn is_default(&self) -> bool {
        self.id == DEFAULT_CLUSTER_ID
    }
}

/// A registration token to store: its digest and its sealed form.
#[derive(Debug, Clone, Copy)]
pub struct ClusterToken<'a> {
    pub digest: &'a str,
    pub sealed: &'a str,
}

fn decode(row: &AnyRow) -> Result<StoredCluster, StoreError> {
    Ok(StoredCluster {
        id: int(row, T, "id")?,
        name: text(row, T, "name")?,
        description: text(row, T, "description")?,
        provider: parse_enum(
            &text(row, T, "provider")?,
            ClusterProvider::parse,
            T,
            "provider",
        )?,
        token_digest: opt_text(row, T, "registration_token_digest")?,
        token_sealed: opt_text(row, T, "registration_token_sealed")?,
        created_at: Timestamp::from_millis(int(row, T, "created_at")?),
        updated_at: Timestamp::from_millis(int(row, T, "updated_at")?),
    })
}

/// How many of `values` to name in a message before "and N more".
const NAMED: usize = 5;

fn name_some(kind: &str, names: &[String], total: i64) -> String {
    let shown = names.join(", ");
    let more = total - i64::try_from(names.len()).unwrap_or(0);
    if more > 0 {
        format!("{kind} {shown} and {more} more")
    } else {
        format!("{kind} {shown}")
    }
}

impl Store {
    /// Adds a cluster with its first registration token. `Conflict` when the name is
    /// taken.
    pub async fn create_cluster(
        &self,
        name: &str,
        description: &str,
        provider: ClusterProvider,
        token: ClusterToken<'_>,
    ) -> Result<StoredCluster, StoreError> {
        let now = Timestamp::now().as_millis();
        let row = sqlx::query(&format!(
            "INSERT INTO clusters (name, description, provider, registration_token_digest, \
             registration_token_sealed, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $6) RETURNING {COLUMNS}"
        ))
        .bind(name)
        .bind(description)
        .bind(provider.as_str())
        .bind(token.digest)
        .bind(token.sealed)
        .bind(now)
        .fetch_one(&self.writes)
        .await
        .map_err(|e| StoreError::conflict_on_unique(e, "cluster", name))?;
        decode(&row)
    }

    pub async fn get_cluster(&self, id: i64) -> Result<StoredCluster, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM clusters WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.reads)
            .await?
            .ok_or_else(|| StoreError::not_found("cluster", id))?;
        decode(&row)
    }

    /// Every cluster, by id (the default first).
    pub async fn list_clusters(&self) -> Result<Vec<StoredCluster>, StoreError> {
        let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM clusters ORDER BY id"))
            .fetch_all(&self.reads)
            .await?;
        rows.iter().map(decode).collect()
    }

    /// The cluster whose current registration token has `digest`.
    pub async fn cluster_by_token_digest(&self, digest: &str) -> Result<StoredCluster, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM clusters WHERE registration_token_digest = $1"
        ))
        .bind(digest)
        .fetch_optional(&self.reads)
        .await?
        .ok_or_else(|| StoreError::not_found("cluster", "of this registration token"))?;
        decode(&row)
    }

    /// Writes a cluster's name, description and provider, if it is still the one read
    /// at `read_at` (its `updated_at`): `Conflict` when someone changed it in between or
    /// the name is another cluster's.
    pub async fn update_cluster(
        &self,
        id: i64,
        read_at: Timestamp,
        name: &str,
        description: &str,
        provider: ClusterProvider,
    ) -> Result<StoredCluster, StoreError> {
        let now = Timestamp::now().as_millis().max(read_at.as_millis() + 1);
        let row = sqlx::query(&format!(
            "UPDATE clusters SET name = $2, description = $3, provider = $4, updated_at = $5 \
             WHERE id = $1 AND updated_at = $6 RETURNING {COLUMNS}"
        ))
        .bind(id)
        .bind(name)
        .bind(description)
        .bind(provider.as_str())
        .bind(now)
        .bind(read_at.as_millis())
        .fetch_optional(&self.writes)
        .await
        .map_err(|e| StoreError::conflict_on_unique(e, "cluster", name))?;
        match row {
            Some(row) => decode(&row),
            None => {
                self.get_cluster(id).await?;
                Err(StoreError::Conflict {
                    resource: "cluster",
                    key: format!("{id} (changed by another request meanwhile; read it again)"),
                })
            }
        }
    }

    /// Replaces a cluster's registration token: registrations with the old one stop,
    /// registered workers (which present their own credentials) are untouched. For the
    /// default cluster the settings row that servers of the previous release check is
    /// kept equal, in the same transaction.
    pub async fn set_cluster_token(
        &self,
        id: i64,
        token: ClusterToken<'_>,
    ) -> Result<StoredCluster, StoreError> {
        let mut tx = self.writes.begin().await?;
        let row = sqlx::query(&format!(
            "UPDATE clusters SET registration_token_digest = $2, registration_token_sealed = $3, \
             updated_at = $4 WHERE id = $1 RETURNING {COLUMNS}"
        ))
        .bind(id)
        .bind(token.digest)
        .bind(token.sealed)
        .bind(Timestamp::now().as_millis())
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| StoreError::not_found("cluster", id))?;
        if id == DEFAULT_CLUSTER_ID {
            sqlx::query(
                "INSERT INTO settings (key, value, created_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            )
            .bind(REGISTRATION_TOKEN_DIGEST)
            .bind(token.digest)
            .bind(Timestamp::now().as_millis())
            .execute(&mut *tx)
            .await?;
        }
        let cluster = decode(&row)?;
        tx.commit().await?;
        Ok(cluster)
    }

    /// Gives the default cluster of a fresh database its first token, unless a token is
    /// there already (another server was first); true when this one was stored.
    pub async fn set_first_default_token(
        &self,
        token: ClusterToken<'_>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.writes.begin().await?;
        let result = sqlx::query(
            "UPDATE clusters SET registration_token_digest = $2, registration_token_sealed = $3 \
             WHERE id = $1 AND registration_token_digest IS NULL",
        )
        .bind(DEFAULT_CLUSTER_ID)
        .bind(token.digest)
        .bind(token.sealed)
        .execute(&mut *tx)
        .await?;
        if result.rows_affected() == 0 {
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO settings (key, value, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (key) DO NOTHING",
        )
        .bind(REGISTRATION_TOKEN_DIGEST)
        .bind(token.digest)
        .bind(Timestamp::now().as_millis())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Stores the sealed form of a cluster's token where only its digest is known, if
    /// the digest is still `token.digest`; true when stored.
    pub async fn seal_cluster_token(
        &self,
        id: i64,
        token: ClusterToken<'_>,
    ) -> Result<bool, StoreError> {
        let result = sqlx::query(
            "UPDATE clusters SET registration_token_sealed = $3 \
             WHERE id = $1 AND registration_token_digest = $2 \
             AND registration_token_sealed IS NULL",
        )
        .bind(id)
        .bind(token.digest)
        .bind(token.sealed)
        .execute(&self.writes)
        .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Deletes a cluster that holds no worker and no model, and takes it from the users
    /// who administered it. The default cluster stays (`Invalid`); a cluster in use is
    /// `InUse`, naming what is in it.
    pub async fn delete_cluster(&self, id: i64) -> Result<StoredCluster, StoreError> {
        if id == DEFAULT_CLUSTER_ID {
            return Err(StoreError::Invalid(
                "the default cluster cannot be deleted: models that name no cluster go there"
                    .to_owned(),
            ));
        }
        let mut tx = self.writes.begin().await?;
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM clusters WHERE id = $1"))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| StoreError::not_found("cluster", id))?;
        let cluster = decode(&row)?;
        let mut users_of = Vec::new();
        for (table, kind) in [
            ("workers", "worker(s)"),
            ("models", "model(s)"),
            ("worker_pools", "worker pool(s)"),
        ] {
            let total: i64 = sqlx::query(&format!(
                "SELECT COUNT(*) AS n FROM {table} WHERE cluster_id = $1"
            ))
            .bind(id)
            .fetch_one(&mut *tx)
            .await?
            .try_get("n")?;
            if total == 0 {
                continue;
            }
            let names: Vec<String> = sqlx::query(&format!(
                "SELECT name FROM {table} WHERE cluster_id = $1 ORDER BY name LIMIT {NAMED}"
            ))
            .bind(id)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|row| text(row, T, "name"))
            .collect::<Result<_, _>>()?;
            users_of.push(name_some(kind, &names, total));
        }
        if !users_of.is_empty() {
            return Err(StoreError::InUse {
                resource: "cluster",
                key: cluster.name,
                by: format!(
                    "{}; delete its models, pools and workers (or move the machines to \
                     another cluster by registering them with its token) first",
                    users_of.join(" and ")
                ),
            });
        }
        sqlx::query("DELETE FROM clusters WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let admins = crate::users::users_administering(&mut tx, id).await?;
        tx.commit().await?;
        for user in admins {
            self.publish(crate::changes::Change::User(
                crate::changes::ChangeKind::Updated,
                user,
            ));
        }
        Ok(cluster)
    }

    /// Each cluster's counts of workers, ready workers, GPUs, models and pool machines on
    /// their way; a cluster with none of them has no entry.
    pub async fn cluster_counts(&self) -> Result<HashMap<i64, ClusterCounts>, StoreError> {
        let gpus = match self.engine {
            Engine::Sqlite => "json_array_length(status, '$.gpus')",
            Engine::Postgres => "json_array_length((status::json) -> 'gpus')",
        };
        let per_worker = format!(
            "SELECT cluster_id, COUNT(*) AS workers, \
             COUNT(*) FILTER (WHERE state = 'ready') AS ready, \
             COALESCE(SUM({gpus}), 0) AS gpus FROM workers GROUP BY cluster_id"
        );
        let workers = sqlx::query(&per_worker).fetch_all(&self.reads);
        let models =
            sqlx::query("SELECT cluster_id, COUNT(*) AS models FROM models GROUP BY cluster_id")
                .fetch_all(&self.reads);
        let machines = sqlx::query(
            "SELECT p.cluster_id AS cluster_id, COUNT(*) AS machines FROM pool_machines m \
             JOIN worker_pools p ON p.id = m.pool_id \
             WHERE m.state IN ('provisioning', 'initializing') GROUP BY p.cluster_id",
        )
        .fetch_all(&self.reads);
        let (workers, models, machines) = tokio::try_join!(workers, models, machines)?;
        let mut counts: HashMap<i64, ClusterCounts> = HashMap::new();
        let count = |row: &AnyRow, column: &str| -> Result<u64, StoreError> {
            Ok(u64::try_from(int(row, T, column)?).unwrap_or(0))
        };
        for row in &workers {
            let entry = counts.entry(int(row, T, "cluster_id")?).or_default();
            entry.workers = count(row, "workers")?;
            entry.ready_workers = count(row, "ready")?;
            entry.gpus = count(row, "gpus")?;
        }
        for row in &models {
            counts.entry(int(row, T, "cluster_id")?).or_default().models = count(row, "models")?;
        }
        for row in &machines {
            counts
                .entry(int(row, T, "cluster_id")?)
                .or_default()
                .machines_on_the_way = count(row, "machines")?;
        }
        Ok(counts)
    }
}
