//! The spec is the truth: Schemathesis runs over the whole OpenAPI document of a live
//! `gantry server`, as an admin with an API key, with every check it has (no server
//! error, every status and content type documented, responses matching their schemas,
//! schema-valid requests accepted and schema-violating ones rejected, ...) in all its
//! phases (examples, coverage, fuzzing, stateful), from a fixed seed and with a bounded
//! number of examples per operation. Any failure fails the test, with Schemathesis'
//! report of it.
//!
//! What the run is told, and why, is in `tests/schemathesis/`: `schemathesis.toml` (the
//! few operations whose bodies carry rules a JSON schema cannot state, where a 422 is
//! accepted for a schema-valid body) and `gantry_hooks.py` (streams end after a second;
//! the run's own API key and user are kept out of its own reach).
//!
//! Needs `GANTRY_PYTHON` with Schemathesis (scripts/python-env.sh prints it;
//! scripts/test.sh sets it).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::common::Cluster;
use gantry_types::ApiKeyCreate;

/// Schemathesis' command line (`st`), run by the Python of the test environment (the
/// environment is built in one place and moved to another, so its `bin/st` script names
/// a Python that is gone).
fn schemathesis() -> Command {
    let python = std::env::var_os("GANTRY_PYTHON").unwrap_or_else(|| {
        panic!(
            "GANTRY_PYTHON is not set: run the tests with scripts/test.sh, or set \
             GANTRY_PYTHON=$(scripts/python-env.sh | tail -1) (it installs Schemathesis)"
        )
    });
    let mut command = Command::new(PathBuf::from(python));
    command.args([
        "-c",
        "import sys; from schemathesis.cli import schemathesis; sys.argv[0] = 'st'; \
         sys.exit(schemathesis())",
    ]);
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_the_spec_does_not_say() {
    // A limit below the free space of any machine the tests run on, so that no upload
    // the spec allows (at most this limit) is refused for want of space.
    let cluster = Cluster::start(&["--upload-max-size", "1GiB", "--pool-interval", "1h"]).await;
    let created = cluster
        .client()
        .create_api_key(&ApiKeyCreate {
            name: "schemathesis".into(),
            description: "the API fuzz test's own key".into(),
            expires_in_days: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schemathesis");
    let report = cluster.dir.path().join("schemathesis.log");
    let began = Instant::now();
    let output = tokio::task::block_in_place(|| {
        schemathesis()
            .current_dir(&config)
            .env("PYTHONPATH", &config)
            .env("SCHEMATHESIS_HOOKS", "gantry_hooks")
            .env("GANTRY_FUZZ_API_KEY_ID", created.api_key.id.to_string())
            .env("GANTRY_FUZZ_USER_ID", created.api_key.user_id.to_string())
            // Plain output, no progress bars.
            .env("NO_COLOR", "1")
            .args(["--config-file", "schemathesis.toml", "run"])
            .arg(format!("{}/api/openapi.json", cluster.base))
            .arg("--header")
            .arg(format!("Authorization: Bearer {}", created.key))
            .args(["--checks", "all", "--request-timeout", "10"])
            .output()
            .unwrap()
    });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::write(&report, &text).unwrap();
    let summary = text
        .rfind("SUMMARY")
        .map_or(text.as_str(), |at| &text[at..]);
    println!(
        "schemathesis ran for {:.0} s:\n{summary}",
        began.elapsed().as_secs_f64()
    );
    let failures = text
        .find("FAILURES")
        .or_else(|| text.find("ERRORS"))
        .map_or("", |at| &text[at..]);
    assert!(
        output.status.success(),
        "Schemathesis found what the spec does not say ({}):\n{}\nserver log tail:\n{}",
        output.status,
        failures,
        common::tail(&cluster.server.log_text(), 20)
    );
}
