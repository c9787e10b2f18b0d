//! Integration tests of the API against a real Postgres.
