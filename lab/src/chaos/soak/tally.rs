//! The soak's judgement: the receiver's requests folded into a tally as
//! they arrive (an hour's bodies are not kept), and the tally judged
//! against every order the business database kept.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use walhook_devkit::postgres::connect_retrying;
use walhook_devkit::receiver::Received;

use crate::chaos::world::World;

/// What the receiver saw of one (endpoint, fact).
struct Seen {
    first_id: u64,
    unstable: bool,
    ok: u32,
}

/// The receiver's requests folded as they come, so that an hour's bodies
/// are not kept.
#[derive(Default)]
pub(super) struct Tally {
    /// (endpoint index, paid, order id).
    seen: HashMap<(u16, bool, i64), Seen>,
    pub(super) bad_signatures: u64,
    foreign: u64,
}

impl Tally {
    pub(super) fn fold(&mut self, paths: &HashMap<String, u16>, batch: Vec<Received>) {
        for r in batch {
            let body: Option<serde_json::Value> = serde_json::from_slice(&r.body).ok();
            let fact = body.as_ref().and_then(|b| {
                let paid = match b["type"].as_str()? {
                    "order.created" => false,
                    "order.paid" => true,
                    _ => return None,
                };
                Some((paid, b["object_id"].as_str()?.parse::<i64>().ok()?))
            });
            let (Some(&ep), Some((paid, id))) = (paths.get(&r.path), fact) else {
                self.foreign += 1;
                continue;
            };
            if r.verified == Some(false) {
                self.bad_signatures += 1;
            }
            let mut h = DefaultHasher::new();
            r.webhook_id.hash(&mut h);
            let hash = h.finish();
            let seen = self.seen.entry((ep, paid, id)).or_insert(Seen {
                first_id: hash,
                unstable: false,
                ok: 0,
            });
            seen.unstable |= seen.first_id != hash;
            if (200..300).contains(&r.status) {
                seen.ok += 1;
            }
        }
    }
}

/// The orders the business database kept, judged against the tally:
/// (orders, expected, lost, unexpected, unstable, duplicates).
pub(super) async fn judge(
    world: &World,
    tally: &Tally,
) -> anyhow::Result<(u64, u64, u64, u64, u64, u64)> {
    let shop = connect_retrying(&world.pg.url("shop"), Duration::from_secs(30)).await?;
    let rows = shop
        .query("SELECT id, tenant_id, status = 'paid' FROM orders", &[])
        .await?;
    let (mut expected, mut lost, mut matched) = (0u64, 0u64, 0u64);
    for r in &rows {
        let (id, tenant, paid): (i64, String, bool) = (r.get(0), r.get(1), r.get(2));
        let mut facts = vec![(false, "order.created")];
        if paid {
            facts.push((true, "order.paid"));
        }
        for (is_paid, event_type) in facts {
            for (ep, _) in world
                .endpoints
                .iter()
                .enumerate()
                .filter(|(_, e)| e.wants(&tenant, event_type))
            {
                expected += 1;
                match tally.seen.get(&(ep as u16, is_paid, id)) {
                    Some(s) => {
                        matched += 1;
                        if s.ok == 0 {
                            lost += 1;
                        }
                    }
                    None => lost += 1,
                }
            }
        }
    }
    let unexpected = tally.seen.len() as u64 - matched + tally.foreign;
    let unstable = tally.seen.values().filter(|s| s.unstable).count() as u64;
    let duplicates = tally
        .seen
        .values()
        .map(|s| u64::from(s.ok.saturating_sub(1)))
        .sum();
    Ok((
        rows.len() as u64,
        expected,
        lost,
        unexpected,
        unstable,
        duplicates,
    ))
}
