//! The `api_keys` table. Keys are stored as a fast lookup digest of the whole key plus
//! an argon2 hash of the secret half; the secret itself is never stored.

use gantry_types::{ApiKey, ApiKeyFilter, ApiKeyLimits, Timestamp};
use sqlx::any::AnyRow;

use crate::changes::{Change, ChangeKind};
use crate::query::{Listing, Page};
use crate::rows::{int, opt_int, opt_text, text, to_json};
use crate::{Store, StoreError};

/// An API key with its stored hashes.
#[derive(Debug, Clone)]
pub struct ApiKeyRecord {
    pub key: ApiKey,
    pub secret_hash: String,
}

/// A key to insert, hashed by the caller.
#[derive(Debug, Clone)]
pub struct NewApiKey {
    pub user_id: i64,
    pub name: String,
    pub description: String,
    pub access_key: String,
    /// SHA-256 of the whole key, hex: finds the row in one indexed read.
    pub lookup_digest: String,
    /// argon2 PHC string of the secret half.
    pub secret_hash: String,
    pub expires_at: Option<Timestamp>,
    pub limits: ApiKeyLimits,
}

const COLUMNS: &str = "id, user_id, name, description, access_key, secret_hash, expires_at, \
     last_used_at, created_at, allowed_routes, requests_per_minute, tokens_per_minute";

fn limits_of(row: &AnyRow) -> Result<ApiKeyLimits, StoreError> {
    const T: &str = "api_keys";
    let allowed_routes = match opt_text(row, T, "allowed_routes")? {
        Some(raw) => Some(
            serde_json::from_str(&raw)
                .map_err(|e| StoreError::corrupt(T, format!("column allowed_routes: {e}")))?,
        ),
        None => None,
    };
    let rpm = opt_int(row, T, "requests_per_minute")?;
    Ok(ApiKeyLimits {
        allowed_routes,
        requests_per_minute: rpm.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        tokens_per_minute: opt_int(row, T, "tokens_per_minute")?
            .map(|n| u64::try_from(n).unwrap_or(0)),
    })
}

fn decode(row: &AnyRow) -> Result<ApiKeyRecord, StoreError> {
    const T: &str = "api_keys";
    Ok(ApiKeyRecord {
        key: ApiKey {
            id: int(row, T, "id")?,
            name: text(row, T, "name")?,
            user_id: int(row, T, "user_id")?,
            access_key: text(row, T, "access_key")?,
            description: text(row, T, "description")?,
            expires_at: opt_int(row, T, "expires_at")?.map(Timestamp::from_millis),
            last_used_at: opt_int(row, T, "last_used_at")?.map(Timestamp::from_millis),
            created_at: Timestamp::from_millis(int(row, T, "created_at")?),
            limits: limits_of(row)?,
        },
        secret_hash: text(row, T, "secret_hash")?,
    })
}

/// How the `api_keys` list reads.
const LISTING: Listing<ApiKey> = Listing {
    columns: COLUMNS,
    from: "api_keys",
    count_from: "api_keys",
    alias: None,
    order_by: "id",
    decode: |row| decode(row).map(|record| record.key),
    id_of: |item| item.id,
};

impl Store {
    /// Inserts a key; `Conflict` if the user already has a key of that name.
    pub async fn create_api_key(&self, new: &NewApiKey) -> Result<ApiKey, StoreError> {
        let row = sqlx::query(&format!(
            "INSERT INTO api_keys (user_id, name, description, access_key, lookup_digest, \
             secret_hash, expires_at, created_at, allowed_routes, requests_per_minute, \
             tokens_per_minute) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
             RETURNING {COLUMNS}"
        ))
        .bind(new.user_id)
        .bind(&new.name)
        .bind(&new.description)
        .bind(&new.access_key)
        .bind(&new.lookup_digest)
        .bind(&new.secret_hash)
        .bind(new.expires_at.map(Timestamp::as_millis))
        .bind(Timestamp::now().as_millis())
        .bind(new.limits.allowed_routes.as_ref().map(to_json))
        .bind(new.limits.requests_per_minute.map(i64::from))
        .bind(
            new.limits
                .tokens_per_minute
                .map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
        )
        .fetch_one(&self.writes)
        .await
        .map_err(|e| StoreError::conflict_on_unique(e, "api key", &new.name))?;
        let key = decode(&row)?.key;
        self.publish(Change::ApiKey(ChangeKind::Created, key.clone()));
        Ok(key)
    }

    /// Finds a key by the digest of the whole key, as presented by a client.
    pub async fn api_key_by_digest(&self, digest: &str) -> Result<ApiKeyRecord, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM api_keys WHERE lookup_digest = $1"
        ))
        .bind(digest)
        .fetch_optional(&self.reads)
        .await?
        .ok_or_else(|| StoreError::not_found("api key", "with that digest"))?;
        decode(&row)
    }

    pub async fn get_api_key(&self, id: i64) -> Result<ApiKey, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM api_keys WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.reads)
            .await?
            .ok_or_else(|| StoreError::not_found("api key", id))?;
        Ok(decode(&row)?.key)
    }

    /// Lists keys, of one user when `user_id` is given.
    pub async fn list_api_keys(
        &self,
        filter: &ApiKeyFilter,
        page: Page,
    ) -> Result<(Vec<ApiKey>, u64), StoreError> {
        self.list_page(&LISTING, filter, page).await
    }

    pub(crate) async fn api_keys_of(&self, user_id: i64) -> Result<Vec<ApiKey>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM api_keys WHERE user_id = $1 ORDER BY id"
        ))
        .bind(user_id)
        .fetch_all(&self.reads)
        .await?;
        rows.iter().map(|r| decode(r).map(|k| k.key)).collect()
    }

    /// Changes a key's description and limits.
    pub async fn update_api_key(
        &self,
        id: i64,
        description: &str,
        limits: &ApiKeyLimits,
    ) -> Result<ApiKey, StoreError> {
        let row = sqlx::query(&format!(
            "UPDATE api_keys SET description = $2, allowed_routes = $3, \
             requests_per_minute = $4, tokens_per_minute = $5 WHERE id = $1 RETURNING {COLUMNS}"
        ))
        .bind(id)
        .bind(description)
        .bind(limits.allowed_routes.as_ref().map(to_json))
        .bind(limits.requests_per_minute.map(i64::from))
        .bind(
            limits
                .tokens_per_minute
                .map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
        )
        .fetch_optional(&self.writes)
        .await?
        .ok_or_else(|| StoreError::not_found("api key", id))?;
        let key = decode(&row)?.key;
        self.publish(Change::ApiKey(ChangeKind::Updated, key.clone()));
        Ok(key)
    }

    /// Every key with a limit (the gateway's limiter reads them at start-up).
    pub async fn limited_api_keys(&self) -> Result<Vec<ApiKey>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM api_keys WHERE allowed_routes IS NOT NULL \
             OR requests_per_minute IS NOT NULL OR tokens_per_minute IS NOT NULL ORDER BY id"
        ))
        .fetch_all(&self.reads)
        .await?;
        rows.iter().map(|r| decode(r).map(|k| k.key)).collect()
    }

    pub async fn delete_api_key(&self, id: i64) -> Result<ApiKey, StoreError> {
        let key = self.get_api_key(id).await?;
        let result = sqlx::query("DELETE FROM api_keys WHERE id = $1")
            .bind(id)
            .execute(&self.writes)
            .await?;
        if result.rows_affected() == 0 {
            return Err(StoreError::not_found("api key", id));
        }
        self.publish(Change::ApiKey(ChangeKind::Deleted, key.clone()));
        Ok(key)
    }

    /// Records when a key was last used. Callers rate-limit this (it is a write per
    /// request otherwise); it publishes no change.
    pub async fn touch_api_key(&self, id: i64, at: Timestamp) -> Result<(), StoreError> {
        sqlx::query("UPDATE api_keys SET last_used_at = $2 WHERE id = $1")
            .bind(id)
            .bind(at.as_millis())
            .execute(&self.writes)
            .await?;
        Ok(())
    }
}
