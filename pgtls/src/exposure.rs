//! Whether a database connection leaves the machine without the server
//! being authenticated, and the warning walhook logs at start when it does.
//!
//! Only `sslmode=verify-full` authenticates the server: every weaker mode
//! lets whoever sits on the network path read and change the traffic
//! (`prefer` and `disable` even let them strip TLS). On loopback or a Unix
//! socket no network path exists, so no warning is given there; anywhere
//! else walhook says which URL to change and how, once, at start.

use std::net::IpAddr;

use tokio_postgres::config::Host;

use crate::mode::SslMode;
use crate::options::ConnectOptions;

/// A connection that reaches another machine under a mode that does not
/// authenticate the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exposure {
    /// The URL's setting (`[source].url`, `[platform].url`).
    pub field: String,
    /// The first host that is not this machine.
    pub host: String,
    /// The mode in force.
    pub mode: SslMode,
}

impl Exposure {
    /// The sentence for the operator: what is exposed and what to change.
    pub fn message(&self) -> String {
        let Exposure { field, host, mode } = self;
        let strip = match mode {
            SslMode::Disable => " (with sslmode=disable nothing is encrypted at all)",
            SslMode::Prefer => " (with sslmode=prefer they can even turn TLS off)",
            _ => "",
        };
        format!(
            "{field} reaches {host} with sslmode={mode}, which does not authenticate the server: \
             anyone on the network path can read and change this connection's traffic{strip}. \
             Set sslmode=verify-full in {field} (with sslrootcert=<PEM file of the CA that signed \
             the server's certificate>, or sslrootcert=system for a public CA)"
        )
    }
}

/// Whether `host` names this machine: a loopback address (127.0.0.0/8,
/// `::1`, or either written as an IPv4-mapped address), `localhost` or a
/// name under `.localhost` (RFC 6761 reserves them for loopback).
pub fn is_local_host(host: &str) -> bool {
    let host = host.trim_end_matches('.');
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return ip.to_canonical().is_loopback();
    }
    let lower = host.to_ascii_lowercase();
    lower == "localhost" || lower.ends_with(".localhost")
}

impl ConnectOptions {
    /// The first connection target that leaves the machine, when the mode
    /// does not authenticate the server; `None` under `verify-full`, or
    /// when every target is loopback or a Unix socket. A `hostaddr` is
    /// where libpq (and tokio-postgres) connects, so it decides over the
    /// `host` beside it.
    pub fn exposure(&self) -> Option<Exposure> {
        let mode = self.tls().mode;
        if mode == SslMode::VerifyFull {
            return None;
        }
        let config = self.config();
        let (hosts, addrs) = (config.get_hosts(), config.get_hostaddrs());
        let remote = (0..hosts.len().max(addrs.len())).find_map(|i| {
            let target = match (addrs.get(i), hosts.get(i)) {
                (Some(addr), _) => addr.to_string(),
                (None, Some(Host::Tcp(name))) => name.clone(),
                (None, Some(Host::Unix(_))) | (None, None) => return None,
            };
            (!is_local_host(&target)).then_some(target)
        })?;
        Some(Exposure {
            field: format!("{}.url", self.section()),
            host: remote,
            mode,
        })
    }

    /// Logs [`ConnectOptions::exposure`] as a warning (at start), and
    /// returns it.
    pub fn warn_if_exposed(&self) -> Option<Exposure> {
        let exposure = self.exposure()?;
        tracing::warn!(
            setting = %exposure.field,
            host = %exposure.host,
            sslmode = %exposure.mode,
            "{}",
            exposure.message()
        );
        Some(exposure)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use crate::DatabaseUrl;

    use super::*;
    use crate::options::TlsFields;

    fn exposure(section: &str, url: &str) -> Option<Exposure> {
        ConnectOptions::parse(&DatabaseUrl::new(url), section, &TlsFields::default())
            .unwrap()
            .exposure()
    }

    #[test]
    fn only_remote_hosts_below_verify_full_are_exposed() {
        let remote = [
            "postgres://u:pw@db.example.com/app",
            "postgres://u:pw@db.example.com/app?sslmode=require",
            "postgres://u:pw@10.0.0.7:6432/app?sslmode=verify-ca&sslrootcert=/ca.pem",
            "postgres://u:pw@db.example.com/app?sslmode=disable",
            "host=db.internal dbname=app sslmode=prefer",
            // A hostaddr decides where the connection goes.
            "host=localhost hostaddr=192.0.2.10 dbname=app",
            // One remote host of several is enough.
            "postgres://u@localhost,db2.example.com/app",
            "postgres://u@[2001:db8::1]/app",
        ];
        for url in remote {
            assert!(exposure("[source]", url).is_some(), "{url}");
        }
        let local = [
            "postgres://u:pw@db.example.com/app?sslmode=verify-full",
            "postgres://u:pw@db.example.com/app?sslrootcert=system",
            "postgres://u:pw@localhost/app",
            "postgres://u:pw@LOCALHOST./app?sslmode=disable",
            "postgres://u:pw@db.localhost/app",
            "postgres://u:pw@127.0.0.1:5432/app",
            "postgres://u:pw@127.45.0.9/app",
            "postgres://u:pw@[::1]:5432/app",
            "postgres://u:pw@[::ffff:127.0.0.1]/app",
            "host=/var/run/postgresql dbname=app",
            "host=db.example.com hostaddr=127.0.0.1 dbname=app",
        ];
        for url in local {
            assert_eq!(exposure("[source]", url), None, "{url}");
        }
    }

    #[test]
    fn the_warning_names_the_url_the_mode_and_the_fix() {
        let e = exposure("[platform]", "postgres://u:pw@db.example.com/app").unwrap();
        assert_eq!(
            (e.field.as_str(), e.host.as_str(), e.mode),
            ("[platform].url", "db.example.com", SslMode::Prefer)
        );
        let text = e.message();
        assert!(text.starts_with("[platform].url reaches db.example.com with sslmode=prefer"));
        assert!(
            text.contains("Set sslmode=verify-full in [platform].url"),
            "{text}"
        );
        assert!(!text.contains("pw"), "the password printed: {text}");
        let e = exposure("[source]", "postgres://u@10.1.2.3/app?sslmode=require").unwrap();
        assert!(
            e.message()
                .starts_with("[source].url reaches 10.1.2.3 with sslmode=require")
        );
    }

    /// A writer the test reads back: the log lines as emitted.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_warning_is_logged_once_for_a_remote_host_and_not_for_loopback() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let parse = |url: &str| {
                ConnectOptions::parse(&DatabaseUrl::new(url), "[source]", &TlsFields::default())
                    .unwrap()
            };
            assert!(
                parse("postgres://cap:s3cret@db.example.com/shop")
                    .warn_if_exposed()
                    .is_some()
            );
            assert!(
                parse("postgres://cap:s3cret@127.0.0.1/shop")
                    .warn_if_exposed()
                    .is_none()
            );
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        assert!(lines[0].contains("WARN"), "{text}");
        assert!(lines[0].contains("[source].url reaches db.example.com with sslmode=prefer"));
        assert!(lines[0].contains("setting=[source].url"), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
    }
}
