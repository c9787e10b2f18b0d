//! TLS to the Fluvio cluster, and client certificates, on rustls.
//!
//! ```text
//!  [log.tls] ──FluvioTls──▶ connector() ──rustls ClientConfig──▶ TlsDomainConnector(domain)
//!                                                                  │ SC:  SNI = domain
//!                                                                  │ SPU: SNI = <spu id>.<domain>
//!  a failed connect ──explain()──▶ the setting to change (typed: rustls's error in the chain)
//! ```
//!
//! Fluvio's client reaches each SPU under the name `<spu id>.<domain>`
//! (SNI, and the name its certificate is checked against), so under
//! `verify-full` the SPUs' certificates must cover that name (for example
//! a wildcard `*.<domain>`) and `domain` must be a DNS name.
//! `verify-ca` checks the chain only, for certificates that do not.
//!
//! The files are read each time a connection is made, so certificates
//! renewed on disk are used from the next reconnection on.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fluvio_future::net::{DefaultDomainConnector, DomainConnector};
use fluvio_future::rust_tls::{TlsConnector, TlsDomainConnector};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{AlertDescription, CertificateError, ClientConfig};
use walhook_pgtls::{ConnectError, Roots, Verification};

/// How walhook's client speaks TLS to the cluster (`[log.tls]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FluvioTls {
    /// The PEM file of the CA that signed the cluster's certificates;
    /// `None` trusts the built-in Mozilla roots (a public CA).
    pub ca_file: Option<PathBuf>,
    /// walhook's certificate and key, for a cluster that demands client
    /// certificates (`fluvio-run … --enable-client-cert`).
    pub client: Option<ClientIdentity>,
    /// The name the cluster's certificates are checked against (the SC's;
    /// each SPU's is `<spu id>.<domain>`).
    pub domain: String,
    /// How much of the cluster's certificates is checked.
    pub verify: TlsVerify,
}

/// A client certificate and its private key, PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The certificate (chain), leaf first.
    pub cert_file: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

/// How much of the cluster's certificates is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVerify {
    /// The chain up to the CA, and the name (`verify-full`, the default).
    Full,
    /// The chain only (`verify-ca`).
    Ca,
}

impl TlsVerify {
    /// The setting's value, as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsVerify::Full => "verify-full",
            TlsVerify::Ca => "verify-ca",
        }
    }
}

impl FluvioTls {
    /// Reads the files and makes the TLS client once, so that a setting
    /// that cannot work is refused at start, naming the field and file.
    pub fn check(&self) -> anyhow::Result<()> {
        connector(Some(self)).map(drop)
    }
}

/// Why a TLS client could not be made from the settings.
fn setting(field: &str, path: &Path, what: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!(
        "[log.tls].{field} = {:?}: {what}",
        path.display().to_string()
    )
}

/// The connector for `tls`: plain TCP without it.
pub(super) fn connector(tls: Option<&FluvioTls>) -> anyhow::Result<DomainConnector> {
    let Some(tls) = tls else {
        return Ok(Box::new(DefaultDomainConnector::new()));
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = tls
        .ca_file
        .as_ref()
        .map_or(Roots::BuiltIn, |p| Roots::File(p.clone()));
    let verification = match tls.verify {
        TlsVerify::Full => Verification::Full,
        TlsVerify::Ca => Verification::Chain,
    };
    let verifier = walhook_pgtls::server_verifier(verification, &roots, provider.clone())
        .map_err(|e| match e {
            ConnectError::RootCertUnreadable { path, source } => {
                setting("ca_file", &path, format!("cannot be read ({source})"))
            }
            ConnectError::RootCertEmpty { path } => setting(
                "ca_file",
                &path,
                "holds no usable CA certificate; give the PEM file of the CA that signed the cluster's certificates",
            ),
            other => anyhow::Error::new(other),
        })?;
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match &tls.client {
        None => builder.with_no_client_auth(),
        Some(id) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&id.cert_file)
                .map_err(|e| setting("cert_file", &id.cert_file, format!("cannot be read ({e})")))?
                .collect::<Result<_, _>>()
                .map_err(|e| setting("cert_file", &id.cert_file, format!("is not PEM ({e})")))?;
            if certs.is_empty() {
                return Err(setting(
                    "cert_file",
                    &id.cert_file,
                    "holds no certificate; give the PEM file of walhook's client certificate",
                ));
            }
            let key = PrivateKeyDer::from_pem_file(&id.key_file).map_err(|e| {
                setting(
                    "key_file",
                    &id.key_file,
                    format!("holds no private key walhook can read ({e})"),
                )
            })?;
            builder.with_client_auth_cert(certs, key).map_err(|e| {
                anyhow::anyhow!(
                    "[log.tls].key_file {:?} does not belong to the certificate in cert_file {:?}: {e}",
                    id.key_file.display().to_string(),
                    id.cert_file.display().to_string()
                )
            })?
        }
    };
    Ok(Box::new(TlsDomainConnector::new(
        TlsConnector::from(Arc::new(config)),
        tls.domain.clone(),
    )))
}

/// Whether `domain` may name the cluster under `verify-full`: a DNS name
/// (Fluvio prefixes it with each SPU's id, which an IP address cannot
/// take).
pub fn check_domain(domain: &str, verify: TlsVerify) -> Result<(), String> {
    match ServerName::try_from(domain) {
        Err(_) => Err(format!(
            "[log.tls].domain = {domain:?} is not a name a certificate can be checked against; \
             give the DNS name in the cluster's certificates"
        )),
        Ok(ServerName::IpAddress(_)) if verify == TlsVerify::Full => Err(format!(
            "[log.tls].domain = {domain:?} is an IP address, but Fluvio checks each SPU's certificate \
             against the name <spu id>.<domain>; give the DNS name the cluster's certificates are issued \
             for (the SPUs' covering *.<domain>), or mode = \"verify-ca\" to check the chain only"
        )),
        Ok(_) => Ok(()),
    }
}

/// What a failed connection says about the TLS settings, when rustls's
/// error is in its chain: which setting to look at. `None` otherwise.
pub(super) fn explain(error: &anyhow::Error, tls: &FluvioTls) -> Option<String> {
    let found = error.chain().find_map(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .or_else(|| cause.downcast_ref::<rustls::Error>())
    })?;
    let ca = tls.ca_file.as_ref().map_or_else(
        || "the built-in Mozilla roots (no [log.tls].ca_file)".to_owned(),
        |p| format!("[log.tls].ca_file {:?}", p.display().to_string()),
    );
    Some(match found {
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "the cluster's certificate is not valid for {:?} ({found}): set [log.tls].domain to a name the \
             certificates list (each SPU's must cover <spu id>.<domain>), or mode = \"verify-ca\"",
            tls.domain
        ),
        rustls::Error::InvalidCertificate(_) => format!(
            "the cluster's certificate did not verify against {ca} ({found}): give the CA that signed the \
             cluster's certificates, and check that they have not expired"
        ),
        rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::HandshakeFailure,
        ) => match &tls.client {
            None => format!(
                "the cluster refused the TLS session ({found}): it demands a client certificate; set \
                 [log.tls].cert_file and key_file to walhook's certificate, signed by a CA the cluster trusts"
            ),
            Some(id) => format!(
                "the cluster refused walhook's client certificate {:?} ({found}): it must be signed by the CA \
                 the cluster trusts (fluvio-run --ca-cert) and not have expired",
                id.cert_file.display().to_string()
            ),
        },
        other => format!("the TLS session with the cluster failed: {other}"),
    })
}
