//! Integration tests of the API, served in-process against a real Postgres
//! (one throwaway cluster per test) and called over loopback HTTP.

mod support;

mod cold;
mod errors;
mod hostile;
mod idempotency;
mod isolation;
mod labels;
mod listing;
mod load;
mod quotas;
mod schemathesis;
mod secrets;
mod signin;
mod slow;
