//! Integration tests of the connectors against real services (a throwaway
//! Postgres per test, a Fluvio cluster, TLS), never a fake.

mod capture;
mod dispatch;
mod fluvio;
mod ledger;
mod source_contract;
mod tls;
