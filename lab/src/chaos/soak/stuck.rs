//! What a soak prints when its backlog did not drain: which stage holds
//! it and what every Postgres session is doing.

use crate::chaos::world::World;

/// Where the stages stand, once per run.
const STAGES: &str = "SELECT (SELECT count(*) FROM walhook.events), \
    (SELECT count(*) FROM walhook.fanouts), \
    (SELECT count(*) FROM walhook.pending WHERE lease_owner IS NOT NULL), \
    (SELECT count(*) FROM walhook.pending WHERE lease_owner IS NULL), \
    (SELECT coalesce(max(pg_current_wal_lsn() - confirmed_flush_lsn), 0)::int8 FROM pg_replication_slots)";

/// Every client session and walsender of the cluster: what it waits on and
/// for how long its transaction has been open.
const SESSIONS: &str = "SELECT pid, coalesce(datname::text, ''), coalesce(state, ''), \
    coalesce(wait_event_type || ':' || wait_event, ''), \
    coalesce(extract(epoch FROM now() - xact_start)::int8, -1), \
    left(regexp_replace(coalesce(query, ''), '\\s+', ' ', 'g'), 160) \
    FROM pg_stat_activity \
    WHERE pid <> pg_backend_pid() AND backend_type IN ('client backend', 'walsender') \
    ORDER BY xact_start NULLS LAST";

/// The backlog did not drain within the settle time: prints which stage
/// holds it and what every Postgres session is doing, so that a run that
/// fails says why (walhook's log, kept, says what walhook did).
pub(super) async fn print_stuck(world: &World) {
    let client = match world.pg.connect("walhook").await {
        Ok(c) => c,
        Err(e) => {
            println!("the backlog did not drain; Postgres cannot be asked why: {e}");
            return;
        }
    };
    match client.query_one(STAGES, &[]).await {
        Ok(r) => println!(
            "the backlog did not drain: {} events fanned out, {} plans left, pending deliveries {} held and {} unheld, slot lag {} bytes",
            r.get::<_, i64>(0),
            r.get::<_, i64>(1),
            r.get::<_, i64>(2),
            r.get::<_, i64>(3),
            r.get::<_, i64>(4)
        ),
        Err(e) => println!("the backlog did not drain; the stages cannot be read: {e}"),
    }
    match client.query(SESSIONS, &[]).await {
        Ok(rows) => {
            println!("Postgres sessions (pid, database, state, wait, transaction age s, query):");
            for r in rows {
                println!(
                    "  {} {} {} {} {} {}",
                    r.get::<_, i32>(0),
                    r.get::<_, String>(1),
                    r.get::<_, String>(2),
                    r.get::<_, String>(3),
                    r.get::<_, i64>(4),
                    r.get::<_, String>(5)
                );
            }
        }
        Err(e) => println!("the sessions cannot be read: {e}"),
    }
}
