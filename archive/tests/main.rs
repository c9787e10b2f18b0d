//! The archive against real Postgres clusters (one throwaway cluster per
//! test), the real archiver and real stores (a local directory and the
//! S3-compatible `s3s-fs` over loopback): parts cut by bytes as well as
//! rows, days that fail without stopping the others, and cold reads.

mod support;

mod analytics;
mod cold;
mod compaction;
mod failures;
mod migration;
mod objstore;
mod parts;
mod schedule;
