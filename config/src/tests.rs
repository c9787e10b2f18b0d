//! The config's parsing: the example file, the log's TLS settings, and
//! secrets that never print.

use super::*;

#[test]
fn the_example_config_is_valid() {
    let example = include_str!("../../walhook.example.toml");
    let cfg = Config::parse(example).unwrap();
    assert_eq!(cfg.fanout.linger, walhook_pipeline::fanout::DEFAULT_LINGER);
    // A linger that would hold every event of a quiet moment for long
    // is refused, naming the field and the bound.
    let slow = example.replace("linger = \"10ms\"", "linger = \"2s\"");
    let err = format!("{:#}", Config::parse(&slow).unwrap_err());
    assert!(
        err.contains("[fanout].linger") && err.contains("at most 1s"),
        "{err}"
    );
    assert_eq!(cfg.rules.len(), 3);
    assert!(!cfg.egress.allow_http_loopback);
    assert!(cfg.api.is_none(), "the example keeps [api] commented out");
    assert_eq!(
        cfg.retry.deadline,
        std::time::Duration::from_secs(24 * 3600)
    );
}

mod log_tls_tests {
    use super::*;

    const BASE: &str = "[platform]\nurl = \"postgres://u@127.0.0.1/p\"\n\n[source]\nurl = \"postgres://u@127.0.0.1/s\"\n\n\
        [[rules]]\nname = \"m\"\nkind = \"message\"\nprefix = \"app\"\n\n[log]\nkind = \"fluvio\"\n";

    fn parse(log: &str) -> anyhow::Result<Config> {
        Config::parse(&format!("{BASE}{log}"))
    }

    #[test]
    fn dispatch_by_endpoint_is_checked_field_by_field() {
        let ep = walhook_pipeline::ids::EndpointId([9; 16]).to_string();
        let cfg = parse(&format!(
            "dispatch = \"by-endpoint\"\ndeliveries_partitions = 4\n\n[log.endpoint_shards]\n\"{ep}\" = 3\n"
        ))
        .unwrap();
        let routes = cfg.log.routes().unwrap().unwrap();
        assert_eq!(routes.partitions(), 4);
        assert_eq!(routes.shards(ep.parse().unwrap()), 3);
        assert_eq!(cfg.log.deliveries_topic(), "walhook-deliveries");
        assert!(parse("").unwrap().log.routes().unwrap().is_none());
        for (log, wanted) in [
            (
                format!(
                    "dispatch = \"by-endpoint\"\ndeliveries_partitions = 2\n\n[log.endpoint_shards]\n\"{ep}\" = 3\n"
                ),
                "give 1 to 2",
            ),
            (
                "dispatch = \"by-endpoint\"\n\n[log.endpoint_shards]\n\"ep_nope\" = 2\n".to_owned(),
                "\"ep_nope\": not an endpoint id",
            ),
            (
                format!("[log.endpoint_shards]\n\"{ep}\" = 2\n"),
                "only [log] dispatch = \"by-endpoint\" has",
            ),
            ("dispatch = \"sideways\"\n".to_owned(), "unknown variant"),
        ] {
            let err = format!("{:#}", parse(&log).unwrap_err());
            assert!(err.contains(wanted), "{log}: {err}");
        }
        let embedded = BASE.replace("kind = \"fluvio\"", "kind = \"embedded\"");
        let err = format!(
            "{:#}",
            Config::parse(&format!("{embedded}dispatch = \"by-endpoint\"\n")).unwrap_err()
        );
        assert!(err.contains("set [log] kind = \"fluvio\""), "{err}");
    }

    #[test]
    fn plain_tcp_leaves_the_machine_only_when_insecure_says_so() {
        let err = format!(
            "{:#}",
            parse("endpoint = \"sc.internal:9003\"\n").unwrap_err()
        );
        assert!(
            err.contains("\"sc.internal:9003\" is not on this machine")
                && err.contains("insecure = true"),
            "{err}"
        );
        let cfg = parse("endpoint = \"sc.internal:9003\"\ninsecure = true\n").unwrap();
        assert!(cfg.log.exposure().unwrap().contains("in clear"));
        assert!(cfg.log.fluvio_settings().tls.is_none());
        for local in ["127.0.0.1:9003", "localhost:9003", "[::1]:9003"] {
            let cfg = parse(&format!("endpoint = \"{local}\"\n")).unwrap();
            assert!(cfg.log.exposure().is_none(), "{local}");
        }
    }

    #[test]
    fn log_tls_maps_onto_the_client_and_its_files_are_read_at_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("walhook.toml");
        let text = format!(
            "{BASE}endpoint = \"sc.fluvio.internal:9003\"\n[log.tls]\nca_file = \"ca.pem\"\n\
             cert_file = \"walhook.pem\"\nkey_file = \"walhook.key\"\n"
        );
        std::fs::write(&path, &text).unwrap();
        let cfg = Config::parse(&text).unwrap();
        let tls = cfg.log.fluvio_settings().tls.unwrap();
        assert_eq!(
            tls.domain, "sc.fluvio.internal",
            "the endpoint's host by default"
        );
        assert_eq!(tls.verify, walhook_connectors::fluvio::TlsVerify::Full);
        assert!(cfg.log.exposure().is_none());
        // Relative to the config's folder, and read when the file loads.
        let err = format!("{:#}", Config::load(&path).unwrap_err());
        assert!(
            err.contains("[log.tls].ca_file")
                && err.contains(&dir.path().join("ca.pem").display().to_string()),
            "{err}"
        );

        let err = format!(
            "{:#}",
            parse("endpoint = \"10.1.2.3:9003\"\n[log.tls]\nca_file = \"ca.pem\"\n").unwrap_err()
        );
        assert!(
            err.contains("[log.tls].domain = \"10.1.2.3\" is an IP address"),
            "{err}"
        );
        parse("endpoint = \"10.1.2.3:9003\"\n[log.tls]\nmode = \"verify-ca\"\n").unwrap();
        let err = format!(
            "{:#}",
            parse("[log.tls]\ncert_file = \"walhook.pem\"\n").unwrap_err()
        );
        assert!(err.contains("cert_file and key_file go together"), "{err}");
        let err = format!(
            "{:#}",
            parse("[log.tls]\nmode = \"require\"\n").unwrap_err()
        );
        assert!(err.contains("unknown variant `require`"), "{err}");
    }
}

mod redaction_tests {
    use super::*;

    const CONFIG: &str = "[platform]\nurl = \"postgres://walhook:pl4tf0rm-pw@db:5432/walhook?sslmode=verify-full\"\n\
        sslrootcert = \"ca.pem\"\n\n[source]\nurl = \"host=shop user=cap password='s0urce pw' dbname=shop\"\n\n\
        [[rules]]\nname = \"m\"\nkind = \"message\"\nprefix = \"app\"\n";

    #[test]
    fn database_passwords_never_print() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("walhook.toml");
        std::fs::write(&path, CONFIG).unwrap();
        let cfg = Config::load(&path).unwrap();
        let shown = format!("{cfg:?} {cfg:#?}");
        for secret in ["pl4tf0rm-pw", "s0urce pw", "s0urce"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("postgres://walhook:***@db:5432/walhook?sslmode=verify-full"));
        // The section's CA file is read from the config's folder.
        let p = cfg.platform().unwrap();
        assert_eq!(
            p.sslrootcert.as_deref(),
            Some(dir.path().join("ca.pem").as_path())
        );
        assert!(!format!("{:?}", p.connect_options().unwrap()).contains("pl4tf0rm-pw"));

        // Errors about the URLs name the field, never the URL.
        let bad = CONFIG.replace("sslmode=verify-full", "sslmode=verify-fully");
        let err = format!("{:#}", Config::parse(&bad).unwrap_err());
        assert!(
            err.contains("verify-fully") && !err.contains("pl4tf0rm-pw"),
            "{err}"
        );
        let bad = CONFIG.replace("dbname=shop", "dbname=shop bogus=1");
        let err = format!("{:#}", Config::parse(&bad).unwrap_err());
        assert!(
            err.contains("[source].url") && !err.contains("s0urce"),
            "{err}"
        );
        let bad = CONFIG.replace("sslrootcert = \"ca.pem\"", "sslmode = \"require\"");
        let err = format!("{:#}", Config::parse(&bad).unwrap_err());
        assert!(
            err.contains("[platform].sslmode") && !err.contains("pl4tf0rm-pw"),
            "{err}"
        );
    }
}
