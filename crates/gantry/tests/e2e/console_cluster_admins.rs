//! The console of a cluster administrator, a user who is not an admin, in a real browser:
//! `gantry start` with a simulated 24 GiB GPU (the default cluster and its worker) and a
//! real llama-server, driven by `tests/console_cluster_admins_browser.py` in Debian's
//! chromium through Playwright; its screenshots, at 1440×900 and 390×844, are written
//! under the test target's `ui-screenshots/`.
//!
//! - an admin makes a cluster, joins a second worker to it and makes a user who
//!   administers it and a plain user (through the API);
//! - the cluster administrator sees the Clusters and Workers screens with only their
//!   cluster and its worker: no New cluster, Edit, Delete, join command, token or
//!   rotation, the cluster's pools without their actions, the worker's labels editable but
//!   no Delete;
//! - they deploy a model from the New model form, whose cluster select holds only their
//!   cluster, chosen; it runs on their cluster's worker, and its row has Edit and Delete,
//!   its instance Restart;
//! - once the admin takes the cluster from them, saving a worker's labels is refused and
//!   the dialog shows the server's sentence;
//! - a plain user sees no Clusters or Workers entries and no New model, and the workers'
//!   address leads to the overview.

use crate::common;

use crate::common::{start_gantry, tiny_model};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_administrators_see_and_change_only_their_clusters_in_the_console() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = tiny_model(dir.path());
    let (gantry, base) = start_gantry(dir.path(), &["--simulate-gpus", "1x24GiB"]).await;

    let names = [
        "clusters",
        "clusters_phone",
        "cluster_page",
        "workers",
        "workers_phone",
        "model_form",
        "models",
        "models_phone",
        "refused",
        "plain_user",
        "plain_user_phone",
    ];
    // The machine that joins the new cluster: its join command, plus what keeps it on this
    // machine's loopback and out of other tests' ports, and the test llama-server, so that
    // a model deployed into that cluster runs there.
    let mut joined = vec![
        "--data-dir".to_string(),
        dir.path().join("east-1").display().to_string(),
        "--worker-name".into(),
        "east-1".into(),
        "--simulate-gpus".into(),
        "1x8GiB".into(),
        "--model-dirs".into(),
        dir.path().display().to_string(),
        "--llama-server-path".into(),
        common::llama_server().display().to_string(),
    ];
    joined.extend(common::loopback_worker_args());
    common::console_checks(
        &gantry,
        dir.path(),
        &base,
        "console_cluster_admins_browser.py",
        "cluster-admins-",
        &names,
        json!({
            "model_path": model_path,
            "gantry": env!("CARGO_BIN_EXE_gantry"),
            "joined_args": joined,
            "joined_log": dir.path().join("east-1.log"),
        }),
    )
    .await;
}
