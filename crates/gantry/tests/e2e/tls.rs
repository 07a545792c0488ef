//! TLS on the server's port: `gantry server` with a certificate made in the test by a
//! test CA, a `gantry worker` that trusts that CA through `--server-ca-file` and joins over
//! `https://`, and clients of the API and the gateway over HTTPS. A plain-HTTP client, a
//! client that does not trust the CA and a worker without the CA file are refused. The
//! worker serves its own API over HTTPS with the same pair, and the server, trusting the
//! CA through `--worker-ca-file`, reaches it there.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{free_port, tail, Process, ADMIN_PASSWORD};
use gantry_client::Client;
use gantry_types::{WorkerQuery, WorkerState};

/// A CA and a server certificate it issued for 127.0.0.1 and localhost, as PEM files.
struct TestPki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    ca_pem: Vec<u8>,
}

fn make_pki(dir: &Path) -> TestPki {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "gantry test CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let leaf_params =
        rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &ca_cert, &ca_key).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    TestPki {
        ca: write("ca.pem", &ca_cert.pem()),
        cert: write("server.pem", &leaf.pem()),
        key: write("server-key.pem", &leaf_key.serialize_pem()),
        ca_pem: ca_cert.pem().into_bytes(),
    }
}

fn https_client(ca_pem: &[u8]) -> reqwest::Client {
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem).unwrap())
        .build()
        .unwrap()
}

fn worker_args(dir: &Path, name: &str, base: &str, token: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "worker",
        "--data-dir",
        &dir.join(name).display().to_string(),
        "--server-url",
        base,
        "--token",
        token,
        "--name",
        name,
        "--worker-host",
        "127.0.0.1",
        "--worker-port",
        &free_port().to_string(),
        "--advertise-host",
        "127.0.0.1",
        "--simulate-gpus",
        "1x8GiB",
        "--heartbeat-interval",
        "500ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_and_worker_speak_tls_with_a_certificate_made_in_the_test() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let port = free_port();
    let args: Vec<String> = [
        "server",
        "--data-dir",
        &dir.path().join("server").display().to_string(),
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--bootstrap-password",
        ADMIN_PASSWORD,
        "--tls-cert-file",
        &pki.cert.display().to_string(),
        "--tls-key-file",
        &pki.key.display().to_string(),
        "--worker-ca-file",
        &pki.ca.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let server = Process::spawn("server", &args, &dir.path().join("server.log"), &[]);
    let base = format!("https://127.0.0.1:{port}");
    let https = https_client(&pki.ca_pem);
    gantry_testkit::eventually(
        "the server to answer /readyz over HTTPS",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            Ok::<_, reqwest::Error>(https.get(format!("{base}/readyz")).send().await?.status())
        },
        |status| status.is_success(),
        || format!("log:\n{}", server.log_text()),
    )
    .await;
    assert!(
        server.log_text().contains("tls=true"),
        "the start-up line says TLS is on: {}",
        tail(&server.log_text(), 5)
    );

    // Plain HTTP to the TLS port gets no HTTP answer; a client that does not trust the
    // test CA refuses the certificate.
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/readyz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP was answered: {plain:?}");
    let untrusting = reqwest::Client::new()
        .get(format!("{base}/readyz"))
        .send()
        .await
        .unwrap_err();
    assert!(
        format!("{untrusting:?}")
            .to_lowercase()
            .contains("certificate"),
        "{untrusting:?}"
    );

    // The API and the gateway over HTTPS, with the typed client trusting the CA.
    let anonymous = Client::with_servers_trusting(vec![base.clone()], &pki.ca_pem).unwrap();
    let login = anonymous.login("admin", ADMIN_PASSWORD).await.unwrap();
    let admin = anonymous.for_token(login.token.clone());
    let models = https
        .get(format!("{base}/v1/models"))
        .bearer_auth(&login.token)
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 200, "{:?}", models.text().await);

    // A worker trusting the CA joins over HTTPS and stays ready on its heartbeats.
    let token = std::fs::read_to_string(dir.path().join("server/registration_token"))
        .unwrap()
        .trim()
        .to_string();
    let ca = pki.ca.display().to_string();
    let (cert, key) = (
        pki.cert.display().to_string(),
        pki.key.display().to_string(),
    );
    let worker = Process::spawn(
        "worker w1",
        &worker_args(
            dir.path(),
            "w1",
            &base,
            &token,
            &[
                "--server-ca-file",
                &ca,
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
            ],
        ),
        &dir.path().join("w1.log"),
        &[],
    );
    let ready = common::poll(
        "worker w1 ready over HTTPS",
        Duration::from_secs(30),
        &[&server, &worker],
        || async {
            admin
                .list_workers(&WorkerQuery::default())
                .await
                .map(|page| page.items)
        },
        |workers| {
            workers
                .iter()
                .any(|w| w.name == "w1" && w.state == WorkerState::Ready)
        },
    )
    .await;
    let w1 = ready.iter().find(|w| w.name == "w1").unwrap();
    let first = w1.last_heartbeat_at.unwrap();
    common::poll(
        "a later heartbeat of w1 over HTTPS",
        Duration::from_secs(10),
        &[&server, &worker],
        || async { admin.get_worker(w1.id).await },
        |w| w.last_heartbeat_at.is_some_and(|at| at > first) && w.state == WorkerState::Ready,
    )
    .await;

    // The worker's own API speaks HTTPS, and the server reaches it there (its model
    // files, read through the server); plain HTTP to the worker's port gets no answer.
    assert!(
        w1.address.starts_with("https://127.0.0.1:"),
        "{}",
        w1.address
    );
    let files = https
        .get(format!("{base}/api/v1/model-files?worker_id={}", w1.id))
        .bearer_auth(&login.token)
        .send()
        .await
        .unwrap();
    assert_eq!(files.status(), 200);
    let files: serde_json::Value = files.json().await.unwrap();
    assert_eq!(
        files["unreachable"],
        serde_json::json!([]),
        "the server reached the worker over HTTPS: {files}\nserver log:\n{}",
        tail(&server.log_text(), 10)
    );
    let plain_worker = reqwest::Client::new()
        .get(format!(
            "http://{}/healthz",
            w1.address.trim_start_matches("https://")
        ))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(
        plain_worker.is_err(),
        "plain HTTP was answered: {plain_worker:?}"
    );

    // A worker without the CA cannot register, and says why.
    let lost = Process::spawn(
        "worker w2",
        &worker_args(dir.path(), "w2", &base, &token, &[]),
        &dir.path().join("w2.log"),
        &[],
    );
    gantry_testkit::eventually(
        "worker w2 to report the untrusted certificate",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async { Ok::<_, std::convert::Infallible>(lost.log_text()) },
        |log| log.to_lowercase().contains("certificate"),
        || format!("log:\n{}", lost.log_text()),
    )
    .await;
    assert!(
        admin
            .list_workers(&WorkerQuery::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|w| w.name != "w2"),
        "a worker that does not trust the server registered"
    );
    drop(lost);
    drop(worker);
    drop(server);
}
