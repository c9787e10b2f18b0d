//! walhook's connectors to the outside world.
//!
//! - [`postgres`]: the capture source: a logical replication slot read with
//!   `pgwire-replication`, our own `pgoutput` decoder, and the capture rules
//!   that turn row changes into events.
//! - `fluvio` (feature `fluvio`, on by default): the log port over a
//!   Fluvio cluster, so that the stages run as separate processes.
//! - [`http`]: the egress that sends signed attempts.

// Tests spawn freely; production code spawns through the supervisor.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

#[cfg(feature = "fluvio")]
pub mod fluvio;
pub mod http;
pub mod postgres;
