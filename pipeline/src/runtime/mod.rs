//! The runtime every walhook process runs on: one supervisor for every
//! role.
//!
//! ```text
//!  capture ──▶ events (embedded or Fluvio) ──▶ fan-out ×P ──▶ deliveries (in-process) ──▶ dispatcher
//!     ▲                                           │
//!     └── receipt: embedded: fan-out committed to Postgres; Fluvio: stored by the cluster
//! ```
//!
//! - [`process`]: a [`Process`] is the set of roles a command hands over
//!   (capture, a worker group, a dispatch member or node, scheduled tasks),
//!   each a named task under one [`crate::supervise::Supervisor`], with
//!   the ordered stop and its watchdog;
//! - [`workers`]: fan-out of a share of the events partitions and its
//!   dispatcher;
//! - [`capture`]: capture from a [`crate::capture::ChangeSource`],
//!   restarted after transient errors, and its checkpoints;
//! - [`log`]: closing the log after a failure and watching its cluster;
//! - [`metrics`]: the registry of a stage process and the collector over
//!   a process's counters.
//!
//! The binary maps configuration and flags onto a [`Process`]; what needs
//! the outside world (the Postgres source, the HTTP egress, the Fluvio
//! client, the platform database) comes in through the ports.

pub mod capture;
pub mod log;
pub mod metrics;
pub mod process;
pub mod workers;

#[cfg(test)]
mod process_tests;

pub use capture::{CaptureCounters, CheckpointStore};
pub use log::LogControl;
pub use process::{
    CaptureRole, Counters, DispatchRole, FAILED_STOP_DEADLINE, PlatformStore, Process,
    ProcessError, ProcessSettings, Running, Task, WorkerRole,
};
pub use workers::{
    DELIVERIES, EVENTS, FANOUT_GROUP, Leased, Share, WorkerCounters, WorkerSettings, Workers,
    events_topic,
};
