//! Connections to Postgres, with TLS as libpq users configure it.
//!
//! ```text
//!  DatabaseUrl (?sslmode=…&sslrootcert=…)  ┐
//!  [section] sslmode / sslrootcert         ┴─▶ ConnectOptions::parse ──▶ tokio_postgres::Config (TLS params taken out)
//!                                                     │                  TlsOptions (mode, roots)
//!                                                     ▼
//!                                               RustlsConnector ──▶ tokio-postgres / deadpool
//! ```
//!
//! - [`SslMode`]: `disable`, `prefer` (the default, as in libpq), `require`,
//!   `verify-ca`, `verify-full`.
//! - [`ConnectOptions`]: a connection string and a config section's
//!   [`TlsFields`] made into tokio-postgres's settings and a [`TlsOptions`]
//!   policy. tokio-postgres does not know `verify-ca`, `verify-full` or
//!   `sslrootcert`, so they are taken out of the string before it parses it.
//! - [`DatabaseUrl`]: a connection string whose password never prints.
//! - [`RustlsConnector`]: the `MakeTlsConnect` carrying out the policy with
//!   rustls (no OpenSSL), whose errors name the check that failed.
//!
//! - [`binding`]: SCRAM channel binding (`tls-server-end-point`), offered
//!   on every TLS session the connector makes.
//! - [`exposure`]: whether a connection leaves the machine without the
//!   server being authenticated, and the start-up warning that says so.
//!
//! The platform pool and capture's SQL session use the connector; the
//! replication stream gives the same [`TlsOptions`] to pgwire-replication
//! (which cannot bind SCRAM to TLS: see [`ConnectOptions::channel_binding`]).

// Tests spawn freely; production code spawns through the supervisor.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod binding;
pub mod connector;
pub mod error;
pub mod exposure;
pub mod mode;
pub mod options;
mod params;
pub mod url;

pub use connector::{RustlsConnector, RustlsStream, server_verifier};
pub use error::{ConnectError, find_connect_error};
pub use mode::{ACCEPTED_MODES, SslMode};
pub use options::{ConnectOptions, Roots, SYSTEM_ROOTS, TlsFields, TlsOptions, Verification};
pub use url::DatabaseUrl;

#[cfg(test)]
mod tests;
