//! `Recipe::Pip` for real: a virtual environment created with python3's venv module and a
//! wheel written by the test, installed by pip with `--no-index --find-links`, so the test
//! needs no network.

use std::path::{Path, PathBuf};
use std::process::Command;

use gantry_install::{
    InstallError, Installation, Installer, InstallerConfig, Recipe, INSTALL_LOG_FILE, MANIFEST_FILE,
};
use gantry_types::InstallProgress;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// An address nothing answers on (TEST-NET-1): any attempt to reach PyPI fails.
const UNROUTABLE_PYPI: &str = "http://192.0.2.1:9";

/// Whether `python3 -m venv` works here; the tests of this file need it.
fn venv_available() -> bool {
    let probe = tempfile::tempdir().expect("temp dir");
    Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(probe.path().join("venv"))
        .status()
        .is_ok_and(|status| status.success())
}

macro_rules! require_venv {
    () => {
        if !venv_available() {
            eprintln!(
                "SKIPPED: `python3 -m venv` is unavailable on this machine \
                 (Debian: apt-get install python3-venv)"
            );
            return;
        }
    };
}

/// Writes the wheel `gantryprobe-<version>-py3-none-any.whl` into `dir`, whose module
/// `gantryprobe` has `VALUE = <value>`. Built with python's zipfile module, RECORD with
/// real digests, as pip checks them.
fn write_wheel(dir: &Path, version: &str, value: u32) -> PathBuf {
    let wheel = dir.join(format!("gantryprobe-{version}-py3-none-any.whl"));
    let script = r#"
import base64, hashlib, sys, zipfile
path, version, value = sys.argv[1], sys.argv[2], sys.argv[3]
info = f"gantryprobe-{version}.dist-info"
files = {
    "gantryprobe/__init__.py": f"VALUE = {value}\n",
    f"{info}/METADATA": f"Metadata-Version: 2.1\nName: gantryprobe\nVersion: {version}\n",
    f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: gantry-install-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for name, text in files.items():
    data = text.encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(data)}")
record.append(f"{info}/RECORD,,")
files[f"{info}/RECORD"] = "\n".join(record) + "\n"
with zipfile.ZipFile(path, "w") as archive:
    for name, text in files.items():
        archive.writestr(name, text)
"#;
    let status = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&wheel)
        .arg(version)
        .arg(value.to_string())
        .status()
        .expect("run python3");
    assert!(status.success(), "writing the wheel failed");
    wheel
}

fn installer(root: &Path) -> Installer {
    Installer::new(InstallerConfig {
        cache_dir: root.join("cache"),
        build_jobs: None,
        allow_system_packages: false,
        python: "python3".to_owned(),
        pypi_url: UNROUTABLE_PYPI.to_owned(),
    })
    .expect("installer")
}

/// A temporary root holding a wheel of `gantryprobe` 1.0 whose module holds `value`,
/// an installer caching under it, and where backend `probe` 1.0 is to be installed. The
/// root lives as long as the returned guard.
fn probe_setup(value: u32) -> (tempfile::TempDir, PathBuf, Installer, PathBuf) {
    let root = tempfile::tempdir().expect("temp dir");
    let wheels = root.path().join("wheels");
    std::fs::create_dir_all(&wheels).expect("wheel dir");
    write_wheel(&wheels, "1.0", value);
    let installer = installer(root.path());
    let dest = root.path().join("data/backends/probe/1.0");
    (root, wheels, installer, dest)
}

fn offline_recipe(wheels: &Path, requirement: &str) -> Recipe {
    Recipe::Pip {
        requirements: vec![requirement.to_owned()],
        pip_args: vec![
            "--no-index".to_owned(),
            "--find-links".to_owned(),
            wheels.display().to_string(),
        ],
    }
}

async fn install(
    installer: &Installer,
    recipe: &Recipe,
    dest: &Path,
    cancel: &CancellationToken,
) -> (
    Result<Installation, InstallError>,
    watch::Receiver<InstallProgress>,
) {
    let (sender, receiver) = watch::channel(InstallProgress::default());
    let result = installer
        .install("probe", "1.0", recipe, dest, &sender, cancel)
        .await;
    (result, receiver)
}

fn python_value(python: &Path) -> String {
    let output = Command::new(python)
        .args(["-c", "import gantryprobe; print(gantryprobe.VALUE)"])
        .output()
        .expect("run the venv's python");
    assert!(
        output.status.success(),
        "import failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

#[tokio::test]
async fn pip_recipe_installs_an_offline_wheel_and_a_second_install_returns_at_once() {
    require_venv!();
    let (_root, wheels, installer, dest) = probe_setup(42);
    let recipe = offline_recipe(&wheels, "gantryprobe==1.0");

    let (result, receiver) = install(&installer, &recipe, &dest, &CancellationToken::new()).await;
    let installation = result.expect("the offline pip install succeeds");
    assert_eq!(installation.dest, dest);
    assert_eq!(installation.bin_dir, dest.join("venv/bin"));
    assert_eq!(installation.variant, "python");
    let python = installation
        .python
        .clone()
        .expect("a python recipe has an interpreter");
    assert_eq!(python, dest.join("venv/bin/python"));
    assert_eq!(python_value(&python), "42");

    assert!(dest.join(MANIFEST_FILE).is_file());
    assert_eq!(Installer::installed(&dest), Some(installation.clone()));
    let log = std::fs::read_to_string(dest.join(INSTALL_LOG_FILE)).expect("install.log");
    assert!(
        log.contains("Successfully installed gantryprobe-1.0"),
        "{log}"
    );

    // The last report is pip's phase with pip's own last lines.
    let progress = receiver.borrow().clone();
    assert_eq!(progress.backend, "probe");
    assert_eq!(progress.version, "1.0");
    assert_eq!(progress.phase, "installing packages");
    assert!(
        progress
            .log_tail
            .iter()
            .any(|line| line.contains("Successfully installed gantryprobe-1.0")),
        "{:?}",
        progress.log_tail
    );
    assert!(progress.log_tail.len() <= gantry_types::INSTALL_LOG_TAIL_LINES);

    // A second install finds the manifest: no pip run, not a single progress report.
    let started = std::time::Instant::now();
    let (again, receiver) = install(&installer, &recipe, &dest, &CancellationToken::new()).await;
    assert_eq!(again.expect("second install"), installation);
    assert_eq!(*receiver.borrow(), InstallProgress::default());
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    assert_eq!(
        std::fs::read_to_string(dest.join(INSTALL_LOG_FILE)).expect("install.log"),
        log,
        "the second install wrote no log"
    );
}

#[tokio::test]
async fn a_failed_install_leaves_only_its_log_and_the_next_one_starts_afresh() {
    require_venv!();
    let (_root, wheels, installer, dest) = probe_setup(7);

    // What an installation killed half-way leaves: files, no manifest.
    std::fs::create_dir_all(dest.join("venv/bin")).expect("leftover");
    std::fs::write(dest.join("leftover"), "from a killed run").expect("leftover");

    let missing = offline_recipe(&wheels, "gantryprobe==2.0");
    let (result, _receiver) = install(&installer, &missing, &dest, &CancellationToken::new()).await;
    let error = result.expect_err("there is no gantryprobe 2.0");
    assert!(error.message.starts_with("pip install failed"), "{error}");
    assert!(
        error
            .log_tail
            .iter()
            .any(|line| line.contains("No matching distribution found for gantryprobe==2.0")),
        "{error}"
    );
    let left: Vec<String> = std::fs::read_dir(&dest)
        .expect("dest")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(left, vec![INSTALL_LOG_FILE.to_owned()]);
    assert_eq!(Installer::installed(&dest), None);

    let good = offline_recipe(&wheels, "gantryprobe==1.0");
    let (result, _receiver) = install(&installer, &good, &dest, &CancellationToken::new()).await;
    let installation = result.expect("the second attempt installs");
    assert_eq!(python_value(&installation.python.expect("python")), "7");
    assert!(!dest.join("leftover").exists());
}

#[tokio::test]
async fn cancelling_an_install_stops_it_and_leaves_no_installation() {
    require_venv!();
    let (_root, wheels, installer, dest) = probe_setup(1);
    let recipe = offline_recipe(&wheels, "gantryprobe==1.0");

    let (sender, mut receiver) = watch::channel(InstallProgress::default());
    let cancel = CancellationToken::new();
    let canceller = cancel.clone();
    tokio::spawn(async move {
        // As soon as a tool runs (the venv being created), cancel.
        let _ = receiver
            .wait_for(|progress| progress.phase == "installing packages")
            .await;
        canceller.cancel();
    });
    let started = std::time::Instant::now();
    let error = installer
        .install("probe", "1.0", &recipe, &dest, &sender, &cancel)
        .await
        .expect_err("cancelled");
    assert!(error.message.ends_with("was cancelled"), "{error}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert_eq!(Installer::installed(&dest), None);
    assert!(!dest.join("venv").exists());
    assert!(!dest.join(MANIFEST_FILE).exists());
}
