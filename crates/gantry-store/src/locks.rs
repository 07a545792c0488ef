//! Distributed locks: a name held by one owner until it releases it or its timeout
//! passes, with a token that grows by one at every acquisition of the name, so writes
//! guarded by the lock can be fenced (see `fence.rs`). A released lock keeps its row
//! (owner empty) so the next token still grows. Times come from the caller's clock.

use gantry_types::{LockInfo, Timestamp};

use crate::rows::{int, text};
use crate::{Store, StoreError};

const COLUMNS: &str = "name, owner, token, acquired_at, expires_at";

fn decode(row: &sqlx::any::AnyRow) -> Result<LockInfo, StoreError> {
    const T: &str = "coordination_locks";
    Ok(LockInfo {
        name: text(row, T, "name")?,
        owner: text(row, T, "owner")?,
        token: u64::try_from(int(row, T, "token")?).unwrap_or(0),
        acquired_at: Timestamp::from_millis(int(row, T, "acquired_at")?),
        expires_at: Timestamp::from_millis(int(row, T, "expires_at")?),
    })
}

/// What [`Store::release_lock`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockRelease {
    Released,
    /// Held by someone else (the lock stays).
    NotOwner {
        owner: String,
    },
    /// Not held by anyone.
    NotHeld,
}

impl Store {
    /// Takes `name` for `owner` until `now + timeout`, when it is free, lapsed, or
    /// already `owner`'s (which renews it with a new token). `Ok(Err(holder))` when
    /// another owner holds it.
    pub async fn acquire_lock(
        &self,
        name: &str,
        owner: &str,
        timeout: std::time::Duration,
        now: Timestamp,
    ) -> Result<Result<LockInfo, LockInfo>, StoreError> {
        let expires = now.as_millis() + i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX / 2);
        // The holder read after a refused take can find the lock freed meanwhile: then
        // the take is tried again, so a refusal always names a live holder.
        let mut tries = 0;
        loop {
            tries += 1;
            let row = sqlx::query(&format!(
                "INSERT INTO coordination_locks (name, owner, token, acquired_at, expires_at) \
                 VALUES ($1, $2, 1, $3, $4) \
                 ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, \
                     token = coordination_locks.token + 1, acquired_at = excluded.acquired_at, \
                     expires_at = excluded.expires_at \
                 WHERE coordination_locks.owner = '' OR coordination_locks.owner = excluded.owner \
                       OR coordination_locks.expires_at <= excluded.acquired_at \
                 RETURNING {COLUMNS}"
            ))
            .bind(name)
            .bind(owner)
            .bind(now.as_millis())
            .bind(expires)
            .fetch_optional(&self.writes)
            .await?;
            if let Some(row) = row {
                return Ok(Ok(decode(&row)?));
            }
            let holder = sqlx::query(&format!(
                "SELECT {COLUMNS} FROM coordination_locks WHERE name = $1"
            ))
            .bind(name)
            .fetch_one(&self.reads)
            .await?;
            let holder = decode(&holder)?;
            let live = !holder.owner.is_empty() && holder.expires_at > now;
            if live || tries >= 3 {
                return Ok(Err(holder));
            }
        }
    }

    /// Takes `name` from a holder known to be gone (its server's session ended): only
    /// while the lock is still as seen (`seen_token`), with a new token, so the old holder's
    /// fenced writes fail should it be alive after all.
    pub async fn take_over_lock(
        &self,
        name: &str,
        owner: &str,
        seen_token: u64,
        timeout: std::time::Duration,
        now: Timestamp,
    ) -> Result<Option<LockInfo>, StoreError> {
        let expires = now.as_millis() + i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX / 2);
        let row = sqlx::query(&format!(
            "UPDATE coordination_locks SET owner = $2, token = token + 1, acquired_at = $3, \
             expires_at = $4 WHERE name = $1 AND token = $5 RETURNING {COLUMNS}"
        ))
        .bind(name)
        .bind(owner)
        .bind(now.as_millis())
        .bind(expires)
        .bind(i64::try_from(seen_token).unwrap_or(i64::MAX))
        .fetch_optional(&self.writes)
        .await?;
        row.as_ref().map(decode).transpose()
    }

    /// Releases `name` if `owner` holds it at `now`. A lapsed lock is not held by anyone
    /// (`NotHeld`), whoever's name it still carries.
    pub async fn release_lock(
        &self,
        name: &str,
        owner: &str,
        now: Timestamp,
    ) -> Result<LockRelease, StoreError> {
        let released = sqlx::query(
            "UPDATE coordination_locks SET owner = '', expires_at = 0 \
             WHERE name = $1 AND owner = $2 AND owner <> '' AND expires_at > $3",
        )
        .bind(name)
        .bind(owner)
        .bind(now.as_millis())
        .execute(&self.writes)
        .await?;
        if released.rows_affected() == 1 {
            return Ok(LockRelease::Released);
        }
        let row = sqlx::query(
            "SELECT owner FROM coordination_locks WHERE name = $1 AND owner <> '' \
             AND expires_at > $2",
        )
        .bind(name)
        .bind(now.as_millis())
        .fetch_optional(&self.reads)
        .await?;
        Ok(match row {
            Some(row) => LockRelease::NotOwner {
                owner: text(&row, "coordination_locks", "owner")?,
            },
            None => LockRelease::NotHeld,
        })
    }

    /// Releases every lock `owner` holds (a server shutting down); returns how many.
    pub async fn release_locks_of(&self, owner: &str) -> Result<u64, StoreError> {
        let released = sqlx::query(
            "UPDATE coordination_locks SET owner = '', expires_at = 0 \
             WHERE owner = $1 AND owner <> ''",
        )
        .bind(owner)
        .execute(&self.writes)
        .await?;
        Ok(released.rows_affected())
    }

    /// The locks held at `now` (not released, not lapsed), by name.
    pub async fn held_locks(&self, now: Timestamp) -> Result<Vec<LockInfo>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM coordination_locks WHERE owner <> '' AND expires_at > $1 \
             ORDER BY name"
        ))
        .bind(now.as_millis())
        .fetch_all(&self.reads)
        .await?;
        rows.iter().map(decode).collect()
    }
}
