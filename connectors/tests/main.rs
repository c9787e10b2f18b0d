//! Integration tests of the connectors against real services: a throwaway
//! Postgres per test and a real S3-compatible server (devkit), never a fake.

mod capture;
mod dispatch;
mod fluvio;
mod ledger;
mod objstore;
mod tls;
