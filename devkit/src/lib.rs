//! Real parts for walhook's demo, benchmarks and tests.
//!
//! - [`postgres`]: a throwaway Postgres cluster started from the machine's
//!   binaries (`initdb`, `postgres`), with `wal_level=logical`, on a free
//!   loopback port, removed when dropped. There is no Docker here.
//!   [`postgres::Builder::tls`] turns TLS on with a certificate from
//!   [`tls`].
//! - [`tls`]: a certificate authority and server certificates made in the
//!   test (rcgen), for `sslmode=verify-full` against a real server.
//! - [`s3`]: a throwaway S3-compatible server (`s3s-fs`, installed by
//!   `scripts/ensure-s3.sh`) on a free loopback port, with one bucket.
//! - [`fluvio`]: a throwaway Fluvio cluster (one SC, one SPU) on loopback,
//!   from the tools built from Fluvio's source, or a skip that says why.
//! - [`history`]: days of events, deliveries and attempts written straight
//!   into the hot tables, for archive benchmarks and tests.
//! - [`receiver`]: HTTP receivers on `127.0.0.1:0` that record what arrives,
//!   answer as a test tells them to, and verify Standard Webhooks signatures
//!   with code of their own (not the code that signed).

// Throwaway clusters and lab tools: their tasks live as long as the test
// or the command that made them.
#![allow(clippy::disallowed_methods)]

pub mod browser;
pub mod faultproxy;
pub mod fluvio;
pub mod history;
pub mod postgres;
pub mod receiver;
pub mod s3;
pub mod tls;
