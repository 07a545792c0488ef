//! The worker's identity: the credential and API token it received at registration,
//! kept in `<data_dir>/worker_credential.json` (mode 0600) and reused after a restart,
//! so the same worker keeps its id.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// What the worker must remember across restarts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Identity {
    pub worker_id: i64,
    pub name: String,
    /// `gantryw_…`, sent as the bearer token on every call to the servers.
    pub credential: String,
    /// What servers present when they call this worker's API.
    pub api_token: String,
}

/// File name of the identity in the data directory.
pub const IDENTITY_FILE: &str = "worker_credential.json";

pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(IDENTITY_FILE)
}

/// Reads the saved identity, if any.
pub fn load(data_dir: &Path) -> anyhow::Result<Option<Identity>> {
    let path = path(data_dir);
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).map(Some).with_context(|| {
            format!(
                "parse {}; delete it to register this worker anew",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

/// Saves the identity atomically with mode 0600.
pub fn save(data_dir: &Path, identity: &Identity) -> anyhow::Result<()> {
    let path = path(data_dir);
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("create {}", tmp.display()))?;
    let text = serde_json::to_string_pretty(identity).context("serialise the identity")?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("move {} into place", path.display()))
}

/// Removes a saved identity the servers no longer accept.
pub fn forget(data_dir: &Path) {
    let _ = std::fs::remove_file(path(data_dir));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_round_trips_with_private_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), None);
        let identity = Identity {
            worker_id: 3,
            name: "w1".into(),
            credential: "gantryw_x".into(),
            api_token: "t".into(),
        };
        save(dir.path(), &identity).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(identity));
        let mode = std::fs::metadata(path(dir.path()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        forget(dir.path());
        assert_eq!(load(dir.path()).unwrap(), None);
    }
}
