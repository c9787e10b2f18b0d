//! Records the commit the binary is built from (`WALHOOK_COMMIT`), for the
//! benchmarks' results and `walhook --version`; "unknown" outside a git
//! checkout. And the platform schema version the binary brings
//! (`WALHOOK_SCHEMA_LEVEL`: the highest-numbered file of `sql/migrations`),
//! for `walhook --version`; a test holds it to the migrations compiled in.

fn main() {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=WALHOOK_COMMIT={commit}");
    let level = std::fs::read_dir("../sql/migrations")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.split('_').next()?.parse::<u32>().ok()
                })
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0);
    println!("cargo:rustc-env=WALHOOK_SCHEMA_LEVEL={level}");
    println!("cargo:rerun-if-changed=../sql/migrations");
    // A new commit moves HEAD's branch; checking out another moves HEAD.
    for path in ["../.git/HEAD", "../.git/refs/heads", "../.git/packed-refs"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
