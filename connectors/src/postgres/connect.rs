//! Connections to the captured database: the SQL session and the
//! replication stream, both under the `[source]` TLS policy.
//!
//! ```text
//!  [source] url (?sslmode=…&sslrootcert=…), sslmode, sslrootcert
//!        │ SourceConfig::connect_options
//!        ▼
//!  ConnectOptions ──connect_sql──▶ tokio-postgres + walhook_pgtls::RustlsConnector
//!        └──────replication_config──▶ pgwire-replication (its own rustls, same mode and roots)
//! ```
//!
//! Capture opens the SQL session first, so a certificate that does not
//! verify is reported by walhook's connector, whose errors name the check
//! that failed, before the stream tries.
//!
//! Channel binding: the SQL session binds its SCRAM login to the TLS
//! session (SCRAM-SHA-256-PLUS, `tls-server-end-point`) whenever the server
//! offers it. pgwire-replication 0.5, the stream's client, implements
//! SCRAM-SHA-256 only (its client-first message says `n,,`: no binding),
//! so the stream's login is never bound; with `channel_binding=require`
//! the source must therefore use `sslmode=verify-full`, which authenticates
//! the server on the stream as well ([`STREAM_CLIENT`] names it in the
//! refusal).

use pgwire_replication::{ReplicationConfig, SslMode as WireMode, TlsConfig};
use tokio_postgres::config::Host;
use walhook_pgtls::{ConnectOptions, Roots, SslMode, Verification};

use super::error::CaptureError;

/// The replication stream's client, as refusals name it.
pub const STREAM_CLIENT: &str =
    "capture's replication stream (pgwire-replication 0.5 logs in with SCRAM-SHA-256 only)";

/// Connects a plain SQL session to the captured database.
#[allow(clippy::disallowed_methods)] // bare spawn: a connection's driver
pub async fn connect_sql(options: &ConnectOptions) -> Result<tokio_postgres::Client, CaptureError> {
    let connector = options.connector()?;
    let (client, conn) = options
        .config()
        .connect(connector)
        .await
        .map_err(CaptureError::query("connect to the captured database"))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "capture SQL connection ended");
        }
    });
    Ok(client)
}

/// The replication connection's settings (its slot and publication added
/// by the caller): the first host of the URL, its credentials and the TLS
/// policy.
pub fn replication_config(
    options: &ConnectOptions,
    slot: &str,
    publication: &str,
) -> ReplicationConfig {
    let cfg = options.config();
    let name = match cfg.get_hosts().first() {
        Some(Host::Tcp(h)) => Some(h.clone()),
        Some(Host::Unix(p)) => Some(p.display().to_string()),
        None => None,
    };
    // `hostaddr` is where to connect; `host` stays the name the
    // certificate must carry (as in libpq and tokio-postgres).
    let (target, tls_name) = match (cfg.get_hostaddrs().first(), name) {
        (Some(addr), name) => (addr.to_string(), name),
        (None, Some(name)) => (name, None),
        (None, None) => ("127.0.0.1".to_owned(), None),
    };
    let mut tls = wire_tls(
        options.tls().mode,
        options.tls().verification(),
        &options.tls().roots,
    );
    if let Some(name) = tls_name {
        tls = tls.with_sni_hostname(name);
    } else if target.parse::<std::net::IpAddr>().is_ok() && tls.mode == WireMode::VerifyFull {
        // pgwire-replication refuses verify-full to an address literal
        // unless a server name is given; rustls then checks the
        // certificate's IP address entries, as libpq does.
        tls = tls.with_sni_hostname(target.clone());
    }
    ReplicationConfig::new(
        target,
        cfg.get_user().unwrap_or("postgres"),
        cfg.get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default(),
        cfg.get_dbname().unwrap_or("postgres"),
        slot,
        publication,
    )
    .with_port(cfg.get_ports().first().copied().unwrap_or(5432))
    .with_tls(tls)
}

/// walhook's policy in pgwire-replication's terms; its modes are libpq's.
fn wire_tls(mode: SslMode, verification: Verification, roots: &Roots) -> TlsConfig {
    let ca = match roots {
        Roots::File(path) => Some(path.clone()),
        // pgwire-replication's default roots are the same Mozilla set.
        Roots::BuiltIn => None,
    };
    let wire_mode = match (mode, verification) {
        (SslMode::Disable, _) => WireMode::Disable,
        (_, Verification::Full) => WireMode::VerifyFull,
        // `require` (or `prefer`) with an sslrootcert checks the chain, as
        // libpq does; pgwire-replication then insists on TLS, which the SQL
        // session already found the server to offer.
        (_, Verification::Chain) => WireMode::VerifyCa,
        (SslMode::Prefer, Verification::None) => WireMode::Prefer,
        (_, Verification::None) => WireMode::Require,
    };
    TlsConfig {
        mode: wire_mode,
        ca_pem_path: ca.filter(|_| verification != Verification::None),
        ..TlsConfig::default()
    }
}

/// The capture error for a failure of the stream; a TLS failure says which
/// mode and roots were in force and what to check.
pub(crate) fn stream_tls_error(
    e: pgwire_replication::PgWireError,
    options: &ConnectOptions,
) -> CaptureError {
    if e.is_tls() {
        CaptureError::ReplicationTls {
            mode: options.tls().mode,
            roots: options.tls().roots.describe(),
            source: e,
        }
    } else {
        CaptureError::Stream(e)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use walhook_pgtls::DatabaseUrl;
    use walhook_pgtls::TlsFields;

    use super::*;

    fn options(url: &str) -> ConnectOptions {
        ConnectOptions::parse(&DatabaseUrl::new(url), "[source]", &TlsFields::default()).unwrap()
    }

    #[test]
    fn the_stream_gets_the_same_policy() {
        let r = replication_config(
            &options(
                "postgres://cap:pw@localhost:6543/shop?sslmode=verify-full&sslrootcert=/ca.pem",
            ),
            "walhook",
            "walhook",
        );
        assert_eq!(r.host, "localhost");
        assert_eq!(r.port, 6543);
        assert_eq!(r.user, "cap");
        assert_eq!(r.password, "pw");
        assert_eq!(r.database, "shop");
        assert_eq!(r.tls.mode, WireMode::VerifyFull);
        assert_eq!(r.tls.ca_pem_path.as_deref(), Some(Path::new("/ca.pem")));

        let r = replication_config(&options("postgres://h/d?sslmode=require"), "s", "p");
        assert_eq!(r.tls.mode, WireMode::Require);
        assert_eq!(r.tls.ca_pem_path, None);
        let r = replication_config(
            &options("postgres://h/d?sslmode=require&sslrootcert=/ca.pem"),
            "s",
            "p",
        );
        assert_eq!(r.tls.mode, WireMode::VerifyCa);
        let r = replication_config(&options("postgres://h/d"), "s", "p");
        assert_eq!(r.tls.mode, WireMode::Prefer);
        let r = replication_config(&options("postgres://h/d?sslmode=disable"), "s", "p");
        assert_eq!(r.tls.mode, WireMode::Disable);

        // An address literal is checked against the certificate's IP
        // entries; `hostaddr` connects there while the name is checked.
        let r = replication_config(
            &options("postgres://127.0.0.1/d?sslmode=verify-full"),
            "s",
            "p",
        );
        assert_eq!(r.host, "127.0.0.1");
        assert_eq!(r.tls.sni_hostname.as_deref(), Some("127.0.0.1"));
        let r = replication_config(
            &options("host=db.example.com hostaddr=127.0.0.1 sslmode=verify-full"),
            "s",
            "p",
        );
        assert_eq!(r.host, "127.0.0.1");
        assert_eq!(r.tls.sni_hostname.as_deref(), Some("db.example.com"));
    }
}
