//! The settings of the S3 store: where the bucket is, how objects are
//! uploaded and listed, and which credentials sign the requests. Checked by
//! a pure [`S3Settings::validate`] whose errors name the field.

use walhook_pipeline::objstore::validate_key;
use walhook_pipeline::redact::Redacted;

/// The region used when none is configured (S3-compatible servers mostly
/// ignore it; AWS needs the bucket's own).
pub const DEFAULT_REGION: &str = "us-east-1";
/// Objects larger than this are uploaded in parts.
pub const DEFAULT_MULTIPART_THRESHOLD: usize = 16 * 1024 * 1024;
/// The size of each part of a multipart upload (the last may be smaller).
pub const DEFAULT_PART_SIZE: usize = 8 * 1024 * 1024;
/// S3's smallest part (all parts but the last).
pub const MIN_PART_SIZE: usize = 5 * 1024 * 1024;
/// Keys asked for per ListObjectsV2 page (S3's own maximum).
pub const DEFAULT_LIST_PAGE_SIZE: i32 = 1000;

/// An access key pair given in configuration instead of the AWS chain.
#[derive(Debug, Clone)]
pub struct S3Credentials {
    /// The access key id (not secret; shown in server logs).
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: Redacted<String>,
}

/// Where and how to reach the bucket.
#[derive(Debug, Clone)]
pub struct S3Settings {
    /// The bucket's name.
    pub bucket: String,
    /// The folder inside the bucket that walhook owns; keys go under
    /// `prefix/`. Empty for the whole bucket. Slashes at either end are
    /// ignored.
    pub prefix: String,
    /// An endpoint URL instead of AWS's (`http://127.0.0.1:9000` for an
    /// S3-compatible server).
    pub endpoint: Option<String>,
    /// The bucket's region; [`DEFAULT_REGION`] when unset.
    pub region: Option<String>,
    /// Address the bucket as `endpoint/bucket/key` instead of
    /// `bucket.endpoint/key` (most S3-compatible servers need this).
    pub force_path_style: bool,
    /// Objects larger than this many bytes are uploaded in parts.
    pub multipart_threshold: usize,
    /// The size of each part of a multipart upload, at least
    /// [`MIN_PART_SIZE`].
    pub part_size: usize,
    /// Keys asked for per listing page, 1 to 1,000.
    pub list_page_size: i32,
    /// Static credentials; `None` reads them from the AWS chain.
    pub credentials: Option<S3Credentials>,
}

impl S3Settings {
    /// Settings for `bucket` with every other field at its default.
    pub fn new(bucket: impl Into<String>) -> Self {
        S3Settings {
            bucket: bucket.into(),
            prefix: String::new(),
            endpoint: None,
            region: None,
            force_path_style: false,
            multipart_threshold: DEFAULT_MULTIPART_THRESHOLD,
            part_size: DEFAULT_PART_SIZE,
            list_page_size: DEFAULT_LIST_PAGE_SIZE,
            credentials: None,
        }
    }

    /// Checks each field on its own; the error names the field, its value
    /// and the fix.
    pub fn validate(&self) -> Result<(), S3SettingsError> {
        let bad = |field, value: String, fix| Err(S3SettingsError { field, value, fix });
        let bucket = &self.bucket;
        if bucket.len() < 3
            || bucket.len() > 63
            || !bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        {
            return bad(
                "bucket",
                format!("{bucket:?}"),
                "a bucket name is 3 to 63 lower-case letters, digits, '-' or '.'",
            );
        }
        let prefix = self.prefix.trim_matches('/');
        if !prefix.is_empty() && validate_key(prefix).is_err() {
            return bad(
                "prefix",
                format!("{:?}", self.prefix),
                "the prefix is a relative path of printable ASCII without spaces, empty, '.' \
                 or '..' segments",
            );
        }
        if let Some(endpoint) = &self.endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return bad(
                "endpoint",
                format!("{endpoint:?}"),
                "the endpoint is a URL starting with http:// or https://",
            );
        }
        if self.part_size < MIN_PART_SIZE {
            return bad(
                "part_size",
                self.part_size.to_string(),
                "S3 refuses parts under 5 MiB (5242880 bytes) but the last",
            );
        }
        if self.multipart_threshold < self.part_size {
            return bad(
                "multipart_threshold",
                self.multipart_threshold.to_string(),
                "the threshold must be at least part_size, or an upload could be one part",
            );
        }
        if !(1..=1000).contains(&self.list_page_size) {
            return bad(
                "list_page_size",
                self.list_page_size.to_string(),
                "a listing page holds 1 to 1,000 keys",
            );
        }
        Ok(())
    }
}

/// A field of [`S3Settings`] that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("[archive.s3] {field} = {value}: {fix}")]
pub struct S3SettingsError {
    /// The field.
    pub field: &'static str,
    /// Its value, as configured.
    pub value: String,
    /// What a valid value looks like.
    pub fix: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_name_the_bad_field() {
        let mut s = S3Settings::new("walhook-archive");
        assert!(s.validate().is_ok());
        s.part_size = 1024;
        let e = s.validate().unwrap_err();
        assert_eq!(e.field, "part_size");
        assert!(e.to_string().contains("5 MiB"), "{e}");
        let e = S3Settings::new("Bad_Bucket").validate().unwrap_err();
        assert_eq!(e.field, "bucket");
        let mut s = S3Settings::new("walhook-archive");
        s.prefix = "a/../b".into();
        assert_eq!(s.validate().unwrap_err().field, "prefix");
        s.prefix = "/walhook/".into();
        assert!(s.validate().is_ok());
    }
}
