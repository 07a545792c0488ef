//! The console's clusters in a real browser (issue 41): `gantry start` with a simulated
//! 24 GiB GPU (the default cluster and its worker) and a real llama-server, driven by
//! `tests/console_clusters_browser.py` in Debian's chromium through Playwright; its
//! screenshots, at 1440×900 and 390×844, are written under the test target's
//! `ui-screenshots/`.
//!
//! - a cluster made with "New cluster" opens on its page with its join command, copied,
//!   which run as it is joins a second worker to that cluster: the page's and the list's
//!   counts show it;
//! - the workers, models, instances and overview screens filter by cluster once there are
//!   two, and the model form deploys into the cluster chosen (the one the list shows):
//!   the model runs on that cluster's worker, and its page names the cluster;
//! - a second cluster of the same name and the deletion of a cluster with a worker and a
//!   model are refused with sentences that say why; the default cluster has no Delete;
//! - "Rotate token" asks first, says registered workers keep working, and shows the new
//!   command; the joined worker stays ready;
//! - a Kubernetes cluster shows its manifests, with the image chosen, to copy;
//! - a user is made the administrator of a cluster from the users screen;
//! - on a cluster's page, a worker pool of the `exec` provider whose program is not in the
//!   server's `pool_commands_dir` is refused with a sentence; one whose program (the
//!   testkit's cloud, refusing this pool's machines as a cloud out of GPUs would) is there
//!   is made, shows "has credentials" and never the credentials, and its machine shows the
//!   provider's words and a failed event; its bounds are changed (a min above max refused
//!   with a sentence), and it is deleted after a confirmation that its machines go too.

use crate::common;

use crate::common::{start_gantry, tiny_model};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_are_made_joined_filtered_deployed_into_and_guarded_in_the_console() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = tiny_model(dir.path());
    let (gantry, base) = start_gantry(
        dir.path(),
        &["--simulate-gpus", "1x24GiB", "--pool-interval", "1s"],
    )
    .await;
    // The exec pools' programs are in <data dir>/pool-commands.
    let commands = dir.path().join("data/pool-commands");
    std::fs::create_dir_all(&commands).unwrap();
    gantry_testkit::cloud::write_cloud_script(
        &commands.join("cloud.sh"),
        gantry_testkit::cloud::Cloud {
            fail_names_starting: Some(("burst", "out of capacity: no GPUs left in region lab-1")),
            ..Default::default()
        },
    );

    let names = [
        "clusters_new",
        "cluster_join",
        "cluster_join_phone",
        "duplicate_name",
        "clusters_list",
        "clusters_phone",
        "workers_filtered",
        "model_form_cluster",
        "model_page",
        "overview_filtered",
        "delete_refused",
        "rotate_confirm",
        "kubernetes",
        "kubernetes_phone",
        "users_clusters",
        "pool_refused",
        "pool_failing",
        "pool_failing_phone",
        "pool_edit_refused",
        "pool_delete",
    ];
    // The machine that joins the new cluster runs the copied command as it is, plus what
    // keeps it on this machine's loopback and out of other tests' ports, and the test
    // llama-server, so that a model deployed into that cluster runs there.
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
        "console_clusters_browser.py",
        "clusters-",
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
