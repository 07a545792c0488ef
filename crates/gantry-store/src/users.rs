//! The `users` table.

use gantry_types::{Role, Timestamp, User, UserFilter};
use sqlx::any::AnyRow;

use crate::changes::{Change, ChangeKind};
use crate::query::{Filter, Listing, Page};
use crate::rows::{int, json, parse_enum, text, to_json};
use crate::{Store, StoreError};

/// A user with the secrets the API never shows.
#[derive(Debug, Clone)]
pub struct UserRecord {
    pub user: User,
    pub password_hash: String,
    /// Bumped on password change and logout; session tokens carry the version they
    /// were issued under and stop working when it moves.
    pub session_version: i64,
}

/// A user to insert; the password is already hashed.
#[derive(Debug, Clone)]
pub struct NewUser {
    pub username: String,
    pub password_hash: String,
    pub role: Role,
    pub full_name: String,
    pub require_password_change: bool,
    /// The clusters the user administers.
    pub cluster_admin_of: Vec<i64>,
}

/// What [`Store::update_user`] changes; `None` leaves a field as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct UserChanges<'a> {
    pub role: Option<Role>,
    pub full_name: Option<&'a str>,
    pub require_password_change: Option<bool>,
    pub cluster_admin_of: Option<&'a [i64]>,
}

const COLUMNS: &str = "id, username, password_hash, role, full_name, require_password_change, \
                       session_version, cluster_admin_of, created_at, updated_at";

fn decode(row: &AnyRow) -> Result<UserRecord, StoreError> {
    const T: &str = "users";
    Ok(UserRecord {
        user: User {
            id: int(row, T, "id")?,
            username: text(row, T, "username")?,
            role: parse_enum(&text(row, T, "role")?, Role::parse, T, "role")?,
            full_name: text(row, T, "full_name")?,
            require_password_change: int(row, T, "require_password_change")? != 0,
            cluster_admin_of: json(row, T, "cluster_admin_of")?,
            created_at: Timestamp::from_millis(int(row, T, "created_at")?),
            updated_at: Timestamp::from_millis(int(row, T, "updated_at")?),
        },
        password_hash: text(row, T, "password_hash")?,
        session_version: int(row, T, "session_version")?,
    })
}

/// True for the row of the user `$1` when it is not an admin or another admin remains: the
/// condition of a write that may take a user's admin role away.
const KEEPS_AN_ADMIN: &str = "(role <> 'admin' OR EXISTS (SELECT 1 FROM users AS other \
                              WHERE other.role = 'admin' AND other.id <> $1))";

/// How the `users` list reads.
const LISTING: Listing<User> = Listing {
    columns: COLUMNS,
    from: "users",
    count_from: "users",
    alias: None,
    order_by: "id",
    decode: |row| decode(row).map(|record| record.user),
    id_of: |item| item.id,
};

impl Store {
    /// Inserts a user; `Conflict` if the username is taken.
    pub async fn create_user(&self, new: &NewUser) -> Result<User, StoreError> {
        let now = Timestamp::now().as_millis();
        let row = sqlx::query(&format!(
            "INSERT INTO users (username, password_hash, role, full_name, require_password_change, \
             session_version, cluster_admin_of, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, 1, $7, $6, $6) \
             RETURNING {COLUMNS}"
        ))
        .bind(&new.username)
        .bind(&new.password_hash)
        .bind(new.role.as_str())
        .bind(&new.full_name)
        .bind(i64::from(new.require_password_change))
        .bind(now)
        .bind(to_json(&new.cluster_admin_of))
        .fetch_one(&self.writes)
        .await
        .map_err(|e| StoreError::conflict_on_unique(e, "user", &new.username))?;
        let user = decode(&row)?.user;
        self.publish(Change::User(ChangeKind::Created, user.clone()));
        Ok(user)
    }

    /// Inserts the user unless one with that name exists; true when inserted. Used at
    /// bootstrap, where several servers may start at once.
    pub async fn create_user_if_absent(&self, new: &NewUser) -> Result<bool, StoreError> {
        let now = Timestamp::now().as_millis();
        let result = sqlx::query(
            "INSERT INTO users (username, password_hash, role, full_name, require_password_change, \
             session_version, cluster_admin_of, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, 1, $7, $6, $6) \
             ON CONFLICT (username) DO NOTHING",
        )
        .bind(&new.username)
        .bind(&new.password_hash)
        .bind(new.role.as_str())
        .bind(&new.full_name)
        .bind(i64::from(new.require_password_change))
        .bind(now)
        .bind(to_json(&new.cluster_admin_of))
        .execute(&self.writes)
        .await?;
        Ok(result.rows_affected() == 1)
    }

    pub async fn user_record(&self, id: i64) -> Result<UserRecord, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM users WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.reads)
            .await?
            .ok_or_else(|| StoreError::not_found("user", id))?;
        decode(&row)
    }

    pub async fn user_record_by_name(&self, username: &str) -> Result<UserRecord, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM users WHERE username = $1"))
            .bind(username)
            .fetch_optional(&self.reads)
            .await?
            .ok_or_else(|| StoreError::not_found("user", username))?;
        decode(&row)
    }

    pub async fn get_user(&self, id: i64) -> Result<User, StoreError> {
        Ok(self.user_record(id).await?.user)
    }

    pub async fn list_users(
        &self,
        filter: &UserFilter,
        page: Page,
    ) -> Result<(Vec<User>, u64), StoreError> {
        self.list_page(&LISTING, filter, page).await
    }

    /// Updates role, name and flags; `None` leaves a field unchanged. A change of role to
    /// `user` is not written when it would leave no admin: `Ok(None)` then. The condition
    /// is part of the write (and the admins' rows are locked first on PostgreSQL), so two
    /// admins demoting each other at once cannot both succeed.
    pub async fn update_user(
        &self,
        id: i64,
        changes: &UserChanges<'_>,
    ) -> Result<Option<User>, StoreError> {
        let demoting = changes.role == Some(Role::User);
        let mut tx = self.writes.begin().await?;
        if demoting {
            self.lock_admins(&mut tx).await?;
        }
        let row = sqlx::query(&format!(
            "UPDATE users SET role = COALESCE($2, role), full_name = COALESCE($3, full_name), \
             require_password_change = COALESCE($4, require_password_change), updated_at = $5, \
             cluster_admin_of = COALESCE($7, cluster_admin_of) \
             WHERE id = $1 AND ($6 = 0 OR {KEEPS_AN_ADMIN}) RETURNING {COLUMNS}"
        ))
        .bind(id)
        .bind(changes.role.map(|r| r.as_str()))
        .bind(changes.full_name)
        .bind(changes.require_password_change.map(i64::from))
        .bind(Timestamp::now().as_millis())
        .bind(i64::from(demoting))
        .bind(changes.cluster_admin_of.map(|ids| to_json(&ids)))
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        let Some(row) = row else {
            // Refused, or there is no such user: which one, the caller must know.
            self.get_user(id).await?;
            return Ok(None);
        };
        let user = decode(&row)?.user;
        self.publish(Change::User(ChangeKind::Updated, user.clone()));
        Ok(Some(user))
    }

    /// On PostgreSQL, locks the rows of the admins until the end of `tx`, so a write
    /// conditional on [`KEEPS_AN_ADMIN`] waits for any other such write and then reads the
    /// admins as it left them. (SQLite writes one statement at a time.)
    async fn lock_admins(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    ) -> Result<(), StoreError> {
        if self.engine == crate::Engine::Postgres {
            sqlx::query("SELECT id FROM users WHERE role = 'admin' ORDER BY id FOR UPDATE")
                .fetch_all(&mut **tx)
                .await?;
        }
        Ok(())
    }

    /// Replaces the password hash and ends every session of the user.
    pub async fn set_password(
        &self,
        id: i64,
        password_hash: &str,
        require_password_change: bool,
    ) -> Result<User, StoreError> {
        let row = sqlx::query(&format!(
            "UPDATE users SET password_hash = $2, require_password_change = $3, \
             session_version = session_version + 1, updated_at = $4 WHERE id = $1 \
             RETURNING {COLUMNS}"
        ))
        .bind(id)
        .bind(password_hash)
        .bind(i64::from(require_password_change))
        .bind(Timestamp::now().as_millis())
        .fetch_optional(&self.writes)
        .await?
        .ok_or_else(|| StoreError::not_found("user", id))?;
        let user = decode(&row)?.user;
        self.publish(Change::User(ChangeKind::Updated, user.clone()));
        Ok(user)
    }

    /// Ends every session of the user (logout).
    pub async fn bump_session_version(&self, id: i64) -> Result<(), StoreError> {
        let result =
            sqlx::query("UPDATE users SET session_version = session_version + 1 WHERE id = $1")
                .bind(id)
                .execute(&self.writes)
                .await?;
        if result.rows_affected() == 0 {
            return Err(StoreError::not_found("user", id));
        }
        Ok(())
    }

    /// Deletes a user and, by cascade, their API keys. The last admin is not deleted:
    /// `Ok(None)` then (see [`Store::update_user`] for why the condition is in the write).
    pub async fn delete_user(&self, id: i64) -> Result<Option<User>, StoreError> {
        let user = self.get_user(id).await?;
        let keys = self.api_keys_of(id).await?;
        let mut tx = self.writes.begin().await?;
        self.lock_admins(&mut tx).await?;
        let result = sqlx::query(&format!(
            "DELETE FROM users WHERE id = $1 AND {KEEPS_AN_ADMIN}"
        ))
        .bind(id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        if result.rows_affected() == 0 {
            self.get_user(id).await?;
            return Ok(None);
        }
        for key in keys {
            self.publish(Change::ApiKey(ChangeKind::Deleted, key));
        }
        self.publish(Change::User(ChangeKind::Deleted, user.clone()));
        Ok(Some(user))
    }

    /// Number of admins.
    pub async fn count_admins(&self) -> Result<u64, StoreError> {
        let admins = UserFilter {
            role: Some(Role::Admin),
            search: None,
        };
        self.count("users", &Filter::of(&admins, None)).await
    }

    pub(crate) async fn count(&self, table: &str, filter: &Filter) -> Result<u64, StoreError> {
        use sqlx::Row;
        let row = sqlx::query_with(
            &format!("SELECT COUNT(*) AS n FROM {table}{}", filter.where_sql()),
            filter.arguments(),
        )
        .fetch_one(&self.reads)
        .await?;
        let n: i64 = row.try_get("n")?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// Takes cluster `cluster_id` from every user who administers it, inside `tx` (the
/// cluster's deletion); returns those users as written, to publish once it commits.
pub(crate) async fn users_administering(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    cluster_id: i64,
) -> Result<Vec<User>, StoreError> {
    // Few users administer clusters; the list is JSON, so the match is made here.
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM users WHERE cluster_admin_of <> '[]'"
    ))
    .fetch_all(&mut **tx)
    .await?;
    let mut changed = Vec::new();
    for row in &rows {
        let user = decode(row)?.user;
        if !user.cluster_admin_of.contains(&cluster_id) {
            continue;
        }
        let kept: Vec<i64> = user
            .cluster_admin_of
            .iter()
            .copied()
            .filter(|id| *id != cluster_id)
            .collect();
        let row = sqlx::query(&format!(
            "UPDATE users SET cluster_admin_of = $2, updated_at = $3 WHERE id = $1 \
             RETURNING {COLUMNS}"
        ))
        .bind(user.id)
        .bind(to_json(&kept))
        .bind(Timestamp::now().as_millis())
        .fetch_one(&mut **tx)
        .await?;
        changed.push(decode(&row)?.user);
    }
    Ok(changed)
}
