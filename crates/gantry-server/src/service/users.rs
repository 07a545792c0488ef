//! Users: the rules that keep the cluster administrable — there is always an admin, and
//! an admin cannot delete their own account.

use gantry_store::Store;
use gantry_types::{Role, User, UserUpdate};

use crate::auth::password;
use crate::error::{ApiError, ApiResult};

/// Whether a change takes the cluster's last admin away: `admins` is the count now.
fn removes_last_admin(user: &User, becomes_user: bool, admins: u64) -> bool {
    user.role == Role::Admin && becomes_user && admins <= 1
}

/// Changes a user's role, name, password or password-change flag. A new password ends the
/// user's sessions and, unless said otherwise, must be changed at the next login.
pub async fn update(store: &Store, id: i64, update: UserUpdate) -> ApiResult<User> {
    let current = store.get_user(id).await?;
    let demoted = update.role == Some(Role::User);
    if demoted && removes_last_admin(&current, demoted, store.count_admins().await?) {
        return Err(ApiError::conflict(
            "cannot demote the last admin; make another user admin first",
        ));
    }
    if let Some(new_password) = update.password {
        let hash = password::hash(new_password).await?;
        let require = update.require_password_change.unwrap_or(true);
        store.set_password(id, &hash, require).await?;
    }
    Ok(store
        .update_user(
            id,
            update.role,
            update.full_name.as_deref(),
            update.require_password_change,
        )
        .await?)
}

/// Deletes a user and their API keys, on behalf of admin `by`.
pub async fn delete(store: &Store, by: &User, id: i64) -> ApiResult<User> {
    if by.id == id {
        return Err(ApiError::conflict("you cannot delete yourself"));
    }
    let user = store.get_user(id).await?;
    if removes_last_admin(&user, true, store.count_admins().await?) {
        return Err(ApiError::conflict("cannot delete the last admin"));
    }
    store.delete_user(id).await?;
    Ok(user)
}

#[cfg(test)]
mod tests {
    use gantry_types::Timestamp;

    use super::*;

    fn user(role: Role) -> User {
        User {
            id: 1,
            username: "ann".into(),
            role,
            full_name: String::new(),
            require_password_change: false,
            created_at: Timestamp::from_millis(0),
            updated_at: Timestamp::from_millis(0),
        }
    }

    #[test]
    fn the_last_admin_stays_an_admin() {
        assert!(removes_last_admin(&user(Role::Admin), true, 1));
        assert!(!removes_last_admin(&user(Role::Admin), true, 2));
        assert!(!removes_last_admin(&user(Role::Admin), false, 1));
        assert!(!removes_last_admin(&user(Role::User), true, 1));
    }
}
