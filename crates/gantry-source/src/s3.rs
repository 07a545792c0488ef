//! Resolving an `s3` source: one object of an S3-compatible store (`s3_endpoint`, path-style
//! addressing), or every object under a prefix ending in `/`, through `object_store`'s S3
//! client (listing, SigV4 signing).
//!
//! - A key names one object; a key that is one part of a split GGUF
//!   (`m-00001-of-00003.gguf`) brings every part, their keys derived from its name. A
//!   prefix is listed and the backend's files are chosen from it as from a hub
//!   repository (`hub::choose`: the GGUF model for llama.cpp, weights, configs and
//!   tokenizer files for vLLM and SGLang).
//! - Every chosen object gets a presigned `GET` URL, so the header reads (`remote.rs`) and
//!   the cache's resumable downloads (`cache.rs`) fetch it like any URL, with no S3 code of
//!   their own. A `HEAD` of each object, with a presigned URL too, gives its size, its ETag
//!   and its encryption, and proves the URL works before it is handed out.
//! - A presigned URL changes at every signing, so a file is named in the cache by
//!   [`RemoteFile::cache_id`] (store, bucket, key and ETag) instead: a download resumes
//!   across signings, and a changed object (new ETag) is a new file.
//! - The ETag of an object uploaded in one part is the MD5 of its bytes (32 hex digits),
//!   and the cache checks it ([`RemoteFile::md5`]); an ETag with a `-` (a multipart upload)
//!   or of an object encrypted with SSE-KMS or SSE-C is no digest, and only the size is
//!   checked.
//!
//! Without `s3_access_key` and `s3_secret_key` requests are anonymous (a public bucket)
//! and the URLs plain. The secret key never appears in a log or an error.
//!
//! The servers keep uploaded files in a bucket too (`s3_upload_bucket`): [`put_file`],
//! [`presign_get`] and [`delete_object`] are what they use.

use std::path::Path;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use gantry_types::BackendKind;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::client::{HttpError, HttpErrorKind};
use object_store::path::Path as ObjectPath;
use object_store::signer::Signer;
use object_store::WriteMultipart;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, RetryConfig};
use reqwest::{Method, StatusCode};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use crate::hub::{self, ListedFile};
use crate::{RemoteFile, Resolved, S3Config, SourceError, Sources, META_TIMEOUT};

/// How long a presigned URL works. The worker signs just before it downloads, and all the
/// files of a model must arrive within this time: 12 hours is 500 GB at 12 MB/s. A
/// download that outlives its URLs fails (the store answers 403) and, when the instance
/// is started again, resumes from the bytes on disk with fresh URLs, since the cache
/// names S3 files by [`RemoteFile::cache_id`], not by URL. Shorter would bound a leaked
/// URL more tightly but fail slow downloads; SigV4 allows at most 7 days.
const PRESIGNED_URL_EXPIRY: Duration = Duration::from_secs(12 * 60 * 60);

/// How long one request of a transfer (a part of an upload) may take.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(300);
/// The parts of an upload to the store, and how many are sent at once.
const PART_SIZE: usize = 16 << 20;
const PARTS_IN_FLIGHT: usize = 4;

/// `HEAD` requests in flight at once while describing the chosen objects.
const CONCURRENT_HEADS: usize = 8;

/// A bucket of the configured store, and how to name it in messages.
struct Bucket<'a> {
    client: AmazonS3,
    config: &'a S3Config,
    name: &'a str,
    /// Whether requests are signed (credentials are configured).
    signed: bool,
    /// The store, as messages name it: `s3_endpoint`, or AWS S3 of `s3_region`.
    store: String,
}

/// An object of a listed prefix, as `hub::choose` reads it.
struct ListedObject {
    key: String,
    /// Its key after the prefix: its path in the model's directory.
    path: String,
}

impl ListedFile for ListedObject {
    fn path(&self) -> &str {
        &self.path
    }
}

pub(crate) async fn resolve(
    sources: &Sources,
    bucket: &str,
    key: &str,
    backend: BackendKind,
) -> Result<Resolved, SourceError> {
    let bucket = Bucket::open(&sources.config.s3, bucket)?;
    // `(key, path in the model's directory)` of each object the source stands for.
    let wanted: Vec<(String, String)> = if key.ends_with('/') {
        choose_under_prefix(&bucket, key, backend).await?
    } else {
        object_path(key)?;
        split_gguf_keys(key)
            .unwrap_or_else(|| vec![key.to_owned()])
            .into_iter()
            .map(|k| {
                let name = k.rsplit('/').next().unwrap_or(&k).to_owned();
                (k, name)
            })
            .collect()
    };
    let files: Vec<RemoteFile> = futures_util::stream::iter(wanted)
        .map(|(object_key, path)| describe(sources, &bucket, object_key, path, key))
        .buffered(CONCURRENT_HEADS)
        .try_collect()
        .await?;

    let mut version = Sha256::new();
    for file in &files {
        version.update(file.path.as_bytes());
        version.update(b"\n");
        version.update(file.cache_id.as_deref().unwrap_or_default().as_bytes());
        version.update(b"\n");
    }
    Ok(Resolved {
        // The key names the model; the digest of the objects' identities makes a changed
        // object a new snapshot directory, so no stale file is left in one.
        key: format!(
            "s3/{}/{}/{}",
            bucket.name,
            key.trim_end_matches('/'),
            &hex::encode(version.finalize())[..16]
        ),
        commit: None,
        files,
    })
}

/// Copies the file at `path` to `key` of `bucket`, in parts sent a few at a time.
pub async fn put_file(
    config: &S3Config,
    bucket: &str,
    key: &str,
    path: &Path,
) -> Result<(), SourceError> {
    let bucket = Bucket::open_with(config, bucket, TRANSFER_TIMEOUT)?;
    let object = object_path(key)?;
    let disk = |e: std::io::Error| SourceError::Disk(format!("{}: {e}", path.display()));
    let mut file = tokio::fs::File::open(path).await.map_err(disk)?;
    let upload = bucket
        .client
        .put_multipart(&object)
        .await
        .map_err(|e| bucket.store_error(e, key))?;
    let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer).await.map_err(disk)?;
        if n == 0 {
            break;
        }
        writer
            .wait_for_capacity(PARTS_IN_FLIGHT)
            .await
            .map_err(|e| bucket.store_error(e, key))?;
        writer.write(&buffer[..n]);
    }
    writer
        .finish()
        .await
        .map_err(|e| bucket.store_error(e, key))?;
    Ok(())
}

/// A URL that gets `key` of `bucket` (presigned for 12 hours when keys are configured).
pub async fn presign_get(
    config: &S3Config,
    bucket: &str,
    key: &str,
) -> Result<String, SourceError> {
    Bucket::open(config, bucket)?
        .url_for(Method::GET, key)
        .await
}

/// Deletes `key` of `bucket`; an object already gone is not an error.
pub async fn delete_object(config: &S3Config, bucket: &str, key: &str) -> Result<(), SourceError> {
    let bucket = Bucket::open(config, bucket)?;
    match bucket.client.delete(&object_path(key)?).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(bucket.store_error(e, key)),
    }
}

impl<'a> Bucket<'a> {
    fn open(config: &'a S3Config, name: &'a str) -> Result<Self, SourceError> {
        Self::open_with(config, name, META_TIMEOUT)
    }

    /// The bucket, each request limited to `timeout`.
    fn open_with(
        config: &'a S3Config,
        name: &'a str,
        timeout: Duration,
    ) -> Result<Self, SourceError> {
        let store = match &config.endpoint {
            Some(endpoint) => format!("{} (s3_endpoint)", endpoint.trim_end_matches('/')),
            None => format!("AWS S3 in {} (s3_region)", config.region),
        };
        let client_options = ClientOptions::new()
            .with_connect_timeout(Duration::from_secs(10))
            .with_timeout(timeout)
            .with_allow_http(true);
        // A listing is retried a little, then fails: an unreachable or refusing store
        // should say so within seconds (object_store's default retries for 3 minutes).
        let retry = RetryConfig {
            backoff: BackoffConfig::default(),
            max_retries: 2,
            retry_timeout: timeout,
        };
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(name)
            .with_region(&config.region)
            .with_virtual_hosted_style_request(false)
            .with_client_options(client_options)
            .with_retry(retry);
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint.trim_end_matches('/'));
        }
        let signed = match (&config.access_key, &config.secret_key) {
            (Some(access_key), Some(secret_key)) => {
                builder = builder
                    .with_access_key_id(access_key)
                    .with_secret_access_key(secret_key);
                true
            }
            (None, None) => {
                builder = builder.with_skip_signature(true);
                false
            }
            (Some(_), None) => return Err(half_configured("s3_access_key", "s3_secret_key")),
            (None, Some(_)) => return Err(half_configured("s3_secret_key", "s3_access_key")),
        };
        let client = builder.build().map_err(|e| {
            SourceError::Invalid(format!(
                "cannot use the S3 store {store} for bucket {name}: {e}"
            ))
        })?;
        Ok(Self {
            client,
            config,
            name,
            signed,
            store,
        })
    }

    /// `s3://<bucket>/<key>`, for messages.
    fn url_of(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.name)
    }

    /// A URL that gets `key` with `method`: presigned when requests are signed, else the
    /// object's plain path-style URL.
    async fn url_for(&self, method: Method, key: &str) -> Result<String, SourceError> {
        let path = object_path(key)?;
        if self.signed {
            let url = self
                .client
                .signed_url(method, &path, PRESIGNED_URL_EXPIRY)
                .await
                .map_err(|e| self.store_error(e, key))?;
            return Ok(url.to_string());
        }
        let endpoint = match &self.config.endpoint {
            Some(endpoint) => endpoint.trim_end_matches('/').to_owned(),
            None => format!("https://s3.{}.amazonaws.com", self.config.region),
        };
        let encoded: Vec<String> = key.split('/').map(hub::encode_segment).collect();
        Ok(format!("{endpoint}/{}/{}", self.name, encoded.join("/")))
    }

    /// Turns a failure of the S3 client about `key` into an error saying what to check.
    fn store_error(&self, error: object_store::Error, key: &str) -> SourceError {
        let what = self.url_of(key);
        let text = chain(&error);
        let (status, code) = answered(&text);
        let code = code.as_deref();
        let detail = match (status, code) {
            (Some(status), Some(code)) => format!("{status} {code}"),
            (Some(status), None) => status.to_string(),
            (None, _) => text.clone(),
        };
        match (&error, status) {
            (object_store::Error::NotFound { .. }, _) | (_, Some(404)) => {
                SourceError::Invalid(format!(
                    "{what}: the S3 store {} has no bucket {} ({detail}); check source.bucket",
                    self.store, self.name
                ))
            }
            (
                object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. },
                _,
            )
            | (_, Some(401 | 403)) => SourceError::Unauthorized(self.refused(&what, &detail)),
            // object_store's words for a redirect without a location, S3's answer to a
            // request for a bucket of another region.
            _ if text.contains("incorrectly configured region")
                || matches!(
                    code,
                    Some("PermanentRedirect" | "AuthorizationHeaderMalformed")
                ) =>
            {
                SourceError::Invalid(format!(
                    "{what}: the S3 store {} says bucket {} is not in region {} ({text}); set \
                     s3_region to the bucket's region",
                    self.store, self.name, self.config.region
                ))
            }
            _ if is_connect_error(&error) => SourceError::Unavailable(format!(
                "cannot reach the S3 store {} for {what}: {text}; check s3_endpoint",
                self.store
            )),
            _ => SourceError::Unavailable(format!(
                "the S3 store {} failed for {what}: {text}",
                self.store
            )),
        }
    }

    /// The message for a store that refused access to `what`.
    fn refused(&self, what: &str, detail: &str) -> String {
        if self.signed {
            format!(
                "the S3 store {} refused access to {what} ({detail}); check s3_access_key and \
                 s3_secret_key, and that they may read the bucket",
                self.store
            )
        } else {
            format!(
                "the S3 store {} refused anonymous access to {what} ({detail}); set \
                 s3_access_key and s3_secret_key, or make the bucket public",
                self.store
            )
        }
    }
}

/// The error for one of the two keys set without the other.
fn half_configured(set: &str, missing: &str) -> SourceError {
    SourceError::Invalid(format!(
        "{set} is set but {missing} is not: set both, or neither for a public bucket"
    ))
}

/// Lists the objects under `prefix` and chooses the ones `backend` loads.
async fn choose_under_prefix(
    bucket: &Bucket<'_>,
    prefix: &str,
    backend: BackendKind,
) -> Result<Vec<(String, String)>, SourceError> {
    let listed = list(bucket, prefix).await?;
    let what = bucket.url_of(prefix);
    let objects: Vec<ListedObject> = listed
        .into_iter()
        .filter_map(|key| {
            let path = key.strip_prefix(prefix)?.to_owned();
            // A key ending in '/' is a "folder" marker some tools create, not a file.
            (!path.is_empty() && !path.ends_with('/')).then_some(ListedObject { key, path })
        })
        .collect();
    if objects.is_empty() {
        return Err(SourceError::Invalid(format!(
            "{what}: the prefix {prefix:?} of bucket {} holds no objects; check source.bucket \
             and source.key (a prefix ends in '/', an object's key does not)",
            bucket.name
        )));
    }
    let refs: Vec<&ListedObject> = objects.iter().collect();
    let chosen = hub::choose(&refs, None, backend, &what).map_err(|e| match e {
        SourceError::Invalid(message) => SourceError::Invalid(format!(
            "{message} (an s3 source chooses by its key: a prefix ending in '/' for a \
             directory, or one object's key)"
        )),
        other => other,
    })?;
    Ok(chosen
        .into_iter()
        .map(|o| (o.key.clone(), o.path.clone()))
        .collect())
}

/// The keys of every object under `prefix`, however deep.
async fn list(bucket: &Bucket<'_>, prefix: &str) -> Result<Vec<String>, SourceError> {
    let path = object_path(prefix)?;
    bucket
        .client
        .list(Some(&path))
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .map_err(|e| bucket.store_error(e, prefix))
}

/// One object as the cache and the header reads want it: a `HEAD` for its size, ETag and
/// encryption, and a presigned `GET` URL.
async fn describe(
    sources: &Sources,
    bucket: &Bucket<'_>,
    key: String,
    path: String,
    source_key: &str,
) -> Result<RemoteFile, SourceError> {
    let what = bucket.url_of(&key);
    let head_url = bucket.url_for(Method::HEAD, &key).await?;
    let response = sources
        .http
        .head(&head_url)
        .timeout(META_TIMEOUT)
        .send()
        .await
        .map_err(|e| {
            // The URL is left out: presigned, it lets anyone read the object for hours.
            SourceError::Unavailable(format!(
                "cannot reach the S3 store {} for {what}: {}; check s3_endpoint",
                bucket.store,
                chain(&e.without_url())
            ))
        })?;
    let status = response.status();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    if !status.is_success() {
        let region = header("x-amz-bucket-region");
        return Err(match status {
            StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED => {
                SourceError::Unauthorized(bucket.refused(&what, status.as_str()))
            }
            StatusCode::NOT_FOUND => {
                SourceError::Invalid(not_found(bucket, &key, source_key).await)
            }
            _ if region.as_deref().is_some_and(|r| r != bucket.config.region) => {
                SourceError::Invalid(format!(
                    "{what}: bucket {} is in region {}, not {} (s3_region); set s3_region",
                    bucket.name,
                    region.unwrap_or_default(),
                    bucket.config.region
                ))
            }
            _ => SourceError::Unavailable(format!(
                "the S3 store {} answered {status} for {what}",
                bucket.store
            )),
        });
    }
    let size = header("content-length").and_then(|v| v.parse::<u64>().ok());
    let etag = header("etag").map(|e| e.trim_start_matches("W/").trim_matches('"').to_owned());
    let md5 = etag_md5(
        etag.as_deref(),
        header("x-amz-server-side-encryption").as_deref(),
        header("x-amz-server-side-encryption-customer-algorithm").is_some(),
    );
    // What changes when the object does: its ETag, else its modification time.
    let version = etag.or_else(|| header("last-modified")).unwrap_or_default();
    let store = bucket
        .config
        .endpoint
        .as_deref()
        .map_or_else(|| format!("aws-{}", bucket.config.region), str::to_owned);
    Ok(RemoteFile {
        url: bucket.url_for(Method::GET, &key).await?,
        cache_id: Some(format!(
            "s3 {store} {}/{key} {version} {}",
            bucket.name,
            size.unwrap_or_default()
        )),
        path,
        size,
        sha256: None,
        md5,
        hub_auth: false,
    })
}

/// The MD5 an object's ETag is, if it is one: S3 gives the MD5 of the bytes (32 hex
/// digits) for an object uploaded in one part, unless it is encrypted with SSE-KMS
/// (`encryption` `aws:kms`, `aws:kms:dsse`) or a customer's key (SSE-C); a multipart
/// upload's ETag has a `-` and digests the parts' digests.
fn etag_md5(etag: Option<&str>, encryption: Option<&str>, customer_key: bool) -> Option<String> {
    let kms = encryption.is_some_and(|e| e.starts_with("aws:kms"));
    etag.filter(|_| !kms && !customer_key)
        .filter(|e| e.len() == 32 && e.chars().all(|c| c.is_ascii_hexdigit()))
        .map(str::to_ascii_lowercase)
}

/// Why `key` was not found, saying what to check: the bucket and key, and whether the key
/// names a directory (objects under `key/`).
async fn not_found(bucket: &Bucket<'_>, key: &str, source_key: &str) -> String {
    let what = bucket.url_of(key);
    if key != source_key && !source_key.ends_with('/') {
        return format!(
            "{what}: no such object, though {source_key} names it as one part of a split \
             GGUF; upload every part"
        );
    }
    let directory = format!("{key}/");
    let is_directory = match object_path(&directory) {
        Ok(path) => bucket.client.list(Some(&path)).next().await.is_some(),
        Err(_) => false,
    };
    if is_directory {
        format!(
            "{what}: no such object, but objects lie under {directory}; end source.key with \
             '/' to use them as the model's directory"
        )
    } else {
        format!(
            "{what}: no such object (or no such bucket) in the S3 store {}; check \
             source.bucket and source.key",
            bucket.store
        )
    }
}

/// The keys of every part of a split GGUF, when `key` is one part
/// (`<prefix>-00002-of-00003.gguf`), first part first.
fn split_gguf_keys(key: &str) -> Option<Vec<String>> {
    let (prefix, total) = hub::split_part(key)?;
    let count: u32 = total.parse().ok()?;
    Some(
        (1..=count)
            .map(|i| format!("{prefix}-{i:05}-of-{total}.gguf"))
            .collect(),
    )
}

/// `key` as the S3 client's path, refused when it cannot be one (an empty, `.` or `..`
/// segment, a control character): such a key could not be a file path in the cache either.
fn object_path(key: &str) -> Result<ObjectPath, SourceError> {
    ObjectPath::parse(key).map_err(|e| {
        SourceError::Invalid(format!(
            "source.key {key:?} cannot be used as a file path: {e}"
        ))
    })
}

/// The HTTP status and S3 error code (`NoSuchBucket`, `SignatureDoesNotMatch`, ...) of a
/// failed request, read from the S3 client's error text: `object_store` reports a failed
/// listing as `Error::Generic` and keeps the status in an error type it does not export,
/// but its message carries both ("status code: 403 Forbidden: <Error><Code>...").
fn answered(text: &str) -> (Option<u16>, Option<String>) {
    let status = text
        .split("status code: ")
        .nth(1)
        .and_then(|rest| rest.get(..3))
        .and_then(|digits| digits.parse().ok());
    let code = text
        .split("<Code>")
        .nth(1)
        .and_then(|rest| rest.split("</Code>").next())
        .filter(|code| code.chars().all(|c| c.is_ascii_alphanumeric()))
        .map(str::to_owned);
    (status, code)
}

/// Whether the S3 client failed to connect at all (or timed out connecting).
fn is_connect_error(error: &object_store::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(cause) = source {
        if let Some(http) = cause.downcast_ref::<HttpError>() {
            return matches!(http.kind(), HttpErrorKind::Connect | HttpErrorKind::Timeout);
        }
        source = cause.source();
    }
    false
}

/// An error and its causes, `: `-separated, each said once.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(&format!(": {text}"));
        }
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_part_of_a_split_gguf_names_every_part() {
        assert_eq!(
            split_gguf_keys("qwen/big-Q4-00002-of-00003.gguf").unwrap(),
            [
                "qwen/big-Q4-00001-of-00003.gguf",
                "qwen/big-Q4-00002-of-00003.gguf",
                "qwen/big-Q4-00003-of-00003.gguf"
            ]
        );
        assert_eq!(split_gguf_keys("qwen/tiny.gguf"), None);
    }

    #[test]
    fn only_a_single_part_unencrypted_or_s3_encrypted_etag_is_an_md5() {
        let md5 = "9E107D9D372BB6826BD81D3542A419D6";
        let lower = Some(md5.to_ascii_lowercase());
        assert_eq!(etag_md5(Some(md5), None, false), lower);
        assert_eq!(etag_md5(Some(md5), Some("AES256"), false), lower);
        assert_eq!(etag_md5(Some(md5), Some("aws:kms"), false), None);
        assert_eq!(etag_md5(Some(md5), Some("aws:kms:dsse"), false), None);
        assert_eq!(etag_md5(Some(md5), None, true), None);
        let multipart = "d41d8cd98f00b204e9800998ecf8427e-2";
        assert_eq!(etag_md5(Some(multipart), None, false), None);
        assert_eq!(
            etag_md5(Some("not-hex-not-hex-not-hex-not-hex!"), None, false),
            None
        );
        assert_eq!(etag_md5(None, None, false), None);
    }

    #[test]
    fn the_status_and_code_of_a_failed_listing_are_read_from_its_text() {
        let text = "Generic S3 error: Error performing list request: Error performing GET \
                    http://s3/models?list-type=2 in 51ms - Server returned non-2xx status code: \
                    403 Forbidden: <?xml version=\"1.0\"?>\n<Error><Code>SignatureDoesNotMatch\
                    </Code><Message>The request signature</Message></Error>";
        assert_eq!(
            answered(text),
            (Some(403), Some("SignatureDoesNotMatch".to_owned()))
        );
        assert_eq!(answered("connection refused"), (None, None));
    }

    #[test]
    fn keys_that_cannot_be_file_paths_are_refused() {
        assert!(object_path("qwen/tiny.gguf").is_ok());
        assert!(object_path("qwen/").is_ok());
        for bad in ["a//b", "a/./b", "a/\u{1}b"] {
            let Err(SourceError::Invalid(message)) = object_path(bad) else {
                panic!("{bad:?} accepted")
            };
            assert!(message.contains("source.key"), "{message}");
        }
    }
}
