//! Real parts for walhook's demo, benchmarks and tests.
//!
//! - [`postgres`]: a throwaway Postgres cluster started from the machine's
//!   binaries (`initdb`, `postgres`), with `wal_level=logical`, on a free
//!   loopback port, removed when dropped. There is no Docker here.
//! - [`receiver`]: HTTP receivers on `127.0.0.1:0` that record what arrives,
//!   answer as a test tells them to, and verify Standard Webhooks signatures
//!   with code of their own (not the code that signed).

pub mod postgres;
pub mod receiver;
