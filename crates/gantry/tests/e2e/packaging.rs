//! The Dockerfile is checked against the workspace and its runtime (no image is built: the
//! test machines have no container runtime).
//! The systemd units in `packaging/systemd` pass `systemd-analyze verify` (Debian's
//! systemd package; scripts/test.sh installs it when missing): every directive known and
//! well-formed, every hardening option valid for this systemd, the command executable.
//! Their `/usr/local/bin/gantry` is replaced by the binary under test for the check.

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

/// The Dockerfile at the repository's root, as far as it can be checked without a
/// container runtime (none on the test machines): it builds packages and binaries the
/// workspace has, its runtime stage is Debian slim and runs as an unprivileged user, the
/// settings it passes are real configuration variables, and the binary it copies needs no
/// library beyond glibc's, which the slim image has.
#[test]
fn the_dockerfile_fits_the_workspace_and_its_slim_runtime() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    let stages: Vec<&str> = dockerfile
        .lines()
        .filter(|line| line.starts_with("FROM "))
        .collect();
    assert!(stages.len() >= 2, "multi-stage: {stages:?}");
    let runtime = dockerfile.rsplit("\nFROM ").next().unwrap();
    assert!(
        stages.last().unwrap().contains("-slim"),
        "a slim runtime: {stages:?}"
    );
    let user = runtime
        .lines()
        .find_map(|line| line.strip_prefix("USER "))
        .expect("the runtime stage sets USER");
    assert!(user != "root" && user != "0", "runs as {user}");

    // `-p PACKAGE` of the cargo build are workspace members.
    let build = dockerfile
        .lines()
        .find(|line| line.contains("cargo build"))
        .unwrap();
    let words: Vec<&str> = build.split_whitespace().collect();
    for pair in words.windows(2) {
        if pair[0] == "-p" {
            assert!(
                root.join("crates")
                    .join(pair[1])
                    .join("Cargo.toml")
                    .is_file(),
                "no workspace package {}",
                pair[1]
            );
        }
    }
    // What ships is built with the `dist` profile (fat LTO, one codegen unit), which the
    // workspace must declare; its binaries land in target/dist/.
    let profile = words
        .windows(2)
        .find(|pair| pair[0] == "--profile")
        .map(|pair| pair[1])
        .expect("the image is built with an explicit --profile");
    assert_eq!(profile, "dist", "the image ships the dist build");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains(&format!("[profile.{profile}]")),
        "Cargo.toml declares [profile.{profile}]"
    );
    for bin in ["gantry", "gantry-install"] {
        assert!(
            dockerfile.contains(&format!("target/{profile}/{bin}")),
            "{bin}"
        );
    }
    assert!(root
        .join("crates/gantry-install/src/bin/gantry-install.rs")
        .is_file());

    // Every GANTRY_ variable it sets is one the binary reads (its --help names them), or
    // the installer's cache directory.
    let help = Command::new(env!("CARGO_BIN_EXE_gantry"))
        .args(["start", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let set: Vec<&str> = runtime
        .split(|c: char| c.is_whitespace() || c == '=')
        .filter(|word| {
            word.starts_with("GANTRY_")
                && word
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .collect();
    assert!(set.len() >= 3, "{set:?}");
    for name in set {
        assert!(
            name == "GANTRY_CACHE_DIR" || help.contains(&format!("env: {name}]")),
            "{name} is no configuration variable of gantry start"
        );
    }
    let port = runtime
        .lines()
        .find_map(|line| line.trim().strip_prefix("EXPOSE "))
        .unwrap();
    assert!(
        runtime.contains(&format!("GANTRY_PORT={port}")),
        "EXPOSE {port}"
    );

    // The binary needs only glibc's libraries (no OpenSSL and the like: TLS is rustls).
    let ldd = Command::new("ldd")
        .arg(env!("CARGO_BIN_EXE_gantry"))
        .output()
        .unwrap();
    let glibc = [
        "linux-vdso",
        "libc.so",
        "libm.so",
        "libgcc_s.so",
        "ld-linux",
        "libpthread.so",
        "libdl.so",
        "librt.so",
    ];
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let library = line.split_whitespace().next().unwrap_or("");
        assert!(
            glibc.iter().any(|known| library.contains(known)),
            "gantry links {library}, which debian slim may not have; install it in the \
             Dockerfile's runtime stage and add it here"
        );
    }
}
