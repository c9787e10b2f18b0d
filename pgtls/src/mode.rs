//! `sslmode`: how much of TLS a connection insists on, as libpq names it.

use std::fmt;
use std::str::FromStr;

use crate::error::ConnectError;

/// libpq's `sslmode`, as walhook carries it out with rustls.
///
/// | mode | encrypted | server certificate checked |
/// |---|---|---|
/// | `disable` | never | — |
/// | `prefer` | when the server offers TLS | no |
/// | `require` | always | no (chain only when `sslrootcert` is given, as libpq does) |
/// | `verify-ca` | always | chain against the roots |
/// | `verify-full` | always | chain against the roots, and the host name |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SslMode {
    /// Plain TCP: the password (when one is sent) and all data travel in
    /// clear.
    Disable,
    /// TLS when the server offers it, plaintext otherwise; libpq's default,
    /// and so walhook's. Protects against nobody who can alter traffic.
    #[default]
    Prefer,
    /// TLS always, the certificate unchecked: protects against listening,
    /// not against a man in the middle.
    Require,
    /// TLS, the certificate chain checked against the roots, the name not.
    VerifyCa,
    /// TLS, the chain and the host name checked: the only mode that
    /// authenticates the server.
    VerifyFull,
}

/// The values [`SslMode::from_str`] accepts, for error messages.
pub const ACCEPTED_MODES: &str = "disable, prefer, require, verify-ca or verify-full";

impl SslMode {
    /// The libpq spelling (`verify-full`).
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether a connection without TLS is refused.
    pub fn requires_tls(self) -> bool {
        matches!(
            self,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        )
    }

    /// The mode tokio-postgres negotiates with (it only knows the first
    /// three); the checks of the stricter modes are done by walhook's
    /// certificate verifier.
    pub(crate) fn transport(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SslMode {
    type Err = ConnectError;

    fn from_str(s: &str) -> Result<Self, ConnectError> {
        match s {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            // `allow` would mean plaintext first, TLS only when the server
            // insists: no better than `prefer`, and easy to mistake for it.
            other => Err(ConnectError::UnknownMode(other.to_owned())),
        }
    }
}

impl<'de> serde::Deserialize<'de> for SslMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_and_unknown_ones_name_the_accepted_values() {
        for mode in [
            SslMode::Disable,
            SslMode::Prefer,
            SslMode::Require,
            SslMode::VerifyCa,
            SslMode::VerifyFull,
        ] {
            assert_eq!(mode.as_str().parse::<SslMode>().unwrap(), mode);
        }
        for bad in ["allow", "verify_full", "VERIFY-FULL", ""] {
            let err = bad.parse::<SslMode>().unwrap_err().to_string();
            assert!(err.contains(ACCEPTED_MODES), "{err}");
        }
    }
}
