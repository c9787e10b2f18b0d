//! Records the commit the binary is built from (`WALHOOK_COMMIT`), for the
//! benchmarks' results; "unknown" outside a git checkout.

fn main() {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=WALHOOK_COMMIT={commit}");
    // A new commit moves HEAD's branch; checking out another moves HEAD.
    for path in ["../.git/HEAD", "../.git/refs/heads", "../.git/packed-refs"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
