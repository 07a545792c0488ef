//! Which local files a worker agrees to serve as models: only those under its
//! `model_dirs`. A model's `local_path` is made absolute and its symlinks resolved before
//! the check, so neither `..` nor a link placed inside an allowed directory reaches a file
//! outside them.

use std::path::{Path, PathBuf};

/// The directories a worker reads model files from.
#[derive(Debug, Clone)]
pub struct ModelDirs {
    dirs: Vec<PathBuf>,
}

impl ModelDirs {
    pub fn new(dirs: &[PathBuf]) -> Self {
        Self {
            dirs: dirs.to_vec(),
        }
    }

    /// The configured directories.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// The canonical path of `path` when it lies under one of the directories; otherwise
    /// a message naming the allowed directories and how to change them.
    pub fn check(&self, path: &Path, worker: &str) -> Result<PathBuf, String> {
        let canonical = std::fs::canonicalize(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                format!(
                    "model path {} does not exist on worker {worker}",
                    path.display()
                )
            }
            _ => format!(
                "model path {} cannot be read on worker {worker}: {e}",
                path.display()
            ),
        })?;
        // Resolved at each check: a directory may be created, or re-pointed, after start.
        let inside = self
            .dirs
            .iter()
            .filter_map(|dir| std::fs::canonicalize(dir).ok())
            .any(|dir| canonical.starts_with(dir));
        if inside {
            return Ok(canonical);
        }
        let shown = if canonical == path {
            path.display().to_string()
        } else {
            format!(
                "{} (which resolves to {})",
                path.display(),
                canonical.display()
            )
        };
        let allowed = self
            .dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        Err(format!(
            "model path {shown} is outside worker {worker}'s model directories ({allowed}); \
             move the model under one of them, or add its directory to the worker's \
             model_dirs (--model-dirs, comma-separated) and restart the worker"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_under_the_directories_pass_and_others_are_refused_naming_them() {
        let root = tempfile::tempdir().unwrap();
        let allowed = root.path().join("models");
        let other = root.path().join("private");
        std::fs::create_dir_all(allowed.join("qwen")).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(allowed.join("qwen/m.gguf"), b"x").unwrap();
        std::fs::write(other.join("secret.gguf"), b"x").unwrap();
        let dirs = ModelDirs::new(&[allowed.clone(), root.path().join("missing")]);

        let inside = dirs.check(&allowed.join("qwen/m.gguf"), "w1").unwrap();
        assert!(inside.ends_with("models/qwen/m.gguf"));
        assert!(
            dirs.check(&allowed.join("qwen"), "w1").is_ok(),
            "a directory"
        );

        let outside = dirs.check(&other.join("secret.gguf"), "w1").unwrap_err();
        assert!(
            outside.contains("outside worker w1's model directories"),
            "{outside}"
        );
        assert!(
            outside.contains(&allowed.display().to_string()),
            "{outside}"
        );
        assert!(outside.contains("missing"), "{outside}");
        assert!(outside.contains("--model-dirs"), "{outside}");

        // `..` is resolved before the check.
        let dotdot = allowed.join("qwen/../../private/secret.gguf");
        let refused = dirs.check(&dotdot, "w1").unwrap_err();
        assert!(refused.contains("which resolves to"), "{refused}");

        let missing = dirs.check(&allowed.join("nope.gguf"), "w1").unwrap_err();
        assert!(missing.contains("does not exist on worker w1"), "{missing}");
    }

    #[test]
    fn a_symlink_inside_is_followed_to_where_it_points() {
        let root = tempfile::tempdir().unwrap();
        let allowed = root.path().join("models");
        std::fs::create_dir_all(allowed.join("real")).unwrap();
        std::fs::write(allowed.join("real/m.gguf"), b"x").unwrap();
        std::fs::write(root.path().join("outside.gguf"), b"x").unwrap();
        std::os::unix::fs::symlink(
            root.path().join("outside.gguf"),
            allowed.join("escape.gguf"),
        )
        .unwrap();
        std::os::unix::fs::symlink(allowed.join("real/m.gguf"), allowed.join("alias.gguf"))
            .unwrap();
        let dirs = ModelDirs::new(std::slice::from_ref(&allowed));

        let refused = dirs.check(&allowed.join("escape.gguf"), "w1").unwrap_err();
        assert!(refused.contains("outside.gguf"), "{refused}");
        assert!(dirs.check(&allowed.join("alias.gguf"), "w1").is_ok());

        // The allowed directory itself reached through a symlink is the same directory.
        let link_to_dir = root.path().join("link-to-models");
        std::os::unix::fs::symlink(&allowed, &link_to_dir).unwrap();
        assert!(dirs.check(&link_to_dir.join("real/m.gguf"), "w1").is_ok());
    }
}
