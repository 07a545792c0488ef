//! The schema, as an ordered list of migrations embedded in the binary and applied at
//! start-up inside one transaction each.
//!
//! Both engines run the same statements; `{id}` stands for the one thing they spell
//! differently, an auto-generated 64-bit primary key; `{now}` is the time the migration
//! runs, in milliseconds. A statement that begins with `{sqlite}` runs on SQLite only (an
//! index the other engine has no use for), one that begins with `{postgres}` on
//! PostgreSQL only (a constraint SQLite cannot add to an existing table). On
//! PostgreSQL an advisory lock serialises servers that start at the same moment.

use sqlx::Row;

use crate::{Engine, Store, StoreError};

struct Migration {
    version: i64,
    name: &'static str,
    statements: &'static [&'static str],
}

// Kept in this flat layout (rustfmt would re-indent every earlier migration when one is
// appended): a migration, once released, never changes, not even in whitespace.
#[rustfmt::skip]
const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "initial schema",
    statements: &[
        "CREATE TABLE users (
            id {id},
            username TEXT NOT NULL UNIQUE,
            password_hash TEXT NOT NULL,
            role TEXT NOT NULL,
            full_name TEXT NOT NULL,
            require_password_change BIGINT NOT NULL,
            session_version BIGINT NOT NULL,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL
        )",
        "CREATE TABLE api_keys (
            id {id},
            user_id BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
            name TEXT NOT NULL,
            description TEXT NOT NULL,
            access_key TEXT NOT NULL UNIQUE,
            lookup_digest TEXT NOT NULL UNIQUE,
            secret_hash TEXT NOT NULL,
            expires_at BIGINT,
            last_used_at BIGINT,
            created_at BIGINT NOT NULL,
            UNIQUE (user_id, name)
        )",
        "CREATE TABLE settings (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL,
            created_at BIGINT NOT NULL
        )",
        "CREATE TABLE workers (
            id {id},
            name TEXT NOT NULL UNIQUE,
            state TEXT NOT NULL,
            state_message TEXT NOT NULL,
            labels TEXT NOT NULL,
            address TEXT NOT NULL,
            status TEXT NOT NULL,
            credential_digest TEXT UNIQUE,
            api_token TEXT NOT NULL,
            last_heartbeat_at BIGINT,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL
        )",
        "CREATE TABLE models (
            id {id},
            name TEXT NOT NULL UNIQUE,
            backend TEXT NOT NULL,
            replicas BIGINT NOT NULL,
            spec TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL
        )",
        "CREATE TABLE model_instances (
            id {id},
            name TEXT NOT NULL UNIQUE,
            model_id BIGINT NOT NULL REFERENCES models(id) ON DELETE CASCADE,
            replica BIGINT NOT NULL,
            worker_id BIGINT,
            gpu_indexes TEXT NOT NULL,
            port BIGINT,
            address TEXT,
            state TEXT NOT NULL,
            state_message TEXT NOT NULL,
            resource_claim TEXT,
            restart_count BIGINT NOT NULL,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL,
            UNIQUE (model_id, replica)
        )",
        "CREATE INDEX model_instances_worker ON model_instances (worker_id)",
        "CREATE INDEX model_instances_state ON model_instances (state)",
    ],
}, Migration {
    version: 2,
    name: "gateway usage records",
    statements: &[
        // One row per minute, user, API key (0: a session token) and model; see
        // usage.rs. No foreign keys: usage outlives the keys and users it names.
        "CREATE TABLE usage_records (
            id {id},
            minute_start BIGINT NOT NULL,
            user_id BIGINT NOT NULL,
            api_key_id BIGINT NOT NULL,
            model_name TEXT NOT NULL,
            request_count BIGINT NOT NULL,
            prompt_tokens BIGINT NOT NULL,
            completion_tokens BIGINT NOT NULL,
            total_tokens BIGINT NOT NULL,
            UNIQUE (minute_start, user_id, api_key_id, model_name)
        )",
        "CREATE INDEX usage_records_user ON usage_records (user_id, minute_start)",
        "CREATE INDEX usage_records_model ON usage_records (model_name, minute_start)",
    ],
}, Migration {
    version: 3,
    name: "typed placement records",
    statements: &[
        // The column holds a gantry_types::PlacementRecord now. Records of the older,
        // untyped shape do not decode: their instances keep their GPUs booked and are
        // placed afresh by the scheduler's roll (see placement_record.rs).
        "ALTER TABLE model_instances RENAME COLUMN resource_claim TO placement",
    ],
}, Migration {
    version: 4,
    name: "coordination: leader lease, locks, server registry",
    statements: &[
        // One row (id 1). fencing_token grows by one every time the lease changes hands;
        // holder_locked says whether the holder also holds the session advisory lock
        // (see lease.rs). Times are milliseconds of the database's clock.
        "CREATE TABLE leader_lease (
            id BIGINT PRIMARY KEY,
            holder TEXT,
            fencing_token BIGINT NOT NULL,
            acquired_at BIGINT NOT NULL,
            expires_at BIGINT NOT NULL,
            holder_locked BIGINT NOT NULL
        )",
        "INSERT INTO leader_lease (id, holder, fencing_token, acquired_at, expires_at, holder_locked) \
         VALUES (1, NULL, 0, 0, 0, 0)",
        "CREATE TABLE coordination_locks (
            name TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            token BIGINT NOT NULL,
            acquired_at BIGINT NOT NULL,
            expires_at BIGINT NOT NULL
        )",
        "CREATE TABLE servers (
            server_id TEXT PRIMARY KEY,
            url TEXT NOT NULL,
            version TEXT NOT NULL,
            role TEXT NOT NULL,
            started_at BIGINT NOT NULL,
            last_heartbeat_at BIGINT NOT NULL,
            inflight_requests BIGINT NOT NULL,
            connected_workers BIGINT NOT NULL,
            incarnation TEXT NOT NULL,
            session_pid BIGINT
        )",
    ],
}, Migration {
    version: 5,
    name: "instance download progress",
    statements: &["ALTER TABLE model_instances ADD COLUMN download TEXT"],
}, Migration {
    version: 6,
    name: "uploads",
    statements: &[
        // location: `server:<server id>` while the bytes are on that server's disk, or
        // `s3:<bucket>/<key>`; received: bytes on record (the holder's file is the truth
        // while it receives).
        "CREATE TABLE uploads (
            id {id},
            name TEXT NOT NULL,
            size BIGINT NOT NULL,
            received BIGINT NOT NULL,
            state TEXT NOT NULL,
            sha256 TEXT,
            location TEXT NOT NULL,
            created_by BIGINT NOT NULL,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL
        )",
    ],
}, Migration {
    version: 7,
    name: "inference backends",
    statements: &[
        // spec: the JSON of `gantry_types::CustomBackendSpec`.
        "CREATE TABLE inference_backends (
            id {id},
            name TEXT NOT NULL UNIQUE,
            spec TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL
        )",
        "ALTER TABLE model_instances ADD COLUMN install TEXT",
        "ALTER TABLE model_instances ADD COLUMN backend_version TEXT",
    ],
}, Migration {
    version: 8,
    name: "worker heartbeats in their own table",
    statements: &[
        // A heartbeat rewrites only this narrow row, not the worker's (see workers.rs).
        "CREATE TABLE worker_heartbeats (
            worker_id BIGINT PRIMARY KEY REFERENCES workers(id) ON DELETE CASCADE,
            at BIGINT NOT NULL
        )",
        "INSERT INTO worker_heartbeats (worker_id, at)
            SELECT id, last_heartbeat_at FROM workers WHERE last_heartbeat_at IS NOT NULL",
        "ALTER TABLE workers DROP COLUMN last_heartbeat_at",
    ],
}, Migration {
    version: 9,
    name: "model providers, model routes, API key limits, usage per target",
    statements: &[
        // api_key_sealed: the provider's key sealed with the server secret (see
        // gantry-auth's sealed.rs); headers and models: JSON.
        "CREATE TABLE model_providers (
            id {id},
            name TEXT NOT NULL UNIQUE,
            description TEXT NOT NULL,
            base_url TEXT NOT NULL,
            api_key_sealed TEXT,
            headers TEXT NOT NULL,
            timeout_seconds BIGINT NOT NULL,
            models TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL
        )",
        // targets: the JSON of `Vec<gantry_types::RouteTarget>`.
        "CREATE TABLE model_routes (
            id {id},
            name TEXT NOT NULL UNIQUE,
            description TEXT NOT NULL,
            targets TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL
        )",
        "ALTER TABLE api_keys ADD COLUMN allowed_routes TEXT",
        "ALTER TABLE api_keys ADD COLUMN requests_per_minute BIGINT",
        "ALTER TABLE api_keys ADD COLUMN tokens_per_minute BIGINT",
        // Usage gains the target that answered (the model itself for a plain model);
        // the unique key changes with it, so the table is rebuilt.
        "CREATE TABLE usage_records_v9 (
            id {id},
            minute_start BIGINT NOT NULL,
            user_id BIGINT NOT NULL,
            api_key_id BIGINT NOT NULL,
            model_name TEXT NOT NULL,
            target TEXT NOT NULL,
            request_count BIGINT NOT NULL,
            prompt_tokens BIGINT NOT NULL,
            completion_tokens BIGINT NOT NULL,
            total_tokens BIGINT NOT NULL,
            UNIQUE (minute_start, user_id, api_key_id, model_name, target)
        )",
        "INSERT INTO usage_records_v9 (minute_start, user_id, api_key_id, model_name, target,
            request_count, prompt_tokens, completion_tokens, total_tokens)
            SELECT minute_start, user_id, api_key_id, model_name, model_name,
            request_count, prompt_tokens, completion_tokens, total_tokens FROM usage_records",
        "DROP TABLE usage_records",
        "ALTER TABLE usage_records_v9 RENAME TO usage_records",
        "CREATE INDEX usage_records_user ON usage_records (user_id, minute_start)",
        "CREATE INDEX usage_records_model ON usage_records (model_name, minute_start)",
        // What each server's gateway admitted per limited API key over the last minute,
        // rewritten about once a second: every server adds the others' to its own.
        "CREATE TABLE gateway_key_load (
            server_id TEXT NOT NULL,
            api_key_id BIGINT NOT NULL,
            requests BIGINT NOT NULL,
            tokens BIGINT NOT NULL,
            updated_at BIGINT NOT NULL,
            PRIMARY KEY (server_id, api_key_id)
        )",
    ],
}, Migration {
    version: 10,
    name: "list pages walk a narrow index of ids on SQLite",
    statements: &[
        // A page of workers or instances reads its ids first, `ORDER BY id LIMIT n
        // OFFSET m` (see query.rs). SQLite walks the table itself for that (the id is
        // the rowid), reading every wide row before the page; an index of the ids alone
        // is a fraction of the pages to walk. PostgreSQL walks its primary key index
        // already.
        "{sqlite} CREATE INDEX workers_by_id ON workers (id)",
        "{sqlite} CREATE INDEX model_instances_by_id ON model_instances (id)",
    ],
}, Migration {
    version: 11,
    name: "clusters",
    statements: &[
        // registration_token_sealed: the token sealed with the server secret, so that any
        // server can show it (gantry-auth's sealed.rs); the digest is what registration
        // checks. A database from before clusters gets the default cluster (id 1: the
        // table's first row) with the one token it had; its plaintext is sealed in by
        // the server whose data directory holds it (bootstrap.rs).
        "CREATE TABLE clusters (
            id {id},
            name TEXT NOT NULL UNIQUE,
            description TEXT NOT NULL,
            provider TEXT NOT NULL,
            registration_token_digest TEXT UNIQUE,
            registration_token_sealed TEXT,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL
        )",
        "INSERT INTO clusters (name, description, provider, registration_token_digest,
            registration_token_sealed, created_at, updated_at)
            SELECT 'default', 'Every worker and model from before clusters existed, and \
            every model deployed without naming a cluster.', 'custom',
            (SELECT value FROM settings WHERE key = 'registration_token_digest'), NULL,
            {now}, {now}",
        // Everything that exists belongs to the default cluster. The settings row of the
        // token stays for servers of the previous release, which check it during a
        // rolling upgrade; the default cluster's token is kept equal to it.
        "ALTER TABLE workers ADD COLUMN cluster_id BIGINT NOT NULL DEFAULT 1",
        "ALTER TABLE models ADD COLUMN cluster_id BIGINT NOT NULL DEFAULT 1",
        // The model's cluster, which never changes, on each instance for list filters.
        "ALTER TABLE model_instances ADD COLUMN cluster_id BIGINT NOT NULL DEFAULT 1",
        "CREATE INDEX workers_cluster ON workers (cluster_id)",
        "CREATE INDEX models_cluster ON models (cluster_id)",
        "CREATE INDEX model_instances_cluster ON model_instances (cluster_id)",
        // SQLite cannot add a column that references another table with a default other
        // than NULL; there the store's conditional inserts (a worker or model only into a
        // cluster that exists, a cluster deleted only when empty) keep the same rule on
        // its single writer.
        "{postgres} ALTER TABLE workers ADD CONSTRAINT workers_cluster_fk \
            FOREIGN KEY (cluster_id) REFERENCES clusters (id)",
        "{postgres} ALTER TABLE models ADD CONSTRAINT models_cluster_fk \
            FOREIGN KEY (cluster_id) REFERENCES clusters (id)",
        // The clusters a user administers (a JSON list of ids).
        "ALTER TABLE users ADD COLUMN cluster_admin_of TEXT NOT NULL DEFAULT '[]'",
    ],
}, Migration {
    version: 12,
    name: "worker pools",
    statements: &[
        // spec: JSON of what the pool's machines are (pools.rs); credentials_sealed: the
        // provider's token sealed with the server secret; next_machine: the number the
        // next machine's name takes, so names are never reused.
        "CREATE TABLE worker_pools (
            id {id},
            cluster_id BIGINT NOT NULL,
            name TEXT NOT NULL UNIQUE,
            provider TEXT NOT NULL,
            spec TEXT NOT NULL,
            min_machines BIGINT NOT NULL,
            max_machines BIGINT NOT NULL,
            credentials_sealed TEXT,
            next_machine BIGINT NOT NULL,
            deleting BIGINT NOT NULL,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL
        )",
        "CREATE INDEX worker_pools_cluster ON worker_pools (cluster_id)",
        "{postgres} ALTER TABLE worker_pools ADD CONSTRAINT worker_pools_cluster_fk \
            FOREIGN KEY (cluster_id) REFERENCES clusters (id)",
        // A machine is written before the provider is asked to create it, under the name
        // it will have there: a leader that dies in between leaves a row the next one
        // looks up by that name instead of making a second machine.
        "CREATE TABLE pool_machines (
            id {id},
            pool_id BIGINT NOT NULL REFERENCES worker_pools(id) ON DELETE CASCADE,
            name TEXT NOT NULL UNIQUE,
            state TEXT NOT NULL,
            state_message TEXT NOT NULL,
            external_id TEXT,
            address TEXT,
            worker_id BIGINT,
            idle_since BIGINT,
            attempts BIGINT NOT NULL,
            next_attempt_at BIGINT NOT NULL,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL
        )",
        "CREATE INDEX pool_machines_pool ON pool_machines (pool_id)",
        "CREATE TABLE pool_events (
            id {id},
            pool_id BIGINT NOT NULL REFERENCES worker_pools(id) ON DELETE CASCADE,
            at BIGINT NOT NULL,
            kind TEXT NOT NULL,
            message TEXT NOT NULL
        )",
        "CREATE INDEX pool_events_pool ON pool_events (pool_id, id)",
    ],
}];

/// A migration statement as `engine` runs it, `None` when it is not for that engine.
fn for_engine(statement: &str, engine: Engine, id_column: &str, now: i64) -> Option<String> {
    let statement = if let Some(sqlite_only) = statement.strip_prefix("{sqlite} ") {
        (engine == Engine::Sqlite).then_some(sqlite_only)?
    } else if let Some(postgres_only) = statement.strip_prefix("{postgres} ") {
        (engine == Engine::Postgres).then_some(postgres_only)?
    } else {
        statement
    };
    Some(
        statement
            .replace("{id}", id_column)
            .replace("{now}", &now.to_string()),
    )
}

/// The newest schema version this build knows.
pub(crate) fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// Applies every migration after the recorded version up to `up_to` (the latest, but in
/// tests of upgrades from an older schema: `testing::create_schema_at`).
pub(crate) async fn run(store: &Store, up_to: i64) -> Result<(), StoreError> {
    let id_column = match store.engine {
        Engine::Sqlite => "INTEGER PRIMARY KEY AUTOINCREMENT",
        Engine::Postgres => "BIGSERIAL PRIMARY KEY",
    };
    let mut tx = store.writes.begin().await?;
    if store.engine == Engine::Postgres {
        // Any constant works; it only has to be the same on every gantry server.
        sqlx::query("SELECT pg_advisory_xact_lock(7251001)")
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS gantry_migrations (
            version BIGINT PRIMARY KEY,
            name TEXT NOT NULL,
            applied_at BIGINT NOT NULL
        )",
    )
    .execute(&mut *tx)
    .await?;
    let applied: i64 = sqlx::query("SELECT COALESCE(MAX(version), 0) AS v FROM gantry_migrations")
        .fetch_one(&mut *tx)
        .await?
        .try_get("v")?;
    if applied > latest_version() {
        return Err(StoreError::SchemaTooNew {
            found: applied,
            known: latest_version(),
        });
    }
    for migration in MIGRATIONS
        .iter()
        .filter(|m| m.version > applied && m.version <= up_to)
    {
        for statement in migration.statements {
            let now = gantry_types::Timestamp::now().as_millis();
            let Some(statement) = for_engine(statement, store.engine, id_column, now) else {
                continue;
            };
            sqlx::query(&statement).execute(&mut *tx).await?;
        }
        sqlx::query(
            "INSERT INTO gantry_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
        )
        .bind(migration.version)
        .bind(migration.name)
        .bind(gantry_types::Timestamp::now().as_millis())
        .execute(&mut *tx)
        .await?;
        tracing::info!(
            version = migration.version,
            name = migration.name,
            "applied database migration"
        );
    }
    tx.commit().await?;
    Ok(())
}

/// The schema version recorded in the database; `/readyz` compares it with
/// [`latest_version`].
pub(crate) async fn applied_version(store: &Store) -> Result<i64, StoreError> {
    let v: i64 = sqlx::query("SELECT COALESCE(MAX(version), 0) AS v FROM gantry_migrations")
        .fetch_one(&store.reads)
        .await?
        .try_get("v")?;
    Ok(v)
}

impl Store {
    /// True when every migration this build knows has been applied.
    pub async fn migrations_done(&self) -> Result<bool, StoreError> {
        Ok(applied_version(self).await? >= latest_version())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_only_statement_runs_on_that_engine_alone() {
        let index = "{sqlite} CREATE INDEX t_by_id ON t (id)";
        assert_eq!(
            for_engine(index, Engine::Sqlite, "ID", 0).as_deref(),
            Some("CREATE INDEX t_by_id ON t (id)")
        );
        assert_eq!(for_engine(index, Engine::Postgres, "ID", 0), None);
        let constraint = "{postgres} ALTER TABLE t ADD CONSTRAINT c CHECK (id > 0)";
        assert_eq!(for_engine(constraint, Engine::Sqlite, "ID", 0), None);
        assert_eq!(
            for_engine(constraint, Engine::Postgres, "ID", 0).as_deref(),
            Some("ALTER TABLE t ADD CONSTRAINT c CHECK (id > 0)")
        );
        let table = "CREATE TABLE t (id {id})";
        assert_eq!(
            for_engine(table, Engine::Postgres, "BIGSERIAL PRIMARY KEY", 0).as_deref(),
            Some("CREATE TABLE t (id BIGSERIAL PRIMARY KEY)")
        );
        let row = "INSERT INTO t (at) VALUES ({now})";
        assert_eq!(
            for_engine(row, Engine::Sqlite, "ID", 42).as_deref(),
            Some("INSERT INTO t (at) VALUES (42)")
        );
    }
}
