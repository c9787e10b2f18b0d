//! SCRAM channel binding (`tls-server-end-point`, RFC 5929 §4): the hash of
//! the server's certificate that ties a SCRAM-SHA-256-PLUS login to this
//! TLS session, so that a man in the middle who terminates TLS cannot pass
//! the login on to the real server.
//!
//! ```text
//!  server certificate (DER) ──signatureAlgorithm OID──▶ hash (MD5/SHA-1 → SHA-256)
//!        └────────────────────────── hash(certificate) ──▶ ChannelBinding::tls_server_end_point
//! ```
//!
//! Postgres computes the same hash with OpenSSL (`be_tls_get_certificate_hash`):
//! the certificate's signature digest, SHA-256 for MD5 and SHA-1. A
//! signature without a digest of its own (Ed25519, RSASSA-PSS) has no
//! end-point hash there either, so none is offered here: tokio-postgres then
//! logs in without binding, which `channel_binding=require` refuses.
//!
//! The certificate is the server's (anyone's, under `sslmode=prefer`), so
//! the few DER headers read here are bounds-checked and never panic.

use sha2::{Digest, Sha224, Sha256, Sha384, Sha512};

/// The hash a certificate's end point is bound with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndPointHash {
    /// SHA-224.
    Sha224,
    /// SHA-256 (also for MD5 and SHA-1 signatures, as RFC 5929 says).
    Sha256,
    /// SHA-384.
    Sha384,
    /// SHA-512.
    Sha512,
}

/// `signatureAlgorithm` OIDs (DER contents) and the hash each binds with.
const ALGORITHMS: &[(&[u8], EndPointHash)] = &[
    // md5WithRSAEncryption, sha1WithRSAEncryption: 1.2.840.113549.1.1.{4,5}.
    (
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x04],
        EndPointHash::Sha256,
    ),
    (
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x05],
        EndPointHash::Sha256,
    ),
    // sha{256,384,512,224}WithRSAEncryption: 1.2.840.113549.1.1.{11..14}.
    (
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b],
        EndPointHash::Sha256,
    ),
    (
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c],
        EndPointHash::Sha384,
    ),
    (
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d],
        EndPointHash::Sha512,
    ),
    (
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0e],
        EndPointHash::Sha224,
    ),
    // ecdsa-with-SHA1: 1.2.840.10045.4.1.
    (
        &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01],
        EndPointHash::Sha256,
    ),
    // ecdsa-with-SHA{224,256,384,512}: 1.2.840.10045.4.3.{1..4}.
    (
        &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x01],
        EndPointHash::Sha224,
    ),
    (
        &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02],
        EndPointHash::Sha256,
    ),
    (
        &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03],
        EndPointHash::Sha384,
    ),
    (
        &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04],
        EndPointHash::Sha512,
    ),
];

/// The `tls-server-end-point` binding data of a DER certificate: its hash
/// under the digest of its signature algorithm; `None` when the algorithm
/// has no digest of its own or the bytes are not a certificate.
pub fn server_end_point(certificate: &[u8]) -> Option<Vec<u8>> {
    Some(match end_point_hash(certificate)? {
        EndPointHash::Sha224 => Sha224::digest(certificate).to_vec(),
        EndPointHash::Sha256 => Sha256::digest(certificate).to_vec(),
        EndPointHash::Sha384 => Sha384::digest(certificate).to_vec(),
        EndPointHash::Sha512 => Sha512::digest(certificate).to_vec(),
    })
}

/// The hash a DER certificate's end point is bound with.
pub fn end_point_hash(certificate: &[u8]) -> Option<EndPointHash> {
    // Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm
    // AlgorithmIdentifier, signatureValue }; AlgorithmIdentifier ::=
    // SEQUENCE { algorithm OBJECT IDENTIFIER, parameters ANY OPTIONAL }.
    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;
    let (SEQUENCE, certificate, _) = tlv(certificate)? else {
        return None;
    };
    let (SEQUENCE, _, rest) = tlv(certificate)? else {
        return None;
    };
    let (SEQUENCE, algorithm, _) = tlv(rest)? else {
        return None;
    };
    let (OID, oid, _) = tlv(algorithm)? else {
        return None;
    };
    ALGORITHMS
        .iter()
        .find(|(known, _)| *known == oid)
        .map(|(_, hash)| *hash)
}

/// One DER element at the start of `input`: its tag, its contents and what
/// follows it. Definite lengths of at most four bytes only (a certificate
/// is far smaller); anything else, or a length past the input, is `None`.
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, after) = rest.split_at(n);
        rest = after;
        bytes
            .iter()
            .fold(0u64, |len, b| (len << 8) | u64::from(*b))
            .try_into()
            .ok()?
    };
    if rest.len() < len {
        return None;
    }
    let (contents, after) = rest.split_at(len);
    Some((tag, contents, after))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A DER element with `tag` and `contents` (lengths up to 64 KiB).
    fn der(tag: u8, contents: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match contents.len() {
            n if n < 0x80 => out.push(n as u8),
            n if n < 0x100 => out.extend_from_slice(&[0x81, n as u8]),
            n => out.extend_from_slice(&[0x82, (n >> 8) as u8, n as u8]),
        }
        out.extend_from_slice(contents);
        out
    }

    /// A certificate-shaped structure signed with `oid` (its tbs and
    /// signature are filler: only the shape matters here).
    fn shaped(oid: &[u8]) -> Vec<u8> {
        let tbs = der(0x30, &[0xa0; 300]);
        let alg = der(0x30, &[der(0x06, oid), vec![0x05, 0x00]].concat());
        let sig = der(0x03, &[0u8; 64]);
        der(0x30, &[tbs, alg, sig].concat())
    }

    #[test]
    fn each_signature_algorithm_binds_with_its_digest() {
        for (oid, hash) in ALGORITHMS {
            let cert = shaped(oid);
            assert_eq!(end_point_hash(&cert), Some(*hash));
            let len = match hash {
                EndPointHash::Sha224 => 28,
                EndPointHash::Sha256 => 32,
                EndPointHash::Sha384 => 48,
                EndPointHash::Sha512 => 64,
            };
            assert_eq!(server_end_point(&cert).unwrap().len(), len);
        }
        // Ed25519 (1.3.101.112) and RSASSA-PSS have no digest of their own.
        assert_eq!(end_point_hash(&shaped(&[0x2b, 0x65, 0x70])), None);
        assert_eq!(
            end_point_hash(&shaped(&[
                0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a
            ])),
            None
        );
    }

    #[test]
    fn a_certificate_made_by_rcgen_binds_with_sha256() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = cert.der();
        assert_eq!(end_point_hash(der), Some(EndPointHash::Sha256));
        assert_eq!(
            server_end_point(der).unwrap(),
            Sha256::digest(der.as_ref()).to_vec()
        );
    }

    #[test]
    fn truncated_and_malformed_certificates_are_none() {
        let cert = shaped(ALGORITHMS[2].0);
        for cut in 0..cert.len() {
            assert_eq!(end_point_hash(&cert[..cut]), None, "cut at {cut}");
        }
        // An indefinite length, a five-byte length, a length past the end.
        assert_eq!(end_point_hash(&[0x30, 0x80, 0, 0]), None);
        assert_eq!(end_point_hash(&[0x30, 0x85, 1, 0, 0, 0, 0]), None);
        assert_eq!(end_point_hash(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
    }

    proptest! {
        /// Whatever bytes a server presents, reading them returns.
        #[test]
        fn any_bytes_are_read_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = server_end_point(&bytes);
        }

        /// A valid shape with any OID bytes is read; only known OIDs bind.
        #[test]
        fn any_oid_in_a_valid_shape_is_read(oid in proptest::collection::vec(any::<u8>(), 0..40)) {
            let known = ALGORITHMS.iter().any(|(k, _)| *k == oid.as_slice());
            prop_assert_eq!(end_point_hash(&shaped(&oid)).is_some(), known);
        }
    }
}
