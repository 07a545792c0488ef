//! `gantry backup` and `gantry restore`: the embedded SQLite database copied out while
//! the server runs, and put back with the server stopped. PostgreSQL has its own tools
//! (`pg_dump`, `pg_restore`); both commands say so.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use gantry_server::ServerConfig;
use gantry_store::{Store, StoreConfig};
use gantry_types::Timestamp;

/// The SQLite file of this configuration, which must exist; PostgreSQL is refused.
fn database_file(server: &ServerConfig, what: &str) -> anyhow::Result<PathBuf> {
    if server.is_multi_server() {
        bail!("gantry {what} handles the embedded SQLite database; for PostgreSQL use pg_dump and pg_restore (see the README)");
    }
    let url = server.effective_database_url();
    let path = PathBuf::from(
        url.trim_start_matches("sqlite://")
            .trim_start_matches("sqlite:")
            .split('?')
            .next()
            .unwrap_or_default(),
    );
    if !path.is_file() {
        bail!(
            "no database at {}; give the data_dir (or database_url) the server uses",
            path.display()
        );
    }
    Ok(path)
}

async fn open(path: &Path) -> anyhow::Result<Store> {
    Ok(Store::open(&StoreConfig {
        url: format!("sqlite://{}", path.display()),
        max_connections: 1,
    })
    .await?)
}

/// `gantry backup --out FILE`.
pub async fn backup(server: &ServerConfig, out: &Path) -> anyhow::Result<()> {
    let path = database_file(server, "backup")?;
    let store = open(&path).await?;
    store
        .backup_to(out)
        .await
        .with_context(|| format!("back up {} to {}", path.display(), out.display()))?;
    store.close().await;
    let size = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    println!(
        "wrote {} ({size} bytes), a copy of {} as of now; restore it with: gantry restore --from {}",
        out.display(),
        path.display(),
        out.display()
    );
    Ok(())
}

/// `gantry restore --from FILE`.
pub async fn restore(server: &ServerConfig, from: &Path) -> anyhow::Result<()> {
    let path = database_file(server, "restore")?;
    if !from.is_file() {
        bail!("no backup at {}", from.display());
    }
    // A server heard from within server_timeout is running on this database.
    let store = open(&path).await?;
    let now = Timestamp::now().as_millis();
    let timeout = i64::try_from(server.server_timeout.as_millis()).unwrap_or(i64::MAX);
    let running: Vec<String> = store
        .list_servers()
        .await?
        .into_iter()
        .filter(|s| now - s.last_heartbeat_at.as_millis() < timeout)
        .map(|s| format!("{} ({})", s.server_id, s.url))
        .collect();
    store.close().await;
    if !running.is_empty() {
        bail!(
            "a server is running on {}: {}; stop it first (a running server would keep writing to the database being replaced)",
            path.display(),
            running.join(", ")
        );
    }
    // The backup must open as a gantry database of this version or older.
    let check =
        std::env::temp_dir().join(format!("gantry-restore-check-{}.db", std::process::id()));
    std::fs::copy(from, &check).with_context(|| format!("read {}", from.display()))?;
    let checked = open(&check).await;
    if let Ok(store) = &checked {
        store.close().await;
    }
    let _ = std::fs::remove_file(&check);
    checked.with_context(|| {
        format!(
            "{} is not a gantry database this version can use",
            from.display()
        )
    })?;

    // The database being replaced, with its WAL, is kept beside it.
    let suffix = format!("before-restore-{}", now / 1000);
    let mut kept = Vec::new();
    for extension in ["", "-wal", "-shm"] {
        let file = PathBuf::from(format!("{}{extension}", path.display()));
        if file.exists() {
            let aside = PathBuf::from(format!("{}{extension}.{suffix}", path.display()));
            std::fs::rename(&file, &aside)
                .with_context(|| format!("move {} aside", file.display()))?;
            kept.push(aside);
        }
    }
    std::fs::copy(from, &path).with_context(|| format!("write {}", path.display()))?;
    // The backup's server registry describes the processes of its moment, not the one
    // about to start: without this, a server started within server_timeout of the backup
    // would take its own old row for another live server.
    let restored = open(&path).await?;
    restored
        .forget_servers_silent_since(Timestamp::from_millis(i64::MAX))
        .await?;
    restored.close().await;
    println!(
        "restored {} from {}; the database it replaced is kept as {}",
        path.display(),
        from.display(),
        kept.first()
            .map_or_else(String::new, |p| p.display().to_string())
    );
    Ok(())
}
