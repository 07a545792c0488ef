//! A real S3-compatible server for tests: moto's `moto_server` (the `moto[s3,server]`
//! package of the `$GANTRY_PYTHON` virtual environment that scripts/python-env.sh makes),
//! started as a process on a free loopback port and killed when the [`S3Server`] is
//! dropped. Not a double written for gantry: moto implements S3's REST API (listing,
//! `HEAD`, ranges, multipart uploads, presigned URLs) as a separate project does, so code
//! talking to it talks S3.
//!
//! Buckets and objects are made through the S3 API itself: [`S3Server::create_bucket`]
//! (a plain `PUT /<bucket>`; moto takes it without credentials until
//! [`S3Server::require_credentials`]), [`S3Server::put`] and
//! [`S3Server::put_multipart`] with `object_store`'s S3 client, signed with
//! [`S3Server::access_key`] and [`S3Server::secret_key`].
//!
//! moto accepts any credentials until [`S3Server::require_credentials`] turns its IAM
//! checks on: from then on only a key it issued is accepted, and requests signed with
//! anything else are refused with 403 `SignatureDoesNotMatch` or `InvalidAccessKeyId`.
//! moto cannot check presigned URLs in that mode (it answers them with a 500), so a test
//! of refused credentials is one of requests signed in the `Authorization` header
//! (listing a prefix).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};

/// The region the server's clients sign for (moto answers for any).
pub const REGION: &str = "us-east-1";

/// A running `moto_server`.
#[derive(Debug)]
pub struct S3Server {
    child: Child,
    endpoint: String,
    access_key: String,
    secret_key: String,
    /// Where the server's output goes: shown when it fails to start.
    log: tempfile::NamedTempFile,
}

impl S3Server {
    /// Starts `moto_server` on a free loopback port and waits until it accepts
    /// connections. Panics when `GANTRY_PYTHON` is unset or the server does not start.
    pub async fn start() -> Self {
        let python = python();
        let script = python
            .parent()
            .expect("the python of a virtual environment lies in its bin directory")
            .join("moto_server");
        assert!(
            script.is_file(),
            "{} does not exist: GANTRY_PYTHON must be the python of the environment \
             scripts/python-env.sh makes (it installs moto[s3,server])",
            script.display()
        );
        let port = crate::free_port();
        let log = tempfile::NamedTempFile::new().expect("create the moto_server log file");
        // The script is run by the venv's python rather than executed: python-env.sh
        // builds the environment elsewhere and moves it, so the scripts' `#!` lines name
        // a directory that no longer exists.
        let child = Command::new(&python)
            .arg(&script)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            // Lets tests make multipart objects out of small parts (S3's minimum is 5 MiB).
            .env("S3_UPLOAD_PART_MIN_SIZE", "1")
            .stdin(Stdio::null())
            .stdout(log.reopen().expect("reopen the moto_server log"))
            .stderr(log.reopen().expect("reopen the moto_server log"))
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", script.display()));
        let mut server = Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            access_key: "gantry-test-access".to_owned(),
            secret_key: "gantry-test-secret".to_owned(),
            log,
        };
        server.wait_until_listening(port).await;
        server
    }

    /// `http://127.0.0.1:<port>`: the `s3_endpoint` of the server.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// An access key the server accepts.
    pub fn access_key(&self) -> &str {
        &self.access_key
    }

    /// The secret key of [`S3Server::access_key`].
    pub fn secret_key(&self) -> &str {
        &self.secret_key
    }

    /// What the server printed so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// Creates `bucket` (before [`S3Server::require_credentials`]: the request is not
    /// signed).
    pub async fn create_bucket(&self, bucket: &str) {
        let response = reqwest::Client::new()
            .put(format!("{}/{bucket}", self.endpoint))
            .send()
            .await
            .unwrap_or_else(|e| panic!("create bucket {bucket}: {e}"));
        assert!(
            response.status().is_success(),
            "create bucket {bucket}: {}",
            response.status()
        );
    }

    /// Lets anyone read the objects of `bucket` (a bucket policy allowing `s3:GetObject`
    /// to every principal), before [`S3Server::require_credentials`].
    pub async fn make_public(&self, bucket: &str) {
        // moto checks a HEAD against `s3:HeadObject`, an action of its own (AWS checks
        // `s3:GetObject`), so the policy names both.
        let policy = format!(
            r#"{{"Version":"2012-10-17","Statement":[{{"Effect":"Allow","Principal":"*","Action":["s3:GetObject","s3:HeadObject"],"Resource":"arn:aws:s3:::{bucket}/*"}}]}}"#
        );
        let response = reqwest::Client::new()
            .put(format!("{}/{bucket}?policy", self.endpoint))
            // moto reads a request without this header as an anonymous one, and refuses
            // it; with it, moto (checking no credentials yet) takes the request as signed.
            .header("authorization", unchecked_authorization("s3"))
            .body(policy)
            .send()
            .await
            .unwrap_or_else(|e| panic!("make bucket {bucket} public: {e}"));
        assert!(
            response.status().is_success(),
            "make bucket {bucket} public: {}",
            response.status()
        );
    }

    /// Uploads `bytes` as `bucket/key` in one part and returns its ETag (without quotes:
    /// the MD5 of the bytes).
    pub async fn put(&self, bucket: &str, key: &str, bytes: &[u8]) -> String {
        let result = self
            .client(bucket)
            .put(&object_path(key), PutPayload::from(bytes.to_vec()))
            .await
            .unwrap_or_else(|e| panic!("put s3://{bucket}/{key}: {e}"));
        unquoted(result.e_tag)
    }

    /// The bytes of `bucket/key`.
    pub async fn get(&self, bucket: &str, key: &str) -> Vec<u8> {
        let result = self
            .client(bucket)
            .get(&object_path(key))
            .await
            .unwrap_or_else(|e| panic!("get s3://{bucket}/{key}: {e}"));
        result
            .bytes()
            .await
            .unwrap_or_else(|e| panic!("read s3://{bucket}/{key}: {e}"))
            .to_vec()
    }

    /// Uploads `bucket/key` as a multipart upload of `parts` and returns its ETag
    /// (`<hex>-<number of parts>`, no digest of the bytes).
    pub async fn put_multipart(&self, bucket: &str, key: &str, parts: &[&[u8]]) -> String {
        let mut upload = self
            .client(bucket)
            .put_multipart(&object_path(key))
            .await
            .unwrap_or_else(|e| panic!("start a multipart upload of s3://{bucket}/{key}: {e}"));
        for part in parts {
            upload
                .put_part(PutPayload::from(part.to_vec()))
                .await
                .unwrap_or_else(|e| panic!("upload a part of s3://{bucket}/{key}: {e}"));
        }
        let result = upload
            .complete()
            .await
            .unwrap_or_else(|e| panic!("complete the upload of s3://{bucket}/{key}: {e}"));
        unquoted(result.e_tag)
    }

    /// Turns moto's credential checks on: an IAM user allowed `s3:*` gets an access key,
    /// which becomes [`S3Server::access_key`] and [`S3Server::secret_key`]; requests signed
    /// with any other key are refused from then on. Presigned URLs stop working (moto
    /// answers them with a 500).
    pub async fn require_credentials(&mut self) {
        let user = "gantry-test";
        self.iam(&[("Action", "CreateUser"), ("UserName", user)])
            .await;
        let policy = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:*","Resource":"*"}]}"#;
        self.iam(&[
            ("Action", "PutUserPolicy"),
            ("UserName", user),
            ("PolicyName", "s3"),
            ("PolicyDocument", policy),
        ])
        .await;
        let created = self
            .iam(&[("Action", "CreateAccessKey"), ("UserName", user)])
            .await;
        self.access_key = xml_text(&created, "AccessKeyId");
        self.secret_key = xml_text(&created, "SecretAccessKey");
        // A count of 0 requests without checks: every request from now on is checked.
        let response = reqwest::Client::new()
            .post(format!("{}/moto-api/reset-auth", self.endpoint))
            .body("0")
            .send()
            .await
            .expect("turn moto's credential checks on");
        assert!(response.status().is_success(), "{}", response.status());
    }

    /// An IAM query-API call, made while moto checks no credentials: the `Authorization`
    /// header only tells moto which service the request is for.
    async fn iam(&self, params: &[(&str, &str)]) -> String {
        let mut form: Vec<(&str, &str)> = vec![("Version", "2010-05-08")];
        form.extend_from_slice(params);
        let response = reqwest::Client::new()
            .post(&self.endpoint)
            .header("authorization", unchecked_authorization("iam"))
            .form(&form)
            .send()
            .await
            .unwrap_or_else(|e| panic!("IAM {params:?}: {e}"));
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        assert!(status.is_success(), "IAM {params:?}: {status}: {body}");
        body
    }

    /// The S3 client of `bucket`, signing with the server's current key.
    fn client(&self, bucket: &str) -> AmazonS3 {
        AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_region(REGION)
            .with_bucket_name(bucket)
            .with_access_key_id(&self.access_key)
            .with_secret_access_key(&self.secret_key)
            .with_allow_http(true)
            .build()
            .expect("build an S3 client for moto")
    }

    async fn wait_until_listening(&mut self, port: u16) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().expect("poll moto_server") {
                panic!("moto_server exited with {status}:\n{}", self.log_text());
            }
            if tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port))
                .await
                .is_ok()
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "moto_server did not listen on port {port} within 60 s:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn python() -> PathBuf {
    match std::env::var_os("GANTRY_PYTHON") {
        Some(python) => PathBuf::from(python),
        None => panic!(
            "GANTRY_PYTHON is not set. The S3 tests run moto's S3 server from it: run the \
             tests with scripts/test.sh, or set GANTRY_PYTHON=$(scripts/python-env.sh | tail -1)."
        ),
    }
}

/// An `Authorization` header for a request to `service` that moto routes by it but, until
/// [`S3Server::require_credentials`], does not check.
fn unchecked_authorization(service: &str) -> String {
    format!(
        "AWS4-HMAC-SHA256 Credential=gantry-test/20260101/{REGION}/{service}/aws4_request, \
         SignedHeaders=host, Signature=0"
    )
}

fn object_path(key: &str) -> ObjectPath {
    ObjectPath::parse(key).unwrap_or_else(|e| panic!("{key:?} is not an object key: {e}"))
}

fn unquoted(etag: Option<String>) -> String {
    etag.expect("S3 answers an upload with its ETag")
        .trim_matches('"')
        .to_owned()
}

/// The text of the first `<tag>` of an XML answer.
fn xml_text(xml: &str, tag: &str) -> String {
    let open = format!("<{tag}>");
    let start = xml
        .find(&open)
        .unwrap_or_else(|| panic!("no <{tag}> in {xml}"))
        + open.len();
    let end = xml[start..]
        .find(&format!("</{tag}>"))
        .unwrap_or_else(|| panic!("no </{tag}> in {xml}"));
    xml[start..start + end].to_owned()
}
