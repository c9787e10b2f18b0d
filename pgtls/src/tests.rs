//! Reading connection strings and section fields into options. The
//! handshakes themselves are tested against real servers in `sql` and
//! `connectors`.

use std::path::PathBuf;

use crate::DatabaseUrl;

use crate::*;

fn parse(url: &str, fields: TlsFields) -> Result<ConnectOptions, ConnectError> {
    ConnectOptions::parse(&DatabaseUrl::new(url), "[platform]", &fields)
}

fn mode(url: &str) -> (SslMode, Roots, Verification) {
    let o = parse(url, TlsFields::default()).unwrap();
    (o.tls().mode, o.tls().roots.clone(), o.tls().verification())
}

#[test]
fn url_parameters_set_the_policy_like_libpq() {
    use tokio_postgres::config::SslMode as Transport;
    let o = parse(
        "postgres://u:pw@db.example.com:6432/app?sslmode=verify-full&sslrootcert=/etc/ca.pem&application_name=walhook",
        TlsFields::default(),
    )
    .unwrap();
    assert_eq!(o.tls().mode, SslMode::VerifyFull);
    assert_eq!(o.tls().roots, Roots::File(PathBuf::from("/etc/ca.pem")));
    assert_eq!(o.tls().verification(), Verification::Full);
    assert_eq!(o.config().get_ssl_mode(), Transport::Require);
    assert_eq!(o.config().get_application_name(), Some("walhook"));
    assert_eq!(o.config().get_password(), Some(&b"pw"[..]));
    assert_eq!(o.config().get_ports(), [6432]);

    // The default is libpq's: prefer, nothing checked.
    assert_eq!(
        mode("postgres://h/d"),
        (SslMode::Prefer, Roots::BuiltIn, Verification::None)
    );
    assert_eq!(
        mode("postgres://h/d?sslmode=require"),
        (SslMode::Require, Roots::BuiltIn, Verification::None)
    );
    // libpq checks the chain in `require` when a root file is given.
    assert_eq!(
        mode("postgres://h/d?sslmode=require&sslrootcert=ca.pem"),
        (
            SslMode::Require,
            Roots::File("ca.pem".into()),
            Verification::Chain
        )
    );
    assert_eq!(
        mode("postgres://h/d?sslmode=verify-ca").2,
        Verification::Chain
    );
    // libpq 16: `sslrootcert=system` means the built-in roots and
    // verify-full by default.
    assert_eq!(
        mode("postgres://h/d?sslrootcert=system"),
        (SslMode::VerifyFull, Roots::BuiltIn, Verification::Full)
    );
    assert_eq!(mode("host=h dbname=d sslmode=disable").0, SslMode::Disable);
    let o = parse("host=h dbname=d sslmode=disable", TlsFields::default()).unwrap();
    assert_eq!(o.config().get_ssl_mode(), Transport::Disable);
}

#[test]
fn section_fields_and_the_url_agree_or_are_refused() {
    let fields = TlsFields {
        sslmode: Some(SslMode::VerifyFull),
        sslrootcert: Some("/etc/walhook/ca.pem".into()),
    };
    let o = parse("postgres://h/d", fields.clone()).unwrap();
    assert_eq!(o.tls().mode, SslMode::VerifyFull);
    assert_eq!(o.tls().roots, Roots::File("/etc/walhook/ca.pem".into()));
    parse("postgres://h/d?sslmode=verify-full", fields.clone()).unwrap();
    let err = parse("postgres://h/d?sslmode=require", fields)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("[platform].sslmode") && err.contains("require") && err.contains("one place"),
        "{err}"
    );
}

#[test]
fn bad_settings_say_what_is_accepted_and_never_quote_the_url() {
    let cases = [
        (
            "postgres://u:hunter2@h/d?sslmode=verify_full",
            "verify-ca or verify-full",
        ),
        ("postgres://u:hunter2@h/d?sslmode=allow", "verify-full"),
        (
            "postgres://u:hunter2@h/d?sslcert=/c.pem",
            "`sslcert` is not supported",
        ),
        (
            "postgres://u:hunter2@h/d?bogus=1",
            "[platform].url is not a valid",
        ),
        (
            "host=h password=hunter2 sslkey=/k.pem",
            "`sslkey` is not supported",
        ),
    ];
    for (url, expected) in cases {
        let err = parse(url, TlsFields::default()).unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(shown.contains(expected), "{url}: {shown}");
        assert!(!shown.contains("hunter2"), "{url}: {shown}");
    }
}

#[test]
fn a_missing_or_empty_root_file_is_named() {
    let missing = parse(
        "postgres://h/d?sslmode=verify-full&sslrootcert=/nonexistent/walhook-ca.pem",
        TlsFields::default(),
    )
    .unwrap();
    let err = missing.connector().unwrap_err().to_string();
    assert!(
        err.contains("/nonexistent/walhook-ca.pem") && err.contains("cannot be read"),
        "{err}"
    );

    let dir = std::env::temp_dir().join(format!("walhook-pgtls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let o = parse(
        &format!(
            "postgres://h/d?sslmode=verify-ca&sslrootcert={}",
            empty.display()
        ),
        TlsFields::default(),
    )
    .unwrap();
    let err = o.connector().unwrap_err().to_string();
    assert!(
        err.contains("empty.pem") && err.contains("no usable CA"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();

    // Modes that check nothing read no file.
    parse(
        "postgres://h/d?sslmode=verify-full&sslrootcert=system",
        TlsFields::default(),
    )
    .unwrap()
    .connector()
    .unwrap();
    parse("postgres://h/d?sslmode=require", TlsFields::default())
        .unwrap()
        .connector()
        .unwrap();
}

#[test]
fn channel_binding_is_read_from_either_url_form() {
    use tokio_postgres::config::ChannelBinding;
    for (url, want) in [
        ("postgres://h/d", ChannelBinding::Prefer),
        (
            "postgres://h/d?channel_binding=require",
            ChannelBinding::Require,
        ),
        (
            "postgres://h/d?channel_binding=disable",
            ChannelBinding::Disable,
        ),
        (
            "host=h dbname=d channel_binding=require",
            ChannelBinding::Require,
        ),
    ] {
        assert_eq!(
            parse(url, TlsFields::default()).unwrap().channel_binding(),
            want,
            "{url}"
        );
    }
    let err = parse(
        "postgres://u:hunter2@h/d?channel_binding=always",
        TlsFields::default(),
    )
    .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("[platform].url is not a valid"), "{shown}");
    assert!(!shown.contains("hunter2"), "{shown}");
}

#[test]
fn require_binds_everywhere_or_verify_full_stands_in() {
    let client = "the replication stream (pgwire-replication)";
    let check = |url: &str| {
        ConnectOptions::parse(&DatabaseUrl::new(url), "[source]", &TlsFields::default())
            .unwrap()
            .require_binding_everywhere(client)
    };
    check("postgres://h/d").unwrap();
    check("postgres://h/d?channel_binding=prefer&sslmode=require").unwrap();
    check("postgres://h/d?channel_binding=require&sslmode=verify-full").unwrap();
    check("postgres://h/d?channel_binding=require&sslrootcert=system").unwrap();
    for url in [
        "postgres://u:hunter2@h/d?channel_binding=require",
        "postgres://u:hunter2@h/d?channel_binding=require&sslmode=verify-ca&sslrootcert=/ca.pem",
    ] {
        let err = check(url).unwrap_err().to_string();
        assert!(
            err.contains("[source].url sets channel_binding=require")
                && err.contains(client)
                && err.contains("sslmode=verify-full")
                && err.contains("channel_binding=prefer"),
            "{err}"
        );
        assert!(!err.contains("hunter2"), "{err}");
    }
}
