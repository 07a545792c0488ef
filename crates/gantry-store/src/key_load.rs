//! The `gateway_key_load` table: what each server's gateway admitted per limited API
//! key over the last minute. Each server rewrites its own rows about once a second and
//! adds the other servers' recent rows to its own counts, so a key's limits hold
//! across the cluster (to within about a second's traffic).

use gantry_types::Timestamp;

use crate::rows::int;
use crate::{Store, StoreError};

/// One key's load as one server saw it over the last minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyLoad {
    pub api_key_id: i64,
    pub requests: u64,
    pub tokens: u64,
}

/// Rows older than this are removed by the next write (a server that stopped).
const STALE_MILLIS: i64 = 10 * 60_000;

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl Store {
    /// Replaces `server_id`'s rows with `loads` (keys with nothing in the last minute
    /// are left out), and drops every server's rows older than ten minutes.
    pub async fn publish_key_load(
        &self,
        server_id: &str,
        loads: &[KeyLoad],
    ) -> Result<(), StoreError> {
        let now = Timestamp::now().as_millis();
        let mut tx = self.writes.begin().await?;
        sqlx::query("DELETE FROM gateway_key_load WHERE server_id = $1 OR updated_at < $2")
            .bind(server_id)
            .bind(now - STALE_MILLIS)
            .execute(&mut *tx)
            .await?;
        for load in loads {
            sqlx::query(
                "INSERT INTO gateway_key_load (server_id, api_key_id, requests, tokens, updated_at) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(server_id)
            .bind(load.api_key_id)
            .bind(to_i64(load.requests))
            .bind(to_i64(load.tokens))
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The other servers' loads written at or after `since`, summed per key.
    pub async fn key_load_of_others(
        &self,
        server_id: &str,
        since: Timestamp,
    ) -> Result<Vec<KeyLoad>, StoreError> {
        let rows = sqlx::query(
            "SELECT api_key_id, CAST(SUM(requests) AS BIGINT) AS requests, \
             CAST(SUM(tokens) AS BIGINT) AS tokens FROM gateway_key_load \
             WHERE server_id <> $1 AND updated_at >= $2 GROUP BY api_key_id",
        )
        .bind(server_id)
        .bind(since.as_millis())
        .fetch_all(&self.reads)
        .await?;
        const T: &str = "gateway_key_load";
        rows.iter()
            .map(|row| {
                Ok(KeyLoad {
                    api_key_id: int(row, T, "api_key_id")?,
                    requests: u64::try_from(int(row, T, "requests")?).unwrap_or(0),
                    tokens: u64::try_from(int(row, T, "tokens")?).unwrap_or(0),
                })
            })
            .collect()
    }
}
