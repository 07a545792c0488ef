//! The systemd units in `packaging/systemd` pass `systemd-analyze verify` (Debian's
//! systemd package; scripts/test.sh installs it when missing): every directive known and
//! well-formed, every hardening option valid for this systemd, the command executable.
//! Their `/usr/local/bin/gantry` is replaced by the binary under test for the check.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

const UNITS: [&str; 2] = ["gantry-server.service", "gantry-worker.service"];
const INSTALLED_AT: &str = "/usr/local/bin/gantry";

#[test]
fn the_systemd_units_pass_systemd_analyze_verify() {
    let packaging = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/systemd");
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for unit in UNITS {
        let text = std::fs::read_to_string(packaging.join(unit)).unwrap();
        assert!(
            text.contains(&format!("ExecStart={INSTALLED_AT} ")),
            "{unit} starts {INSTALLED_AT}"
        );
        let path = dir.path().join(unit);
        std::fs::write(
            &path,
            text.replace(INSTALLED_AT, env!("CARGO_BIN_EXE_gantry")),
        )
        .unwrap();
        paths.push(path);
    }
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .args(&paths)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run systemd-analyze: {e}; install Debian's systemd package (scripts/test.sh does)")
        });
    let stderr = String::from_utf8_lossy(&output.stderr);
    // A directive systemd does not know or cannot parse is only a warning: refuse those too.
    assert!(
        output.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {}\n{stderr}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout)
    );
}
