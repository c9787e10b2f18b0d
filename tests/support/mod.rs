//! Helpers shared by the end-to-end tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `walhook` binary built for these tests.
pub fn walhook() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_walhook"));
    cmd.env("WALHOOK_LOG", "warn");
    cmd
}

/// Writes `text` as `walhook.toml` in `dir`.
pub fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("walhook.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `cmd` to completion, returning its output.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("cannot run walhook")
}

/// Stdout as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stderr as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
