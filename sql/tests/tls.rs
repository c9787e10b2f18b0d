//! The platform pool over TLS, against a cluster with `ssl = on` and a
//! certificate from a CA made in the test.

use std::error::Error;
use std::path::PathBuf;

use walhook_devkit::postgres::LocalPostgres;
use walhook_devkit::tls::TestCa;
use walhook_pgtls::DatabaseUrl;
use walhook_pgtls::{ConnectOptions, SslMode, TlsFields};
use walhook_sql::{Platform, StoreError};

/// A TLS cluster, the CA that signed its certificate, and another CA.
struct TlsWorld {
    pg: LocalPostgres,
    ca: PathBuf,
    wrong_ca: PathBuf,
    _dir: tempfile::TempDir,
}

async fn world(tls_only: bool) -> TlsWorld {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("walhook test CA").unwrap();
    let server = ca.server_cert(&["localhost", "127.0.0.1"]).unwrap();
    let mut builder = LocalPostgres::builder().tls(server);
    if tls_only {
        builder = builder.tls_only();
    }
    let pg = builder.start().await.unwrap();
    TlsWorld {
        ca: ca.write_pem(dir.path(), "ca.pem").unwrap(),
        wrong_ca: TestCa::new("another CA")
            .unwrap()
            .write_pem(dir.path(), "wrong-ca.pem")
            .unwrap(),
        pg,
        _dir: dir,
    }
}

impl TlsWorld {
    /// A URL to `host` (the password is ignored by the trust rules, and
    /// must never show in an error).
    fn url(&self, host: &str, params: &str) -> String {
        format!(
            "postgres://postgres:hunter2@{host}:{}/postgres?{params}",
            self.pg.port()
        )
    }
}

/// An error and its sources, as the binary prints them.
fn chain(e: &(dyn Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        text.push_str(": ");
        text.push_str(&s.to_string());
        cur = s.source();
    }
    text
}

/// Whether the pool's session is encrypted, by the server's account.
async fn ssl_in_use(platform: &Platform) -> Result<bool, StoreError> {
    let client = platform.client().await?;
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .map_err(StoreError::query("read pg_stat_ssl"))?;
    Ok(row.get(0))
}

#[tokio::test]
async fn verify_full_with_the_right_ca_connects_by_name_and_by_address() {
    let w = world(true).await;
    let ca = w.ca.display();
    // The certificate lists both: a DNS name and an IP address entry.
    for host in ["localhost", "127.0.0.1"] {
        let url = w.url(host, &format!("sslmode=verify-full&sslrootcert={ca}"));
        let platform = Platform::new(&url, 2).unwrap();
        assert!(ssl_in_use(&platform).await.unwrap(), "{host}");
    }
    // The same policy from the section's fields instead of the URL.
    let fields = TlsFields {
        sslmode: Some(SslMode::VerifyFull),
        sslrootcert: Some(w.ca.clone()),
    };
    let url = DatabaseUrl::new(w.url("localhost", "application_name=walhook"));
    let options = ConnectOptions::parse(&url, "[platform]", &fields).unwrap();
    let platform = Platform::from_options(&options, 2, &Default::default()).unwrap();
    assert!(ssl_in_use(&platform).await.unwrap());
}

#[tokio::test]
async fn verify_full_with_a_wrong_ca_refuses_and_says_what_to_check() {
    let w = world(false).await;
    let url = w.url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", w.wrong_ca.display()),
    );
    let platform = Platform::new(&url, 2).unwrap();
    let err = ssl_in_use(&platform).await.unwrap_err();
    let text = chain(&err);
    assert!(
        text.contains("the server certificate of localhost did not verify against the CA in")
            && text.contains("wrong-ca.pem")
            && text.contains("check that sslrootcert holds the CA that signed"),
        "{text}"
    );
    assert!(!text.contains("hunter2") && !format!("{err:?}").contains("hunter2"));
    assert!(
        !err.is_transient(),
        "a certificate that does not verify needs the operator"
    );
}

#[tokio::test]
async fn verify_full_refuses_a_host_name_the_certificate_does_not_list() {
    let w = world(false).await;
    // `hostaddr` connects to loopback while TLS checks the name.
    let conn = format!(
        "host=db.walhook.test hostaddr=127.0.0.1 port={} user=postgres dbname=postgres \
         sslmode=verify-full sslrootcert={}",
        w.pg.port(),
        w.ca.display()
    );
    let err = ssl_in_use(&Platform::new(&conn, 1).unwrap())
        .await
        .unwrap_err();
    let text = chain(&err);
    assert!(
        text.contains("not valid for the host name db.walhook.test"),
        "{text}"
    );
    assert!(!err.is_transient());
    // verify-ca checks the chain only, so the same name passes.
    let conn = conn.replace("verify-full", "verify-ca");
    assert!(ssl_in_use(&Platform::new(&conn, 1).unwrap()).await.unwrap());
}

#[tokio::test]
async fn require_encrypts_without_verifying() {
    let w = world(true).await;
    let platform = Platform::new(&w.url("127.0.0.1", "sslmode=require"), 2).unwrap();
    assert!(ssl_in_use(&platform).await.unwrap());
    // Without sslmode, libpq's `prefer` takes the TLS the server offers.
    let platform = Platform::new(&w.url("127.0.0.1", ""), 2).unwrap();
    assert!(ssl_in_use(&platform).await.unwrap());
}

#[tokio::test]
async fn disable_against_a_server_that_requires_tls_fails_clearly() {
    let w = world(true).await;
    let platform = Platform::new(&w.url("127.0.0.1", "sslmode=disable"), 2).unwrap();
    let err = ssl_in_use(&platform).await.unwrap_err();
    let text = chain(&err);
    assert!(
        text.contains("no pg_hba.conf entry") && text.contains("no encryption"),
        "{text}"
    );
    assert!(
        !err.is_transient(),
        "the server refused the client: SQLSTATE 28000"
    );
}

#[tokio::test]
async fn a_missing_ca_file_stops_the_pool_and_names_the_path() {
    let w = world(false).await;
    let url = w.url(
        "localhost",
        "sslmode=verify-full&sslrootcert=/nonexistent/walhook/ca.pem",
    );
    let err = Platform::new(&url, 2).unwrap_err();
    let text = chain(&err);
    assert!(
        text.contains("sslrootcert /nonexistent/walhook/ca.pem cannot be read"),
        "{text}"
    );
    assert!(!text.contains("hunter2"));
}

/// SCRAM over TLS binds the login to the TLS session (SCRAM-SHA-256-PLUS,
/// `tls-server-end-point`): with `channel_binding=require` tokio-postgres
/// logs in only when the server offered -PLUS and walhook's connector gave
/// it the hash of the certificate this session presented, and the server
/// accepts the login only when that hash is the one of its own
/// certificate. Against the same server a wrong password is refused, so
/// the login really is SCRAM's.
#[tokio::test]
async fn scram_over_tls_binds_the_login_to_the_session() {
    let w = world(true).await;
    let admin = w.pg.connect("postgres").await.unwrap();
    admin
        .batch_execute(
            "SET password_encryption = 'scram-sha-256'; \
             CREATE ROLE binder LOGIN PASSWORD 'b1nd-me'",
        )
        .await
        .unwrap();
    // Passwords only over TLS, only by SCRAM (the superuser keeps its
    // trust rule for devkit's own sessions).
    std::fs::write(
        w.pg.data_dir().join("pg_hba.conf"),
        "local   all all                 trust\n\
         hostssl all postgres 127.0.0.1/32 trust\n\
         hostssl all binder   127.0.0.1/32 scram-sha-256\n",
    )
    .unwrap();
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    let url = |password: &str, params: &str| {
        format!(
            "postgres://binder:{password}@localhost:{}/postgres?{params}",
            w.pg.port()
        )
    };
    // The reload is asynchronous: wait until the server asks for SCRAM
    // (a wrong password is refused) instead of sleeping.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let wrong = Platform::new(&url("wrong", "sslmode=require"), 1).unwrap();
        match ssl_in_use(&wrong).await {
            Err(e) if chain(&e).contains("password authentication failed") => break,
            other => assert!(
                std::time::Instant::now() < deadline,
                "the SCRAM rule never took effect: {other:?}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let ca = w.ca.display().to_string();
    for params in [
        "sslmode=require&channel_binding=require".to_string(),
        format!("sslmode=verify-full&sslrootcert={ca}&channel_binding=require"),
        // The default (`prefer`) binds too; `disable` logs in unbound.
        format!("sslmode=verify-full&sslrootcert={ca}"),
        "sslmode=require&channel_binding=disable".to_string(),
    ] {
        let platform = Platform::new(&url("b1nd-me", &params), 1).unwrap();
        let in_use = ssl_in_use(&platform).await;
        assert!(
            matches!(in_use, Ok(true)),
            "{params}: {:?}",
            in_use.map_err(|e| chain(&e))
        );
    }
}
