//! PostgreSQL: the instance and worker tables are vacuumed soon after a burst of writes,
//! not only when autovacuum comes by.
//!
//! A deploy rewrites every instance row three or four times on its way to `running`
//! (pending, scheduled, starting, running), each time leaving the old version behind and,
//! since `state` is indexed, a new entry in every index. Until the table is vacuumed its
//! pages are not marked all-visible, so the index-only scans that count a list and walk to
//! its page visit the table for every entry, dead ones included, which makes a page of a
//! freshly deployed fleet's list many times dearer than once the table is vacuumed.
//! Autovacuum's launcher visits a database once a minute by default, so for up to a
//! minute after every deploy the instance list would stay slow.
//!
//! Every [`CHECK_INTERVAL`] this task reads the dead-row counts of [`TABLES`] from the
//! statistics (one cheap query) and vacuums a table that has at least [`MIN_DEAD_ROWS`]
//! dead rows and a tenth as many as live ones, at most once every [`MIN_SPACING`] per
//! table. `SKIP_LOCKED`: a table another server (or autovacuum) is vacuuming is left to
//! it. A vacuum of a table just rewritten is cheap next to the list reads it saves.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::AnyPool;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often the dead-row counts are read.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// The fewest dead rows that get a table vacuumed (and at least a tenth of its live ones).
pub(crate) const MIN_DEAD_ROWS: i64 = 1_000;
/// The least time between two vacuums of one table: during a long burst the table is
/// vacuumed now and then, not on every check.
pub(crate) const MIN_SPACING: Duration = Duration::from_secs(5);
/// The tables whose lists walk their index and whose rows the controllers read whole.
const TABLES: [&str; 2] = ["model_instances", "workers"];

/// Whether a table with `live` and `dead` rows is due a vacuum.
fn due(live: i64, dead: i64) -> bool {
    dead >= MIN_DEAD_ROWS && dead.saturating_mul(10) >= live
}

/// Checks and vacuums through `pool` every [`CHECK_INTERVAL`] until `shutdown`.
pub(crate) fn start(pool: AnyPool, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(CHECK_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: HashMap<&'static str, Instant> = HashMap::new();
        let mut failing = false;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            match check(&pool, &mut last).await {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("vacuuming the instance and worker tables works again");
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "could not read or vacuum the instance and worker tables; autovacuum still does, later (lists may be slow for a minute after a deploy)");
                }
                Err(_) => {}
            }
        }
    });
}

/// One check: reads the dead-row counts and vacuums what is due.
async fn check(
    pool: &AnyPool,
    last: &mut HashMap<&'static str, Instant>,
) -> Result<(), sqlx::Error> {
    use sqlx::Row;
    let names = TABLES.map(|t| format!("'{t}'")).join(", ");
    let rows = sqlx::query(&format!(
        "SELECT relname::text AS name, n_live_tup AS live, n_dead_tup AS dead \
         FROM pg_stat_user_tables WHERE schemaname = current_schema() AND relname IN ({names})"
    ))
    .fetch_all(pool)
    .await?;
    for row in rows {
        let name: String = row.try_get("name")?;
        let (live, dead): (i64, i64) = (row.try_get("live")?, row.try_get("dead")?);
        let Some(table) = TABLES.iter().copied().find(|t| *t == name) else {
            continue;
        };
        if !due(live, dead) || last.get(table).is_some_and(|at| at.elapsed() < MIN_SPACING) {
            continue;
        }
        let started = Instant::now();
        // The table name is one of TABLES, not input.
        sqlx::query(&format!("VACUUM (SKIP_LOCKED) {table}"))
            .execute(pool)
            .await?;
        last.insert(table, Instant::now());
        tracing::debug!(
            table,
            live,
            dead,
            elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
            "vacuumed a table after a burst of writes"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_due_once_its_dead_rows_are_many_and_a_tenth_of_its_live_ones() {
        assert!(!due(10_000, 999), "too few dead rows");
        assert!(due(10_000, 1_000));
        assert!(due(100, 1_000), "a small table rewritten many times");
        assert!(!due(100_000, 9_999), "less than a tenth");
        assert!(due(100_000, 10_000));
        assert!(!due(0, 0));
    }
}
