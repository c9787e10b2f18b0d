//! Certificates made in a test, for clusters that speak TLS.
//!
//! ```text
//!  TestCa::new("walhook test CA") ──server_cert(["localhost", "127.0.0.1"])──▶ ServerCert
//!        │ write_pem → ca.pem (the client's sslrootcert)                          │
//!        ▼                                                                         ▼
//!  ConnectOptions (verify-full)  ◀────── TLS handshake ──────  LocalPostgres::builder().tls(cert)
//! ```
//!
//! Each CA is new (a fresh key pair), so a second `TestCa` is the "wrong
//! CA" of a test: it did not sign the server's certificate.

use std::io;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen refused the parameters or could not sign.
    #[error("cannot make a test certificate")]
    Rcgen(#[from] rcgen::Error),
    /// The PEM file could not be written.
    #[error("cannot write {0}")]
    Write(PathBuf, #[source] io::Error),
}

/// A certificate authority that lives for one test.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

/// A certificate (a server's, or a client's) and its private key, in PEM.
#[derive(Clone)]
pub struct ServerCert {
    /// The certificate.
    pub cert_pem: String,
    /// The private key (PKCS#8).
    pub key_pem: String,
}

impl ServerCert {
    /// Writes the certificate to `dir/<stem>.pem` and the key to
    /// `dir/<stem>.key`.
    pub fn write(&self, dir: &Path, stem: &str) -> Result<(), CertError> {
        for (path, text) in [
            (dir.join(format!("{stem}.pem")), &self.cert_pem),
            (dir.join(format!("{stem}.key")), &self.key_pem),
        ] {
            std::fs::write(&path, text).map_err(|e| CertError::Write(path.clone(), e))?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for ServerCert {
    // The key is a throwaway, but keys do not print, by habit.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerCert").finish_non_exhaustive()
    }
}

impl TestCa {
    /// A new CA named `name`, with a key of its own.
    pub fn new(name: &str) -> Result<Self, CertError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        Ok(TestCa { issuer })
    }

    /// The CA certificate in PEM: what a client trusts.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// Writes [`TestCa::pem`] to `dir/file` and returns the path.
    pub fn write_pem(&self, dir: &Path, file: &str) -> Result<PathBuf, CertError> {
        let path = dir.join(file);
        std::fs::write(&path, self.pem()).map_err(|e| CertError::Write(path.clone(), e))?;
        Ok(path)
    }

    /// A server certificate for `names` (DNS names or IP addresses, as
    /// subjectAltName entries), signed by this CA.
    pub fn server_cert(&self, names: &[&str]) -> Result<ServerCert, CertError> {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names.clone())?;
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(ServerCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

impl TestCa {
    /// A client certificate for `name` (its common name), signed by this
    /// CA: what a client shows a server that demands one.
    pub fn client_cert(&self, name: &str) -> Result<ServerCert, CertError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(ServerCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// How a cluster speaks TLS: its certificate, and whether it refuses TCP
/// connections without TLS.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The server's certificate and key.
    pub cert: ServerCert,
    /// `pg_hba.conf` has only `hostssl` lines for TCP: a client with
    /// `sslmode=disable` is refused, as by a server that requires TLS.
    pub only: bool,
}

/// `pg_hba.conf` of a cluster that takes TCP connections over TLS only
/// (Unix sockets stay open, for tools on the machine).
const HBA_TLS_ONLY: &str = "\
local   all          all                 trust
local   replication  all                 trust
hostssl all          all   127.0.0.1/32  trust
hostssl replication  all   127.0.0.1/32  trust
hostssl all          all   ::1/128       trust
hostssl replication  all   ::1/128       trust
";

impl ServerTls {
    /// Writes the certificate and key into the data directory (the key
    /// readable by its owner only, as Postgres demands), and `pg_hba.conf`
    /// when TLS is required; returns the settings that turn TLS on.
    pub(crate) fn install(&self, data: &Path) -> io::Result<Vec<(String, String)>> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(data.join("server.crt"), &self.cert.cert_pem)?;
        let key = data.join("server.key");
        std::fs::write(&key, &self.cert.key_pem)?;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
        if self.only {
            std::fs::write(data.join("pg_hba.conf"), HBA_TLS_ONLY)?;
        }
        Ok(vec![
            ("ssl".into(), "on".into()),
            ("ssl_cert_file".into(), "'server.crt'".into()),
            ("ssl_key_file".into(), "'server.key'".into()),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_signs_a_server_certificate() {
        let ca = TestCa::new("walhook test CA").unwrap();
        let server = ca.server_cert(&["localhost", "127.0.0.1"]).unwrap();
        assert!(ca.pem().starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(server.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(server.key_pem.contains("PRIVATE KEY"));
        assert_ne!(ca.pem(), TestCa::new("other").unwrap().pem());
        assert!(!format!("{server:?}").contains("PRIVATE"));
    }
}
