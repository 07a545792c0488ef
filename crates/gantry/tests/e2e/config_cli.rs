//! The binary's configuration path end to end: a bad value from any source stops
//! start-up before anything runs, with a message naming the key and the source, and
//! `--help` documents every key. These runs never get as far as opening a database.

use std::process::{Command, Output};

fn gantry(args: &[&str], env: &[(&str, &str)]) -> Output {
    let data_dir = tempfile::tempdir().expect("temporary data directory");
    let mut command = Command::new(env!("CARGO_BIN_EXE_gantry"));
    command
        .args(args)
        .env("GANTRY_DATA_DIR", data_dir.path())
        .env_remove("GANTRY_CONFIG");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run gantry")
}

fn failure_message(output: &Output) -> String {
    assert!(
        !output.status.success(),
        "gantry should have refused to start"
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_bad_flag_value_stops_start_up_naming_the_key_and_flag() {
    let output = gantry(&["server", "--port", "eighty"], &[]);
    let stderr = failure_message(&output);
    assert!(
        stderr.contains("invalid value \"eighty\" for port (from flag --port)"),
        "{stderr}"
    );
}

#[test]
fn a_bad_variable_stops_start_up_naming_the_key_and_variable() {
    let output = gantry(&["start"], &[("GANTRY_MAX_REQUEST_BODY", "20X")]);
    let stderr = failure_message(&output);
    assert!(
        stderr.contains("for max_request_body (from environment variable GANTRY_MAX_REQUEST_BODY)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("KiB, MiB, GiB"),
        "names the accepted forms: {stderr}"
    );
}

#[test]
fn a_bad_file_stops_start_up_naming_the_key_and_file() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("gantry.yaml");
    std::fs::write(&path, "worker_nme: w1\n").expect("write the config file");
    let file = path.to_str().expect("a UTF-8 path");
    let output = gantry(&["worker", "--config", file], &[]);
    let stderr = failure_message(&output);
    assert!(stderr.contains(file), "{stderr}");
    assert!(stderr.contains("unknown key \"worker_nme\""), "{stderr}");

    std::fs::write(&path, "stop_grace_period: 0s\n").expect("write the config file");
    let output = gantry(&["worker", "--config", file], &[]);
    let stderr = failure_message(&output);
    assert!(
        stderr.contains(&format!("for stop_grace_period (from config file {file})")),
        "{stderr}"
    );
}

#[test]
fn help_documents_each_key_with_its_default() {
    let output = gantry(&["worker", "--help"], &[]);
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for needle in [
        "--port-range <LOW-HIGH>",
        "Ports for backend processes. [default: 40000-40999] [env: GANTRY_PORT_RANGE]",
        "--heartbeat-interval <DURATION>",
        "[default: 15s]",
        "[alias: --name]",
        "[alias: --server-url]",
    ] {
        assert!(help.contains(needle), "{needle:?} missing from:\n{help}");
    }
}
