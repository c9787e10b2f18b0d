//! Endpoint signing secrets at rest: AES-256-GCM under a master key.
//!
//! ```text
//!  create_endpoint / rotate_secret ──seal──▶ endpoint_secrets(secret = v1 ‖ nonce ‖ ciphertext+tag,
//!                                                             key_id = mk_…)
//!  load_endpoints ◀──open── key_id picks the master key from the Keyring
//!  reencrypt_secrets: rows under an old key ──open, seal──▶ the current key
//! ```
//!
//! - A master key is 32 random bytes, given as base64 (a file or
//!   `WALHOOK_MASTER_KEY`; only the binary reads config). Its id,
//!   `mk_` + 16 hex digits of SHA-256 over a label and the key, is stored
//!   with each row, so that several keys can be in use while the master key
//!   is rotated: the [`Keyring`] holds the current key (which seals) and
//!   old keys (which only open).
//! - Each secret is sealed with a fresh random 96-bit nonce (far below the
//!   2^32 messages per key that random nonces allow) and authenticated with
//!   its row's identity (endpoint id and secret version) as associated data:
//!   a ciphertext copied to another row does not open.
//! - Rows written before encryption existed carry `key_id = 'plain'`. They
//!   are refused ([`SecretsError::Plaintext`]): the directory quarantines
//!   their endpoint (an incident naming the fix, the
//!   `walhook_endpoints_quarantined` gauge) until `walhook secrets rotate`
//!   seals them, which is the only reader that opens them. A secret left
//!   readable in the database would let anyone who reads a backup or a
//!   replica sign webhooks as walhook; refusing it makes the operator seal
//!   it rather than leave it so behind a warning.
//! - No key or secret ever appears in `Debug`, `Display`, errors or logs.

use std::fmt;
use std::path::Path;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha256};
use walhook_pipeline::ids::EndpointId;
use walhook_pipeline::signing::SigningSecret;

/// The key id of rows stored before encryption (migration 2's default).
pub const PLAIN_KEY_ID: &str = "plain";

/// The first byte of a sealed secret: the format version.
const FORMAT_V1: u8 = 1;
const NONCE_BYTES: usize = 12;
const TAG_BYTES: usize = 16;
const AAD_LABEL: &[u8] = b"walhook.endpoint_secrets.v1";
const KEY_ID_LABEL: &[u8] = b"walhook master key id v1\0";

/// Errors of the keyring. None of them carries key material.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// The platform was built without a keyring.
    #[error(
        "no master key: set [secrets].master_key_file or WALHOOK_MASTER_KEY (make one with `walhook secrets generate-key`)"
    )]
    NoKeyring,
    /// A key is not base64 of 32 bytes.
    #[error(
        "{what} is not a master key: expected base64 of 32 bytes (make one with `walhook secrets generate-key`)"
    )]
    BadKey {
        /// Where the key came from.
        what: String,
    },
    /// A key file could not be read.
    #[error("cannot read the master key file {path}")]
    KeyFile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A row was sealed under a key this keyring does not hold.
    #[error(
        "endpoint {endpoint} secret version {version} is sealed under master key {key_id}, which is not configured: \
         add that key to [secrets].old_key_files (or WALHOOK_OLD_MASTER_KEYS) until `walhook secrets rotate` has re-sealed every row"
    )]
    UnknownKey {
        /// The endpoint.
        endpoint: EndpointId,
        /// The secret version.
        version: i32,
        /// The key id stored with the row.
        key_id: String,
    },
    /// The row was stored in plaintext, before secrets were sealed: refused
    /// until `walhook secrets rotate` seals it.
    #[error(
        "endpoint {endpoint} secret version {version} is stored in plaintext (written before \
         secrets were sealed), which walhook refuses to use: run `walhook secrets rotate --config \
         <file>` to seal it under the master key (its deliveries wait until then)"
    )]
    Plaintext {
        /// The endpoint.
        endpoint: EndpointId,
        /// The secret version.
        version: i32,
    },
    /// Authentication failed: the wrong key under that id, or the row was
    /// altered or moved.
    #[error(
        "endpoint {endpoint} secret version {version} does not open under master key {key_id}: the row was altered \
         or copied from another row"
    )]
    Corrupt {
        /// The endpoint.
        endpoint: EndpointId,
        /// The secret version.
        version: i32,
        /// The key id stored with the row.
        key_id: String,
    },
}

/// A master key: 32 bytes. `Debug` shows its id only.
#[derive(Clone)]
pub struct MasterKey {
    id: String,
    cipher: Aes256Gcm,
}

impl MasterKey {
    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        let digest = Sha256::new()
            .chain_update(KEY_ID_LABEL)
            .chain_update(bytes)
            .finalize();
        let id = format!(
            "mk_{}",
            digest[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        MasterKey {
            id,
            cipher: Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&bytes)),
        }
    }

    /// A fresh random key.
    pub fn generate() -> Self {
        Self::from_bytes(rand::random())
    }

    /// A fresh random key as base64 text, to store (`walhook secrets
    /// generate-key`).
    pub fn generate_text() -> String {
        STANDARD.encode(rand::random::<[u8; 32]>())
    }

    /// Parses base64 of 32 bytes; `what` names the source in errors.
    pub fn parse(text: &str, what: &str) -> Result<Self, SecretsError> {
        let bad = || SecretsError::BadKey {
            what: what.to_owned(),
        };
        let bytes = STANDARD.decode(text.trim()).map_err(|_| bad())?;
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| bad())?;
        Ok(Self::from_bytes(bytes))
    }

    /// Reads a key file (base64 of 32 bytes). Warns when others than the
    /// owner may read it.
    pub fn read_file(path: &Path) -> Result<Self, SecretsError> {
        let text = std::fs::read_to_string(path).map_err(|source| SecretsError::KeyFile {
            path: path.display().to_string(),
            source,
        })?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            if let Ok(meta) = std::fs::metadata(path)
                && meta.permissions().mode() & 0o077 != 0
            {
                tracing::warn!(
                    path = %path.display(),
                    "the master key file is readable by other users; chmod 600 it"
                );
            }
        }
        Self::parse(&text, &format!("the file {}", path.display()))
    }

    /// The key's id, stored with every row it seals.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MasterKey({}, ***)", self.id)
    }
}

/// A sealed secret, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// The id of the key that sealed it.
    pub key_id: String,
    /// Format byte, nonce, ciphertext and tag.
    pub bytes: Vec<u8>,
}

/// The current master key and old ones that may still open rows.
#[derive(Clone, Debug)]
pub struct Keyring {
    current: MasterKey,
    old: Vec<MasterKey>,
}

fn aad(endpoint: EndpointId, version: i32) -> Vec<u8> {
    let mut aad = Vec::with_capacity(AAD_LABEL.len() + 20);
    aad.extend_from_slice(AAD_LABEL);
    aad.extend_from_slice(&endpoint.0);
    aad.extend_from_slice(&version.to_be_bytes());
    aad
}

impl Keyring {
    /// A keyring sealing with `current`; `old` keys only open. An old key
    /// equal to the current one is ignored.
    pub fn new(current: MasterKey, old: Vec<MasterKey>) -> Self {
        let mut kept: Vec<MasterKey> = Vec::new();
        for k in old {
            if k.id != current.id && !kept.iter().any(|o| o.id == k.id) {
                kept.push(k);
            }
        }
        Keyring { current, old: kept }
    }

    /// A keyring with a fresh random key that lives as long as the process:
    /// for the demo and benchmarks, whose databases are thrown away with it.
    pub fn ephemeral() -> Self {
        Self::new(MasterKey::generate(), Vec::new())
    }

    /// The id of the key that seals.
    pub fn current_id(&self) -> &str {
        &self.current.id
    }

    /// Every key id this keyring opens.
    pub fn key_ids(&self) -> Vec<&str> {
        std::iter::once(self.current.id.as_str())
            .chain(self.old.iter().map(|k| k.id.as_str()))
            .collect()
    }

    /// Seals `secret` for version `version` of `endpoint`'s secrets.
    pub fn seal(&self, endpoint: EndpointId, version: i32, secret: &SigningSecret) -> Sealed {
        let nonce: [u8; NONCE_BYTES] = rand::random();
        let aad = aad(endpoint, version);
        let ciphertext = self
            .current
            .cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: secret.expose_bytes(),
                    aad: &aad,
                },
            )
            // AES-GCM fails only on inputs near 64 GiB; secrets are 32 bytes.
            .expect("AES-GCM seals a 32-byte secret");
        let mut bytes = Vec::with_capacity(1 + NONCE_BYTES + ciphertext.len());
        bytes.push(FORMAT_V1);
        bytes.extend_from_slice(&nonce);
        bytes.extend_from_slice(&ciphertext);
        Sealed {
            key_id: self.current.id.clone(),
            bytes,
        }
    }

    /// Opens the secret stored for version `version` of `endpoint` under
    /// `key_id`. A plaintext row (`key_id = 'plain'`) is refused.
    pub fn open(
        &self,
        endpoint: EndpointId,
        version: i32,
        key_id: &str,
        bytes: &[u8],
    ) -> Result<SigningSecret, SecretsError> {
        if key_id == PLAIN_KEY_ID {
            return Err(SecretsError::Plaintext { endpoint, version });
        }
        let key = std::iter::once(&self.current)
            .chain(&self.old)
            .find(|k| k.id == key_id)
            .ok_or_else(|| SecretsError::UnknownKey {
                endpoint,
                version,
                key_id: key_id.to_owned(),
            })?;
        let corrupt = || SecretsError::Corrupt {
            endpoint,
            version,
            key_id: key_id.to_owned(),
        };
        if bytes.len() < 1 + NONCE_BYTES + TAG_BYTES || bytes[0] != FORMAT_V1 {
            return Err(corrupt());
        }
        let (nonce, ciphertext) = bytes[1..].split_at(NONCE_BYTES);
        let aad = aad(endpoint, version);
        let plain = key
            .cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| corrupt())?;
        Ok(SigningSecret::from_bytes(plain))
    }
}

/// What a master key rotation did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resealed {
    /// Rows re-sealed under the current key, by the key id they had.
    pub by_key: std::collections::BTreeMap<String, u64>,
}

impl Resealed {
    /// Rows re-sealed in all.
    pub fn rows(&self) -> u64 {
        self.by_key.values().sum()
    }
}

impl crate::Platform {
    /// How many secret rows each master key id seals (`plain`: none).
    pub async fn secret_key_counts(&self) -> Result<Vec<(String, i64)>, crate::StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT key_id, count(*) FROM walhook.endpoint_secrets GROUP BY key_id ORDER BY key_id",
                &[],
            )
            .await
            .map_err(crate::StoreError::query("count secrets by master key"))?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Re-seals every secret that is not under the keyring's current key,
    /// `batch` rows per transaction. Running processes keep delivering:
    /// each batch bumps the config epoch, and a directory that cannot open
    /// a row keeps its previous snapshot (so give every process the new key
    /// before rotating; see docs/security.md). Idempotent: a second run
    /// finds nothing to do.
    pub async fn reseal_secrets(&self, batch: i64) -> Result<Resealed, crate::StoreError> {
        use crate::StoreError;
        let keyring = self.keyring()?;
        let current = keyring.current_id().to_owned();
        let mut done = Resealed::default();
        let mut client = self.client().await?;
        loop {
            let tx = client
                .transaction()
                .await
                .map_err(StoreError::query("begin"))?;
            let rows = tx
                .query(
                    "SELECT endpoint_id, version, key_id, secret FROM walhook.endpoint_secrets \
                     WHERE key_id <> $1 ORDER BY endpoint_id, version LIMIT $2 FOR UPDATE",
                    &[&current, &batch.max(1)],
                )
                .await
                .map_err(StoreError::query("read secrets to re-seal"))?;
            if rows.is_empty() {
                crate::commit!(tx, client).map_err(StoreError::query("end a secret re-seal"))?;
                return Ok(done);
            }
            let mut ids = Vec::with_capacity(rows.len());
            let mut versions = Vec::with_capacity(rows.len());
            let mut sealed = Vec::with_capacity(rows.len());
            for r in &rows {
                let uid: uuid::Uuid = r.get(0);
                let version: i32 = r.get(1);
                let key_id: String = r.get(2);
                let bytes: Vec<u8> = r.get(3);
                let endpoint = EndpointId(*uid.as_bytes());
                // The one reader of plaintext rows: it seals them.
                let secret = if key_id == PLAIN_KEY_ID {
                    SigningSecret::from_bytes(bytes)
                } else {
                    keyring.open(endpoint, version, &key_id, &bytes)?
                };
                sealed.push(keyring.seal(endpoint, version, &secret).bytes);
                ids.push(uid);
                versions.push(version);
                *done.by_key.entry(key_id).or_default() += 1;
            }
            tx.execute(
                "UPDATE walhook.endpoint_secrets s SET secret = n.secret, key_id = $4 \
                 FROM unnest($1::uuid[], $2::int4[], $3::bytea[]) AS n(endpoint_id, version, secret) \
                 WHERE s.endpoint_id = n.endpoint_id AND s.version = n.version",
                &[&ids, &versions, &sealed, &current],
            )
            .await
            .map_err(StoreError::query("store re-sealed secrets"))?;
            crate::commit!(tx, client).map_err(StoreError::query("commit re-sealed secrets"))?;
            tracing::info!(rows = rows.len(), key_id = %current, "re-sealed endpoint secrets");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(n: u8) -> EndpointId {
        EndpointId([n; 16])
    }

    #[test]
    fn seal_and_open_round_trip_and_bind_the_row() {
        let ring = Keyring::ephemeral();
        let secret = SigningSecret::generate();
        let sealed = ring.seal(ep(1), 3, &secret);
        assert_eq!(sealed.key_id, ring.current_id());
        assert!(
            !sealed
                .bytes
                .windows(secret.expose_bytes().len())
                .any(|w| w == secret.expose_bytes()),
            "the plaintext is in the ciphertext"
        );
        assert_eq!(sealed.bytes.len(), 1 + 12 + 32 + 16);
        assert_eq!(
            ring.open(ep(1), 3, &sealed.key_id, &sealed.bytes).unwrap(),
            secret
        );
        // Another row, another version, a flipped bit: no.
        assert!(matches!(
            ring.open(ep(2), 3, &sealed.key_id, &sealed.bytes),
            Err(SecretsError::Corrupt { .. })
        ));
        assert!(ring.open(ep(1), 4, &sealed.key_id, &sealed.bytes).is_err());
        let mut flipped = sealed.bytes.clone();
        flipped[20] ^= 1;
        assert!(ring.open(ep(1), 3, &sealed.key_id, &flipped).is_err());
        assert!(ring.open(ep(1), 3, &sealed.key_id, &[1, 2, 3]).is_err());
        // Two seals of one secret differ (fresh nonces).
        assert_ne!(ring.seal(ep(1), 3, &secret).bytes, sealed.bytes);
    }

    #[test]
    fn old_keys_open_and_only_the_current_seals() {
        let old = MasterKey::generate();
        let new = MasterKey::generate();
        let before = Keyring::new(old.clone(), vec![]);
        let secret = SigningSecret::generate();
        let sealed = before.seal(ep(1), 1, &secret);
        let during = Keyring::new(new.clone(), vec![old.clone(), new.clone()]);
        assert_eq!(during.key_ids(), vec![new.id(), old.id()]);
        assert_eq!(
            during
                .open(ep(1), 1, &sealed.key_id, &sealed.bytes)
                .unwrap(),
            secret
        );
        assert_eq!(during.seal(ep(1), 1, &secret).key_id, new.id());
        let after = Keyring::new(new, vec![]);
        let err = after
            .open(ep(1), 1, &sealed.key_id, &sealed.bytes)
            .unwrap_err();
        assert!(matches!(err, SecretsError::UnknownKey { .. }));
        assert!(err.to_string().contains(old.id()), "{err}");
        // Legacy plaintext rows are refused, naming the fix.
        let err = after.open(ep(1), 1, PLAIN_KEY_ID, b"raw").unwrap_err();
        assert!(matches!(err, SecretsError::Plaintext { .. }));
        assert!(
            err.to_string().contains("walhook secrets rotate") && !err.to_string().contains("raw"),
            "{err}"
        );
    }

    #[test]
    fn keys_parse_from_base64_and_never_print() {
        let text = MasterKey::generate_text();
        let a = MasterKey::parse(&format!("  {text}\n"), "test").unwrap();
        let b = MasterKey::parse(&text, "test").unwrap();
        assert_eq!(a.id(), b.id());
        assert!(a.id().starts_with("mk_") && a.id().len() == 19);
        let shown = format!("{a:?} {:?}", Keyring::new(a.clone(), vec![]));
        assert!(!shown.contains(&text), "{shown}");
        for bad in ["", "abc", &STANDARD.encode([0u8; 31]), "!!!!"] {
            let err = MasterKey::parse(bad, "WALHOOK_MASTER_KEY").unwrap_err();
            assert!(err.to_string().contains("WALHOOK_MASTER_KEY"), "{err}");
        }
    }
}
