//! The object-store contract (`walhook_pipeline::objstore`), run against
//! every implementation: a local directory in a temporary folder, and S3
//! on a real S3-compatible server (`s3s-fs`, started by devkit) with real
//! SigV4 signatures, checksums and multipart uploads.
//!
//! The S3 tests fail, never skip, when `s3s-fs` is missing: the message
//! says to run `scripts/ensure-s3.sh`.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use bytes::Bytes;
use sha2::{Digest, Sha256};
use walhook_archive::objstore::{AnyStore, LocalDirStore, S3Credentials, S3Settings, S3Store};
use walhook_devkit::s3::S3Server;
use walhook_pipeline::objstore::{ObjectInfo, ObjectStore, ObjectStoreError, sha256_hex};

const MIB: usize = 1024 * 1024;

/// The same checks for every store; `store` must be empty.
async fn contract<S: ObjectStore>(store: &S) {
    assert!(
        store.list("").await.unwrap().is_empty(),
        "a fresh store lists nothing"
    );

    // A put returns the size and SHA-256 of what it stored; get returns it.
    let receipt = store
        .put("t/a/one", Bytes::from_static(b"hello, archive"))
        .await
        .unwrap();
    assert_eq!(receipt.size, 14);
    assert_eq!(receipt.sha256, sha256_hex(b"hello, archive"));
    assert_eq!(
        store.get("t/a/one").await.unwrap().as_deref(),
        Some(&b"hello, archive"[..])
    );

    // A second put replaces the object whole: a shorter body leaves no tail.
    let receipt = store
        .put("t/a/one", Bytes::from_static(b"hi"))
        .await
        .unwrap();
    assert_eq!(
        (receipt.size, receipt.sha256.as_str()),
        (2, &*sha256_hex(b"hi"))
    );
    assert_eq!(
        store.get("t/a/one").await.unwrap().as_deref(),
        Some(&b"hi"[..])
    );

    // A missing object is None, not an error, whether or not its
    // "directory" exists.
    assert_eq!(store.get("t/a/missing").await.unwrap(), None);
    assert_eq!(store.get("nowhere/at/all").await.unwrap(), None);

    // A ranged get returns those bytes only, cut at the object's end; a
    // missing object is None.
    store
        .put("t/r", Bytes::from_static(b"0123456789"))
        .await
        .unwrap();
    let range = |r: std::ops::Range<u64>| store.get_range("t/r", r);
    assert_eq!(range(2..5).await.unwrap().as_deref(), Some(&b"234"[..]));
    assert_eq!(
        range(0..10).await.unwrap().as_deref(),
        Some(&b"0123456789"[..])
    );
    assert_eq!(range(7..100).await.unwrap().as_deref(), Some(&b"789"[..]));
    assert_eq!(range(10..20).await.unwrap().as_deref(), Some(&b""[..]));
    assert_eq!(range(4..4).await.unwrap().as_deref(), Some(&b""[..]));
    assert_eq!(store.get_range("t/nothing", 0..4).await.unwrap(), None);
    assert_eq!(store.get_range("t/nothing", 0..0).await.unwrap(), None);
    store.delete("t/r").await.unwrap();

    // Listing: everything under a prefix, sorted by key (bytes), with sizes.
    for key in ["t/b/2", "t/b/10", "u/x", "t/c", "t/b/1", "t/bz"] {
        store.put(key, Bytes::from(key.to_owned())).await.unwrap();
    }
    let listed = store.list("t/b/").await.unwrap();
    assert_eq!(
        listed,
        [info("t/b/1", 5), info("t/b/10", 6), info("t/b/2", 5)]
    );
    let keys = |list: Vec<ObjectInfo>| list.into_iter().map(|o| o.key).collect::<Vec<_>>();
    assert_eq!(
        keys(store.list("t/b").await.unwrap()),
        ["t/b/1", "t/b/10", "t/b/2", "t/bz"],
        "a prefix is a string prefix, not a directory"
    );
    assert_eq!(
        keys(store.list("").await.unwrap()),
        ["t/a/one", "t/b/1", "t/b/10", "t/b/2", "t/bz", "t/c", "u/x"]
    );
    assert!(store.list("zzz/").await.unwrap().is_empty());

    // More objects than a listing page holds (the S3 store is set to
    // pages of 7 keys): all of them, in order.
    let mut expected = Vec::new();
    for i in (0..23).rev() {
        let key = format!("p/{i:04}");
        store.put(&key, Bytes::from(vec![b'x'; i])).await.unwrap();
        expected.push(info(&key, i as u64));
    }
    expected.reverse();
    assert_eq!(store.list("p/").await.unwrap(), expected);

    // Delete removes; deleting what is not there succeeds.
    store.delete("t/c").await.unwrap();
    assert_eq!(store.get("t/c").await.unwrap(), None);
    assert!(!keys(store.list("t/").await.unwrap()).contains(&"t/c".to_owned()));
    store.delete("t/c").await.unwrap();
    store.delete("never/was").await.unwrap();

    // Invalid keys are refused before any I/O.
    for bad in ["", "/abs", "a//b", "a/../b", "a b", "a\\b", "é"] {
        let refused = |r: Result<(), ObjectStoreError>| {
            assert!(
                matches!(r, Err(ObjectStoreError::InvalidKey { .. })),
                "{bad:?}: {r:?}"
            )
        };
        refused(store.put(bad, Bytes::from_static(b"x")).await.map(drop));
        refused(store.get(bad).await.map(drop));
        refused(store.get_range(bad, 0..1).await.map(drop));
        refused(store.delete(bad).await);
    }

    // A large object (multipart on S3: 11 MiB in parts of 5 MiB) comes
    // back bit-exact.
    let big = pseudo_random(11 * MIB + 123);
    let receipt = store.put("big/object", big.clone()).await.unwrap();
    assert_eq!(receipt.size, big.len() as u64);
    assert_eq!(receipt.sha256, sha256_hex(&big));
    let back = store
        .get("big/object")
        .await
        .unwrap()
        .expect("the big object");
    assert!(back == big, "the large object changed on the way");
    // A range of it (of a multipart object on S3) is the same bytes.
    let tail = store
        .get_range("big/object", (6 * MIB) as u64..(6 * MIB + 4096) as u64)
        .await
        .unwrap()
        .expect("the big object");
    assert!(tail == big.slice(6 * MIB..6 * MIB + 4096));
}

fn info(key: &str, size: u64) -> ObjectInfo {
    ObjectInfo {
        key: key.to_owned(),
        size,
    }
}

/// Bytes that no compression or deduplication can shortcut.
fn pseudo_random(len: usize) -> Bytes {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

/// A server, or a failure that says how to install one.
async fn s3_server() -> S3Server {
    S3Server::start("walhook-test")
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Settings for `server` with small parts and small listing pages, so the
/// contract exercises multipart uploads and pagination.
fn s3_settings(server: &S3Server) -> S3Settings {
    S3Settings {
        prefix: "walhook/archive".into(),
        endpoint: Some(server.endpoint().to_owned()),
        force_path_style: true,
        multipart_threshold: 5 * MIB,
        part_size: 5 * MIB,
        list_page_size: 7,
        credentials: Some(S3Credentials {
            access_key_id: server.access_key().to_owned(),
            secret_access_key: server.secret_key().to_owned().into(),
        }),
        ..S3Settings::new(server.bucket())
    }
}

#[tokio::test]
async fn local_dir_store_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDirStore::open(dir.path().join("archive")).unwrap();
    assert!(
        store.describe().starts_with("file:///"),
        "{}",
        store.describe()
    );
    contract(&AnyStore::from(store.clone())).await;
    // A directory (the prefix of other keys) is no object. (s3s-fs answers
    // InternalError here; S3 itself has no directories.)
    assert_eq!(store.get("t").await.unwrap(), None);
    // Nothing but objects is left behind: no temporary files.
    let leftovers: Vec<_> = walk(store.root())
        .into_iter()
        .filter(|p| p.contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test]
async fn s3_store_keeps_the_contract() {
    let server = s3_server().await;
    let store = S3Store::connect(s3_settings(&server)).await.unwrap();
    assert_eq!(
        store.describe(),
        format!("s3://walhook-test/walhook/archive at {}", server.endpoint())
    );
    contract(&AnyStore::from(store)).await;
    // Keys live under the prefix in the bucket, and the multipart upload
    // left no parts behind.
    let bucket = server.root().join("walhook-test");
    assert!(bucket.join("walhook/archive/t/a/one").is_file());
    // The upload carried its SHA-256, which the server checked against the
    // bytes it received and kept (s3s-fs keeps it beside the object).
    let name = |s: &str| URL_SAFE_NO_PAD.encode(s);
    let kept = std::fs::read_to_string(server.root().join(format!(
        ".bucket-{}.object-{}.internal.json",
        name("walhook-test"),
        name("walhook/archive/t/a/one")
    )))
    .unwrap();
    let want = STANDARD.encode(Sha256::digest(b"hi"));
    assert!(kept.contains(&want), "no SHA-256 {want} in {kept}");
    let parts: Vec<_> = walk(&server.root())
        .into_iter()
        .filter(|p| p.contains(".upload"))
        .collect();
    assert!(parts.is_empty(), "{parts:?}");
}

#[tokio::test]
async fn s3_wrong_secret_is_definite_and_says_so() {
    let server = s3_server().await;
    let mut settings = s3_settings(&server);
    settings.credentials = Some(S3Credentials {
        access_key_id: server.access_key().to_owned(),
        secret_access_key: "not-the-secret".to_owned().into(),
    });
    let store = S3Store::connect(settings).await.unwrap();
    let err = store
        .put("a", Bytes::from_static(b"x"))
        .await
        .expect_err("a wrong secret must be refused");
    assert!(matches!(err, ObjectStoreError::Definite { .. }), "{err:?}");
    assert!(err.to_string().contains("secret access key"), "{err}");
}

#[tokio::test]
async fn s3_unknown_access_key_is_definite_and_says_so() {
    let server = s3_server().await;
    let mut settings = s3_settings(&server);
    settings.credentials = Some(S3Credentials {
        access_key_id: "nobody".into(),
        secret_access_key: server.secret_key().to_owned().into(),
    });
    let store = S3Store::connect(settings).await.unwrap();
    let err = store
        .list("")
        .await
        .expect_err("an unknown key must be refused");
    assert!(matches!(err, ObjectStoreError::Definite { .. }), "{err:?}");
    assert!(err.to_string().contains("access key id"), "{err}");
}

#[tokio::test]
async fn s3_missing_bucket_is_definite_and_named() {
    let server = s3_server().await;
    let settings = S3Settings {
        bucket: "no-such-bucket".into(),
        ..s3_settings(&server)
    };
    let store = S3Store::connect(settings).await.unwrap();
    // A listing (s3s-fs makes the bucket's folder on a put; S3 would not).
    let err = store
        .list("")
        .await
        .expect_err("a missing bucket must be refused");
    assert!(matches!(err, ObjectStoreError::Definite { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("bucket no-such-bucket does not exist"),
        "{err}"
    );
}

#[tokio::test]
async fn s3_stopped_server_is_transient_and_keys_are_checked_first() {
    let mut server = s3_server().await;
    let store = S3Store::connect(s3_settings(&server)).await.unwrap();
    store.put("a", Bytes::from_static(b"x")).await.unwrap();
    server.stop();
    let err = store.get("a").await.expect_err("nothing listens any more");
    assert!(err.is_transient(), "{err:?}");
    let err = store
        .put("a", Bytes::from_static(b"x"))
        .await
        .expect_err("nothing listens any more");
    assert!(err.is_transient(), "{err:?}");
    // An invalid key is refused without a request (which would fail as
    // transient here).
    let err = store
        .put("../a", Bytes::from_static(b"x"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ObjectStoreError::InvalidKey { .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn s3_settings_are_checked_at_connect() {
    let err = S3Store::connect(S3Settings {
        part_size: 1024,
        ..S3Settings::new("walhook-test")
    })
    .await
    .expect_err("parts under 5 MiB");
    assert!(matches!(err, ObjectStoreError::Definite { .. }), "{err:?}");
    let source = std::error::Error::source(&err).map(|s| s.to_string());
    assert!(
        source.as_deref().is_some_and(|s| s.contains("part_size")),
        "{source:?}"
    );
}

fn walk(root: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                out.push(path.display().to_string());
            }
        }
    }
    out
}
