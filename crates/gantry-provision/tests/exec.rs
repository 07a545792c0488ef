//! The `exec` provider against a real script (the test kit's cloud: machines kept as
//! files): created, found by name, deleted, and a failure's own words.

#![allow(clippy::unwrap_used)]

use gantry_provision::exec::Exec;
use gantry_provision::MachineRequest;
use gantry_testkit::cloud::{write_cloud_script, Cloud};

fn request(name: &str) -> MachineRequest {
    MachineRequest {
        name: name.into(),
        cluster_token: "gantryreg_x".into(),
        server_urls: vec!["http://127.0.0.1:8080".into()],
        instance_type: "a100".into(),
        image: "ubuntu".into(),
        region: "nyc2".into(),
        gpus: "1x80GiB".into(),
        labels: [("gantry.dev/pool".to_owned(), "p".to_owned())].into(),
    }
}

#[tokio::test]
async fn a_script_creates_finds_and_deletes_machines() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("provider.sh");
    write_cloud_script(
        &script,
        Cloud {
            fail_names_starting: Some(("bad", "quota exceeded: no GPUs left in region nyc2")),
            ..Cloud::default()
        },
    );
    let exec = Exec::new(dir.path(), "provider.sh --verbose", Some("secret-token")).unwrap();

    assert_eq!(exec.find("p-1").await.unwrap(), None);
    let made = exec.create(&request("p-1")).await.unwrap();
    assert_eq!(made.external_id, "vm-p-1");
    assert_eq!(made.address.as_deref(), Some("127.0.0.1"));
    let given: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("machines/p-1.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(given["cluster_token"], "gantryreg_x");
    assert_eq!(given["labels"]["gantry.dev/pool"], "p");
    assert!(given["user_data"]
        .as_str()
        .unwrap()
        .contains("GANTRY_WORKER_NAME=p-1"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("machines/p-1.credentials")).unwrap(),
        "secret-token"
    );
    assert_eq!(
        exec.find("p-1").await.unwrap().unwrap().external_id,
        "vm-p-1"
    );
    exec.delete("p-1", Some("vm-p-1")).await.unwrap();
    assert_eq!(exec.find("p-1").await.unwrap(), None);
    exec.delete("p-1", None).await.unwrap();

    let failed = exec.create(&request("bad-1")).await.unwrap_err();
    assert!(
        failed.0.contains("exited with exit status: 2")
            && failed
                .0
                .contains("quota exceeded: no GPUs left in region nyc2"),
        "{failed}"
    );
    assert!(Exec::new(dir.path(), "'unclosed", None).is_err());
    assert!(
        Exec::new(dir.path(), "/bin/rm -rf", None).is_err(),
        "a path, not a name"
    );
    assert!(Exec::new(dir.path(), "../provider.sh", None).is_err());
    let missing = Exec::new(dir.path(), "nonexistent", None).unwrap();
    let error = missing.find("x").await.unwrap_err();
    assert!(error.0.contains("cannot run the pool's command"), "{error}");
}
