//! What can go wrong setting up or carrying out TLS to Postgres.
//!
//! Every message names the parameter, the file or the host at fault and
//! what to check. None of them quotes the connection string: it may hold a
//! password.

use std::path::PathBuf;

/// A connection setting that cannot be used, or a TLS handshake that
/// failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The connection string does not parse.
    #[error(
        "{section}.url is not a valid Postgres connection string; write postgres://user:password@host:port/database"
    )]
    InvalidUrl {
        /// The config section (`[platform]`, `[source]`).
        section: String,
        /// tokio-postgres's finding (it names the option, never the value).
        #[source]
        source: tokio_postgres::Error,
    },
    /// `sslmode` has a value walhook does not know.
    #[error("sslmode={0:?} is not supported; use {accepted}", accepted = crate::mode::ACCEPTED_MODES)]
    UnknownMode(String),
    /// A libpq TLS parameter that walhook does not carry out.
    #[error(
        "the connection parameter `{0}` is not supported; walhook understands sslmode, sslrootcert and sslnegotiation (client certificates and CRLs are not supported)"
    )]
    UnsupportedParameter(String),
    /// The URL and the config section both set a parameter, differently.
    #[error(
        "{section}.{key} = {config:?} but the connection URL says {key}={url:?}; set it in one place"
    )]
    Conflict {
        /// The config section (`[platform]`, `[source]`).
        section: String,
        /// The parameter.
        key: &'static str,
        /// The value in the section.
        config: String,
        /// The value in the URL.
        url: String,
    },
    /// `channel_binding=require` on a URL that a client which cannot bind
    /// also connects with, and no `verify-full` to stand in for it.
    #[error(
        "{section}.url sets channel_binding=require, but {client} cannot bind its login to TLS; set sslmode=verify-full in {section}.url as well (it authenticates the server on every connection), or use channel_binding=prefer"
    )]
    BindingUnavailable {
        /// The config section (`[source]`).
        section: String,
        /// The client that cannot bind.
        client: &'static str,
    },
    /// `sslrootcert` names a file that cannot be read.
    #[error("sslrootcert {} cannot be read; check the path and that walhook may read the file", path.display())]
    RootCertUnreadable {
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// `sslrootcert` holds no certificate rustls can use.
    #[error(
        "sslrootcert {} holds no usable CA certificate; give the PEM file of the CA that signed the server's certificate",
        path.display()
    )]
    RootCertEmpty {
        /// The file.
        path: PathBuf,
    },
    /// The server's certificate chain does not lead to a trusted root (or
    /// is expired, or badly signed).
    #[error(
        "the server certificate of {host} did not verify against {roots} (sslmode={mode}); check that sslrootcert holds the CA that signed the server's certificate and that it has not expired"
    )]
    Untrusted {
        /// The host name connected to.
        host: String,
        /// The roots, described (`the CA in /etc/ca.pem`).
        roots: String,
        /// The mode in force.
        mode: crate::SslMode,
        /// rustls's finding.
        #[source]
        source: rustls::Error,
    },
    /// The certificate is trusted but not issued for the host connected to.
    #[error(
        "the server certificate is not valid for the host name {host} (sslmode=verify-full); connect with a name the certificate lists in its subjectAltName, or check that {host} is the server you meant"
    )]
    WrongHost {
        /// The host name connected to.
        host: String,
        /// rustls's finding.
        #[source]
        source: rustls::Error,
    },
    /// `host` cannot be used as a TLS server name.
    #[error(
        "the host {0:?} cannot be checked against a certificate; give a DNS name or an IP address"
    )]
    BadServerName(String),
    /// rustls refused its configuration (should not happen with its own
    /// provider).
    #[error("the TLS library refused its configuration")]
    Rustls(#[source] rustls::Error),
    /// The handshake failed for another reason (network, protocol).
    #[error("the TLS handshake with {host} failed")]
    Handshake {
        /// The host name connected to.
        host: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl ConnectError {
    /// Whether retrying may help. Bad settings and certificates that do not
    /// verify stay bad until the operator acts; a handshake cut by the
    /// network may go through next time.
    pub fn is_transient(&self) -> bool {
        matches!(self, ConnectError::Handshake { .. })
    }
}

/// The [`ConnectError`] somewhere in `err`'s chain of sources, if any: how
/// callers classify a tokio-postgres or pool error that came out of the
/// connector, by type rather than by text.
pub fn find_connect_error<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a ConnectError> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(tls) = e.downcast_ref::<ConnectError>() {
            return Some(tls);
        }
        cur = e.source();
    }
    None
}
