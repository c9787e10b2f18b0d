//! The change source contract (`walhook_pipeline::capture::source::contract`)
//! against a real Postgres: each check gets a table, a publication and a
//! slot of its own in one throwaway cluster.

use std::sync::atomic::{AtomicU32, Ordering};

use walhook_connectors::postgres::PostgresSource;
use walhook_connectors::postgres::config::{RuleConfig, SourceConfig};
use walhook_devkit::postgres::LocalPostgres;
use walhook_pipeline::capture::source::contract::{SourceFixture, check_all};

struct Postgres {
    url: String,
    db: tokio_postgres::Client,
    next: AtomicU32,
}

impl SourceFixture for Postgres {
    type Source = PostgresSource;

    async fn fresh(&self) -> PostgresSource {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let table = format!("items_{n}");
        self.db
            .batch_execute(&format!(
                "CREATE TABLE {table} (id text PRIMARY KEY, tenant_id text NOT NULL)"
            ))
            .await
            .unwrap();
        let source: SourceConfig = toml::from_str(&format!(
            "name = \"contract-{n}\"\nurl = \"{}\"\nslot = \"contract_{n}\"\npublication = \"contract_{n}\"\n\
             create_slot = true\ncreate_publication = true\nheartbeat_interval = \"200ms\"\nstatus_interval = \"100ms\"\n",
            self.url
        ))
        .unwrap();
        let rules: Vec<RuleConfig> = toml::from_str::<super::capture::Rules>(&format!(
            "[[rules]]\nname = \"item_created\"\ntable = \"{table}\"\noperations = [\"insert\"]\n\
             event_type = \"item.created\"\ntenant_column = \"tenant_id\"\nobject_id_column = \"id\"\n"
        ))
        .unwrap()
        .rules;
        PostgresSource::prepare(source, rules).await.unwrap()
    }

    async fn commit(&self, source: &PostgresSource, objects: &[&str]) {
        let values: Vec<String> = objects.iter().map(|o| format!("('{o}', 'acme')")).collect();
        // One statement: one transaction, its rows in this order.
        self.db
            .batch_execute(&format!(
                "INSERT INTO items_{} (id, tenant_id) VALUES {}",
                source.config().name.trim_start_matches("contract-"),
                values.join(", ")
            ))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn the_postgres_source_keeps_the_source_contract() {
    let pg = LocalPostgres::start().await.unwrap();
    let url = pg.create_database("contract").await.unwrap();
    let db = pg.connect("contract").await.unwrap();
    let fixture = Postgres {
        url,
        db,
        next: AtomicU32::new(0),
    };
    check_all(&fixture).await.unwrap();
}
