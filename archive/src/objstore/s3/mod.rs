//! S3 (or an S3-compatible server) as the object store, through
//! `aws-sdk-s3`.
//!
//! ```text
//!  put(key, bytes) ── len ≤ multipart_threshold ──► PutObject + x-amz-checksum-sha256
//!                  └─ len > multipart_threshold ──► CreateMultipartUpload (SHA-256)
//!                                                   UploadPart × n, each with its SHA-256
//!                                                   CompleteMultipartUpload
//!                                                   (AbortMultipartUpload on any failure)
//!  get ──► GetObject (NoSuchKey → None)      list ──► ListObjectsV2, page after page
//!  get_range ──► GetObject with Range: bytes=a-b (cold reads: footers and pages)
//! ```
//!
//! Keys live under `prefix/` in the bucket. Every upload carries the
//! SHA-256 of its bytes, so the server refuses bytes that changed on the
//! way (`BadDigest`) and an acknowledged `put` is what walhook hashed.
//!
//! Credentials come from the usual AWS chain (`AWS_ACCESS_KEY_ID` and
//! `AWS_SECRET_ACCESS_KEY`, a profile, web identity, the container or
//! instance role) unless [`S3Settings::credentials`] names them. TLS is
//! rustls on ring, as for every other connection walhook makes.
//!
//! Errors are classified once, in `error.rs`: what a retry may fix
//! (throttling, 5xx, timeouts, lost connections) is transient; what it will
//! not (credentials, a missing bucket, permissions, a checksum the server
//! refused) is definite, with a hint naming what the operator should check.
//!
//! - [`config`]: [`S3Settings`] and their validation.
//! - `error.rs`: the classification of failures.

pub mod config;
mod error;

use std::fmt;
use std::sync::Arc;

use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, SharedCredentialsProvider,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{ChecksumAlgorithm, ChecksumMode, CompletedMultipartUpload, CompletedPart};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use sha2::{Digest, Sha256};
use walhook_pipeline::objstore::{
    ObjectInfo, ObjectStore, ObjectStoreError, PutReceipt, validate_key,
};

pub use config::{
    DEFAULT_LIST_PAGE_SIZE, DEFAULT_MULTIPART_THRESHOLD, DEFAULT_PART_SIZE, DEFAULT_REGION,
    MIN_PART_SIZE, S3Credentials, S3Settings, S3SettingsError,
};
use error::classify;

/// Objects in an S3 bucket, under a prefix. Cheap to clone.
#[derive(Clone)]
pub struct S3Store {
    inner: Arc<Inner>,
}

struct Inner {
    client: aws_sdk_s3::Client,
    bucket: String,
    /// Empty, or the configured prefix with one trailing `/`.
    prefix: String,
    endpoint: Option<String>,
    multipart_threshold: usize,
    part_size: usize,
    list_page_size: i32,
}

impl fmt::Debug for S3Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Store")
            .field("location", &self.describe())
            .finish_non_exhaustive()
    }
}

impl S3Store {
    /// Builds the client. Nothing is sent yet: a wrong bucket or wrong
    /// credentials show on the first operation, as a definite error.
    pub async fn connect(settings: S3Settings) -> Result<Self, ObjectStoreError> {
        settings
            .validate()
            .map_err(|e| ObjectStoreError::Definite {
                op: "connect",
                key: settings.bucket.clone(),
                hint: "the S3 settings are invalid".into(),
                source: Box::new(e),
            })?;
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let region = settings
            .region
            .clone()
            .unwrap_or_else(|| DEFAULT_REGION.to_owned());
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .region(Region::new(region));
        if let Some(creds) = &settings.credentials {
            loader = loader.credentials_provider(SharedCredentialsProvider::new(Credentials::new(
                creds.access_key_id.clone(),
                creds.secret_access_key.expose().clone(),
                None,
                None,
                "walhook-settings",
            )));
        }
        let shared = loader.load().await;
        let mut config = aws_sdk_s3::config::Builder::from(&shared)
            .force_path_style(settings.force_path_style)
            // Every upload carries our own SHA-256; the SDK adds no CRC32
            // of its own beside it.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired);
        if let Some(endpoint) = &settings.endpoint {
            config = config.endpoint_url(endpoint.clone());
        }
        let prefix = match settings.prefix.trim_matches('/') {
            "" => String::new(),
            p => format!("{p}/"),
        };
        Ok(S3Store {
            inner: Arc::new(Inner {
                client: aws_sdk_s3::Client::from_conf(config.build()),
                bucket: settings.bucket,
                prefix,
                endpoint: settings.endpoint,
                multipart_threshold: settings.multipart_threshold,
                part_size: settings.part_size,
                list_page_size: settings.list_page_size,
            }),
        })
    }

    fn full_key(&self, key: &str) -> String {
        format!("{}{key}", self.inner.prefix)
    }

    fn fail<E>(&self, op: &'static str, key: &str, err: SdkError<E>) -> ObjectStoreError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        classify(op, key, &self.inner.bucket, err)
    }

    async fn put_multipart(&self, key: &str, bytes: Bytes) -> Result<(), ObjectStoreError> {
        let inner = &self.inner;
        let full = self.full_key(key);
        let created = inner
            .client
            .create_multipart_upload()
            .bucket(&inner.bucket)
            .key(&full)
            .checksum_algorithm(ChecksumAlgorithm::Sha256)
            .send()
            .await
            .map_err(|e| self.fail("put", key, e))?;
        let Some(upload_id) = created.upload_id else {
            return Err(ObjectStoreError::Transient {
                op: "put",
                key: key.to_owned(),
                source: "CreateMultipartUpload answered without an upload id".into(),
            });
        };
        let uploaded = self.upload_parts(key, &full, &upload_id, bytes).await;
        if uploaded.is_err() {
            // Parts of an unfinished upload are billed until aborted; a
            // failed abort is left to the bucket's lifecycle rule.
            if let Err(e) = inner
                .client
                .abort_multipart_upload()
                .bucket(&inner.bucket)
                .key(&full)
                .upload_id(&upload_id)
                .send()
                .await
            {
                tracing::warn!(
                    bucket = %inner.bucket,
                    key = %full,
                    error = %aws_sdk_s3::error::DisplayErrorContext(&e),
                    "could not abort a failed multipart upload; its parts stay until a lifecycle rule removes them"
                );
            }
        }
        uploaded
    }

    async fn upload_parts(
        &self,
        key: &str,
        full: &str,
        upload_id: &str,
        bytes: Bytes,
    ) -> Result<(), ObjectStoreError> {
        let inner = &self.inner;
        let mut parts = Vec::new();
        let mut start = 0;
        let mut number = 1;
        while start < bytes.len() {
            let end = (start + inner.part_size).min(bytes.len());
            let part = bytes.slice(start..end);
            let checksum = BASE64.encode(Sha256::digest(&part));
            let out = inner
                .client
                .upload_part()
                .bucket(&inner.bucket)
                .key(full)
                .upload_id(upload_id)
                .part_number(number)
                .checksum_sha256(&checksum)
                .body(ByteStream::from(part))
                .send()
                .await
                .map_err(|e| self.fail("put", key, e))?;
            parts.push(
                CompletedPart::builder()
                    .part_number(number)
                    .set_e_tag(out.e_tag)
                    .checksum_sha256(checksum)
                    .build(),
            );
            start = end;
            number += 1;
        }
        inner
            .client
            .complete_multipart_upload()
            .bucket(&inner.bucket)
            .key(full)
            .upload_id(upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| self.fail("put", key, e))?;
        Ok(())
    }
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

impl ObjectStore for S3Store {
    async fn put(&self, key: &str, bytes: Bytes) -> Result<PutReceipt, ObjectStoreError> {
        validate_key(key)?;
        let digest = Sha256::digest(&bytes);
        let receipt = PutReceipt {
            size: bytes.len() as u64,
            sha256: hex(&digest),
        };
        if bytes.len() > self.inner.multipart_threshold {
            self.put_multipart(key, bytes).await?;
        } else {
            let inner = &self.inner;
            inner
                .client
                .put_object()
                .bucket(&inner.bucket)
                .key(self.full_key(key))
                .checksum_sha256(BASE64.encode(digest))
                .body(ByteStream::from(bytes))
                .send()
                .await
                .map_err(|e| self.fail("put", key, e))?;
        }
        Ok(receipt)
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>, ObjectStoreError> {
        validate_key(key)?;
        let inner = &self.inner;
        let sent = inner
            .client
            .get_object()
            .bucket(&inner.bucket)
            .key(self.full_key(key))
            // The SDK checks the body against the stored checksum.
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await;
        let out = match sent {
            Ok(out) => out,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => return Ok(None),
            Err(e) => return Err(self.fail("get", key, e)),
        };
        let body = out
            .body
            .collect()
            .await
            .map_err(|e| ObjectStoreError::Transient {
                op: "get",
                key: key.to_owned(),
                source: Box::new(e),
            })?;
        Ok(Some(body.into_bytes()))
    }

    async fn get_range(
        &self,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> Result<Option<Bytes>, ObjectStoreError> {
        validate_key(key)?;
        let inner = &self.inner;
        if range.start >= range.end {
            // No bytes to ask for (a `Range` header cannot say "none"):
            // only whether the object is there.
            return match inner
                .client
                .head_object()
                .bucket(&inner.bucket)
                .key(self.full_key(key))
                .send()
                .await
            {
                Ok(_) => Ok(Some(Bytes::new())),
                Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => Ok(None),
                Err(e) => Err(self.fail("get", key, e)),
            };
        }
        // No checksum mode: the stored checksum covers the whole object,
        // not a range of it (verification reads objects whole).
        let sent = inner
            .client
            .get_object()
            .bucket(&inner.bucket)
            .key(self.full_key(key))
            .range(format!("bytes={}-{}", range.start, range.end - 1))
            .send()
            .await;
        let out = match sent {
            Ok(out) => out,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => return Ok(None),
            // The range starts past the object's end: nothing of it.
            Err(e) if e.code() == Some("InvalidRange") => return Ok(Some(Bytes::new())),
            Err(e) => return Err(self.fail("get", key, e)),
        };
        let body = out
            .body
            .collect()
            .await
            .map_err(|e| ObjectStoreError::Transient {
                op: "get",
                key: key.to_owned(),
                source: Box::new(e),
            })?;
        Ok(Some(body.into_bytes()))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, ObjectStoreError> {
        let inner = &self.inner;
        let full_prefix = self.full_key(prefix);
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = inner
                .client
                .list_objects_v2()
                .bucket(&inner.bucket)
                .prefix(&full_prefix)
                .max_keys(inner.list_page_size)
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| self.fail("list", prefix, e))?;
            for object in page.contents() {
                let Some(key) = object.key().and_then(|k| k.strip_prefix(&inner.prefix)) else {
                    continue;
                };
                out.push(ObjectInfo {
                    key: key.to_owned(),
                    size: object.size().unwrap_or(0).max(0) as u64,
                });
            }
            match (page.is_truncated(), page.next_continuation_token()) {
                (Some(true), Some(next)) => token = Some(next.to_owned()),
                (Some(true), None) => {
                    return Err(ObjectStoreError::Transient {
                        op: "list",
                        key: prefix.to_owned(),
                        source: "ListObjectsV2 said the listing goes on but gave no continuation \
                                 token"
                            .into(),
                    });
                }
                _ => break,
            }
        }
        // S3 lists in UTF-8 byte order already; sorting keeps the contract
        // whatever an S3-compatible server does.
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    async fn delete(&self, key: &str) -> Result<(), ObjectStoreError> {
        validate_key(key)?;
        let inner = &self.inner;
        match inner
            .client
            .delete_object()
            .bucket(&inner.bucket)
            .key(self.full_key(key))
            .send()
            .await
        {
            Ok(_) => Ok(()),
            // S3 answers 204 for a missing key; some compatible servers do not.
            Err(e) if e.code() == Some("NoSuchKey") => Ok(()),
            Err(e) => Err(self.fail("delete", key, e)),
        }
    }

    fn describe(&self) -> String {
        let inner = &self.inner;
        let place = format!(
            "s3://{}/{}",
            inner.bucket,
            inner.prefix.trim_end_matches('/')
        );
        match &inner.endpoint {
            Some(endpoint) => format!("{place} at {endpoint}"),
            None => place,
        }
    }
}
