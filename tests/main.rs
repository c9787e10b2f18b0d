//! End-to-end tests: real Postgres, real HTTP receivers, the real `walhook`
//! binary. One test binary; one module per area.

mod support;

mod api;
mod archive;
mod capture;
mod cli;
mod console;
mod console_journey;
mod egress;
mod engine;
mod fairness;
mod faults;
mod freshness;
mod hostile;
mod init;
mod nodes;
mod ownership;
mod package;
mod pipeline;
mod reconcile;
mod scaleout;
mod secrets;
mod supervision;
mod upgrade;
