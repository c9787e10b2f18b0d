//! The Debian package, installed: `.ci/run` builds it from the tested
//! binary (scripts/package-deb.sh), installs it with `dpkg -i`, names it in
//! WALHOOK_INSTALLED_PACKAGE for this test, and removes it afterwards.
//! Without that variable the test says it was skipped.

use std::path::Path;
use std::process::Command;

use walhook_devkit::postgres::LocalPostgres;

use crate::support::{psql_file, run, stderr, stdout, walhook};

const INSTALLED: &str = "/usr/bin/walhook";
const UNITS: [&str; 2] = [
    "/lib/systemd/system/walhook.service",
    "/lib/systemd/system/walhook-dispatch.service",
];

fn installed(args: &[&str]) -> Command {
    let mut cmd = Command::new(INSTALLED);
    cmd.args(args);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_installed_package_sets_up_a_database_and_its_units_verify() {
    let Some(deb) = std::env::var_os("WALHOOK_INSTALLED_PACKAGE") else {
        eprintln!(
            "skipped: WALHOOK_INSTALLED_PACKAGE is not set (.ci/run builds, installs and removes \
             the Debian package around the tests)"
        );
        return;
    };
    // The package is the one built from this code: same version line.
    let ours = stdout(&run(walhook().arg("--version")));
    let theirs = stdout(&run(&mut installed(&["--version"])));
    assert!(ours.contains("(commit "), "{ours}");
    assert_eq!(
        theirs,
        ours,
        "{} is not the tested build",
        Path::new(&deb).display()
    );
    let listed = stdout(&run(Command::new("dpkg").args(["-L", "walhook"])));
    for file in [INSTALLED, "/etc/walhook/walhook.toml", UNITS[0], UNITS[1]] {
        assert!(
            listed.lines().any(|l| l == file),
            "{file} is not in the package:\n{listed}"
        );
    }
    let conffiles = stdout(&run(Command::new("dpkg-query").args([
        "-W",
        "-f=${Conffiles}",
        "walhook",
    ])));
    assert!(
        conffiles.contains("/etc/walhook/walhook.toml"),
        "{conffiles}"
    );
    // The debug info was split off: the installed program has no symbols
    // and names its debug file.
    let sections = stdout(&run(Command::new("objdump").args(["-h", INSTALLED])));
    assert!(sections.contains(".gnu_debuglink"), "{sections}");
    assert!(!sections.contains(".debug_info"), "{sections}");

    // The unit files, as systemd reads them (where systemd-analyze exists).
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok()
    {
        let out = run(Command::new("systemd-analyze").arg("verify").args(UNITS));
        assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
        for unit in UNITS {
            let text = std::fs::read_to_string(unit).unwrap();
            for hardening in [
                "DynamicUser=yes",
                "ProtectSystem=strict",
                "NoNewPrivileges=yes",
                "StateDirectory=",
                "ExecReload=",
            ] {
                assert!(text.contains(hardening), "{unit} lacks {hardening}");
            }
        }
    } else {
        eprintln!("systemd-analyze is not installed: the unit files were not verified");
    }
    // The packaged configuration is accepted as shipped once the master
    // key is given (the unit's reload runs this check).
    let key = walhook_sql::secrets::MasterKey::generate_text();
    let out = run(installed(&[
        "run",
        "--config",
        "/etc/walhook/walhook.toml",
        "--check-config",
    ])
    .env("WALHOOK_MASTER_KEY", &key));
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));

    // The installed program against a test cluster: init, the setup SQL,
    // migrate, then doctor passes.
    let pg = LocalPostgres::start().await.unwrap();
    pg.create_database("erp").await.unwrap();
    pg.connect("erp")
        .await
        .unwrap()
        .batch_execute(crate::init::ERP)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = run(installed(&["init", "--source", &pg.url("erp"), "--out"]).arg(dir.path()));
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let out = psql_file(&pg, "erp", &dir.path().join("walhook-setup.sql"));
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let config = dir.path().join("walhook.toml");
    for command in ["migrate", "doctor"] {
        let out = run(installed(&[command, "--config"]).arg(&config));
        assert!(
            out.status.success(),
            "{INSTALLED} {command}: {}{}",
            stdout(&out),
            stderr(&out)
        );
    }
}
