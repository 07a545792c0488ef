//! Finding a cmake new enough for llama.cpp, and installing one when there is none: the
//! old script's order, unchanged — `cmake` on `PATH`, then `<cache>/cmake-venv/bin/cmake`,
//! then Debian's `cmake` package (as root, when allowed), then PyPI's `cmake` wheel in
//! `<cache>/cmake-venv`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::lock::lock_exclusive;
use crate::process::{capture_stdout, find_on_path, is_executable, run_tool, sleep_or_cancel};
use crate::progress::{phase, Reporter};
use crate::{InstallError, InstallerConfig, DEFAULT_PYPI_URL};

/// llama.cpp's `ui-assets.cmake` needs 3.18; its top-level CMakeLists.txt accepts up to
/// 3.28 policies.
pub(crate) const CMAKE_MIN_VERSION: &str = "3.18";

/// apt-get fails at once when another apt-get holds its locks (other scripts of this
/// project install packages too), so it is retried this often, this far apart.
const APT_ATTEMPTS: u32 = 30;
const APT_RETRY_DELAY: Duration = Duration::from_secs(10);

/// A cmake of at least [`CMAKE_MIN_VERSION`], installed first when there is none.
pub(crate) async fn find_or_install_cmake(
    config: &InstallerConfig,
    reporter: &mut Reporter<'_>,
    cancel: &CancellationToken,
) -> Result<PathBuf, InstallError> {
    if let Some(cmake) = find_cmake(&config.cache_dir).await {
        return Ok(cmake);
    }
    install_cmake(config, reporter, cancel).await?;
    find_cmake(&config.cache_dir).await.ok_or_else(|| {
        reporter.fail(format!(
            "no cmake >= {CMAKE_MIN_VERSION} after installing it; install cmake >= \
             {CMAKE_MIN_VERSION} and put it on PATH"
        ))
    })
}

/// The first cmake of [`cmake_candidates`] that is recent enough.
async fn find_cmake(cache_dir: &Path) -> Option<PathBuf> {
    for candidate in cmake_candidates(cache_dir) {
        let Some(output) = capture_stdout(&candidate, &["--version"]).await else {
            continue;
        };
        if parse_cmake_version(&output)
            .is_some_and(|have| version_at_least(&have, CMAKE_MIN_VERSION))
        {
            return Some(candidate);
        }
    }
    None
}

fn cmake_candidates(cache_dir: &Path) -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = find_on_path("cmake").into_iter().collect();
    let venv_cmake = cmake_venv(cache_dir).join("bin").join("cmake");
    if is_executable(&venv_cmake) {
        candidates.push(venv_cmake);
    }
    candidates
}

fn cmake_venv(cache_dir: &Path) -> PathBuf {
    cache_dir.join("cmake-venv")
}

/// The version in `cmake --version`'s first line (`cmake version 3.25.1`).
pub(crate) fn parse_cmake_version(output: &str) -> Option<String> {
    let first = output.lines().next()?;
    let version = first.split_whitespace().nth(2)?;
    version
        .split('.')
        .next()
        .is_some_and(|major| major.parse::<u32>().is_ok())
        .then(|| version.to_owned())
}

/// Whether dotted version `have` is at least `want`, compared number by number (a
/// suffix such as `-rc1` on a component counts as the number before it).
pub(crate) fn version_at_least(have: &str, want: &str) -> bool {
    numeric_parts(have) >= numeric_parts(want)
}

pub(crate) fn numeric_parts(version: &str) -> Vec<u64> {
    version
        .split('.')
        .map(|part| {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().unwrap_or(0)
        })
        .collect()
}

async fn install_cmake(
    config: &InstallerConfig,
    reporter: &mut Reporter<'_>,
    cancel: &CancellationToken,
) -> Result<(), InstallError> {
    reporter.phase(phase::INSTALLING_PACKAGES);
    let root = nix::unistd::geteuid().is_root();
    if let Some(apt_get) = find_on_path("apt-get").filter(|_| root && config.allow_system_packages)
    {
        reporter.note("cmake not found; installing the Debian package cmake");
        match apt_install_cmake(&apt_get, reporter, cancel).await {
            Ok(()) => return Ok(()),
            Err(error) if cancel.is_cancelled() => return Err(error),
            Err(error) => reporter.note(&format!(
                "installing Debian's cmake failed ({}); trying PyPI's cmake",
                error.message
            )),
        }
    }
    pip_install_cmake(config, reporter, cancel).await
}

async fn apt_install_cmake(
    apt_get: &Path,
    reporter: &mut Reporter<'_>,
    cancel: &CancellationToken,
) -> Result<(), InstallError> {
    apt_get_retried(apt_get, &["update", "-qq"], reporter, cancel).await?;
    apt_get_retried(
        apt_get,
        &["install", "-y", "-qq", "--no-install-recommends", "cmake"],
        reporter,
        cancel,
    )
    .await
}

async fn apt_get_retried(
    apt_get: &Path,
    args: &[&str],
    reporter: &mut Reporter<'_>,
    cancel: &CancellationToken,
) -> Result<(), InstallError> {
    let mut attempt = 1;
    loop {
        let mut command = Command::new(apt_get);
        command
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["-o", "DPkg::Lock::Timeout=60"])
            .args(args);
        let what = format!("apt-get {}", args[0]);
        match run_tool(reporter, cancel, command, &what, "see its output").await {
            Ok(()) => return Ok(()),
            Err(error) if cancel.is_cancelled() || attempt == APT_ATTEMPTS => return Err(error),
            Err(_) => {
                reporter.note(&format!(
                    "{what} failed (attempt {attempt}); retrying in {} s",
                    APT_RETRY_DELAY.as_secs()
                ));
                attempt += 1;
                sleep_or_cancel(APT_RETRY_DELAY, cancel, &what).await?;
            }
        }
    }
}

/// PyPI's `cmake` wheel in `<cache>/cmake-venv`, under a lock of its own: builds of two
/// llama.cpp versions may both need it.
async fn pip_install_cmake(
    config: &InstallerConfig,
    reporter: &mut Reporter<'_>,
    cancel: &CancellationToken,
) -> Result<(), InstallError> {
    let venv = cmake_venv(&config.cache_dir);
    let lock_path = config.cache_dir.join("cmake-venv.lock");
    let _lock = lock_exclusive(
        &lock_path,
        "an installation of PyPI's cmake",
        reporter,
        cancel,
    )
    .await?;
    reporter.phase(phase::INSTALLING_PACKAGES);
    if find_cmake(&config.cache_dir).await.is_some() {
        return Ok(());
    }
    reporter.note(&format!("installing PyPI's cmake into {}", venv.display()));
    let mut command = Command::new(&config.python);
    command.arg("-m").arg("venv").arg(&venv);
    run_tool(
        reporter,
        cancel,
        command,
        "creating a virtual environment for cmake",
        &format!(
            "cmake not found and {} cannot create a virtual environment to install it; \
             install cmake >= {CMAKE_MIN_VERSION} (Debian: apt-get install cmake) or python3-venv",
            config.python
        ),
    )
    .await?;
    let mut command = Command::new(venv.join("bin").join("pip"));
    command
        .env("PIP_NO_INPUT", "1")
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--cache-dir",
        ])
        .arg(config.cache_dir.join("pip"));
    if config.pypi_url != DEFAULT_PYPI_URL {
        command
            .arg("--index-url")
            .arg(format!("{}/simple", config.pypi_url));
    }
    command.args([
        "--only-binary",
        ":all:",
        &format!("cmake>={CMAKE_MIN_VERSION}"),
    ]);
    run_tool(
        reporter,
        cancel,
        command,
        "installing cmake from PyPI",
        &format!("install cmake >= {CMAKE_MIN_VERSION} (Debian: apt-get install cmake) and put it on PATH"),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmake_version_output_parses() {
        assert_eq!(
            parse_cmake_version(
                "cmake version 3.25.1\n\nCMake suite maintained and supported by Kitware.\n"
            ),
            Some("3.25.1".to_owned())
        );
        assert_eq!(
            parse_cmake_version("cmake3 version 3.31.0-rc2\n").as_deref(),
            Some("3.31.0-rc2")
        );
        assert_eq!(parse_cmake_version("something else"), None);
        assert_eq!(parse_cmake_version(""), None);
    }

    #[test]
    fn versions_compare_number_by_number() {
        assert!(version_at_least("3.18", "3.18"));
        assert!(version_at_least("3.18.0", "3.18"));
        assert!(version_at_least("3.25.1", "3.18"));
        assert!(version_at_least("4.0.2", "3.18"));
        assert!(version_at_least("3.31.0-rc2", "3.18"));
        assert!(!version_at_least("3.16.3", "3.18"));
        assert!(!version_at_least("3.9", "3.18"));
        assert!(!version_at_least("2.8.12", "3.18"));
    }
}
