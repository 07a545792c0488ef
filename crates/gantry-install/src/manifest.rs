//! The manifest `dest/gantry-install.json`: the commit point of an installation. It is
//! written last, atomically (a `.tmp` file renamed over it), so a destination either has a
//! manifest and is complete, or has none and is redone from scratch.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The manifest's file name inside the destination.
pub const MANIFEST_FILE: &str = "gantry-install.json";

/// A complete installation of a backend version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Installation {
    /// The destination directory, absolute (as it was installed: a moved destination is
    /// not an installation any more, since virtual environments embed their path).
    pub dest: PathBuf,
    /// Where the backend's executables are (`dest/bin`, `dest/venv/bin`).
    pub bin_dir: PathBuf,
    /// The virtual environment's interpreter, for `Pip` recipes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<PathBuf>,
    /// `cpu` or `cuda` (llama.cpp builds), `python` (virtual environments).
    pub variant: String,
    /// When the manifest was written, in milliseconds since the Unix epoch.
    pub installed_at_ms: i64,
}

/// The installation whose manifest is in `dest`, if it reads and names `dest` itself.
pub(crate) fn read(dest: &Path) -> Option<Installation> {
    let text = std::fs::read(dest.join(MANIFEST_FILE)).ok()?;
    let installation: Installation = match serde_json::from_slice(&text) {
        Ok(installation) => installation,
        Err(error) => {
            tracing::warn!(dest = %dest.display(), "unreadable install manifest: {error}");
            return None;
        }
    };
    let here = std::path::absolute(dest).ok()?;
    (installation.dest == here).then_some(installation)
}

/// Writes the manifest: `.tmp`, fsync, rename, fsync of the directory.
pub(crate) fn write(installation: &Installation) -> std::io::Result<()> {
    let final_path = installation.dest.join(MANIFEST_FILE);
    let temporary = installation.dest.join(format!("{MANIFEST_FILE}.tmp"));
    let text = serde_json::to_vec_pretty(installation).expect("a manifest serialises");
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(&text)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, &final_path)?;
    std::fs::File::open(&installation.dest)?.sync_all()
}
