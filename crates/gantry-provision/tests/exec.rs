//! The `exec` provider against a real script: machines kept as files in a directory,
//! created, found by name, deleted, and a failure's own words.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;

use gantry_provision::exec::Exec;
use gantry_provision::MachineRequest;

/// A provider script: `create` writes `<dir>/<name>.json` with what it was given and
/// answers an id; `find` answers the machine when its file is there; `delete` removes
/// it. A name starting with `bad` fails with a message on stderr, as a cloud would.
const SCRIPT: &str = r#"#!/bin/bash
set -eu
dir="$(dirname "$0")/machines"
mkdir -p "$dir"
input=$(cat)
name=$(printf '%s' "$input" | sed -n 's/.*"name":"\([^"]*\)".*/\1/p')
case "${@: -1}" in
  create)
    if [[ "$name" == bad* ]]; then echo "quota exceeded: no GPUs left in region nyc2" >&2; exit 3; fi
    printf '%s' "$input" > "$dir/$name.json"
    printf '%s' "${GANTRY_POOL_CREDENTIALS:-none}" > "$dir/$name.credentials"
    echo "{\"external_id\": \"vm-$name\", \"address\": \"10.1.2.3\"}"
    ;;
  find)
    if [[ -f "$dir/$name.json" ]]; then echo "{\"external_id\": \"vm-$name\"}"; else echo null; fi
    ;;
  delete)
    rm -f "$dir/$name.json"
    ;;
esac
"#;

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
    std::fs::write(&script, SCRIPT).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exec = Exec::new(dir.path(), "provider.sh --verbose", Some("secret-token")).unwrap();

    assert_eq!(exec.find("p-1").await.unwrap(), None);
    let made = exec.create(&request("p-1")).await.unwrap();
    assert_eq!(made.external_id, "vm-p-1");
    assert_eq!(made.address.as_deref(), Some("10.1.2.3"));
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
        failed.0.contains("exited with exit status: 3")
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
