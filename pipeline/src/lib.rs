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
//! - [`metrics`]: what the stages feed Prometheus, the same series in
//!   `walhook run` and in a stage process on its own.
//! - [`retry`]: the retry schedule, tenants' and endpoints' overrides of it, and
//!   the delivery state it drives.
//! - [`objstore`]: the object-store port that cold history is written to.
//! - [`url_policy`]: which endpoint URLs and addresses may be sent to (SSRF),
//!   pure, for registration and for the egress's connect-time checks.
//! - [`stored`]: enums stored as text, declared with [`stored_names!`](crate::stored_names!) and
//!   parsed back in one place at the SQL edge.
//! - [`sanitize`], [`redact`]: untrusted text made storable, and secrets
//!   that never print.
//!
//! This crate has no network dependencies; connectors, the platform store and
//! the binary depend on it, never the other way.

// Tests spawn freely; production code spawns through the supervisor.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

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
pub mod metrics;
pub mod objstore;
pub mod redact;
pub mod retry;
pub mod routing;
pub mod runtime;
pub mod sanitize;
pub mod signing;
pub mod store;
pub mod stored;
pub mod supervise;
pub mod time;
pub mod url_policy;
