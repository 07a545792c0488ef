//! Running a page in a real browser from a test: Debian's chromium, driven by a Python
//! script with Playwright's package (no browser download), which takes screenshots.

use std::path::{Path, PathBuf};

/// The Python that runs the browser scripts: `GANTRY_PYTHON`, which must have Playwright.
pub fn python() -> std::ffi::OsString {
    let Some(python) = std::env::var_os("GANTRY_PYTHON") else {
        panic!(
            "GANTRY_PYTHON is not set. The browser tests drive chromium with Playwright's \
             Python package: run the tests with scripts/test.sh, or set \
             GANTRY_PYTHON=$(scripts/python-env.sh | tail -1)."
        );
    };
    let has_playwright = std::process::Command::new(&python)
        .args(["-c", "import playwright.sync_api"])
        .status()
        .unwrap_or_else(|e| panic!("run {python:?}: {e}"));
    assert!(
        has_playwright.success(),
        "{python:?} cannot import playwright: the browser tests need Playwright's Python \
         package in the environment scripts/python-env.sh makes"
    );
    python
}

/// Debian's chromium (`GANTRY_CHROMIUM` names another): Playwright drives it through
/// `executable_path` and downloads no browser of its own.
pub fn chromium() -> PathBuf {
    let path = std::env::var_os("GANTRY_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    assert!(
        path.is_file(),
        "no browser at {}: install Debian's chromium (apt-get install chromium) or set \
         GANTRY_CHROMIUM",
        path.display()
    );
    path
}

/// Screenshot files `<dir>/ui-screenshots/<name>.png`, earlier ones removed, so a test
/// that takes none fails. `dir` is the test crate's `CARGO_TARGET_TMPDIR`.
pub fn screenshot_paths(dir: &Path, names: &[impl AsRef<str>]) -> Vec<PathBuf> {
    let dir = dir.join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    names
        .iter()
        .map(|name| {
            let path = dir.join(format!("{}.png", name.as_ref()));
            let _ = std::fs::remove_file(&path);
            path
        })
        .collect()
}

/// Runs `script` with `expected` (JSON) as its argument, and checks that it passed and
/// took its screenshots.
pub async fn run_checks(script: &Path, expected: &serde_json::Value, screenshots: &[PathBuf]) {
    let python = python();
    let output = tokio::process::Command::new(&python)
        .arg(script)
        .arg(expected.to_string())
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {python:?} {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "the browser checks failed ({}):\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{}", String::from_utf8_lossy(&output.stdout));
    for taken in screenshots {
        assert!(taken.is_file(), "no screenshot at {}", taken.display());
        println!("screenshot: {}", taken.display());
    }
}
