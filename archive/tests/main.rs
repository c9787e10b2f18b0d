//! Integration tests of the archive: real Postgres (one throwaway cluster
//! per test), the real archiver, and real stores (a local directory and the
//! S3-compatible `s3s-fs` over loopback).

mod support;

mod cold;
