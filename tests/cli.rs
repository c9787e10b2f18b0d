//! The command line: clear errors with the fix, and help that teaches.

use crate::support::{run, stderr, stdout, walhook, write_config};

#[test]
fn the_demo_without_postgres_binaries_says_how_to_get_them() {
    let out = run(walhook()
        .args(["demo", "--duration", "1s"])
        .env("WALHOOK_PG_BIN", "/nonexistent"));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("apt-get install -y postgresql") && err.contains("WALHOOK_PG_BIN"),
        "{err}"
    );
}

#[test]
fn run_without_a_reachable_platform_database_names_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    // Port 9 on loopback: nothing listens there.
    let cfg = write_config(
        dir.path(),
        "[platform]\nurl = \"postgres://postgres@127.0.0.1:9/walhook\"\n\n[source]\nurl = \"postgres://postgres@127.0.0.1:9/shop\"\n\n\
         [[rules]]\nname = \"m\"\nkind = \"message\"\nprefix = \"app\"\n",
    );
    let out = run(walhook().args(["run", "--config"]).arg(&cfg).env(
        "WALHOOK_MASTER_KEY",
        walhook_sql::secrets::MasterKey::generate_text(),
    ));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("[platform].url") && err.contains("walhook migrate"),
        "{err}"
    );
}

#[test]
fn run_without_a_master_key_names_the_fix_before_touching_anything() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "[platform]\nurl = \"postgres://postgres@127.0.0.1:9/walhook\"\n\n[source]\nurl = \"postgres://postgres@127.0.0.1:9/shop\"\n\n\
         [[rules]]\nname = \"m\"\nkind = \"message\"\nprefix = \"app\"\n",
    );
    let out = run(walhook()
        .args(["run", "--config"])
        .arg(&cfg)
        .env_remove("WALHOOK_MASTER_KEY"));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("master_key_file")
            && err.contains("WALHOOK_MASTER_KEY")
            && err.contains("walhook secrets generate-key"),
        "{err}"
    );
    // A key that is not a key is named too, and never echoed.
    let out = run(walhook()
        .args(["run", "--config"])
        .arg(&cfg)
        .env("WALHOOK_MASTER_KEY", "c2hvcnQ="));
    let err = stderr(&out);
    assert!(
        err.contains("WALHOOK_MASTER_KEY is not a master key") && !err.contains("c2hvcnQ="),
        "{err}"
    );
}

#[test]
fn bad_config_values_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let base = "[platform]\nurl = \"postgres://u@127.0.0.1/p\"\n\n[source]\nurl = \"postgres://u@127.0.0.1/s\"\n\n\
                [[rules]]\nname = \"m\"\nkind = \"message\"\nprefix = \"app\"\n";
    let cases = [
        ("[retry]\nmax_attempts = 0\n", "retry.max_attempts"),
        (
            "[retry]\ndeadline = \"soon\"\n",
            "\"soon\" is not a duration",
        ),
        (
            "[dispatch]\nlease = \"1s\"\n",
            "must outlast [egress].request_timeout",
        ),
        (
            "[log]\nkind = \"kafka\"\n",
            "unknown variant `kafka`, expected `embedded` or `fluvio`",
        ),
        (
            "[log]\nkind = \"fluvio\"\nendpoint = \"sc.example\"\n",
            "[log].endpoint = \"sc.example\": give the Fluvio SC's public address as host:port",
        ),
        (
            "[log]\nkind = \"fluvio\"\ngive_up_after = \"2s\"\n",
            "[log].give_up_after = 2s: give at least \"10s\"",
        ),
        (
            "[log]\nkind = \"fluvio\"\nmember_lease = \"500ms\"\n",
            "[log].member_lease = 500ms: give \"2s\" to \"10m\"",
        ),
        (
            "[log]\nkind = \"fluvio\"\nretention = \"5s\"\n",
            "[log].retention = 5s: give at least \"10s\"",
        ),
        (
            "[log]\nkind = \"fluvio\"\nendpoint = \"fluvio.example.net:9003\"\n",
            "[log].endpoint = \"fluvio.example.net:9003\" is not on this machine",
        ),
        (
            "[log]\nkind = \"fluvio\"\n[log.tls]\nca_file = \"no-such-ca.pem\"\nmode = \"verify-ca\"\n",
            "no-such-ca.pem\": cannot be read",
        ),
        (
            "[log]\nkind = \"fluvio\"\ntopic_prefix = \"Walhook_\"\n",
            "[log].topic_prefix = \"Walhook_\": Fluvio topic names use a-z, 0-9 and '-'",
        ),
        (
            "[egress]\nallow_http = true\n",
            "unknown field `allow_http`",
        ),
    ];
    for (extra, expected) in cases {
        let cfg = write_config(dir.path(), &format!("{base}\n{extra}"));
        let out = run(walhook().args(["run", "--config"]).arg(&cfg));
        assert!(!out.status.success(), "accepted {extra}");
        assert!(
            stderr(&out).contains(expected),
            "expected {expected:?} in {}",
            stderr(&out)
        );
    }
}

/// The scale-out commands refuse what cannot work, saying what to change.
#[test]
fn scale_out_commands_explain_what_they_need() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "[platform]\nurl = \"postgres://postgres@127.0.0.1:9/walhook\"\n\n[source]\nurl = \"postgres://postgres@127.0.0.1:9/shop\"\n\n\
         [[rules]]\nname = \"m\"\nkind = \"message\"\nprefix = \"app\"\n",
    );
    for member in [&["--member", "0/2"][..], &[]] {
        let out = run(walhook()
            .arg("fanout")
            .args(member)
            .arg("--config")
            .arg(&cfg));
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("set [log] kind = \"fluvio\""),
            "{member:?}: {}",
            stderr(&out)
        );
    }
    for bad in ["2/2", "x", "1/0"] {
        let out = run(walhook()
            .args(["fanout", "--member", bad, "--config"])
            .arg(&cfg));
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("give the member as I/N"),
            "{bad}: {}",
            stderr(&out)
        );
    }
    let out = run(walhook().args(["capture", "--config"]).arg(&cfg));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("set [log] kind = \"fluvio\" to run capture alone"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn help_teaches_the_commands() {
    let out = run(walhook().arg("--help"));
    let help = stdout(&out);
    for command in [
        "demo",
        "run",
        "migrate",
        "capture",
        "fanout",
        "dispatch",
        "bench",
        "check-url",
        "secrets",
    ] {
        assert!(
            help.contains(command),
            "{command} missing from --help:\n{help}"
        );
    }
    let fanout = stdout(&run(walhook().args(["fanout", "--help"])));
    assert!(
        fanout.contains("--member")
            && fanout.contains("kind = \"fluvio\"")
            && fanout.contains("member_lease"),
        "{fanout}"
    );
    let capture = stdout(&run(walhook().args(["capture", "--help"])));
    assert!(
        capture.contains("--stdout") && capture.contains("--confirm"),
        "{capture}"
    );
}

/// `walhook chaos` refuses a fault its log cannot have, saying which to use.
#[test]
fn chaos_faults_fit_the_log() {
    let out = run(walhook().args(["chaos", "--faults", "spu-kill", "--rounds", "1"]));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("add --log fluvio"),
        "{}",
        stderr(&out)
    );
    let out = run(walhook().args([
        "chaos",
        "--log",
        "fluvio",
        "--faults",
        "lease-expiry",
        "--rounds",
        "1",
    ]));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("give member-freeze"),
        "{}",
        stderr(&out)
    );
    let out = run(walhook().args(["chaos", "--log", "fluvio", "--soak", "10s"]));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--soak runs on the embedded log"),
        "{}",
        stderr(&out)
    );
}

/// `walhook migrate --check` says what an upgrade would apply and which
/// statements lock the tables the pipeline writes, changing nothing; its
/// exit code gates a deploy; `--version` names the schema it brings.
#[tokio::test]
async fn migrate_check_lists_what_is_pending_and_what_it_locks() {
    let pg = walhook_devkit::postgres::LocalPostgres::start()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = pg.url("postgres");
    let cfg = write_config(
        dir.path(),
        &format!(
            "[platform]\nurl = \"{url}\"\n\n[source]\nurl = \"{url}\"\n\n\
             [[rules]]\nname = \"m\"\nkind = \"message\"\nprefix = \"app\"\n"
        ),
    );
    let latest = walhook_sql::migrate::latest();
    let check = || run(walhook().args(["migrate", "--check", "--config"]).arg(&cfg));

    // An empty database: everything pending, nothing applied by the check.
    let out = check();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}{}", stderr(&out));
    assert!(
        text.contains(&format!(
            "at version 0; this binary brings version {latest}. {latest} migrations pending"
        )),
        "{text}"
    );
    let mut sql = pg.connect("postgres").await.unwrap();
    let status = walhook_sql::migrate::status(&sql).await.unwrap();
    assert!(
        status.applied.is_empty(),
        "the check applied {:?}",
        status.applied
    );

    // As an earlier release left it: the rest is pending, and moving
    // deliveries into daily partitions (0024) is named with its lock.
    walhook_sql::migrate::run_until(&mut sql, 23).await.unwrap();
    let out = check();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("at version 23;"), "{text}");
    assert!(
        !text.contains("0023_"),
        "applied ones are not listed: {text}"
    );
    let partitioned = text
        .split("  0024_deliveries_by_day:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("0024 is not listed with locks: {text}"));
    assert!(
        partitioned.contains("ACCESS EXCLUSIVE (blocks reads and writes until it commits) on deliveries: ALTER TABLE walhook.deliveries RENAME"),
        "{text}"
    );
    assert!(text.contains("blocks writes"), "{text}");

    // Applied: the check passes.
    let out = run(walhook().args(["migrate", "--config"]).arg(&cfg));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = check();
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains(&format!("is current (version {latest})")));

    // A migration changed after it shipped fails the check, named.
    sql.execute(
        "UPDATE walhook.schema_migrations SET checksum = 'edited' WHERE version = 5",
        &[],
    )
    .await
    .unwrap();
    let out = check();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("0005_api was changed after it was applied"),
        "{}",
        stdout(&out)
    );

    let out = run(walhook().arg("--version"));
    let version = stdout(&out);
    assert!(
        version.starts_with("walhook ")
            && version.contains("(commit ")
            && version
                .trim_end()
                .ends_with(&format!("schema version {latest})")),
        "{version}"
    );
}

/// `walhook doctor` names every problem of a source that is not ready,
/// each with a fix; once the printed fixes are applied it passes.
#[tokio::test]
async fn doctor_names_each_problem_with_its_fix_and_passes_once_they_are_applied() {
    let mut pg = walhook_devkit::postgres::LocalPostgres::builder()
        .setting("wal_level", "replica")
        .start()
        .await
        .unwrap();
    let platform_url = pg.create_database("walhook").await.unwrap();
    let mut platform = pg.connect("walhook").await.unwrap();
    walhook_sql::migrate::run(&mut platform).await.unwrap();
    pg.create_database("shop").await.unwrap();
    let shop = pg.connect("shop").await.unwrap();
    shop.batch_execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, tenant_id text NOT NULL, status text);
         CREATE TABLE items (id bigint PRIMARY KEY, tenant_id text NOT NULL, note text);
         CREATE PUBLICATION walhook FOR TABLE orders WITH (publish_via_partition_root = true);
         CREATE ROLE capture LOGIN;
         GRANT SELECT ON orders, items TO capture;",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let source_url = format!("postgres://capture@127.0.0.1:{}/shop", pg.port());
    // `items_noted` reads the old note, which the WAL carries only with
    // REPLICA IDENTITY FULL.
    let cfg = write_config(
        dir.path(),
        &format!(
            "[platform]\nurl = \"{platform_url}\"\n\n\
             [source]\nurl = \"{source_url}\"\nslot = \"walhook_shop\"\npublication = \"walhook\"\n\
             create_slot = true\ncreate_publication = false\n\n\
             [[rules]]\nname = \"orders\"\ntable = \"public.orders\"\nevent_type = \"order.changed\"\n\
             tenant_column = \"tenant_id\"\noperations = [\"insert\", \"update\"]\n\n\
             [[rules]]\nname = \"items_noted\"\ntable = \"public.items\"\nevent_type = \"item.noted\"\n\
             tenant_column = \"tenant_id\"\noperations = [\"update\"]\n\
             when = [{{ column = \"note\", changed = true }}]\n"
        ),
    );
    let key = walhook_sql::secrets::MasterKey::generate_text();
    let doctor = |json: bool| {
        let mut cmd = walhook();
        cmd.args(["doctor", "--config"])
            .arg(&cfg)
            .env("WALHOOK_MASTER_KEY", &key);
        if json {
            cmd.arg("--json");
        }
        run(&mut cmd)
    };

    let out = doctor(false);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}{}", stderr(&out));
    assert!(!text.is_empty(), "{}", stderr(&out));
    for (check, fix) in [
        ("source.wal_level", "ALTER SYSTEM SET wal_level = logical"),
        ("source.role", "ALTER ROLE \"capture\" REPLICATION;"),
        (
            "source.publication",
            "ALTER PUBLICATION \"walhook\" ADD TABLE \"public\".\"items\";",
        ),
        (
            "rule.items_noted",
            "ALTER TABLE public.items REPLICA IDENTITY FULL",
        ),
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("FAIL") && l.contains(check)),
            "{check} is not named as failing:\n{text}"
        );
        assert!(text.contains(fix), "no fix {fix:?} for {check}:\n{text}");
    }
    // A rule that fits does not fail (a warning may advise on TOAST).
    assert!(
        text.lines()
            .any(|l| !l.starts_with("FAIL") && l.contains("rule.orders")),
        "{text}"
    );
    assert!(text.contains("4 checks failed"), "{text}");

    // `walhook run` runs the same checks before capture prepares anything
    // and names the first that fails, with its fix.
    let mut child = walhook()
        .args(["run", "--config"])
        .arg(&cfg)
        .env("WALHOOK_MASTER_KEY", &key)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("walhook run started on a source that is not ready");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("capture cannot start: wal_level = replica")
            && err.contains("fix: ALTER SYSTEM SET wal_level = logical"),
        "{err}"
    );

    // Apply what it printed: the fix of each failing check, as SQL (the
    // rule's is quoted in its message), then restart for wal_level.
    let out = doctor(true);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], false);
    for f in report["findings"].as_array().unwrap() {
        if f["verdict"] != "fail" {
            continue;
        }
        let fix = f["fix"].as_str().unwrap();
        assert!(fix.starts_with("ALTER "), "{f}");
        shop.batch_execute(fix.split(';').next().unwrap())
            .await
            .unwrap();
    }
    pg.crash_and_restart(std::time::Duration::from_millis(100))
        .await
        .unwrap();

    let out = doctor(false);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(
        text.contains("everything walhook run needs holds"),
        "{text}"
    );
    assert!(!text.contains("FAIL"), "{text}");
}

/// A tree exported by `git archive` (how scripts/ensure-previous-release.sh
/// builds the previous release) carries its commit in `cli/commit.txt`,
/// which the build script reads when there is no checkout to ask.
#[test]
fn an_archived_tree_names_its_commit() {
    #![allow(clippy::disallowed_methods)]
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .expect("git runs (the tests run from a clone)");
        assert!(out.status.success(), "git {args:?}: {}", stderr(&out));
        stdout(&out)
    };
    let head = git(&["rev-parse", "HEAD"]);
    let archived = git(&["archive", "HEAD", "cli/commit.txt"]);
    // A tar stream: the file's text follows its 512-byte header.
    assert!(
        archived.contains(head.trim()),
        "cli/commit.txt in `git archive HEAD` does not hold {head}"
    );
}
