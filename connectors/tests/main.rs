//! Integration tests of the connectors against real services: a throwaway
//! Postgres per test (devkit), never a fake.

mod capture;
mod dispatch;
mod tls;
