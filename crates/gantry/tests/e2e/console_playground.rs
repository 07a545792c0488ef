//! The console's playground, model page, catalog, usage and model files in a real browser
//! (issue 40): `gantry start` with a real llama-server and simulated GPUs, and the slow
//! OpenAI double (`tests/slow_openai.py`) as a provider behind two routes, one that ticks
//! for a minute and one that answers fixed Markdown. Driven by
//! `tests/console_playground_browser.py` in Debian's chromium through Playwright; its
//! screenshots, at 1440×900 and 390×844, are written under the test target's
//! `ui-screenshots/`.
//!
//! - while an answer streams, its time to first token shows as soon as the first text
//!   came and its speed and length as it goes; after Stop the length is in tokens, said to
//!   be estimated; an answer that reports its usage is counted by it;
//! - answers are Markdown (code blocks, lists, links), with raw HTML and a
//!   `javascript:` link inert; `lib/markdown.js` itself is checked case by case in the
//!   page;
//! - a model's page shows its settings, its instances with why they are not running, its
//!   estimate, its usage and the routes that use it;
//! - the catalog is searched, its cards line up and its form shows whole names;
//! - the usage page's 7-day view has a bar a day;
//! - the model files screen lists the files read in place, and an upload deploys.

use crate::common;

use std::path::Path;
use std::time::Duration;

use crate::common::{start_gantry, tiny_model};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_playground_streams_markdown_and_counts_truthfully_and_the_model_page_shows_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = tiny_model(dir.path());
    // Three entries to search among: one on this machine, two from a hub the test points
    // at a closed loopback port (the fit check fails here without leaving the machine).
    let catalog = dir.path().join("catalog.yaml");
    std::fs::write(
        &catalog,
        common::tiny_catalog_entry(&model_path)
            + "- name: llama-3.2-3b-instruct\n  title: Llama 3.2 3B Instruct (Q4_K_M)\n  \
             description: Meta's Llama 3.2 chat model at 3B; fits a small GPU.\n  tags: [chat]\n  \
             parameters: 3.2B\n  size: 2.0 GB\n  \
             source: {type: huggingface, repo_id: bartowski/Llama-3.2-3B-Instruct-GGUF, \
             file: Llama-3.2-3B-Instruct-Q4_K_M.gguf}\n  backend: llama.cpp\n  \
             backend_args: [--ctx-size, \"8192\"]\n\
             - name: nomic-embed-text\n  title: Nomic Embed Text v1.5 (Q4_K_M)\n  \
             tags: [embedding, small]\n  parameters: 137M\n  size: 0.1 GB\n  \
             source: {type: huggingface, repo_id: nomic-ai/nomic-embed-text-v1.5-GGUF, \
             file: nomic-embed-text-v1.5.Q4_K_M.gguf}\n  backend: llama.cpp\n  \
             backend_args: [--embedding]\n",
    )
    .unwrap();
    let catalog_arg = catalog.display().to_string();
    let closed_hub = format!("http://127.0.0.1:{}", common::free_port());
    let (gantry, base) = start_gantry(
        dir.path(),
        &[
            "--simulate-gpus",
            "2x24GiB",
            "--model-catalog-file",
            &catalog_arg,
            "--hf-endpoint",
            &closed_hub,
        ],
    )
    .await;
    let (_double, double_url) = start_slow_double(dir.path()).await;

    let names = [
        "streaming",
        "streaming_phone",
        "stopped",
        "markdown",
        "markdown_phone",
        "model_page",
        "model_page_phone",
        "model_pending",
        "model_missing",
        "catalog",
        "catalog_phone",
        "catalog_search",
        "catalog_deploy",
        "usage_week",
        "usage_week_phone",
        "model_files",
        "model_files_phone",
        "upload_deploy",
        "uploaded_model",
    ];
    common::console_checks(
        &gantry,
        dir.path(),
        &base,
        "console_playground_browser.py",
        "playground-",
        &names,
        json!({
            "model_path": model_path,
            "model": "tiny-chat",
            "slow_url": format!("{double_url}/v1"),
        }),
    )
    .await;
}

/// Starts `slow_openai.py` on a free port; returns it (killed when dropped) and its URL.
async fn start_slow_double(dir: &Path) -> (tokio::process::Child, String) {
    let port = common::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/slow_openai.py");
    let log = std::fs::File::create(dir.join("slow-double.log")).unwrap();
    let double = tokio::process::Command::new(gantry_testkit::browser::python())
        .arg(&script)
        .args(["--port", &port.to_string()])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    gantry_testkit::eventually(
        "the slow double to listen",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            Ok::<_, reqwest::Error>(http.get(format!("{url}/health")).send().await?.status())
        },
        |status| status.is_success(),
        String::new,
    )
    .await;
    (double, url)
}
