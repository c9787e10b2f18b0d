//! A connection string and TLS settings, made into what tokio-postgres and
//! the connector need.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::DatabaseUrl;

use crate::connector::RustlsConnector;
use crate::error::ConnectError;
use crate::mode::SslMode;
use crate::params;

/// The value of `sslrootcert` that means "the built-in roots" (libpq 16's
/// spelling for the system's roots).
pub const SYSTEM_ROOTS: &str = "system";

/// TLS settings given beside the URL, in a config section. `None` leaves
/// the URL's value (or the default) in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFields {
    /// `sslmode`.
    pub sslmode: Option<SslMode>,
    /// `sslrootcert`: a PEM file of CA certificates, or `system`.
    pub sslrootcert: Option<PathBuf>,
}

/// Which certificates a verifying mode trusts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Roots {
    /// Mozilla's roots, built into walhook (`webpki-roots`): no
    /// `sslrootcert`, or `sslrootcert=system`.
    BuiltIn,
    /// The CA certificates of a PEM file.
    File(PathBuf),
}

impl Roots {
    /// For messages: `the CA in /etc/ca.pem`.
    pub fn describe(&self) -> String {
        match self {
            Roots::BuiltIn => "the built-in Mozilla roots (no sslrootcert given)".into(),
            Roots::File(p) => format!("the CA in {}", p.display()),
        }
    }
}

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verification {
    /// Nothing: encryption only (`prefer`, `require`).
    None,
    /// The chain up to a trusted root (`verify-ca`; and `require` or
    /// `prefer` with an `sslrootcert`, as libpq does).
    Chain,
    /// The chain and the host name (`verify-full`).
    Full,
}

/// The TLS policy of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOptions {
    /// The mode.
    pub mode: SslMode,
    /// The roots a verifying mode trusts.
    pub roots: Roots,
    /// Whether `sslrootcert` was given (libpq then checks the chain even
    /// in `require`).
    root_given: bool,
}

impl TlsOptions {
    /// A policy made in code (tools, tests); a CA file given makes
    /// `require` check the chain, as libpq does.
    pub fn new(mode: SslMode, roots: Roots) -> Self {
        let root_given = matches!(roots, Roots::File(_));
        TlsOptions {
            mode,
            roots,
            root_given,
        }
    }

    /// What the connector checks.
    pub fn verification(&self) -> Verification {
        match self.mode {
            SslMode::VerifyFull => Verification::Full,
            SslMode::VerifyCa => Verification::Chain,
            SslMode::Prefer | SslMode::Require if self.root_given => Verification::Chain,
            _ => Verification::None,
        }
    }
}

/// Everything needed to connect: tokio-postgres's settings (TLS parameters
/// taken out) and the TLS policy.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    config: tokio_postgres::Config,
    tls: TlsOptions,
    /// The config section the URL came from (`[source]`), for messages.
    section: String,
}

impl ConnectOptions {
    /// Reads `url` (either form libpq accepts) and the section's `fields`.
    /// `section` (`[platform]`) names the source of a problem in errors.
    /// Reads no file: [`ConnectOptions::connector`] does.
    pub fn parse(
        url: &DatabaseUrl,
        section: &str,
        fields: &TlsFields,
    ) -> Result<Self, ConnectError> {
        let text = url.expose();
        let parsed = params::parse(text);
        let mut url_mode = None;
        let mut url_root = None;
        if let Some(parsed) = &parsed {
            for p in &parsed.params {
                match p.key.as_str() {
                    "sslmode" => url_mode = Some(p.value.parse::<SslMode>()?),
                    "sslrootcert" => url_root = Some(PathBuf::from(&p.value)),
                    // tokio-postgres carries out `sslnegotiation` itself.
                    "sslnegotiation" => {}
                    key if key.starts_with("ssl") => {
                        return Err(ConnectError::UnsupportedParameter(key.to_owned()));
                    }
                    _ => {}
                }
            }
        }
        let mode = merge(section, "sslmode", fields.sslmode, url_mode, |m| {
            m.to_string()
        })?;
        let root = merge(
            section,
            "sslrootcert",
            fields.sslrootcert.clone(),
            url_root,
            |p| p.display().to_string(),
        )?;
        let rest = match &parsed {
            Some(parsed) => params::without(text, parsed, |k| k == "sslmode" || k == "sslrootcert"),
            None => text.to_owned(),
        };
        let mut config =
            tokio_postgres::Config::from_str(&rest).map_err(|source| ConnectError::InvalidUrl {
                section: section.to_owned(),
                source,
            })?;
        let is_system = root.as_deref() == Some(Path::new(SYSTEM_ROOTS));
        // libpq 16: `sslrootcert=system` makes verify-full the default.
        let mode = mode.unwrap_or(if is_system {
            SslMode::VerifyFull
        } else {
            SslMode::default()
        });
        config.ssl_mode(mode.transport());
        let tls = TlsOptions {
            mode,
            roots: match root.clone() {
                Some(path) if !is_system => Roots::File(path),
                _ => Roots::BuiltIn,
            },
            root_given: root.is_some(),
        };
        Ok(ConnectOptions {
            config,
            tls,
            section: section.to_owned(),
        })
    }

    /// tokio-postgres's settings; their `ssl_mode` is the transport side
    /// of [`TlsOptions::mode`].
    pub fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    /// The TLS policy.
    pub fn tls(&self) -> &TlsOptions {
        &self.tls
    }

    /// The config section the URL came from (`[platform]`, `[source]`).
    pub fn section(&self) -> &str {
        &self.section
    }

    /// The URL's `channel_binding` (`disable`, `prefer`, the default, or
    /// `require`), which tokio-postgres carries out on the SQL sessions:
    /// SCRAM-SHA-256-PLUS whenever the server offers it over TLS, bound to
    /// the server's certificate ([`crate::binding`]). The replication
    /// stream's client (pgwire-replication 0.5) cannot bind; see
    /// [`ConnectOptions::require_binding_everywhere`].
    pub fn channel_binding(&self) -> tokio_postgres::config::ChannelBinding {
        self.config.get_channel_binding()
    }

    /// Refuses `channel_binding=require` for a connection that is also
    /// opened by `client`, a client that cannot bind, unless `verify-full`
    /// authenticates the server there instead: otherwise the promise of
    /// `require` (no man in the middle can relay the login) would hold for
    /// one connection and silently not for the other.
    pub fn require_binding_everywhere(&self, client: &'static str) -> Result<(), ConnectError> {
        if self.channel_binding() == tokio_postgres::config::ChannelBinding::Require
            && self.tls.verification() != Verification::Full
        {
            return Err(ConnectError::BindingUnavailable {
                section: self.section.clone(),
                client,
            });
        }
        Ok(())
    }

    /// The connector carrying out the policy; reads `sslrootcert` now, so
    /// that a missing file stops start-up rather than the first connection.
    pub fn connector(&self) -> Result<RustlsConnector, ConnectError> {
        RustlsConnector::new(&self.tls)
    }
}

/// One value from the section or the URL; both only when they agree.
fn merge<T: PartialEq>(
    section: &str,
    key: &'static str,
    config: Option<T>,
    url: Option<T>,
    show: impl Fn(&T) -> String,
) -> Result<Option<T>, ConnectError> {
    match (config, url) {
        (Some(c), Some(u)) if c != u => Err(ConnectError::Conflict {
            section: section.to_owned(),
            key,
            config: show(&c),
            url: show(&u),
        }),
        (Some(c), _) => Ok(Some(c)),
        (None, u) => Ok(u),
    }
}
