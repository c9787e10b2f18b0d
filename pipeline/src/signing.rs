//! Standard Webhooks signatures.
//!
//! The signed content is `{webhook-id}.{webhook-timestamp}.{body}`; the key is
//! the bytes behind a `whsec_` secret; the header carries one `v1,<base64>`
//! per active secret, space-separated, so that receivers holding either the
//! old or the new secret verify during a rotation overlap.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The prefix of a secret's text form.
pub const SECRET_PREFIX: &str = "whsec_";

/// An endpoint's signing key. `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret(Vec<u8>);

impl SigningSecret {
    /// A fresh secret of 32 random bytes.
    pub fn generate() -> Self {
        SigningSecret(rand::random::<[u8; 32]>().to_vec())
    }

    /// From raw key bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        SigningSecret(bytes)
    }

    /// Parses `whsec_<base64>`.
    pub fn parse(text: &str) -> Option<Self> {
        let b64 = text.strip_prefix(SECRET_PREFIX)?;
        let bytes = STANDARD.decode(b64).ok()?;
        (!bytes.is_empty()).then_some(SigningSecret(bytes))
    }

    /// The key bytes (to store or sign with).
    pub fn expose_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The `whsec_…` text, to show the customer once.
    pub fn expose_text(&self) -> String {
        format!("{SECRET_PREFIX}{}", STANDARD.encode(&self.0))
    }
}

/// A secret and the version it is stored under: attempts record which
/// versions signed them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionedSecret {
    /// The endpoint's secret version (1 for the first, +1 per rotation).
    pub version: i32,
    /// The key.
    pub secret: SigningSecret,
}

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningSecret(***)")
    }
}

impl fmt::Display for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("whsec_***")
    }
}

/// One `v1,<base64>` signature of `body` under `secret`.
pub fn sign_one(secret: &SigningSecret, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&secret.0)
        .expect("HMAC takes keys of any length");
    mac.update(msg_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// The `webhook-signature` header: one signature per secret.
pub fn signature_header(
    secrets: &[VersionedSecret],
    msg_id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    let mut out = String::with_capacity(secrets.len() * 48);
    for (i, s) in secrets.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&sign_one(&s.secret, msg_id, timestamp, body));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_webhooks_known_answer() {
        let secret = SigningSecret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        let body = br#"{"email":"test@example.com","username":"test_user"}"#;
        assert_eq!(
            sign_one(
                &secret,
                "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
                1_649_367_553,
                body
            ),
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
        );
    }

    #[test]
    fn secrets_never_print() {
        let s = SigningSecret::generate();
        assert_eq!(format!("{s:?} {s}"), "SigningSecret(***) whsec_***");
        assert_eq!(SigningSecret::parse(&s.expose_text()).unwrap(), s);
        assert!(SigningSecret::parse("whsec_").is_none());
        assert!(SigningSecret::parse("sk_abc").is_none());
    }

    #[test]
    fn one_signature_per_secret() {
        let a = SigningSecret::generate();
        let b = SigningSecret::generate();
        let versioned = |version, secret: &SigningSecret| VersionedSecret {
            version,
            secret: secret.clone(),
        };
        let header = signature_header(&[versioned(2, &a), versioned(1, &b)], "id", 1, b"{}");
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(
            parts,
            vec![sign_one(&a, "id", 1, b"{}"), sign_one(&b, "id", 1, b"{}")]
        );
    }
}
