//! `Recipe::Pip`: a Python virtual environment at `dest/venv` with the recipe's
//! requirements, pip's downloads cached machine-wide in `<cache>/pip`.

use std::path::{Path, PathBuf};

use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::process::run_tool;
use crate::progress::{phase, Reporter};
use crate::{InstallError, InstallerConfig};

/// What a virtual environment installation leaves: its `bin` directory and interpreter.
pub(crate) struct Venv {
    pub(crate) bin_dir: PathBuf,
    pub(crate) python: PathBuf,
}

pub(crate) async fn install_venv(
    config: &InstallerConfig,
    requirements: &[String],
    pip_args: &[String],
    dest: &Path,
    reporter: &mut Reporter<'_>,
    cancel: &CancellationToken,
) -> Result<Venv, InstallError> {
    if requirements.is_empty() {
        return Err(InstallError::new(
            "a pip recipe needs at least one requirement (such as vllm==0.8.5)",
        ));
    }
    reporter.phase(phase::INSTALLING_PACKAGES);
    let venv = dest.join("venv");
    let mut create = Command::new(&config.python);
    create.arg("-m").arg("venv").arg(&venv);
    run_tool(
        reporter,
        cancel,
        create,
        "creating the virtual environment",
        &format!(
            "{} needs its venv module (Debian: apt-get install python3-venv)",
            config.python
        ),
    )
    .await?;

    let bin_dir = venv.join("bin");
    let mut install = Command::new(bin_dir.join("pip"));
    install
        .env("PIP_NO_INPUT", "1")
        .arg("install")
        .arg("--cache-dir")
        .arg(config.cache_dir.join("pip"))
        .arg("--disable-pip-version-check")
        .args(pip_args)
        .args(requirements);
    run_tool(
        reporter,
        cancel,
        install,
        "pip install",
        "check the requirements and pip's output above",
    )
    .await?;
    let python = bin_dir.join("python");
    Ok(Venv { bin_dir, python })
}
