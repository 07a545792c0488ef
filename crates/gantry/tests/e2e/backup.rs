//! `gantry backup` while the server runs and `gantry restore` with it stopped: the
//! restored server has what the backup had (a model made before it) and not what came
//! after; restore refuses while the server runs, backup refuses to overwrite a file, and
//! the database the restore replaced is kept.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::{manual_model_create, Cluster};
use gantry_types::ModelQuery;

fn gantry(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_gantry"))
        .args(args)
        .env("GANTRY_LOG_LEVEL", "warn")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

async fn model_names(server: &Cluster) -> Vec<String> {
    let mut names: Vec<String> = server
        .client()
        .list_models(&ModelQuery::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|m| m.name)
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_serving_restores_with_the_server_stopped() {
    let mut server = Cluster::start(&[]).await;
    let data_dir = server.dir.path().join("server").display().to_string();
    let model_file = server.dir.path().join("tiny.gguf");
    std::fs::write(&model_file, b"not read: the model is placed by hand").unwrap();
    server
        .client()
        .create_model(&manual_model_create("before", &model_file, 1))
        .await
        .unwrap();

    let backup = server.dir.path().join("backup.db");
    let backup_arg = backup.display().to_string();
    let (ok, text) = gantry(&["backup", "--data-dir", &data_dir, "--out", &backup_arg]);
    assert!(ok, "{text}");
    assert!(text.contains("gantry restore --from"), "{text}");
    let (ok, text) = gantry(&["backup", "--data-dir", &data_dir, "--out", &backup_arg]);
    assert!(!ok && text.contains("exists already"), "{text}");

    server
        .client()
        .create_model(&manual_model_create("after", &model_file, 1))
        .await
        .unwrap();
    assert_eq!(model_names(&server).await, ["after", "before"]);

    let (ok, text) = gantry(&["restore", "--data-dir", &data_dir, "--from", &backup_arg]);
    assert!(!ok && text.contains("a server is running"), "{text}");

    let mut restored = (false, String::new());
    server
        .restart_with(Duration::from_secs(20), || {
            restored = gantry(&["restore", "--data-dir", &data_dir, "--from", &backup_arg]);
        })
        .await;
    assert!(restored.0, "{}", restored.1);
    assert_eq!(model_names(&server).await, ["before"]);
    let kept: Vec<String> = std::fs::read_dir(Path::new(&data_dir))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("gantry.db.before-restore-"))
        .collect();
    assert!(!kept.is_empty(), "the replaced database is kept");

    let (ok, text) = gantry(&[
        "backup",
        "--database-url",
        "postgres://127.0.0.1:1/gantry",
        "--out",
        "/tmp/never-written.db",
    ]);
    assert!(!ok && text.contains("pg_dump"), "{text}");
}
