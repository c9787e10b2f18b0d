//! The archive against real Postgres clusters and the real S3-compatible
//! server (`s3s-fs`, devkit): parts cut by bytes as well as rows, and days
//! that fail without stopping the others.

mod failures;
mod parts;
mod support;
