//! walhook's pipeline: the domain and the operators between the connectors.
//!
//! ```text
//!   capture (connectors) ─▶ log:events ─▶ FanoutOperator ─▶ log:deliveries ─▶ Dispatcher ─▶ egress (connectors)
//!                                              │                                  │
//!                                              ▼                                  ▼
//!                                  platform store: events, deliveries, attempts (sql)
//! ```
//!
//! - [`ids`], [`time`], [`event`]: identities, instants and events, with the
//!   canonical body writer in [`canonical`].
//! - [`log`]: the log port, its embedded implementation and its contract.
//! - [`capture`]: what capture hands downstream (the sink contract), the
//!   sinks that store its incidents and its [`capture::ledger`] on the way.
//! - [`runtime`]: fan-out and dispatch wired together over any log, shared
//!   by `walhook run` and the scale-out processes; [`routing`]: the
//!   deliveries topic keyed by endpoint between fan-out and dispatch members.
//! - [`failpoint`]: named crash points for the kill tests.
//! - [`objstore`]: the object-store port that cold history is written to.
//! - [`sanitize`], [`redact`]: untrusted text made storable, and secrets
//!   that never print.
//!
//! This crate has no network dependencies; connectors, the platform store and
//! the binary depend on it, never the other way.

pub mod canonical;
pub mod capture;
pub mod delivery;
pub mod dispatch;
pub mod duration;
pub mod endpoint;
pub mod event;
pub mod failpoint;
pub mod fanout;
pub mod ids;
pub mod incident;
pub mod log;
pub mod membership;
pub mod objstore;
pub mod redact;
pub mod routing;
pub mod runtime;
pub mod sanitize;
pub mod signing;
pub mod store;
pub mod supervise;
pub mod time;
