//! The platform database picks a deliveries partition's deliveries with
//! `walhook.delivery_partition`: it must agree with the routes fan-out
//! sends jobs by, or a partition's dispatcher would claim another's
//! deliveries (and leave its own).

use walhook_devkit::postgres::LocalPostgres;
use walhook_pipeline::ids::{DeliveryId, EndpointId};
use walhook_pipeline::routing::partition_of;

#[tokio::test]
async fn the_database_computes_the_partition_fan_out_routes_by() {
    let pg = LocalPostgres::start().await.unwrap();
    let mut sql = pg.connect("postgres").await.unwrap();
    walhook_sql::migrate::run(&mut sql).await.unwrap();
    let mut endpoints = Vec::new();
    let mut deliveries = Vec::new();
    let mut partitions = Vec::new();
    let mut shards = Vec::new();
    let mut want = Vec::new();
    for i in 0..2000u32 {
        let mut e: [u8; 16] = rand::random();
        let d: [u8; 16] = rand::random();
        // The extremes of the four bytes that decide.
        if i < 4 {
            e[12..16].copy_from_slice(
                &[[0xff; 4], [0; 4], [0x80, 0, 0, 0], [0x7f, 0xff, 0xff, 0xff]][i as usize],
            );
        }
        let n = [1u32, 2, 3, 7, 16, 64][i as usize % 6];
        let k = [1u32, 2, 4, 7][i as usize % 4].min(n);
        endpoints.push(uuid::Uuid::from_bytes(e));
        deliveries.push(uuid::Uuid::from_bytes(d));
        partitions.push(n as i32);
        shards.push(k as i32);
        want.push(partition_of(EndpointId(e), DeliveryId(d), n, k) as i32);
    }
    let got: Vec<i32> = sql
        .query(
            "SELECT walhook.delivery_partition(e, d, n, k) \
             FROM unnest($1::uuid[], $2::uuid[], $3::int4[], $4::int4[]) WITH ORDINALITY AS t(e, d, n, k, i) \
             ORDER BY i",
            &[&endpoints, &deliveries, &partitions, &shards],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g, w,
            "endpoint {} delivery {} over {} partitions, {} shards",
            endpoints[i], deliveries[i], partitions[i], shards[i]
        );
    }
    assert_eq!(got.len(), want.len());
}
