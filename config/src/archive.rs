//! `[archive]`: where cold history goes (a local directory by default, or
//! S3), the hot window, and how often `walhook run` archives.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;
use serde::Deserialize;

/// `[archive]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArchiveConfig {
    /// `local` (a directory; the default) or `s3`.
    pub store: String,
    /// The local store's directory; relative paths are read from the config
    /// file's folder.
    pub path: PathBuf,
    /// Days that stay in Postgres: a day is archived once it ended more than
    /// this many days ago (and nothing of it is still pending).
    pub hot_days: u32,
    /// Tenant hash buckets per day (`tenant_bucket=NN` in object keys).
    pub tenant_buckets: u16,
    /// Rows per Parquet part at most.
    pub part_rows: usize,
    /// Bytes of rows per Parquet part at most (default 256 MiB, at most
    /// 1 GiB): a part is built in memory, and a day of large payloads in
    /// one tenant bucket is cut into parts of this size. A row bigger than
    /// this gets a part of its own.
    pub part_bytes: u64,
    /// How often `walhook run` archives due days; `0s` turns it off (then
    /// run `walhook archive` from cron).
    #[serde(with = "walhook_pipeline::duration")]
    pub every: Duration,
    /// How old an archived delivery's event may be for the API to replay
    /// it (history stays readable beyond it).
    #[serde(with = "walhook_pipeline::duration")]
    pub replay_window: Duration,
    /// Archived days older than this many days are deleted from the store
    /// (their objects and manifests); 0 keeps them for ever.
    pub retention_days: u32,
    /// S3 settings, when `store = "s3"`.
    pub s3: Option<S3Config>,
}

/// `[archive.s3]`. Credentials come from the usual AWS chain (environment
/// variables `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, profiles, instance
/// roles), never from this file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    /// The bucket (it must exist).
    pub bucket: String,
    /// A key prefix inside the bucket, e.g. `walhook/prod`.
    #[serde(default)]
    pub prefix: String,
    /// An endpoint for S3-compatible servers (MinIO, Garage, Ceph), e.g.
    /// `http://127.0.0.1:9000`; AWS when absent.
    pub endpoint: Option<String>,
    /// The region (`us-east-1` when absent).
    pub region: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`), which most
    /// S3-compatible servers need.
    #[serde(default)]
    pub force_path_style: bool,
    /// The size of each part of a multipart upload, bytes (default 8 MiB;
    /// S3 takes 5 MiB to 5 GiB).
    #[serde(default = "default_part_size")]
    pub part_size: usize,
    /// Objects larger than this many bytes are uploaded in parts of
    /// `part_size` (default 16 MiB; at least `part_size`, at most 5 GiB,
    /// S3's largest single upload).
    #[serde(default = "default_multipart_threshold")]
    pub multipart_threshold: usize,
}

/// S3's largest part and largest single upload (5 GiB).
const S3_MAX_UPLOAD: usize = 5 * 1024 * 1024 * 1024;

fn default_part_size() -> usize {
    walhook_archive::objstore::s3::DEFAULT_PART_SIZE
}

fn default_multipart_threshold() -> usize {
    walhook_archive::objstore::s3::DEFAULT_MULTIPART_THRESHOLD
}

impl S3Config {
    /// Checks the upload sizes; the message names the field, the value and
    /// the fix.
    fn validate_uploads(&self) -> anyhow::Result<()> {
        let min = walhook_archive::objstore::s3::MIN_PART_SIZE;
        if !(min..=S3_MAX_UPLOAD).contains(&self.part_size) {
            bail!(
                "[archive.s3] part_size = {} is out of range: S3 takes parts of {min} (5 MiB) to {S3_MAX_UPLOAD} (5 GiB) bytes; the default is {}",
                self.part_size,
                default_part_size()
            );
        }
        if !(self.part_size..=S3_MAX_UPLOAD).contains(&self.multipart_threshold) {
            bail!(
                "[archive.s3] multipart_threshold = {} is out of range: use part_size ({}) to {S3_MAX_UPLOAD} (5 GiB, S3's largest single upload); the default is {}",
                self.multipart_threshold,
                self.part_size,
                default_multipart_threshold()
            );
        }
        Ok(())
    }
}

impl Default for ArchiveConfig {
    fn default() -> Self {
        ArchiveConfig {
            store: "local".into(),
            path: PathBuf::from("walhook-archive"),
            hot_days: walhook_archive::archiver::DEFAULT_HOT_DAYS,
            tenant_buckets: walhook_archive::layout::DEFAULT_TENANT_BUCKETS,
            part_rows: walhook_archive::archiver::DEFAULT_PART_ROWS,
            part_bytes: walhook_archive::archiver::DEFAULT_PART_BYTES,
            every: Duration::from_secs(3600),
            replay_window: walhook_archive::cold::DEFAULT_REPLAY_WINDOW,
            retention_days: 0,
            s3: None,
        }
    }
}

impl ArchiveConfig {
    /// Checks the values; the message names the field and the fix.
    pub fn validate(&self) -> anyhow::Result<()> {
        match self.store.as_str() {
            "local" => {}
            "s3" => {
                let Some(s3) = &self.s3 else {
                    bail!(
                        "[archive] store = \"s3\" needs an [archive.s3] section with at least bucket = \"…\""
                    );
                };
                if s3.bucket.trim().is_empty() {
                    bail!("[archive.s3] bucket is empty: name an existing bucket");
                }
                if let Some(e) = &s3.endpoint
                    && !(e.starts_with("http://") || e.starts_with("https://"))
                {
                    bail!(
                        "[archive.s3] endpoint = {e:?} is not an http(s) URL: write e.g. \"http://127.0.0.1:9000\""
                    );
                }
                s3.validate_uploads()?;
            }
            other => bail!("[archive] store = {other:?} is not known: use \"local\" or \"s3\""),
        }
        if self.hot_days < 1 {
            bail!(
                "[archive] hot_days = 0 would archive today's partitions while they are written: use 1 or more (default 3)"
            );
        }
        if !(1..=256).contains(&self.tenant_buckets) {
            bail!(
                "[archive] tenant_buckets = {} is out of range: use 1 to 256 (default 16)",
                self.tenant_buckets
            );
        }
        if self.retention_days > 0 && self.retention_days <= self.hot_days {
            bail!(
                "[archive] retention_days = {} would delete days before they leave Postgres (hot_days = {}): use more than hot_days, or 0 to keep everything",
                self.retention_days,
                self.hot_days
            );
        }
        if self.part_rows < 1000 {
            bail!(
                "[archive] part_rows = {} is too small: use 1000 or more (default 1000000)",
                self.part_rows
            );
        }
        const MIB: u64 = 1024 * 1024;
        let max = walhook_archive::archiver::MAX_PART_BYTES;
        if !(MIB..=max).contains(&self.part_bytes) {
            bail!(
                "[archive] part_bytes = {} is out of range: use {MIB} (1 MiB) to {max} (1 GiB); the default is {} (256 MiB)",
                self.part_bytes,
                walhook_archive::archiver::DEFAULT_PART_BYTES
            );
        }
        Ok(())
    }

    /// Reads a relative `path` from `dir`.
    pub fn resolve_paths(&mut self, dir: &Path) {
        if self.path.is_relative() {
            self.path = dir.join(&self.path);
        }
    }

    /// The archive's settings from this section (every table, today's
    /// date); commands override what their flags change.
    pub fn settings(&self) -> walhook_archive::Settings {
        walhook_archive::Settings {
            hot_days: self.hot_days,
            tenant_buckets: self.tenant_buckets,
            part_rows: self.part_rows,
            part_bytes: self.part_bytes,
            retention_days: (self.retention_days > 0).then_some(self.retention_days),
            ..walhook_archive::Settings::default()
        }
    }

    /// Opens the configured store.
    pub async fn open_store(&self) -> anyhow::Result<walhook_archive::objstore::AnyStore> {
        use walhook_archive::objstore::{AnyStore, LocalDirStore, S3Settings, S3Store};
        Ok(match self.store.as_str() {
            "s3" => {
                let s3 = self.s3.as_ref().expect("validated");
                let mut settings = S3Settings::new(s3.bucket.clone());
                settings.prefix = s3.prefix.clone();
                settings.endpoint = s3.endpoint.clone();
                settings.region = s3.region.clone();
                settings.force_path_style = s3.force_path_style;
                settings.part_size = s3.part_size;
                settings.multipart_threshold = s3.multipart_threshold;
                AnyStore::S3(S3Store::connect(settings).await?)
            }
            _ => AnyStore::Local(LocalDirStore::open(&self.path)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes the S3 store's error texts name (`raise [archive.s3]
    /// part_size`, `lower [archive.s3] multipart_threshold`) exist, are
    /// read, and a bad one is refused naming the field, value and range.
    #[test]
    fn s3_upload_sizes_are_read_and_checked() {
        let base = "store = \"s3\"\n[s3]\nbucket = \"b\"\n";
        let cfg: ArchiveConfig = toml::from_str(base).unwrap();
        cfg.validate().unwrap();
        let s3 = cfg.s3.unwrap();
        assert_eq!((s3.part_size, s3.multipart_threshold), (8 << 20, 16 << 20));
        let cfg: ArchiveConfig = toml::from_str(&format!(
            "{base}part_size = 6291456\nmultipart_threshold = 67108864\n"
        ))
        .unwrap();
        cfg.validate().unwrap();
        let s3 = cfg.s3.unwrap();
        assert_eq!((s3.part_size, s3.multipart_threshold), (6 << 20, 64 << 20));
        for (extra, want) in [
            (
                "part_size = 1048576",
                "[archive.s3] part_size = 1048576 is out of range",
            ),
            (
                "part_size = 6442450944",
                "[archive.s3] part_size = 6442450944 is out of range",
            ),
            (
                "part_size = 8388608\nmultipart_threshold = 5242880",
                "[archive.s3] multipart_threshold = 5242880 is out of range: use part_size (8388608)",
            ),
        ] {
            let cfg: ArchiveConfig = toml::from_str(&format!("{base}{extra}\n")).unwrap();
            let err = cfg.validate().unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn part_bytes_is_read_bounded_and_named_with_its_fix() {
        let default = ArchiveConfig::default();
        default.validate().unwrap();
        assert_eq!(default.settings().part_bytes, 256 * 1024 * 1024);
        let small: ArchiveConfig = toml::from_str("part_bytes = 4194304").unwrap();
        small.validate().unwrap();
        assert_eq!(small.settings().part_bytes, 4 * 1024 * 1024);
        for bad in [
            0,
            1024 * 1024 - 1,
            walhook_archive::archiver::MAX_PART_BYTES + 1,
        ] {
            let cfg = ArchiveConfig {
                part_bytes: bad,
                ..ArchiveConfig::default()
            };
            let err = cfg.validate().unwrap_err().to_string();
            assert!(
                err.contains(&format!("[archive] part_bytes = {bad} is out of range"))
                    && err.contains("1 MiB")
                    && err.contains("1 GiB"),
                "{err}"
            );
        }
    }
}
