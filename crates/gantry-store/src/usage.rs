//! The `usage_records` table: what the gateway served, per minute, caller and model,
//! and the cheap counts the `/metrics` endpoint reads.
//!
//! The gateway never writes here on a request's path: it sums usage in memory and a
//! background task adds each batch with [`Store::add_usage`], one upsert per
//! (minute, user, API key, model, target) in one transaction. The model is the name the
//! client sent (a route's, or a deployed model's); the target is what answered (the
//! model itself, another deployed model, or `provider/model`). Because the write is an
//! increment (`ON CONFLICT … DO UPDATE SET n = n + excluded.n`), several servers can add
//! to the same minute's row without coordination.
//!
//! Rows are not tied to users or keys by foreign keys on purpose: usage is history and
//! stays when a key or a user is deleted.
//!
//! Minutes are kept for a retention period; then [`Store::roll_up_usage`] folds each day's
//! minutes into one row per (user, API key, model) at the day's first minute, so the table
//! grows by days, not minutes. A report over a window that reaches rolled-up days counts
//! each day whole at its start.

use gantry_types::{InstanceState, Timestamp, WorkerState};
use sqlx::any::{AnyArguments, AnyRow};
use sqlx::Arguments;

use crate::rows::{int, parse_enum, text};
use crate::{Store, StoreError};

/// The `api_key_id` stored for requests made with a session token instead of a key
/// (the column is part of the unique key, where NULLs would never conflict).
const NO_API_KEY: i64 = 0;

/// Length of one usage bucket.
pub const USAGE_BUCKET_MILLIS: i64 = 60_000;

/// What one caller's requests to one model added during one minute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageIncrement {
    /// Start of the minute (a multiple of [`USAGE_BUCKET_MILLIS`]).
    pub minute_start: Timestamp,
    pub user_id: i64,
    /// `None` for requests authenticated with a session token.
    pub api_key_id: Option<i64>,
    pub model: String,
    /// What answered: the route target's label (the model itself for a plain model).
    pub target: String,
    pub sums: UsageSums,
}

/// Request count and token sums.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageSums {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

impl UsageSums {
    /// Adds another sum to this one, saturating.
    pub fn add(&mut self, other: &UsageSums) {
        self.requests = self.requests.saturating_add(other.requests);
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
        self.total_tokens = self.total_tokens.saturating_add(other.total_tokens);
    }
}

/// Which usage rows a report covers. Every field narrows the selection.
#[derive(Debug, Clone, Default)]
pub struct UsageFilter {
    pub user_id: Option<i64>,
    pub api_key_id: Option<i64>,
    pub model: Option<String>,
    /// Minutes that start at or after this time.
    pub from: Option<Timestamp>,
    /// Minutes that start before this time.
    pub to: Option<Timestamp>,
}

/// Usage of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageByModel {
    pub model: String,
    pub sums: UsageSums,
}

/// Usage of one route (or model) through one of its targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageByTarget {
    pub model: String,
    pub target: String,
    pub sums: UsageSums,
}

/// Usage of one model through one API key (or one user's session tokens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageByApiKey {
    pub user_id: i64,
    /// `None`: requests made with a session token.
    pub api_key_id: Option<i64>,
    pub model: String,
    pub sums: UsageSums,
}

/// Usage of one user's API key (or session tokens) on one model during one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsagePoint {
    /// Start of the bucket (a multiple of its length since the Unix epoch, UTC).
    pub start: Timestamp,
    pub usage: UsageByApiKey,
}

/// Length of a day, the unit usage is rolled up into.
pub const USAGE_DAY_MILLIS: i64 = 86_400_000;

/// The minute a time falls in.
pub fn usage_minute_of(at: Timestamp) -> Timestamp {
    Timestamp::from_millis(at.as_millis().div_euclid(USAGE_BUCKET_MILLIS) * USAGE_BUCKET_MILLIS)
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn count_of(row: &AnyRow, column: &str) -> Result<u64, StoreError> {
    Ok(u64::try_from(int(row, "usage_records", column)?).unwrap_or(0))
}

fn sums_of(row: &AnyRow) -> Result<UsageSums, StoreError> {
    Ok(UsageSums {
        requests: count_of(row, "requests")?,
        prompt_tokens: count_of(row, "prompt_tokens")?,
        completion_tokens: count_of(row, "completion_tokens")?,
        total_tokens: count_of(row, "total_tokens")?,
    })
}

/// `SUM` of a BIGINT is NUMERIC on PostgreSQL; the cast keeps both engines at BIGINT.
const SUMS_SQL: &str = "CAST(SUM(request_count) AS BIGINT) AS requests, \
     CAST(SUM(prompt_tokens) AS BIGINT) AS prompt_tokens, \
     CAST(SUM(completion_tokens) AS BIGINT) AS completion_tokens, \
     CAST(SUM(total_tokens) AS BIGINT) AS total_tokens";

/// Adds one row's sums to its (minute, user, API key, model) row, creating it if needed.
const ADD_SQL: &str = "INSERT INTO usage_records (minute_start, user_id, api_key_id, model_name, \
     request_count, prompt_tokens, completion_tokens, total_tokens, target) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
     ON CONFLICT (minute_start, user_id, api_key_id, model_name, target) DO UPDATE SET \
     request_count = usage_records.request_count + excluded.request_count, \
     prompt_tokens = usage_records.prompt_tokens + excluded.prompt_tokens, \
     completion_tokens = usage_records.completion_tokens + excluded.completion_tokens, \
     total_tokens = usage_records.total_tokens + excluded.total_tokens";

/// Adds `usage` to its caller's row of the minute (or day) starting at `start`, for
/// requests `target` answered.
async fn add_row(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    start: Timestamp,
    usage: &UsageByApiKey,
    target: &str,
) -> Result<(), StoreError> {
    sqlx::query(ADD_SQL)
        .bind(start.as_millis())
        .bind(usage.user_id)
        .bind(usage.api_key_id.unwrap_or(NO_API_KEY))
        .bind(&usage.model)
        .bind(to_i64(usage.sums.requests))
        .bind(to_i64(usage.sums.prompt_tokens))
        .bind(to_i64(usage.sums.completion_tokens))
        .bind(to_i64(usage.sums.total_tokens))
        .bind(target)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A row's caller (user and API key), model and sums.
fn caller_usage_of(row: &AnyRow) -> Result<UsageByApiKey, StoreError> {
    let api_key_id = int(row, "usage_records", "api_key_id")?;
    Ok(UsageByApiKey {
        user_id: int(row, "usage_records", "user_id")?,
        api_key_id: (api_key_id != NO_API_KEY).then_some(api_key_id),
        model: text(row, "usage_records", "model_name")?,
        sums: sums_of(row)?,
    })
}

fn where_of(filter: &UsageFilter) -> (String, AnyArguments<'static>) {
    let mut clauses = Vec::new();
    let mut arguments = AnyArguments::default();
    // Adding an i64 or a String to AnyArguments cannot fail: every engine supports both.
    if let Some(user_id) = filter.user_id {
        let _ = arguments.add(user_id);
        clauses.push(format!("user_id = ${}", clauses.len() + 1));
    }
    if let Some(api_key_id) = filter.api_key_id {
        let _ = arguments.add(api_key_id);
        clauses.push(format!("api_key_id = ${}", clauses.len() + 1));
    }
    if let Some(model) = &filter.model {
        let _ = arguments.add(model.clone());
        clauses.push(format!("model_name = ${}", clauses.len() + 1));
    }
    if let Some(from) = filter.from {
        let _ = arguments.add(from.as_millis());
        clauses.push(format!("minute_start >= ${}", clauses.len() + 1));
    }
    if let Some(to) = filter.to {
        let _ = arguments.add(to.as_millis());
        clauses.push(format!("minute_start < ${}", clauses.len() + 1));
    }
    let sql = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    (sql, arguments)
}

impl Store {
    /// Adds a batch of usage increments in one transaction.
    pub async fn add_usage(&self, increments: &[UsageIncrement]) -> Result<(), StoreError> {
        if increments.is_empty() {
            return Ok(());
        }
        let mut tx = self.writes.begin().await?;
        for increment in increments {
            let usage = UsageByApiKey {
                user_id: increment.user_id,
                api_key_id: increment.api_key_id,
                model: increment.model.clone(),
                sums: increment.sums,
            };
            add_row(
                &mut tx,
                usage_minute_of(increment.minute_start),
                &usage,
                &increment.target,
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Usage summed per model, ordered by model name.
    pub async fn usage_by_model(
        &self,
        filter: &UsageFilter,
    ) -> Result<Vec<UsageByModel>, StoreError> {
        let (where_sql, arguments) = where_of(filter);
        let rows = sqlx::query_with(
            &format!(
                "SELECT model_name, {SUMS_SQL} FROM usage_records{where_sql} \
                 GROUP BY model_name ORDER BY model_name"
            ),
            arguments,
        )
        .fetch_all(&self.reads)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(UsageByModel {
                    model: text(row, "usage_records", "model_name")?,
                    sums: sums_of(row)?,
                })
            })
            .collect()
    }

    /// Usage summed per model and target, ordered by both.
    pub async fn usage_by_target(
        &self,
        filter: &UsageFilter,
    ) -> Result<Vec<UsageByTarget>, StoreError> {
        let (where_sql, arguments) = where_of(filter);
        let rows = sqlx::query_with(
            &format!(
                "SELECT model_name, target, {SUMS_SQL} FROM usage_records{where_sql} \
                 GROUP BY model_name, target ORDER BY model_name, target"
            ),
            arguments,
        )
        .fetch_all(&self.reads)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(UsageByTarget {
                    model: text(row, "usage_records", "model_name")?,
                    target: text(row, "usage_records", "target")?,
                    sums: sums_of(row)?,
                })
            })
            .collect()
    }

    /// Usage summed per user, API key and model.
    pub async fn usage_by_api_key(
        &self,
        filter: &UsageFilter,
    ) -> Result<Vec<UsageByApiKey>, StoreError> {
        let (where_sql, arguments) = where_of(filter);
        let rows = sqlx::query_with(
            &format!(
                "SELECT user_id, api_key_id, model_name, {SUMS_SQL} FROM usage_records{where_sql} \
                 GROUP BY user_id, api_key_id, model_name \
                 ORDER BY user_id, api_key_id, model_name"
            ),
            arguments,
        )
        .fetch_all(&self.reads)
        .await?;
        rows.iter().map(caller_usage_of).collect()
    }

    /// Usage summed per bucket of `bucket_millis` (a multiple of a minute), user, API key
    /// and model, ordered by bucket.
    pub async fn usage_series(
        &self,
        filter: &UsageFilter,
        bucket_millis: i64,
    ) -> Result<Vec<UsagePoint>, StoreError> {
        let bucket_millis = bucket_millis.max(USAGE_BUCKET_MILLIS);
        let (where_sql, arguments) = where_of(filter);
        // Rows start at or after the epoch, so integer division rounds down.
        let bucket = format!("(minute_start / {bucket_millis}) * {bucket_millis}");
        let rows = sqlx::query_with(
            &format!(
                "SELECT {bucket} AS bucket_start, user_id, api_key_id, model_name, {SUMS_SQL} \
                 FROM usage_records{where_sql} \
                 GROUP BY {bucket}, user_id, api_key_id, model_name \
                 ORDER BY bucket_start, user_id, api_key_id, model_name"
            ),
            arguments,
        )
        .fetch_all(&self.reads)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(UsagePoint {
                    start: Timestamp::from_millis(int(row, "usage_records", "bucket_start")?),
                    usage: caller_usage_of(row)?,
                })
            })
            .collect()
    }

    /// Folds the minutes of every whole day that ends at or before `before` into one row
    /// per (user, API key, model) at the day's first minute. Returns how many minute rows
    /// were folded.
    ///
    /// Each day is one transaction that deletes its minutes (all but the first, which
    /// takes the sums) and adds them up: a server doing the same day at the same moment
    /// finds the rows already deleted (PostgreSQL makes it wait for the first's
    /// transaction; SQLite has one writer), so nothing is counted twice.
    pub async fn roll_up_usage(&self, before: Timestamp) -> Result<u64, StoreError> {
        let mut folded = 0;
        loop {
            let next = sqlx::query(
                "SELECT MIN(minute_start) AS first FROM usage_records \
                 WHERE minute_start < $1 AND minute_start % $2 <> 0",
            )
            .bind(before.as_millis().div_euclid(USAGE_DAY_MILLIS) * USAGE_DAY_MILLIS)
            .bind(USAGE_DAY_MILLIS)
            .fetch_one(&self.reads)
            .await?;
            let Some(first) = crate::rows::opt_int(&next, "usage_records", "first")? else {
                return Ok(folded);
            };
            let day = first.div_euclid(USAGE_DAY_MILLIS) * USAGE_DAY_MILLIS;
            folded += self.roll_up_usage_day(day).await?;
        }
    }

    async fn roll_up_usage_day(&self, day: i64) -> Result<u64, StoreError> {
        let mut tx = self.writes.begin().await?;
        let rows = sqlx::query(
            "DELETE FROM usage_records WHERE minute_start > $1 AND minute_start < $2 \
             RETURNING user_id, api_key_id, model_name, target, request_count AS requests, \
             prompt_tokens, completion_tokens, total_tokens",
        )
        .bind(day)
        .bind(day + USAGE_DAY_MILLIS)
        .fetch_all(&mut *tx)
        .await?;
        // One row per caller, model and target, in a stable order.
        let mut days: std::collections::BTreeMap<(i64, i64, String, String), UsageByApiKey> =
            std::collections::BTreeMap::new();
        for row in &rows {
            let usage = caller_usage_of(row)?;
            let key = (
                usage.user_id,
                usage.api_key_id.unwrap_or(NO_API_KEY),
                usage.model.clone(),
                text(row, "usage_records", "target")?,
            );
            match days.entry(key) {
                std::collections::btree_map::Entry::Occupied(mut day) => {
                    day.get_mut().sums.add(&usage.sums)
                }
                std::collections::btree_map::Entry::Vacant(day) => {
                    day.insert(usage);
                }
            }
        }
        for ((.., target), usage) in &days {
            add_row(&mut tx, Timestamp::from_millis(day), usage, target).await?;
        }
        tx.commit().await?;
        let folded = rows.len() as u64;
        if folded > 0 {
            tracing::info!(
                day = %Timestamp::from_millis(day),
                minutes = folded,
                rows = days.len(),
                "rolled a day of usage up"
            );
        }
        Ok(folded)
    }

    /// How many instances are in each state (states with none are absent). One
    /// grouped read, for `/metrics`.
    pub async fn count_instances_by_state(&self) -> Result<Vec<(InstanceState, u64)>, StoreError> {
        let rows = sqlx::query("SELECT state, COUNT(*) AS n FROM model_instances GROUP BY state")
            .fetch_all(&self.reads)
            .await?;
        let mut counts = Vec::with_capacity(rows.len());
        for row in &rows {
            const T: &str = "model_instances";
            let state = parse_enum(&text(row, T, "state")?, InstanceState::parse, T, "state")?;
            counts.push((state, u64::try_from(int(row, T, "n")?).unwrap_or(0)));
        }
        Ok(counts)
    }

    /// How many workers are in each state (states with none are absent). One grouped
    /// read, for `/metrics`.
    pub async fn count_workers_by_state(&self) -> Result<Vec<(WorkerState, u64)>, StoreError> {
        let rows = sqlx::query("SELECT state, COUNT(*) AS n FROM workers GROUP BY state")
            .fetch_all(&self.reads)
            .await?;
        let mut counts = Vec::with_capacity(rows.len());
        for row in &rows {
            const T: &str = "workers";
            let state = parse_enum(&text(row, T, "state")?, WorkerState::parse, T, "state")?;
            counts.push((state, u64::try_from(int(row, T, "n")?).unwrap_or(0)));
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::StoreConfig;

    fn sums(requests: u64, prompt: u64, completion: u64) -> UsageSums {
        UsageSums {
            requests,
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
        }
    }

    #[test]
    fn usage_minute_of_rounds_down_to_the_minute() {
        assert_eq!(
            usage_minute_of(Timestamp::from_millis(120_999)).as_millis(),
            120_000
        );
        assert_eq!(
            usage_minute_of(Timestamp::from_millis(-1)).as_millis(),
            -60_000
        );
    }

    #[tokio::test]
    async fn add_usage_adds_to_the_same_minute_and_reports_filter_by_caller_model_and_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&StoreConfig {
            url: format!("sqlite://{}/gantry.db", dir.path().display()),
            max_connections: 2,
        })
        .await
        .unwrap();
        let minute = |m: i64| Timestamp::from_millis(m * USAGE_BUCKET_MILLIS + 1234);
        let increment = |m: i64, key: Option<i64>, model: &str, s: UsageSums| UsageIncrement {
            minute_start: minute(m),
            user_id: 1,
            api_key_id: key,
            model: model.to_string(),
            target: model.to_string(),
            sums: s,
        };
        store
            .add_usage(&[
                increment(10, Some(7), "a", sums(1, 10, 5)),
                increment(10, None, "a", sums(2, 1, 1)),
                increment(11, Some(7), "b", sums(1, 3, 3)),
            ])
            .await
            .unwrap();
        // The same minute, key and model again: added to the existing row.
        store
            .add_usage(&[increment(10, Some(7), "a", sums(1, 10, 5))])
            .await
            .unwrap();

        let all = store.usage_by_model(&UsageFilter::default()).await.unwrap();
        assert_eq!(
            all,
            vec![
                UsageByModel {
                    model: "a".into(),
                    sums: sums(4, 21, 11)
                },
                UsageByModel {
                    model: "b".into(),
                    sums: sums(1, 3, 3)
                },
            ]
        );
        let by_key = store
            .usage_by_api_key(&UsageFilter {
                model: Some("a".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(by_key.len(), 2);
        assert_eq!(by_key[0].api_key_id, None);
        assert_eq!(by_key[0].sums, sums(2, 1, 1));
        assert_eq!(by_key[1].api_key_id, Some(7));
        assert_eq!(by_key[1].sums, sums(2, 20, 10));

        let minute_eleven = store
            .usage_by_model(&UsageFilter {
                from: Some(Timestamp::from_millis(11 * USAGE_BUCKET_MILLIS)),
                to: Some(Timestamp::from_millis(12 * USAGE_BUCKET_MILLIS)),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(minute_eleven.len(), 1);
        assert_eq!(minute_eleven[0].model, "b");
        let other_user = store
            .usage_by_model(&UsageFilter {
                user_id: Some(2),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(other_user.is_empty());
        store.close().await;
    }
}
