//! Records the commit the binary is built from (`WALHOOK_COMMIT`), for the
//! benchmarks' results and `walhook --version`; in a tree exported by `git
//! archive`, the commit it wrote into `cli/commit.txt`; "unknown" elsewhere;
//! and "-dirty" after it when a file the binary is built from differs from
//! that commit. And the platform schema version the binary brings
//! (`WALHOOK_SCHEMA_LEVEL`: the highest-numbered file of `sql/migrations`),
//! for `walhook --version`; a test holds it to the migrations compiled in.

fn main() {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .or_else(archived_commit)
        .unwrap_or_else(|| "unknown".into());
    // What the binary is built from: every crate's sources and manifest,
    // the lock file and the migrations. A change to one of them runs this
    // script again (so the label follows the tree); a change elsewhere
    // (docs, tests) neither reruns it nor counts as dirty.
    let mut inputs = vec![
        "Cargo.lock".to_owned(),
        "Cargo.toml".to_owned(),
        "sql/migrations".to_owned(),
        "cli/build.rs".to_owned(),
    ];
    for krate in [
        "pipeline",
        "connectors",
        "sql",
        "pgtls",
        "devkit",
        "cli",
        "config",
        "lab",
        "bin",
        "api",
        "archive",
        "reconcile",
    ] {
        inputs.push(format!("{krate}/src"));
        inputs.push(format!("{krate}/Cargo.toml"));
    }
    let dirty = commit != "unknown"
        && std::process::Command::new("git")
            .args(["status", "--porcelain", "--untracked-files=no", "--"])
            .args(&inputs)
            .current_dir("..")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .is_some_and(|o| !o.stdout.is_empty());
    let commit = if dirty {
        format!("{commit}-dirty")
    } else {
        commit
    };
    println!("cargo:rustc-env=WALHOOK_COMMIT={commit}");
    for input in &inputs {
        let path = format!("../{input}");
        if std::path::Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
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
    // A new commit moves HEAD's branch; checking out another moves HEAD;
    // staging or committing rewrites the index.
    for path in [
        "../.git/HEAD",
        "../.git/refs/heads",
        "../.git/packed-refs",
        "../.git/index",
    ] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

/// The commit `git archive` wrote into `commit.txt` (its `export-subst`
/// attribute, .gitattributes), when the tree is an export and not a
/// checkout: the previous release that the upgrade test builds is one.
fn archived_commit() -> Option<String> {
    println!("cargo:rerun-if-changed=commit.txt");
    let text = std::fs::read_to_string("commit.txt").ok()?;
    let hash = text.trim();
    (hash.len() >= 12 && hash.bytes().all(|b| b.is_ascii_hexdigit())).then(|| hash[..12].to_owned())
}
