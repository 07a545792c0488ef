//! The `settings` table: cluster-wide values created once, such as the hash of the
//! worker registration token.

use sqlx::Row;

use crate::{Store, StoreError};

/// Key under which the registration token's digest is stored.
pub const REGISTRATION_TOKEN_DIGEST: &str = "registration_token_digest";

impl Store {
    pub async fn get_setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT value FROM settings WHERE key = $1")
            .bind(key)
            .fetch_optional(&self.reads)
            .await?;
        Ok(match row {
            Some(row) => Some(row.try_get::<String, _>("value")?),
            None => None,
        })
    }

    /// Stores the value unless the key exists; true when stored. Safe when several
    /// servers bootstrap at once: exactly one wins.
    pub async fn insert_setting_if_absent(
        &self,
        key: &str,
        value: &str,
    ) -> Result<bool, StoreError> {
        let result = sqlx::query(
            "INSERT INTO settings (key, value, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (key) DO NOTHING",
        )
        .bind(key)
        .bind(value)
        .bind(gantry_types::Timestamp::now().as_millis())
        .execute(&self.writes)
        .await?;
        Ok(result.rows_affected() == 1)
    }
}
