//! The `inference_backends` table: custom backends an admin defined. The built-in ones
//! (llama.cpp, vLLM, SGLang) are not stored; the server lists them from code.

use gantry_types::{CustomBackendSpec, Timestamp};
use sqlx::any::AnyRow;

use crate::rows::{int, json, text, to_json};
use crate::{Store, StoreError};

const COLUMNS: &str = "id, name, spec, created_at, updated_at";
const T: &str = "inference_backends";

/// A custom backend as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBackend {
    pub id: i64,
    pub name: String,
    pub spec: CustomBackendSpec,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

fn decode(row: &AnyRow) -> Result<StoredBackend, StoreError> {
    Ok(StoredBackend {
        id: int(row, T, "id")?,
        name: text(row, T, "name")?,
        spec: json(row, T, "spec")?,
        created_at: Timestamp::from_millis(int(row, T, "created_at")?),
        updated_at: Timestamp::from_millis(int(row, T, "updated_at")?),
    })
}

impl Store {
    /// Defines a custom backend. `Conflict` when the name is taken.
    pub async fn create_backend(
        &self,
        name: &str,
        spec: &CustomBackendSpec,
    ) -> Result<StoredBackend, StoreError> {
        let now = Timestamp::now().as_millis();
        let row = sqlx::query(&format!(
            "INSERT INTO inference_backends (name, spec, created_at, updated_at) \
             VALUES ($1, $2, $3, $3) RETURNING {COLUMNS}"
        ))
        .bind(name)
        .bind(to_json(spec))
        .bind(now)
        .fetch_one(&self.writes)
        .await
        .map_err(|e| StoreError::conflict_on_unique(e, "inference backend", name))?;
        decode(&row)
    }

    pub async fn get_backend(&self, name: &str) -> Result<StoredBackend, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM inference_backends WHERE name = $1"
        ))
        .bind(name)
        .fetch_optional(&self.reads)
        .await?
        .ok_or_else(|| StoreError::not_found("inference backend", name))?;
        decode(&row)
    }

    /// Every custom backend, by name.
    pub async fn list_backends(&self) -> Result<Vec<StoredBackend>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM inference_backends ORDER BY name"
        ))
        .fetch_all(&self.reads)
        .await?;
        rows.iter().map(decode).collect()
    }

    /// Replaces a custom backend's definition, if it is still the one read at `read_at`
    /// (its `updated_at`): `Conflict` when someone changed it in between.
    pub async fn update_backend(
        &self,
        name: &str,
        read_at: Timestamp,
        spec: &CustomBackendSpec,
    ) -> Result<StoredBackend, StoreError> {
        let now = Timestamp::now().as_millis().max(read_at.as_millis() + 1);
        let row = sqlx::query(&format!(
            "UPDATE inference_backends SET spec = $2, updated_at = $3 \
             WHERE name = $1 AND updated_at = $4 RETURNING {COLUMNS}"
        ))
        .bind(name)
        .bind(to_json(spec))
        .bind(now)
        .bind(read_at.as_millis())
        .fetch_optional(&self.writes)
        .await?;
        match row {
            Some(row) => decode(&row),
            None => {
                // Gone, or changed by someone else since it was read.
                self.get_backend(name).await?;
                Err(StoreError::Conflict {
                    resource: "inference backend",
                    key: format!("{name} (changed by another request meanwhile; read it again)"),
                })
            }
        }
    }

    /// Deletes a custom backend no model uses. `InUse` naming the models otherwise.
    pub async fn delete_backend(&self, name: &str) -> Result<(), StoreError> {
        let result = sqlx::query(
            "DELETE FROM inference_backends WHERE name = $1 \
             AND NOT EXISTS (SELECT 1 FROM models WHERE backend = $1)",
        )
        .bind(name)
        .execute(&self.writes)
        .await?;
        if result.rows_affected() == 1 {
            return Ok(());
        }
        self.get_backend(name).await?;
        let users = self.models_using_backend(name).await?;
        Err(StoreError::InUse {
            resource: "inference backend",
            key: name.to_owned(),
            by: format!(
                "model(s) {}; delete them or change their backend first",
                users.join(", ")
            ),
        })
    }

    /// The names of the models whose backend is `name`.
    pub async fn models_using_backend(&self, name: &str) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query("SELECT name FROM models WHERE backend = $1 ORDER BY name")
            .bind(name)
            .fetch_all(&self.reads)
            .await?;
        rows.iter().map(|row| text(row, "models", "name")).collect()
    }
}
