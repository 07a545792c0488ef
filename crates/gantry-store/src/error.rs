//! What can go wrong in the store, split the way callers must branch.

/// A store failure. `NotFound` and `Conflict` are the caller's business (404, 409);
/// the rest are faults of the database or its contents.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{resource} {key} not found")]
    NotFound { resource: &'static str, key: String },
    #[error("{resource} {key} already exists")]
    Conflict { resource: &'static str, key: String },
    /// The object is referred to by others and cannot go: `by` names them.
    #[error("{resource} {key} is in use by {by}")]
    InUse {
        resource: &'static str,
        key: String,
        by: String,
    },
    /// The request refers to something that does not fit the stored state (an unknown
    /// worker, a GPU index the worker does not have).
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Config(String),
    #[error("database schema is newer than this gantry: found migration {found}, this build knows up to {known}; upgrade gantry")]
    SchemaTooNew { found: i64, known: i64 },
    #[error("row in {table} is not what this gantry wrote: {detail}")]
    Corrupt { table: &'static str, detail: String },
    /// A fenced write was refused: the lease or lock it carried a token of has changed
    /// hands. The caller lost its right to write and must step down.
    #[error("write refused: the {fence} is no longer current (another server took over)")]
    Fenced { fence: String },
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The database is known to be unreachable (see `Store::unreachable`), so it was
    /// not asked.
    #[error("database unreachable: {0}")]
    Unreachable(String),
}

impl StoreError {
    /// The database could not be reached (connection refused or lost, no pooled
    /// connection within the acquire timeout): worth trying again later, unlike an error
    /// in what was asked.
    ///
    /// PostgreSQL also says so itself on a connection it ends: SQLSTATE class `08`
    /// (connection exception) and `57P01`–`57P03` (shut down by an administrator, after
    /// a crash, or not accepting connections yet) — what a pooled connection reads first
    /// after the server was stopped or restarted.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Unreachable(_)
            | StoreError::Database(
                sqlx::Error::Io(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed
                | sqlx::Error::Tls(_),
            ) => true,
            StoreError::Database(sqlx::Error::Database(e)) => e.code().is_some_and(|code| {
                code.starts_with("08") || matches!(code.as_ref(), "57P01" | "57P02" | "57P03")
            }),
            _ => false,
        }
    }

    pub(crate) fn not_found(resource: &'static str, key: impl ToString) -> Self {
        Self::NotFound {
            resource,
            key: key.to_string(),
        }
    }

    pub(crate) fn corrupt(table: &'static str, detail: impl ToString) -> Self {
        Self::Corrupt {
            table,
            detail: detail.to_string(),
        }
    }

    /// Maps a unique-constraint violation to `Conflict`, passing other errors through.
    pub(crate) fn conflict_on_unique(
        error: sqlx::Error,
        resource: &'static str,
        key: impl ToString,
    ) -> Self {
        match &error {
            sqlx::Error::Database(db) if db.is_unique_violation() => Self::Conflict {
                resource,
                key: key.to_string(),
            },
            _ => Self::Database(error),
        }
    }
}
