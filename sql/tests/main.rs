//! Integration tests of the platform database against real Postgres
//! clusters (devkit), never a fake.

mod ledger;
mod membership;
mod partitions;
mod plans;
mod routing;
mod store_contract;
mod tls;
