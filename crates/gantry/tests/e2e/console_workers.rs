//! The console's workers, guards, navigation and theme in a real browser (issue 40):
//! `gantry start` with a simulated 24 GiB GPU and a real llama-server, driven by
//! `tests/console_workers_browser.py` in Debian's chromium through Playwright; its
//! screenshots, at 1440×900 and 390×844, are written under the test target's
//! `ui-screenshots/`.
//!
//! - a worker shows the GPU memory its instances claim beside what it reports in use, the
//!   instances placed on it, and how it runs each backend (found, installed by gantry, or
//!   installed on first use);
//! - "Add a worker" shows the join command with the registration token, copies it, and the
//!   copied command, run as it is, joins a second worker;
//! - the last admin's role cannot be given up (the refusal is a sentence in the dialog),
//!   and a role changes only once confirmed;
//! - deleting a model a route targets names the route; a route to a model with no running
//!   instance is accepted with a warning;
//! - the navigation is in groups, a menu on a phone, and the models, instances and workers
//!   tables keep their key columns on one;
//! - the theme follows the system, or light or dark as chosen, remembered after a reload.

use crate::common;

use crate::common::{start_gantry, tiny_model};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_show_what_is_on_them_and_the_console_guards_and_fits_a_phone() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = tiny_model(dir.path());
    let (gantry, base) = start_gantry(dir.path(), &["--simulate-gpus", "1x24GiB"]).await;
    let token = std::fs::read_to_string(dir.path().join("data/registration_token")).unwrap();

    let names = [
        "workers_join",
        "workers_two",
        "worker",
        "worker_phone",
        "nav_desktop",
        "models_phone",
        "menu_phone",
        "instances_phone",
        "workers_phone",
        "last_admin",
        "role_confirm",
        "route_idle_warning",
        "delete_model_warning",
        "dark_desktop",
        "dark_phone",
        "light_chosen",
    ];
    // The second worker runs the copied command as it is, plus what keeps it on this
    // machine's loopback and out of other tests' ports.
    let mut joined = vec![
        "--data-dir".to_string(),
        dir.path().join("joined").display().to_string(),
        "--worker-name".into(),
        "joined".into(),
        "--simulate-gpus".into(),
        "1x8GiB".into(),
        "--model-dirs".into(),
        dir.path().display().to_string(),
    ];
    joined.extend(common::loopback_worker_args());
    common::console_checks(
        &gantry,
        dir.path(),
        &base,
        "console_workers_browser.py",
        "workers-",
        &names,
        json!({
            "model_path": model_path,
            "llama_server": common::llama_server(),
            "token": token.trim(),
            "gantry": env!("CARGO_BIN_EXE_gantry"),
            "joined_args": joined,
            "joined_log": dir.path().join("joined.log"),
        }),
    )
    .await;
}
