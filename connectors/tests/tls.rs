//! Capture over TLS: the SQL session and the replication stream against a
//! cluster that takes TCP connections over TLS only (`hostssl`), so a
//! stream that reads anything used TLS.

use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pgwire_replication::ReplicationClient;
use tokio_util::sync::CancellationToken;
use walhook_connectors::postgres::config::{RuleConfig, SourceConfig};
use walhook_connectors::postgres::connect::{connect_sql, replication_config};
use walhook_connectors::postgres::{CaptureObserver, PostgresSource, RunOptions};
use walhook_devkit::postgres::LocalPostgres;
use walhook_devkit::tls::TestCa;
use walhook_pgtls::ConnectOptions;

use crate::capture::Collect;

/// A TLS-only cluster with a database `shop`, and two CA files: the one
/// that signed the server's certificate and another.
struct TlsWorld {
    pg: LocalPostgres,
    ca: PathBuf,
    wrong_ca: PathBuf,
    _dir: tempfile::TempDir,
}

async fn world() -> TlsWorld {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("walhook test CA").unwrap();
    let server = ca.server_cert(&["localhost", "127.0.0.1"]).unwrap();
    let pg = LocalPostgres::builder()
        .tls(server)
        .tls_only()
        .start()
        .await
        .unwrap();
    pg.create_database("shop").await.unwrap();
    pg.connect("shop")
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE orders (id bigint PRIMARY KEY, tenant_id text NOT NULL, state text NOT NULL);
             ALTER TABLE orders REPLICA IDENTITY FULL;",
        )
        .await
        .unwrap();
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
    fn source(&self, params: &str) -> (SourceConfig, Vec<RuleConfig>) {
        let url = format!(
            "postgres://postgres:hunter2@localhost:{}/shop?{params}",
            self.pg.port()
        );
        let source: SourceConfig = toml::from_str(&format!(
            "url = \"{url}\"\ncreate_slot = true\ncreate_publication = true\n\
             heartbeat_interval = \"200ms\"\nstatus_interval = \"100ms\""
        ))
        .unwrap();
        let rules: Rules = toml::from_str(
            r#"[[rules]]
            name = "order_changed"
            table = "orders"
            event_type = "order.changed"
            tenant_column = "tenant_id"
            object_id_column = "id""#,
        )
        .unwrap();
        (source, rules.rules)
    }

    fn verify_full(&self, ca: &std::path::Path) -> String {
        format!("sslmode=verify-full&sslrootcert={}", ca.display())
    }
}

#[derive(serde::Deserialize)]
struct Rules {
    rules: Vec<RuleConfig>,
}

struct Quiet;
impl CaptureObserver for Quiet {}

/// What a replication stream with `options` ends with (it connects in the
/// background, so its first message says).
async fn first_stream_error(options: &ConnectOptions) -> pgwire_replication::PgWireError {
    let mut client = ReplicationClient::connect(replication_config(options, "walhook", "walhook"))
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), client.recv())
        .await
        .expect("the stream neither failed nor delivered");
    match first {
        Err(e) => e,
        Ok(event) => panic!("the stream must not connect, got {event:?}"),
    }
}

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

#[tokio::test]
async fn capture_streams_a_change_over_verified_tls() {
    let w = world().await;
    let (cfg, rules) = w.source(&w.verify_full(&w.ca));
    let source = PostgresSource::prepare(cfg, rules).await.unwrap();
    let sql = connect_sql(&source.config().connect_options().unwrap())
        .await
        .unwrap();
    let ssl: bool = sql
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(ssl, "the SQL session is encrypted");
    sql.batch_execute("INSERT INTO orders VALUES (1, 'acme', 'new')")
        .await
        .unwrap();
    let sink = Collect::default();
    let options = RunOptions {
        confirm: true,
        stop_when_caught_up: true,
    };
    tokio::time::timeout(
        Duration::from_secs(60),
        source.run(
            sink.clone(),
            Arc::new(Quiet),
            options,
            CancellationToken::new(),
        ),
    )
    .await
    .expect("capture did not catch up")
    .unwrap();
    let events: Vec<String> = sink
        .events()
        .iter()
        .map(|e| e.event_type.to_string())
        .collect();
    // The server takes TCP over TLS only, so the stream that read this
    // used TLS (verified against the test CA).
    assert_eq!(events, ["order.changed"]);
}

#[tokio::test]
async fn a_wrong_ca_is_refused_by_the_sql_session_and_the_stream() {
    let w = world().await;
    let (cfg, rules) = w.source(&w.verify_full(&w.wrong_ca));
    let options = cfg.connect_options().unwrap();
    let err = PostgresSource::prepare(cfg, rules).await.err().unwrap();
    let text = chain(&err);
    assert!(
        text.contains("the server certificate of localhost did not verify against the CA in")
            && text.contains("wrong-ca.pem"),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");
    assert!(!err.is_transient(), "the operator must fix the CA");

    // The stream on its own (pgwire-replication's TLS) refuses too, rather
    // than falling back to plaintext.
    let err = first_stream_error(&options).await;
    assert!(err.is_tls(), "{err}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

#[tokio::test]
async fn require_connects_and_disable_is_refused_by_a_tls_only_server() {
    let w = world().await;
    let (cfg, _) = w.source("sslmode=require");
    let sql = connect_sql(&cfg.connect_options().unwrap()).await.unwrap();
    let ssl: bool = sql
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(ssl);

    let (cfg, rules) = w.source("sslmode=disable");
    let err = PostgresSource::prepare(cfg.clone(), rules)
        .await
        .err()
        .unwrap();
    let text = chain(&err);
    assert!(
        text.contains("no pg_hba.conf entry") && text.contains("no encryption"),
        "{text}"
    );
    assert!(!err.is_transient());
    let options = cfg.connect_options().unwrap();
    let err = first_stream_error(&options).await;
    assert!(err.to_string().contains("no encryption"), "{err}");
}
