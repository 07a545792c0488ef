//! Users: the rules that keep the cluster administrable — there is always an admin, and
//! an admin cannot delete their own account.

use gantry_store::{Store, UserChanges};
use gantry_types::{User, UserUpdate};

use crate::auth::password;
use crate::error::{ApiError, ApiResult};

/// The clusters a user is to administer must exist (422 naming the first that does not).
pub async fn check_clusters(store: &Store, ids: &[i64]) -> ApiResult<()> {
    for id in ids {
        super::clusters::named_in_request(store, "cluster_admin_of", *id).await?;
    }
    Ok(())
}

/// Changes a user's role, name, password, password-change flag or administered clusters.
/// A new password ends the user's sessions and, unless said otherwise, must be changed at
/// the next login. The last admin keeps the role (409): the store refuses the write that
/// would leave no admin.
pub async fn update(store: &Store, id: i64, update: UserUpdate) -> ApiResult<User> {
    if let Some(ids) = &update.cluster_admin_of {
        check_clusters(store, ids).await?;
    }
    let changes = UserChanges {
        role: update.role,
        full_name: update.full_name.as_deref(),
        require_password_change: update.require_password_change,
        cluster_admin_of: update.cluster_admin_of.as_deref(),
    };
    let Some(user) = store.update_user(id, &changes).await? else {
        let user = store.get_user(id).await?;
        return Err(ApiError::conflict(format!(
            "{} is the last admin, so their role cannot change to user: make another user \
             an admin first",
            user.username
        )));
    };
    let Some(new_password) = update.password else {
        return Ok(user);
    };
    let hash = password::hash(new_password).await?;
    let require = update.require_password_change.unwrap_or(true);
    Ok(store.set_password(id, &hash, require).await?)
}

/// Deletes a user and their API keys, on behalf of admin `by`. The last admin stays (409).
pub async fn delete(store: &Store, by: &User, id: i64) -> ApiResult<User> {
    if by.id == id {
        return Err(ApiError::conflict("you cannot delete yourself"));
    }
    match store.delete_user(id).await? {
        Some(user) => Ok(user),
        None => {
            let user = store.get_user(id).await?;
            Err(ApiError::conflict(format!(
                "{} is the last admin and cannot be deleted: make another user an admin first",
                user.username
            )))
        }
    }
}
