//! The `model_providers` table: external OpenAI-compatible endpoints. The API key is
//! stored sealed (the caller seals and opens it; the store never sees it in clear).

use std::collections::BTreeMap;

use gantry_types::{ModelProvider, Timestamp};
use sqlx::any::AnyRow;

use crate::changes::{Change, ChangeKind};
use crate::rows::{int, json, opt_text, text, to_json};
use crate::{Store, StoreError};

const COLUMNS: &str = "id, name, description, base_url, api_key_sealed, headers, \
     timeout_seconds, models, created_at, updated_at";
const T: &str = "model_providers";

/// A provider as stored: what the API shows, plus its sealed key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredProvider {
    pub provider: ModelProvider,
    /// The API key sealed with the server secret; `None` when the provider takes none.
    pub api_key_sealed: Option<String>,
}

/// A provider's fields, to insert or to write over the stored ones.
#[derive(Debug, Clone)]
pub struct ProviderFields {
    pub description: String,
    pub base_url: String,
    pub api_key_sealed: Option<String>,
    pub headers: BTreeMap<String, String>,
    pub timeout_seconds: u64,
    pub models: Vec<String>,
}

impl ProviderFields {
    /// The fields of a stored provider, to change some of them.
    pub fn of(stored: &StoredProvider) -> Self {
        let p = &stored.provider;
        Self {
            description: p.description.clone(),
            base_url: p.base_url.clone(),
            api_key_sealed: stored.api_key_sealed.clone(),
            headers: p.headers.clone(),
            timeout_seconds: p.timeout_seconds,
            models: p.models.clone(),
        }
    }
}

fn decode(row: &AnyRow) -> Result<StoredProvider, StoreError> {
    let api_key_sealed = opt_text(row, T, "api_key_sealed")?;
    Ok(StoredProvider {
        provider: ModelProvider {
            id: int(row, T, "id")?,
            name: text(row, T, "name")?,
            description: text(row, T, "description")?,
            base_url: text(row, T, "base_url")?,
            has_api_key: api_key_sealed.is_some(),
            headers: json(row, T, "headers")?,
            timeout_seconds: u64::try_from(int(row, T, "timeout_seconds")?).unwrap_or(1),
            models: json(row, T, "models")?,
            created_at: Timestamp::from_millis(int(row, T, "created_at")?),
            updated_at: Timestamp::from_millis(int(row, T, "updated_at")?),
        },
        api_key_sealed,
    })
}

/// Binds `$1` (the name) to `$7` (the fields in their column order).
fn bind_fields<'q>(
    query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    name: &'q str,
    fields: &'q ProviderFields,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    query
        .bind(name)
        .bind(&fields.description)
        .bind(&fields.base_url)
        .bind(fields.api_key_sealed.clone())
        .bind(to_json(&fields.headers))
        .bind(to_i64(fields.timeout_seconds))
        .bind(to_json(&fields.models))
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl Store {
    /// Adds a provider. `Conflict` when the name is taken.
    pub async fn create_provider(
        &self,
        name: &str,
        fields: &ProviderFields,
    ) -> Result<StoredProvider, StoreError> {
        let now = Timestamp::now().as_millis();
        let sql = format!(
            "INSERT INTO model_providers (name, description, base_url, api_key_sealed, headers, \
             timeout_seconds, models, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8) RETURNING {COLUMNS}"
        );
        let row = bind_fields(sqlx::query(&sql), name, fields)
            .bind(now)
            .fetch_one(&self.writes)
            .await
            .map_err(|e| StoreError::conflict_on_unique(e, "model provider", name))?;
        let stored = decode(&row)?;
        self.publish(Change::Provider(
            ChangeKind::Created,
            stored.provider.clone(),
        ));
        Ok(stored)
    }

    pub async fn get_provider(&self, name: &str) -> Result<StoredProvider, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM model_providers WHERE name = $1"
        ))
        .bind(name)
        .fetch_optional(&self.reads)
        .await?
        .ok_or_else(|| StoreError::not_found("model provider", name))?;
        decode(&row)
    }

    pub(crate) async fn get_provider_by_id(&self, id: i64) -> Result<StoredProvider, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM model_providers WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.reads)
        .await?
        .ok_or_else(|| StoreError::not_found("model provider", id))?;
        decode(&row)
    }

    /// Every provider, by name.
    pub async fn list_providers(&self) -> Result<Vec<StoredProvider>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM model_providers ORDER BY name"
        ))
        .fetch_all(&self.reads)
        .await?;
        rows.iter().map(decode).collect()
    }

    /// Writes `fields` over a provider, if it is still the one read at `read_at` (its
    /// `updated_at`): `Conflict` when someone changed it in between.
    pub async fn update_provider(
        &self,
        name: &str,
        read_at: Timestamp,
        fields: &ProviderFields,
    ) -> Result<StoredProvider, StoreError> {
        let now = Timestamp::now().as_millis().max(read_at.as_millis() + 1);
        let sql = format!(
            "UPDATE model_providers SET description = $2, base_url = $3, api_key_sealed = $4, \
             headers = $5, timeout_seconds = $6, models = $7, updated_at = $8 \
             WHERE name = $1 AND updated_at = $9 RETURNING {COLUMNS}"
        );
        let row = bind_fields(sqlx::query(&sql), name, fields)
            .bind(now)
            .bind(read_at.as_millis())
            .fetch_optional(&self.writes)
            .await?;
        match row {
            Some(row) => {
                let stored = decode(&row)?;
                self.publish(Change::Provider(
                    ChangeKind::Updated,
                    stored.provider.clone(),
                ));
                Ok(stored)
            }
            None => {
                self.get_provider(name).await?;
                Err(StoreError::Conflict {
                    resource: "model provider",
                    key: format!("{name} (changed by another request meanwhile; read it again)"),
                })
            }
        }
    }

    /// Deletes a provider no route uses. `InUse` naming the routes otherwise.
    pub async fn delete_provider(&self, name: &str) -> Result<(), StoreError> {
        let stored = self.get_provider(name).await?;
        // A route added between this check and the delete names a provider that is
        // gone: the gateway treats such a target as unavailable, and the route's page
        // shows it.
        let mut tx = self.writes.begin().await?;
        let users = crate::routes::routes_using_provider(&mut tx, name).await?;
        if !users.is_empty() {
            return Err(StoreError::InUse {
                resource: "model provider",
                key: name.to_owned(),
                by: format!(
                    "route(s) {}; remove it from their targets or delete them first",
                    users.join(", ")
                ),
            });
        }
        sqlx::query("DELETE FROM model_providers WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.publish(Change::Provider(ChangeKind::Deleted, stored.provider));
        Ok(())
    }
}
