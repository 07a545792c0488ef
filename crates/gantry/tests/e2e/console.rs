//! The web console as a newcomer meets it, in a real browser: `gantry start` (server and
//! worker in one process, embedded SQLite, a real llama-server), driven by
//! `tests/console_browser.py` in Debian's chromium through Playwright. Screenshots of each
//! step are written under the test target's `ui-screenshots/`.

use crate::common;

use std::path::Path;

use crate::common::{start_gantry, tiny_model};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_deploys_a_model_chats_with_it_and_cleans_up_in_a_real_browser() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = tiny_model(dir.path());
    // A catalog of one model, on this machine, instead of the built-in one (whose models
    // come from Hugging Face, which the tests cannot reach).
    let catalog = dir.path().join("catalog.yaml");
    std::fs::write(&catalog, common::tiny_catalog_entry(&model_path)).unwrap();
    let catalog_arg = catalog.display().to_string();
    let (gantry, base) = start_gantry(
        dir.path(),
        &[
            "--simulate-gpus",
            "1x8GiB",
            "--model-catalog-file",
            &catalog_arg,
        ],
    )
    .await;
    let names = [
        "password",
        "model_form",
        "models",
        "catalog",
        "catalog_deploy",
        "overview",
        "worker",
        "playground",
        "playground_code",
        "playground_compare",
        "usage",
        "usage_by_key",
        "playground_stop",
        "api_key",
        "providers",
        "route_form",
        "playground_route",
        "routes",
        "provider_in_use",
        "models_empty",
    ];
    common::console_checks(
        &gantry,
        dir.path(),
        &base,
        "console_browser.py",
        "",
        &names,
        json!({
            "model_path": model_path,
            "model": "tiny-chat",
            "slow": {
                "python": gantry_testkit::browser::python().to_string_lossy(),
                "script": Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/slow_openai.py"),
                "cancelled": dir.path().join("cancelled"),
            },
        }),
    )
    .await;
}
