//! A flood of unauthenticated API requests for `walhook bench pipeline
//! --api-flood`: `/metrics`, `/readyz` and calls with keys that do not
//! exist, at a fixed rate, to loopback only. It shows what such a flood
//! costs the pipeline next to it (the API has its own pool, limits and
//! cached gauges).

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
    let paths = [
        ("/metrics", None),
        ("/readyz", None),
        (
            "/v1/webhook-endpoints",
            Some("whk_not-a-key-of-anyone-0123456789abcdef"),
        ),
        ("/v1/webhook-deliveries", Some("garbage")),
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
                if let Some(key) = key {
                    req = req.bearer_auth(key);
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
