//! The `model_routes` table: public model names with their targets.

use gantry_types::{ModelRoute, RouteTarget, Timestamp};
use sqlx::any::AnyRow;

use crate::changes::{Change, ChangeKind};
use crate::rows::{int, json, text, to_json};
use crate::{Store, StoreError};

const COLUMNS: &str = "id, name, description, targets, created_at, updated_at";
const T: &str = "model_routes";

fn decode(row: &AnyRow) -> Result<ModelRoute, StoreError> {
    Ok(ModelRoute {
        id: int(row, T, "id")?,
        name: text(row, T, "name")?,
        description: text(row, T, "description")?,
        targets: json(row, T, "targets")?,
        created_at: Timestamp::from_millis(int(row, T, "created_at")?),
        updated_at: Timestamp::from_millis(int(row, T, "updated_at")?),
    })
}

/// The names of the routes with a target at provider `name`.
pub(crate) async fn routes_using_provider(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    name: &str,
) -> Result<Vec<String>, StoreError> {
    let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM model_routes ORDER BY name"))
        .fetch_all(&mut **tx)
        .await?;
    let mut users = Vec::new();
    for row in &rows {
        let route = decode(row)?;
        if route
            .targets
            .iter()
            .any(|t| t.provider.as_deref() == Some(name))
        {
            users.push(route.name);
        }
    }
    Ok(users)
}

impl Store {
    /// Adds a route. `Conflict` when the name is taken.
    pub async fn create_route(
        &self,
        name: &str,
        description: &str,
        targets: &[RouteTarget],
    ) -> Result<ModelRoute, StoreError> {
        let now = Timestamp::now().as_millis();
        let row = sqlx::query(&format!(
            "INSERT INTO model_routes (name, description, targets, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $4) RETURNING {COLUMNS}"
        ))
        .bind(name)
        .bind(description)
        .bind(to_json(&targets))
        .bind(now)
        .fetch_one(&self.writes)
        .await
        .map_err(|e| StoreError::conflict_on_unique(e, "model route", name))?;
        let route = decode(&row)?;
        self.publish(Change::Route(ChangeKind::Created, route.clone()));
        Ok(route)
    }

    pub async fn get_route(&self, name: &str) -> Result<ModelRoute, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM model_routes WHERE name = $1"
        ))
        .bind(name)
        .fetch_optional(&self.reads)
        .await?
        .ok_or_else(|| StoreError::not_found("model route", name))?;
        decode(&row)
    }

    pub(crate) async fn get_route_by_id(&self, id: i64) -> Result<ModelRoute, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM model_routes WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.reads)
            .await?
            .ok_or_else(|| StoreError::not_found("model route", id))?;
        decode(&row)
    }

    /// Every route, by name.
    pub async fn list_routes(&self) -> Result<Vec<ModelRoute>, StoreError> {
        let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM model_routes ORDER BY name"))
            .fetch_all(&self.reads)
            .await?;
        rows.iter().map(decode).collect()
    }

    /// Writes a route's description and targets, if it is still the one read at
    /// `read_at` (its `updated_at`): `Conflict` when someone changed it in between.
    pub async fn update_route(
        &self,
        name: &str,
        read_at: Timestamp,
        description: &str,
        targets: &[RouteTarget],
    ) -> Result<ModelRoute, StoreError> {
        let now = Timestamp::now().as_millis().max(read_at.as_millis() + 1);
        let row = sqlx::query(&format!(
            "UPDATE model_routes SET description = $2, targets = $3, updated_at = $4 \
             WHERE name = $1 AND updated_at = $5 RETURNING {COLUMNS}"
        ))
        .bind(name)
        .bind(description)
        .bind(to_json(&targets))
        .bind(now)
        .bind(read_at.as_millis())
        .fetch_optional(&self.writes)
        .await?;
        match row {
            Some(row) => {
                let route = decode(&row)?;
                self.publish(Change::Route(ChangeKind::Updated, route.clone()));
                Ok(route)
            }
            None => {
                self.get_route(name).await?;
                Err(StoreError::Conflict {
                    resource: "model route",
                    key: format!("{name} (changed by another request meanwhile; read it again)"),
                })
            }
        }
    }

    pub async fn delete_route(&self, name: &str) -> Result<(), StoreError> {
        let route = self.get_route(name).await?;
        let result = sqlx::query("DELETE FROM model_routes WHERE name = $1")
            .bind(name)
            .execute(&self.writes)
            .await?;
        if result.rows_affected() == 0 {
            return Err(StoreError::not_found("model route", name));
        }
        self.publish(Change::Route(ChangeKind::Deleted, route));
        Ok(())
    }
}
