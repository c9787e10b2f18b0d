//! The Postgres fan-out and dispatch store keeps the contract the
//! in-memory twin keeps (`walhook_pipeline::store::contract`): each check
//! on a database of its own, copied from a migrated template.

use std::sync::atomic::{AtomicU32, Ordering};

use walhook_devkit::postgres::LocalPostgres;
use walhook_pipeline::ids::{DeliveryId, TenantId};
use walhook_pipeline::store::StoreError;
use walhook_pipeline::store::contract::{self, ENDPOINTS, Fixture, TENANT};
use walhook_sql::Platform;

const TEMPLATE: &str = "contract_template";

struct Cluster {
    pg: LocalPostgres,
    made: AtomicU32,
}

impl Cluster {
    /// A cluster with a template database: migrated, with the contract's
    /// tenant and endpoints.
    async fn start() -> Cluster {
        let pg = LocalPostgres::start().await.unwrap();
        pg.create_database(TEMPLATE).await.unwrap();
        {
            let mut sql = pg.connect(TEMPLATE).await.unwrap();
            walhook_sql::migrate::run(&mut sql).await.unwrap();
            sql.execute(
                "INSERT INTO walhook.tenants (id, name) VALUES ($1, 'Contract')",
                &[&TENANT],
            )
            .await
            .unwrap();
            for ep in ENDPOINTS {
                sql.execute(
                    "INSERT INTO walhook.endpoints (id, tenant_id, url) VALUES ($1, $2, 'https://127.0.0.1/hook')",
                    &[&uuid::Uuid::from_bytes(ep.0), &TENANT],
                )
                .await
                .unwrap();
            }
        }
        Cluster {
            pg,
            made: AtomicU32::new(0),
        }
    }
}

fn failed(what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> StoreError {
    move |e| StoreError::transient(what, e)
}

impl Fixture for Cluster {
    type Store = Platform;

    async fn fresh(&self) -> Result<Platform, StoreError> {
        let name = format!("contract_{}", self.made.fetch_add(1, Ordering::Relaxed));
        let admin = self
            .pg
            .connect("postgres")
            .await
            .map_err(failed("connect"))?;
        // The template's last session may still be closing.
        let mut tries = 0;
        loop {
            match admin
                .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {TEMPLATE}"))
                .await
            {
                Ok(()) => break,
                Err(e) if tries < 50 => {
                    tries += 1;
                    tracing::debug!(error = %e, "the template is busy; trying again");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => return Err(failed("copy the template database")(e)),
            }
        }
        Platform::new(&self.pg.url(&name), 4).map_err(StoreError::from)
    }

    async fn request_replay(
        &self,
        store: &Platform,
        delivery: DeliveryId,
    ) -> Result<i64, StoreError> {
        Ok(store.request_replay(delivery, "contract").await?)
    }

    async fn cancel(&self, store: &Platform, delivery: DeliveryId) -> Result<(), StoreError> {
        let tenant = TenantId::new(TENANT).unwrap();
        store
            .cancel_delivery_of_tenant(&tenant, delivery, "contract")
            .await?;
        Ok(())
    }
}

#[tokio::test]
async fn the_postgres_store_keeps_the_store_contract() {
    let cluster = Cluster::start().await;
    contract::check_all(&cluster).await.unwrap();
}
