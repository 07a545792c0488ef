//! `/api/v1/usage`: what the gateway served — requests and tokens per model, per
//! API key and per route target. Admins see everyone's usage and may filter by user; everyone else sees
//! their own. Usage is recorded per minute and written about once a second, so the
//! newest second of traffic may not show yet.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;
use gantry_store::{UsageByApiKey, UsageFilter, UsageSums};
use gantry_types::usage::{
    ApiKeyUsage, ModelUsage, TargetUsage, UsagePoint, UsageQuery, UsageReport, UsageTotals,
};
use gantry_types::Role;

use crate::auth::Auth;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiQuery;
use crate::state::AppState;

/// Requests and tokens served by the gateway, per model and per API key; with `bucket`,
/// also over time (`series`).
#[utoipa::path(get, path = "/api/v1/usage", tag = "usage", security(("bearer" = [])), params(UsageQuery),
    responses((status = 200, body = UsageReport), (status = 400, body = gantry_types::ErrorBody),
        (status = 403, body = gantry_types::ErrorBody)))]
pub async fn report(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiQuery(query): ApiQuery<UsageQuery>,
) -> ApiResult<Json<UsageReport>> {
    let user = principal.require_user()?;
    let user_id = match (user.role, query.user_id) {
        (Role::Admin, requested) => requested,
        (Role::User, None) => Some(user.id),
        (Role::User, Some(requested)) if requested == user.id => Some(user.id),
        (Role::User, Some(_)) => {
            return Err(ApiError::forbidden(
                "only admins can see other users' usage",
            ))
        }
    };
    let filter = UsageFilter {
        user_id,
        api_key_id: query.api_key_id,
        model: query.model.clone(),
        from: query.from,
        to: query.to,
    };
    // One read, so that the totals, the models, the keys and the series agree (a flush
    // between two reads would make them differ): with a bucket, the rest is summed from
    // the series.
    let (by_key, series) = match query.bucket {
        None => (state.store.usage_by_api_key(&filter).await?, None),
        Some(bucket) => {
            let points = state.store.usage_series(&filter, bucket.millis()).await?;
            let mut keys: BTreeMap<(i64, i64, &str), UsageByApiKey> = BTreeMap::new();
            for point in &points {
                let usage = &point.usage;
                let key = (
                    usage.user_id,
                    usage.api_key_id.unwrap_or(0),
                    usage.model.as_str(),
                );
                keys.entry(key)
                    .or_insert_with(|| UsageByApiKey {
                        sums: UsageSums::default(),
                        ..usage.clone()
                    })
                    .sums
                    .add(&usage.sums);
            }
            let by_key = keys.into_values().collect();
            let series = points
                .into_iter()
                .map(|point| UsagePoint {
                    start: point.start,
                    user_id: point.usage.user_id,
                    api_key_id: point.usage.api_key_id,
                    model: point.usage.model,
                    totals: totals(point.usage.sums),
                })
                .collect();
            (by_key, Some(series))
        }
    };
    let targets = state
        .store
        .usage_by_target(&filter)
        .await?
        .into_iter()
        .map(|row| TargetUsage {
            model: row.model,
            target: row.target,
            totals: totals(row.sums),
        })
        .collect();
    let mut total = UsageSums::default();
    let mut by_model: BTreeMap<&str, UsageSums> = BTreeMap::new();
    for row in &by_key {
        total.add(&row.sums);
        by_model
            .entry(row.model.as_str())
            .or_default()
            .add(&row.sums);
    }
    let models = by_model
        .into_iter()
        .map(|(model, sums)| ModelUsage {
            model: model.to_string(),
            totals: totals(sums),
        })
        .collect();
    Ok(Json(UsageReport {
        user_id,
        api_key_id: query.api_key_id,
        model: query.model,
        from: query.from,
        to: query.to,
        total: totals(total),
        models,
        api_keys: by_key
            .into_iter()
            .map(|row| ApiKeyUsage {
                user_id: row.user_id,
                api_key_id: row.api_key_id,
                model: row.model,
                totals: totals(row.sums),
            })
            .collect(),
        targets,
        bucket: query.bucket,
        series,
    }))
}

fn totals(sums: UsageSums) -> UsageTotals {
    UsageTotals {
        requests: sums.requests,
        prompt_tokens: sums.prompt_tokens,
        completion_tokens: sums.completion_tokens,
        total_tokens: sums.total_tokens,
    }
}
