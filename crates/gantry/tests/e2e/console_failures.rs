//! A broken model looks broken and is fixed from the console (issue 40), in a real
//! browser: `gantry start` with two simulated GPUs and a real llama-server, driven by
//! `tests/console_failures_browser.py` in Debian's chromium through Playwright; its
//! screenshots, at 1440×900 and 390×844, are written under the test target's
//! `ui-screenshots/`.
//!
//! - a model whose file does not exist on the server is refused, on "Check fit" and on
//!   "Create model", with a sentence about the form's path (no field path, no error
//!   number);
//! - the catalog's fit check of a hub the server cannot reach says so in words;
//! - a file the server can read but the worker refuses (outside its model directories,
//!   which only the worker knows) makes a model that is created and fails: its row shows
//!   the worker's reason, and the overview lists it under "Needs attention";
//! - the edit form changes the model's source, refusing a missing one with a sentence, and
//!   the model reaches running on the new one;
//! - a restart from the instances screen restarts the backend in place: Restarts counts 1;
//! - the estimate of two replicas on two simulated GPUs places them on both, and a
//!   worker's name and its "simulated" badge read as two words.

use crate::common;

use crate::common::{start_gantry, tiny_model};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_model_looks_broken_and_is_fixed_from_the_console() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    // The worker may serve only what is under `models`; the server reads any file.
    let inside_path = tiny_model(&models);
    let outside_path = tiny_model(&outside);
    let missing_path = models.join("missing.gguf");
    // A catalog entry from the hub, which the server reaches at a port where nothing
    // listens: the fit check of a hub it cannot reach, without leaving the machine.
    let catalog = dir.path().join("catalog.yaml");
    std::fs::write(
        &catalog,
        "- name: hub-model\n  title: A model on the hub\n  description: Read from the hub.\n  \
         tags: [chat]\n  parameters: 1M\n  size: 0.5 MB\n  \
         source: {type: huggingface, repo_id: org/tiny-GGUF, file: \"*Q4_K_M.gguf\"}\n  \
         backend: llama.cpp\n",
    )
    .unwrap();
    let models_arg = models.display().to_string();
    let catalog_arg = catalog.display().to_string();
    let (gantry, base) = start_gantry(
        dir.path(),
        &[
            "--simulate-gpus",
            "2x8GiB",
            "--model-dirs",
            &models_arg,
            "--model-catalog-file",
            &catalog_arg,
            "--hf-endpoint",
            "http://127.0.0.1:1",
        ],
    )
    .await;
    let names = [
        "missing_check_fit",
        "missing_create",
        "missing_create_phone",
        "hub_unreachable",
        "hub_unreachable_phone",
        "model_reason",
        "model_reason_phone",
        "attention",
        "attention_phone",
        "edit_refused",
        "edit_source",
        "fixed",
        "restarted",
        "estimate_pair",
        "estimate_pair_phone",
    ];
    common::console_checks(
        &gantry,
        dir.path(),
        &base,
        "console_failures_browser.py",
        "failures-",
        &names,
        json!({
            "missing_path": missing_path,
            "outside_path": outside_path,
            "inside_path": inside_path,
            "model_dirs": models_arg,
        }),
    )
    .await;
}
