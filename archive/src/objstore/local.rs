//! A directory on local disk as the object store: the embedded default.
//!
//! The key `a/b/c` is the file `<root>/a/b/c`. A `put` writes the bytes to a
//! temporary file beside the target (`.c.tmp-<random>`), fsyncs it, renames
//! it over the key and fsyncs the directory: a reader, or a restart after a
//! crash, sees the old object or the new one, never a prefix. Directories
//! that a `put` creates are fsynced into their parents too, so a durable
//! object is never in a directory that a crash can lose. Temporary files
//! left by a crash are skipped by `list`, and removed by the `list` that
//! meets them once they are [`STALE_TEMPORARY`] old (a `put` in flight, in
//! this process or another sharing the directory, is never that old); each
//! removal is logged.
//!
//! A ranged `get` is one positioned read (`pread`) of the file.
//!
//! The file system calls are blocking and run on tokio's blocking pool.

use std::fs::File;
use std::io::{self, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use walhook_pipeline::objstore::{
    ObjectInfo, ObjectStore, ObjectStoreError, PutReceipt, sha256_hex, validate_key,
};

/// The marker in the names of temporary files (`.<name>.tmp-<random>`).
const TMP_MARKER: &str = ".tmp-";

/// How old a temporary file must be before a `list` removes it as the
/// leftover of a `put` that a crash cut off. A `put` writes, fsyncs and
/// renames one object: seconds, not an hour.
pub const STALE_TEMPORARY: std::time::Duration = std::time::Duration::from_secs(3600);

/// Objects stored as files under a root directory.
#[derive(Debug, Clone)]
pub struct LocalDirStore {
    root: Arc<PathBuf>,
}

impl LocalDirStore {
    /// Opens the store at `root`, creating the directory (and its parents)
    /// when it does not exist yet.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, ObjectStoreError> {
        let root = root.into();
        let shown = root.display().to_string();
        let fail = |e: io::Error| ObjectStoreError::Definite {
            op: "open",
            key: shown.clone(),
            hint: format!(
                "cannot create or open the archive directory {shown}: check the configured path \
                 and that walhook's user may create and write files there"
            ),
            source: Box::new(e),
        };
        std::fs::create_dir_all(&root).map_err(fail)?;
        // An absolute, symlink-free root: `describe` shows where the files
        // really are, and a later change of working directory is harmless.
        let root = std::fs::canonicalize(&root).map_err(fail)?;
        if !root.is_dir() {
            return Err(fail(io::Error::new(
                io::ErrorKind::NotADirectory,
                "the path exists and is not a directory",
            )));
        }
        Ok(LocalDirStore {
            root: Arc::new(root),
        })
    }

    /// The root directory (absolute).
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path_of(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }
}

/// Rejects keys whose last segment looks like one of our temporary files:
/// `list` skips those names, so such an object could be written but never
/// listed.
fn validate_local_key(key: &str) -> Result<(), ObjectStoreError> {
    validate_key(key)?;
    let name = key.rsplit('/').next().unwrap_or(key);
    if is_temporary(name) {
        return Err(ObjectStoreError::InvalidKey {
            key: key.chars().take(200).collect(),
            reason: "names of the form .<name>.tmp-<suffix> are reserved for temporary files",
        });
    }
    Ok(())
}

fn is_temporary(file_name: &str) -> bool {
    file_name.starts_with('.') && file_name.contains(TMP_MARKER)
}

/// Decides, once, whether a file-system failure may pass on a retry: the
/// ones an operator must fix (permissions, a read-only or full disk, a file
/// where a directory should be) are definite, the rest transient.
fn classify(op: &'static str, key: &str, path: &Path, e: io::Error) -> ObjectStoreError {
    use io::ErrorKind as K;
    let shown = path.display();
    let hint = match e.kind() {
        K::PermissionDenied => Some(format!(
            "permission denied on {shown}: give walhook's user read and write access to the \
             archive directory"
        )),
        K::ReadOnlyFilesystem => Some(format!(
            "{shown} is on a read-only file system: mount it read-write or choose another \
             archive directory"
        )),
        K::StorageFull | K::QuotaExceeded => Some(format!(
            "no space left for {shown}: free space on that file system or move the archive \
             directory"
        )),
        K::NotADirectory | K::IsADirectory => Some(format!(
            "{shown} clashes with an existing file or directory (one key is the directory of \
             another): remove the stray entry"
        )),
        _ => None,
    };
    ObjectStoreError::backend(op, key, hint, e)
}

/// Creates `dir` and any missing parents below `root`, fsyncing each new
/// directory's parent so the new entry survives a crash.
fn create_dirs_durably(root: &Path, dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let relative = dir.strip_prefix(root).map_err(io::Error::other)?;
    let mut current = root.to_path_buf();
    for part in relative.components() {
        let parent = current.clone();
        current.push(part);
        match std::fs::create_dir(&current) {
            Ok(()) => File::open(&parent)?.sync_all()?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && current.is_dir() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn put_blocking(root: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other("a key always has a parent directory"))?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("a key always has a file name"))?
        .to_string_lossy();
    create_dirs_durably(root, dir)?;
    let tmp = dir.join(format!(".{name}{TMP_MARKER}{:016x}", rand::random::<u64>()));
    let written = (|| {
        let mut file = File::create_new(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)?;
        // The rename is durable only once the directory is.
        File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        // Best effort: a leftover is skipped by `list` anyway.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn list_blocking(root: &Path, prefix: &str) -> io::Result<Vec<ObjectInfo>> {
    // Start the walk at the deepest directory that the prefix names whole,
    // when that part is a valid key (so it cannot leave the root).
    let start = match prefix.rfind('/') {
        Some(i) if validate_key(&prefix[..i]).is_ok() => root.join(&prefix[..i]),
        _ => root.to_path_buf(),
    };
    let mut out = Vec::new();
    let mut pending = vec![start];
    while let Some(dir) = pending.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            // The prefix names a directory that does not exist: nothing there.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                continue;
            }
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let kind = entry.file_type()?;
            let path = entry.path();
            if kind.is_dir() {
                pending.push(path);
                continue;
            }
            // Symbolic links and other special files are not objects.
            if !kind.is_file() {
                continue;
            }
            if is_temporary(&entry.file_name().to_string_lossy()) {
                remove_if_stale(&path, &entry.metadata()?);
                continue;
            }
            let Some(key) = path
                .strip_prefix(root)
                .ok()
                .and_then(|p| p.to_str())
                .map(|p| p.replace(std::path::MAIN_SEPARATOR, "/"))
            else {
                continue;
            };
            // A stray file whose name is no valid key could not be read back
            // through this store: it is not one of ours.
            if key.starts_with(prefix) && validate_key(&key).is_ok() {
                let size = entry.metadata()?.len();
                out.push(ObjectInfo { key, size });
            }
        }
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

/// Removes the temporary file at `path` when it is older than
/// [`STALE_TEMPORARY`]: what a crash left of a `put`. A failure to remove it
/// is logged and harmless (it is never listed or read).
fn remove_if_stale(path: &Path, meta: &std::fs::Metadata) {
    let age = meta
        .modified()
        .ok()
        .and_then(|t| t.elapsed().ok())
        .unwrap_or_default();
    if age < STALE_TEMPORARY {
        return;
    }
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(
            path = %path.display(),
            bytes = meta.len(),
            age_s = age.as_secs(),
            "removed the temporary file of an archive write that did not finish (a crash cut it off)"
        ),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(
            path = %path.display(),
            error = %e,
            "could not remove the temporary file of an archive write that did not finish; it is never read, remove it by hand"
        ),
    }
}

/// The bytes of `range` of the file at `path`, cut at its end: one
/// positioned read, whatever the file's size.
fn read_range(path: &Path, range: Range<u64>) -> io::Result<Bytes> {
    use std::os::unix::fs::FileExt;
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(io::Error::from(io::ErrorKind::IsADirectory));
    }
    let end = range.end.min(meta.len());
    let len = usize::try_from(end.saturating_sub(range.start)).map_err(io::Error::other)?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, range.start)?;
    Ok(Bytes::from(buf))
}

/// Runs blocking file-system work off the async threads.
async fn blocking<T: Send + 'static>(
    op: &'static str,
    key: &str,
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> Result<io::Result<T>, ObjectStoreError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ObjectStoreError::Transient {
            op,
            key: key.to_owned(),
            source: Box::new(e),
        })
}

impl ObjectStore for LocalDirStore {
    async fn put(&self, key: &str, bytes: Bytes) -> Result<PutReceipt, ObjectStoreError> {
        validate_local_key(key)?;
        let path = self.path_of(key);
        let root = Arc::clone(&self.root);
        let receipt = PutReceipt {
            size: bytes.len() as u64,
            sha256: sha256_hex(&bytes),
        };
        let target = path.clone();
        blocking("put", key, move || put_blocking(&root, &target, &bytes))
            .await?
            .map_err(|e| classify("put", key, &path, e))?;
        Ok(receipt)
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>, ObjectStoreError> {
        validate_local_key(key)?;
        let path = self.path_of(key);
        match tokio::fs::read(&path).await {
            Ok(bytes) => Ok(Some(Bytes::from(bytes))),
            // Missing, a file where a directory of the key should be, or a
            // directory (a prefix of other keys): no object by that key.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound
                        | io::ErrorKind::NotADirectory
                        | io::ErrorKind::IsADirectory
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(classify("get", key, &path, e)),
        }
    }

    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> Result<Option<Bytes>, ObjectStoreError> {
        validate_local_key(key)?;
        let path = self.path_of(key);
        let target = path.clone();
        match blocking("get", key, move || read_range(&target, range)).await? {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound
                        | io::ErrorKind::NotADirectory
                        | io::ErrorKind::IsADirectory
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(classify("get", key, &path, e)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, ObjectStoreError> {
        let root = Arc::clone(&self.root);
        let owned = prefix.to_owned();
        blocking("list", prefix, move || list_blocking(&root, &owned))
            .await?
            .map_err(|e| classify("list", prefix, &self.root, e))
    }

    async fn delete(&self, key: &str) -> Result<(), ObjectStoreError> {
        validate_local_key(key)?;
        let path = self.path_of(key);
        match tokio::fs::remove_file(&path).await {
            Ok(()) => Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(classify("delete", key, &path, e)),
        }
    }

    fn describe(&self) -> String {
        format!("file://{}", self.root.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_names_are_recognised_and_reserved() {
        assert!(is_temporary(".part-0.parquet.tmp-00ff"));
        assert!(!is_temporary("part-0.parquet"));
        assert!(!is_temporary(".hidden"));
        assert!(validate_local_key("a/.b.tmp-1").is_err());
        assert!(validate_local_key("a/.b").is_ok());
    }

    /// The keys `list(prefix)` gives.
    async fn keys(store: &LocalDirStore, prefix: &str) -> Vec<String> {
        store
            .list(prefix)
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect()
    }

    #[tokio::test]
    async fn leftover_temporary_files_are_not_listed() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::open(dir.path().join("objects")).unwrap();
        store.put("t/a", Bytes::from_static(b"x")).await.unwrap();
        std::fs::write(store.root().join("t/.a.tmp-1234"), b"half").unwrap();
        assert_eq!(keys(&store, "").await, ["t/a"]);
    }

    #[tokio::test]
    async fn a_crashed_puts_temporary_file_is_removed_once_stale_and_a_fresh_one_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::open(dir.path().join("objects")).unwrap();
        store.put("t/a", Bytes::from_static(b"x")).await.unwrap();
        let stale = store.root().join("t/.b.tmp-0001");
        let fresh = store.root().join("t/.c.tmp-0002");
        std::fs::write(&stale, b"half").unwrap();
        std::fs::write(&fresh, b"in flight").unwrap();
        let old =
            std::time::SystemTime::now() - STALE_TEMPORARY - std::time::Duration::from_secs(60);
        File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert_eq!(keys(&store, "t/").await, ["t/a"]);
        assert!(!stale.exists(), "the stale temporary file is still there");
        assert!(fresh.exists(), "a put in flight lost its temporary file");
        assert_eq!(store.get("t/a").await.unwrap().as_deref(), Some(&b"x"[..]));
    }
}
