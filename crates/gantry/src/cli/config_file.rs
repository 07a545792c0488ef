//! The login the client commands use, saved by `gantry login` in the user's
//! configuration directory: `$XDG_CONFIG_HOME/gantry/cli.json`, else
//! `~/.config/gantry/cli.json`. The file holds a secret, so it is written 0600 in a
//! directory made 0700, and replaced whole (written beside it, then renamed), so a
//! reader never sees half a file.

use std::fs::{DirBuilder, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// What `gantry login` saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedLogin {
    /// The server's URL, with its scheme.
    pub server: String,
    /// The bearer token: the API key made for this login.
    pub token: String,
    /// Who logged in.
    pub username: String,
    /// The id of the API key in `token`, which `gantry logout` deletes; `None` for a
    /// token that is not a key of this login's making.
    #[serde(default)]
    pub api_key_id: Option<i64>,
}

impl SavedLogin {
    /// The saved login of this user, if there is one.
    pub fn load() -> anyhow::Result<Option<Self>> {
        Self::load_from(&path()?)
    }

    pub fn load_from(path: &Path) -> anyhow::Result<Option<Self>> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
        };
        serde_json::from_str(&text)
            .map(Some)
            .with_context(|| format!("read {} (run gantry login again)", path.display()))
    }

    /// Saves this login, readable by the user alone; returns where.
    pub fn save(&self) -> anyhow::Result<PathBuf> {
        let path = path()?;
        self.save_to(&path)?;
        Ok(path)
    }

    pub fn save_to(&self, path: &Path) -> anyhow::Result<()> {
        let dir = path
            .parent()
            .context("the login file's path has a directory")?;
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("create {}", dir.display()))?;
        // The directory may have existed with a wider mode; it holds only gantry's files.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("make {} private", dir.display()))?;
        let partial = path.with_extension("json.partial");
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&partial)
            .with_context(|| format!("create {}", partial.display()))?;
        // `mode` applies to a new file only; a leftover partial file keeps its own.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("make {} private", partial.display()))?;
        let text = serde_json::to_string_pretty(self).context("encode the login")?;
        file.write_all(format!("{text}\n").as_bytes())
            .and_then(|()| file.sync_all())
            .with_context(|| format!("write {}", partial.display()))?;
        std::fs::rename(&partial, path)
            .with_context(|| format!("move {} into place", partial.display()))
    }

    /// Forgets the saved login; whether there was one.
    pub fn remove() -> anyhow::Result<bool> {
        let path = path()?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e).with_context(|| format!("remove {}", path.display())),
        }
    }
}

/// Where the login is saved, from this process's environment.
pub fn path() -> anyhow::Result<PathBuf> {
    path_in(
        std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from),
        std::env::var_os("HOME").map(PathBuf::from),
    )
}

/// `$XDG_CONFIG_HOME/gantry/cli.json`, else `$HOME/.config/gantry/cli.json`. As the XDG
/// specification says, a relative `XDG_CONFIG_HOME` is ignored.
fn path_in(xdg_config_home: Option<PathBuf>, home: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let config_home = match xdg_config_home.filter(|dir| dir.is_absolute()) {
        Some(dir) => dir,
        None => home
            .filter(|dir| dir.is_absolute())
            .context(
                "neither XDG_CONFIG_HOME nor HOME is set: cannot find where to keep the login",
            )?
            .join(".config"),
    };
    Ok(config_home.join("gantry").join("cli.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login() -> SavedLogin {
        SavedLogin {
            server: "http://127.0.0.1:8080".into(),
            token: "gantry_abc_def".into(),
            username: "admin".into(),
            api_key_id: Some(7),
        }
    }

    #[test]
    fn xdg_config_home_wins_over_home_and_must_be_absolute() {
        let at = |xdg: Option<&str>, home: Option<&str>| {
            path_in(xdg.map(PathBuf::from), home.map(PathBuf::from))
        };
        assert_eq!(
            at(Some("/x"), Some("/home/u")).unwrap(),
            Path::new("/x/gantry/cli.json")
        );
        assert_eq!(
            at(None, Some("/home/u")).unwrap(),
            Path::new("/home/u/.config/gantry/cli.json")
        );
        assert_eq!(
            at(Some("relative"), Some("/home/u")).unwrap(),
            Path::new("/home/u/.config/gantry/cli.json")
        );
        assert!(at(None, None).is_err());
    }

    #[test]
    fn a_saved_login_reads_back_private_to_its_owner() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("config/gantry/cli.json");
        assert_eq!(SavedLogin::load_from(&path).unwrap(), None);
        login().save_to(&path).unwrap();
        assert_eq!(SavedLogin::load_from(&path).unwrap(), Some(login()));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        // Saving again replaces the file and leaves nothing beside it.
        let other = SavedLogin {
            api_key_id: None,
            ..login()
        };
        other.save_to(&path).unwrap();
        assert_eq!(SavedLogin::load_from(&path).unwrap(), Some(other));
        let files: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(files, vec![std::ffi::OsString::from("cli.json")]);
    }

    #[test]
    fn an_unreadable_login_file_says_to_log_in_again() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("cli.json");
        std::fs::write(&path, "{").unwrap();
        let error = format!("{:#}", SavedLogin::load_from(&path).unwrap_err());
        assert!(error.contains("gantry login again"), "{error}");
    }
}
