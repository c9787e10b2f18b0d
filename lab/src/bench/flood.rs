//! A flood of unauthenticated API requests for `walhook bench pipeline
//! --api-flood`: `/metrics` without a token (401), `/readyz` and calls with
//! keys that do not exist, at a fixed rate, to loopback only. It shows what
//! such a flood costs the pipeline next to it (the API has its own pool,
//! limits and cached gauges). From one address, the made-up keys soon meet
//! `[api].failed_authentications_per_minute` (429) and the per-address
//! share of request slots: the answers by status say so.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

/// What the flood sent and got back.
#[derive(Debug, Default, Clone)]
pub struct FloodReport {
    /// Requests sent.
    pub sent: u64,
    /// Answers by status (0: no answer).
    pub statuses: BTreeMap<u16, u64>,
}

/// Sends `rate` requests per second to the API at `port` on 127.0.0.1
/// from `clients` connections until `stop`.
pub fn start(
    port: u16,
    rate: u64,
    clients: u64,
    stop: CancellationToken,
) -> (Arc<Mutex<FloodReport>>, Vec<tokio::task::JoinHandle<()>>) {
    let report = Arc::new(Mutex::new(FloodReport::default()));
    let per_client = Duration::from_secs_f64(clients as f64 / rate.max(1) as f64);
    // Unknown keys of the right form (the worst case: each could be a
    // key), and plain garbage.
    let paths = [
        ("/metrics", None),
        ("/readyz", None),
        ("/v1/webhook-endpoints", Some(true)),
        ("/v1/webhook-deliveries", Some(false)),
    ];
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (report, stop) = (report.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(5))
                .build()
                .expect("an HTTP client");
            let mut tick = tokio::time::interval(per_client);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut n = c as usize;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let (path, key) = paths[n % paths.len()];
                n += 1;
                let mut req = http.get(format!("http://127.0.0.1:{port}{path}"));
                match key {
                    Some(true) => req = req.bearer_auth(made_up_key(n as u64)),
                    Some(false) => req = req.bearer_auth("garbage"),
                    None => {}
                }
                let status = match req.send().await {
                    Ok(r) => {
                        let s = r.status().as_u16();
                        let _ = r.bytes().await;
                        s
                    }
                    Err(_) => 0,
                };
                let mut rep = report.lock();
                rep.sent += 1;
                *rep.statuses.entry(status).or_default() += 1;
            }
        }));
    }
    (report, tasks)
}

/// A key of the form walhook issues (`whk_` and 43 URL-safe base64
/// characters) that no one was given, different for every `n`.
fn made_up_key(n: u64) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut key = String::from("whk_");
    for _ in 0..43 {
        // xorshift64: cheap, and every key differs.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        key.push(ALPHABET[(x % 64) as usize] as char);
    }
    key
}
