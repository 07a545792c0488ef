//! The `s3` model source against a real S3-compatible server (moto's `moto_server`, from
//! `gantry_testkit::s3`): resolving a key, a prefix and a split GGUF, reading through the
//! presigned URLs, downloading into the cache (MD5-checked against the ETag, reused,
//! resumed), and the errors for a missing object, refused credentials and an unreachable
//! store.
//!
//! Needs `GANTRY_PYTHON` (scripts/python-env.sh prints it; scripts/test.sh sets it).
//! Without it the tests fail saying so; they never skip.

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gantry_source::cache::{Fetched, ModelCache, Progress};
use gantry_source::{Resolved, S3Config, SourceConfig, SourceError, Sources};
use gantry_testkit::s3::{S3Server, REGION};
use gantry_types::{BackendKind, ModelSource};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const BUCKET: &str = "models";

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn sources(endpoint: &str, access_key: &str, secret_key: &str) -> Sources {
    Sources::new(SourceConfig {
        s3: S3Config {
            endpoint: Some(endpoint.to_owned()),
            region: REGION.to_owned(),
            access_key: Some(access_key.to_owned()),
            secret_key: Some(secret_key.to_owned()),
        },
        ..SourceConfig::default()
    })
}

fn sources_for(server: &S3Server) -> Sources {
    sources(server.endpoint(), server.access_key(), server.secret_key())
}

fn s3(key: &str) -> ModelSource {
    ModelSource::S3 {
        bucket: BUCKET.to_owned(),
        key: key.to_owned(),
    }
}

fn paths(resolved: &Resolved) -> Vec<&str> {
    resolved.files.iter().map(|f| f.path.as_str()).collect()
}

async fn fetch(cache: &ModelCache, resolved: &Resolved) -> Result<Fetched, SourceError> {
    let (progress, _) = watch::channel(Progress::default());
    cache
        .fetch(resolved, &progress, &CancellationToken::new())
        .await
}

fn files_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The message of an error, checked not to hold the secret key.
fn message(error: &SourceError, secret_key: &str) -> String {
    let message = error.to_string();
    assert!(
        !message.contains(secret_key),
        "the secret key is in: {message}"
    );
    message
}

#[tokio::test]
async fn an_object_key_resolves_to_a_presigned_md5_checked_file_that_header_reads_can_use() {
    let server = S3Server::start().await;
    server.create_bucket(BUCKET).await;
    let content = bytes(1, 4096);
    let etag = server.put(BUCKET, "qwen/tiny.gguf", &content).await;
    let sources = sources_for(&server);

    let resolved = sources
        .resolve(&s3("qwen/tiny.gguf"), BackendKind::LlamaCpp)
        .await
        .unwrap();
    assert_eq!(paths(&resolved), ["tiny.gguf"]);
    let file = &resolved.files[0];
    assert_eq!(file.size, Some(4096));
    assert_eq!(
        file.md5.as_deref(),
        Some(etag.as_str()),
        "the ETag is the MD5"
    );
    assert_eq!(file.sha256, None);
    assert!(
        file.url
            .starts_with(&format!("{}/{BUCKET}/qwen/tiny.gguf?", server.endpoint())),
        "a path-style URL: {}",
        file.url
    );
    assert!(file.url.contains("X-Amz-Signature="), "{}", file.url);
    assert!(file.url.contains("X-Amz-Expires=43200"), "{}", file.url);
    assert!(!file.url.contains(server.secret_key()));
    assert!(file.cache_id.as_deref().unwrap().contains(&etag));
    assert!(
        resolved.key.starts_with("s3/models/qwen/tiny.gguf/"),
        "{}",
        resolved.key
    );
    // What the scheduler's header reads do: a range of the presigned URL.
    let range = sources.read_range(file, 100, 50).await.unwrap();
    assert_eq!(&range[..], &content[100..150]);
}

#[tokio::test]
async fn a_prefix_gives_vllm_its_weights_configs_and_tokenizer_files_only() {
    let server = S3Server::start().await;
    server.create_bucket(BUCKET).await;
    for key in [
        "qwen/config.json",
        "qwen/model-00001-of-00002.safetensors",
        "qwen/model-00002-of-00002.safetensors",
        "qwen/model.safetensors.index.json",
        "qwen/tokenizer.json",
        "qwen/README.md",
        "qwen/original/params.json",
        "other/config.json",
    ] {
        server.put(BUCKET, key, key.as_bytes()).await;
    }
    let resolved = sources_for(&server)
        .resolve(&s3("qwen/"), BackendKind::Vllm)
        .await
        .unwrap();
    assert_eq!(
        paths(&resolved),
        [
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "tokenizer.json"
        ]
    );
    assert!(
        resolved.key.starts_with("s3/models/qwen/"),
        "{}",
        resolved.key
    );
    assert!(resolved.files.iter().all(|f| f.md5.is_some()));

    // A prefix without weights is refused, saying what vLLM needs.
    let error = sources_for(&server)
        .resolve(&s3("other/"), BackendKind::Vllm)
        .await
        .unwrap_err();
    assert!(matches!(error, SourceError::Invalid(_)), "{error:?}");
    assert!(error.to_string().contains("safetensors"), "{error}");
}

#[tokio::test]
async fn a_split_gguf_comes_whole_and_first_part_first_from_a_prefix_or_any_part() {
    let server = S3Server::start().await;
    server.create_bucket(BUCKET).await;
    let parts = [
        "big/m-Q4-00002-of-00003.gguf",
        "big/m-Q4-00003-of-00003.gguf",
        "big/m-Q4-00001-of-00003.gguf",
    ];
    for part in parts {
        server.put(BUCKET, part, part.as_bytes()).await;
    }
    server.put(BUCKET, "big/README.md", b"# big").await;
    let sources = sources_for(&server);
    let expected = [
        "m-Q4-00001-of-00003.gguf",
        "m-Q4-00002-of-00003.gguf",
        "m-Q4-00003-of-00003.gguf",
    ];
    let from_prefix = sources
        .resolve(&s3("big/"), BackendKind::LlamaCpp)
        .await
        .unwrap();
    assert_eq!(paths(&from_prefix), expected);
    let from_a_part = sources
        .resolve(&s3("big/m-Q4-00002-of-00003.gguf"), BackendKind::LlamaCpp)
        .await
        .unwrap();
    assert_eq!(paths(&from_a_part), expected);
    assert_eq!(from_a_part.first_gguf_index(), Some(0));
}

#[tokio::test]
async fn downloads_are_md5_checked_reused_across_signings_and_resumed() {
    let server = S3Server::start().await;
    server.create_bucket(BUCKET).await;
    let content = bytes(7, 1 << 20);
    server.put(BUCKET, "qwen/tiny.gguf", &content).await;
    // Downloads go through a relay that counts the bytes the store sends, to see that a
    // resumed download fetches only what was missing. moto checks no signatures here, so
    // URLs signed for the relay's address work.
    let relay = CountingRelay::start(server.endpoint()).await;
    let sources = sources(&relay.endpoint, server.access_key(), server.secret_key());
    let root = tempfile::tempdir().unwrap();
    let cache = ModelCache::new(root.path().to_owned(), sources.clone());

    let resolved = sources
        .resolve(&s3("qwen/tiny.gguf"), BackendKind::LlamaCpp)
        .await
        .unwrap();
    let fetched = fetch(&cache, &resolved).await.unwrap();
    assert_eq!(std::fs::read(&fetched.files[0]).unwrap(), content);
    let blobs = files_in(&root.path().join("blobs"));
    assert_eq!(blobs.len(), 1);
    assert!(
        blobs[0].starts_with("id-"),
        "named by the object: {blobs:?}"
    );

    // Signed again, then with a URL nobody answers: the file in the cache is the object's,
    // whatever its URL, and is not fetched again.
    let mut again = sources
        .resolve(&s3("qwen/tiny.gguf"), BackendKind::LlamaCpp)
        .await
        .unwrap();
    assert_eq!(
        again.key, resolved.key,
        "the same objects, the same snapshot"
    );
    again.files[0].url = "http://127.0.0.1:9/gone".to_owned();
    let reused = fetch(&cache, &again).await.unwrap();
    assert_eq!(std::fs::read(&reused.files[0]).unwrap(), content);

    // Half the file on disk, in a fresh cache: only the rest is fetched.
    let root = tempfile::tempdir().unwrap();
    let cache = ModelCache::new(root.path().to_owned(), sources.clone());
    std::fs::create_dir_all(root.path().join("partial")).unwrap();
    let half = content.len() / 2;
    std::fs::write(
        root.path()
            .join("partial")
            .join(format!("{}.part", blobs[0])),
        &content[..half],
    )
    .unwrap();
    relay.reset();
    let resumed = fetch(&cache, &resolved).await.unwrap();
    assert_eq!(std::fs::read(&resumed.files[0]).unwrap(), content);
    let sent = relay.bytes_sent();
    println!(
        "resumed at {half} of {} bytes: {sent} bytes sent",
        content.len()
    );
    assert!(
        sent >= (content.len() - half) as u64 && sent < (content.len() - half) as u64 + 4096,
        "{sent} bytes sent to resume a {}-byte file from byte {half}",
        content.len()
    );

    // Bytes that do not match the ETag are refused, naming both digests, and nothing is
    // kept.
    let root = tempfile::tempdir().unwrap();
    let cache = ModelCache::new(root.path().to_owned(), sources.clone());
    let mut wrong = resolved.clone();
    wrong.files[0].md5 = Some("0".repeat(32));
    let error = fetch(&cache, &wrong).await.unwrap_err();
    let SourceError::Corrupt(message) = &error else {
        panic!("{error:?}")
    };
    let actual = md5_hex(&content);
    assert!(
        message.contains(&"0".repeat(32)) && message.contains(&actual),
        "{message}"
    );
    assert!(files_in(&root.path().join("blobs")).is_empty());
    assert!(files_in(&root.path().join("partial")).is_empty());
}

#[tokio::test]
async fn a_multipart_object_has_no_digest_and_is_checked_by_size() {
    let server = S3Server::start().await;
    server.create_bucket(BUCKET).await;
    let (first, second) = (bytes(3, 3000), bytes(4, 1000));
    let etag = server
        .put_multipart(BUCKET, "qwen/parts.gguf", &[&first, &second])
        .await;
    assert!(etag.contains('-'), "a multipart ETag: {etag}");
    let sources = sources_for(&server);
    let resolved = sources
        .resolve(&s3("qwen/parts.gguf"), BackendKind::LlamaCpp)
        .await
        .unwrap();
    assert_eq!(resolved.files[0].md5, None);
    assert_eq!(resolved.files[0].size, Some(4000));
    let root = tempfile::tempdir().unwrap();
    let cache = ModelCache::new(root.path().to_owned(), sources);
    let fetched = fetch(&cache, &resolved).await.unwrap();
    assert_eq!(
        std::fs::read(&fetched.files[0]).unwrap(),
        [first, second].concat()
    );
}

#[tokio::test]
async fn a_public_bucket_is_read_without_keys_through_plain_urls() {
    let server = S3Server::start().await;
    server.create_bucket(BUCKET).await;
    server.make_public(BUCKET).await;
    let content = bytes(5, 2048);
    server.put(BUCKET, "open/tiny model.gguf", &content).await;
    let anonymous = |access_key: Option<&str>, secret_key: Option<&str>| {
        Sources::new(SourceConfig {
            s3: S3Config {
                endpoint: Some(server.endpoint().to_owned()),
                region: REGION.to_owned(),
                access_key: access_key.map(str::to_owned),
                secret_key: secret_key.map(str::to_owned),
            },
            ..SourceConfig::default()
        })
    };
    let sources = anonymous(None, None);
    let resolved = sources
        .resolve(&s3("open/"), BackendKind::LlamaCpp)
        .await
        .unwrap();
    assert_eq!(
        resolved.files[0].url,
        format!("{}/{BUCKET}/open/tiny%20model.gguf", server.endpoint())
    );
    let root = tempfile::tempdir().unwrap();
    let fetched = fetch(&ModelCache::new(root.path().to_owned(), sources), &resolved)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&fetched.files[0]).unwrap(), content);

    // One key without the other is a mistake, not a request for anonymous access.
    let error = anonymous(Some("gantry"), None)
        .resolve(&s3("open/"), BackendKind::LlamaCpp)
        .await
        .unwrap_err();
    assert!(matches!(error, SourceError::Invalid(_)), "{error:?}");
    assert!(error.to_string().contains("s3_secret_key"), "{error}");
}

#[tokio::test]
async fn a_missing_object_prefix_or_bucket_is_named_with_what_to_check() {
    let server = S3Server::start().await;
    server.create_bucket(BUCKET).await;
    server.put(BUCKET, "qwen/dir/config.json", b"{}").await;
    let sources = sources_for(&server);
    let secret = server.secret_key();
    let invalid = |error: SourceError| {
        assert!(matches!(error, SourceError::Invalid(_)), "{error:?}");
        message(&error, secret)
    };

    let missing = invalid(
        sources
            .resolve(&s3("qwen/nope.gguf"), BackendKind::LlamaCpp)
            .await
            .unwrap_err(),
    );
    println!("{missing}");
    assert!(
        missing.contains("s3://models/qwen/nope.gguf") && missing.contains("source.key"),
        "{missing}"
    );

    let directory = invalid(
        sources
            .resolve(&s3("qwen/dir"), BackendKind::Vllm)
            .await
            .unwrap_err(),
    );
    assert!(directory.contains("end source.key with '/'"), "{directory}");

    let empty = invalid(
        sources
            .resolve(&s3("nothing/"), BackendKind::Vllm)
            .await
            .unwrap_err(),
    );
    assert!(
        empty.contains("s3://models/nothing/") && empty.contains("no objects"),
        "{empty}"
    );

    let no_bucket = invalid(
        sources
            .resolve(
                &ModelSource::S3 {
                    bucket: "absent".to_owned(),
                    key: "qwen/".to_owned(),
                },
                BackendKind::Vllm,
            )
            .await
            .unwrap_err(),
    );
    println!("{no_bucket}");
    assert!(
        no_bucket.contains("absent") && no_bucket.contains("source.bucket"),
        "{no_bucket}"
    );
}

#[tokio::test]
async fn wrong_credentials_are_refused_naming_the_keys_to_check_and_not_the_secret() {
    let mut server = S3Server::start().await;
    server.create_bucket(BUCKET).await;
    server.put(BUCKET, "qwen/config.json", b"{}").await;
    server.require_credentials().await;
    // The listing is signed in the Authorization header, which moto checks in this mode.
    let wrong_secret = "not-the-secret-key-0123";
    let error = sources(server.endpoint(), server.access_key(), wrong_secret)
        .resolve(&s3("qwen/"), BackendKind::Vllm)
        .await
        .unwrap_err();
    let text = message(&error, wrong_secret);
    println!("{text}");
    assert!(matches!(error, SourceError::Unauthorized(_)), "{error:?}");
    assert!(
        text.contains("s3_access_key") && text.contains("s3_secret_key"),
        "{text}"
    );
    assert!(text.contains("s3://models/qwen/"), "{text}");
}

#[tokio::test]
async fn a_refused_object_says_to_check_the_keys() {
    // moto cannot check presigned requests (see gantry_testkit::s3), so the refusal of
    // an object's HEAD comes from a store that refuses everything.
    let refusing = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let endpoint = format!("http://{}", refusing.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = refusing.accept().await {
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request).await;
            let _ = stream
                .write_all(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let secret = "refused-secret-0123";
    let error = sources(&endpoint, "gantry", secret)
        .resolve(&s3("qwen/tiny.gguf"), BackendKind::LlamaCpp)
        .await
        .unwrap_err();
    let text = message(&error, secret);
    println!("{text}");
    assert!(matches!(error, SourceError::Unauthorized(_)), "{error:?}");
    assert!(
        text.contains("s3_access_key") && text.contains("s3://models/qwen/tiny.gguf"),
        "{text}"
    );
}

#[tokio::test]
async fn an_unreachable_store_names_s3_endpoint() {
    // A port that was free a moment ago: nothing listens there.
    let endpoint = {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let secret = "unreachable-secret-0123";
    let sources = sources(&endpoint, "gantry", secret);
    for key in ["qwen/tiny.gguf", "qwen/"] {
        let error = sources
            .resolve(&s3(key), BackendKind::LlamaCpp)
            .await
            .unwrap_err();
        let text = message(&error, secret);
        println!("{text}");
        assert!(error.is_transient(), "{error:?}");
        assert!(
            text.contains("s3_endpoint") && text.contains(&endpoint),
            "{text}"
        );
    }
}

fn md5_hex(bytes: &[u8]) -> String {
    use md5::Digest;
    hex::encode(md5::Md5::digest(bytes))
}

/// A TCP relay to an HTTP server that counts the bytes the server sends back.
struct CountingRelay {
    endpoint: String,
    sent: Arc<AtomicU64>,
}

impl CountingRelay {
    async fn start(upstream: &str) -> Self {
        let upstream = upstream.trim_start_matches("http://").to_owned();
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let sent = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&sent);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let requests = tokio::io::copy(&mut client_read, &mut server_write);
                    let answers = async {
                        let mut buffer = vec![0u8; 64 << 10];
                        loop {
                            let n = match server_read.read(&mut buffer).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            counter.fetch_add(n as u64, Ordering::Relaxed);
                            if client_write.write_all(&buffer[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    tokio::select! {
                        _ = requests => {}
                        () = answers => {}
                    }
                });
            }
        });
        Self { endpoint, sent }
    }

    fn reset(&self) {
        self.sent.store(0, Ordering::Relaxed);
    }

    fn bytes_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}
