//! The Postgres source: committed row changes become events.
//!
//! ```text
//!  business Postgres ──pgoutput──▶ source.rs ──▶ pgoutput.rs (decode) ──▶ rules/ (match, build)
//!        ▲                             │                                      │
//!        │  catalog.rs: wal_level,     │ hand_off(tx) ──▶ TransactionSink ◀────┘
//!        │  slot, publication, tables  │
//!        └──── confirmed LSN ◀─────────┘ (only when the sink's receipt resolved)
//! ```
//!
//! - [`config`]: the `[source]` section and `[[rules]]`, validated without a
//!   database.
//! - [`connect`]: the SQL session and the replication stream under the
//!   `[source]` TLS policy (`sslmode`, `sslrootcert`).
//! - [`catalog`]: start-up checks, slot and publication management;
//!   [`preflight`]: every precondition checked at once, read-only
//!   (`walhook doctor`).
//! - [`init`]: a business schema read from the catalog becomes a proposed
//!   config and the least-privilege setup SQL (`walhook init`).
//! - [`pgoutput`]: the protocol decoder (fuzzed; never panics).
//! - [`types`]: domains and arrays mapped to the type they are written as.
//! - [`value`]: Postgres text values as typed canonical JSON.
//! - [`rules`]: rules bound to columns; changes to events.
//! - [`source`]: the streaming loop and the ack protocol; `stream`: one
//!   stream's transactions gathered (events, bounded incidents, chunks).

pub mod catalog;
pub mod config;
pub mod connect;
pub mod declared;
pub mod error;
pub mod init;
pub mod pgoutput;
pub mod preflight;
pub mod rules;
pub mod schema;
pub mod source;
mod stream;
pub mod types;
pub mod value;

pub use config::{RuleConfig, SourceConfig};
pub use error::CaptureError;
pub use source::{PostgresSource, rule_event_types};
// The capture port's types, where callers of the Postgres source looked for them.
pub use walhook_pipeline::capture::{
    CaptureObserver, ChangeSource, LogObserver, RunOptions, RunStats,
};
