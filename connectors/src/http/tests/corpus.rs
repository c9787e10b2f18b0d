//! The SSRF corpus (`ssrf-corpus.tsv`): every entry refused with its
//! reason, by the URL check or at connect time, and nothing dialled.

use std::net::IpAddr;
use std::sync::Arc;

use walhook_pipeline::dispatch::egress::Egress;

use super::{Recorder, blocked, egress, outbound};
use crate::http::EgressSettings;
use crate::http::resolve::{StaticLookup, resolve};
use walhook_pipeline::url_policy::{RefusalReason, UrlPolicy, VettedHost, check_url};

/// One corpus line.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The line number, for messages.
    pub line: usize,
    /// The expected reason.
    pub reason: RefusalReason,
    /// The URL (escapes decoded).
    pub url: String,
    /// For names refused at connect time: what they resolve to.
    pub answers: Option<Vec<IpAddr>>,
}

fn reason(name: &str) -> RefusalReason {
    match name {
        "malformed" => RefusalReason::Malformed,
        "scheme" => RefusalReason::Scheme,
        "userinfo" => RefusalReason::Userinfo,
        "port" => RefusalReason::Port,
        "host_name" => RefusalReason::HostName,
        "address" => RefusalReason::Address,
        other => panic!("unknown reason {other:?} in the corpus"),
    }
}

fn unescape(s: &str) -> String {
    s.replace("\\t", "\t")
        .replace("\\n", "\n")
        .replace("\\r", "\r")
        .replace("\\\\", "\\")
}

/// The corpus.
pub fn corpus() -> Vec<Entry> {
    include_str!("ssrf-corpus.tsv")
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
        .map(|(i, l)| {
            let cols: Vec<&str> = l.split('\t').collect();
            assert!(
                (2..=3).contains(&cols.len()),
                "corpus line {}: {l:?}",
                i + 1
            );
            let answers = cols.get(2).map(|a| {
                if *a == "-" {
                    Vec::new()
                } else {
                    a.split(',').map(|ip| ip.parse().unwrap()).collect()
                }
            });
            Entry {
                line: i + 1,
                reason: reason(cols[0]),
                url: unescape(cols[1]),
                answers,
            }
        })
        .collect()
}

fn table_for(entries: &[Entry]) -> Arc<StaticLookup> {
    let table = Arc::new(StaticLookup::new());
    for e in entries {
        if let Some(answers) = &e.answers {
            let url = check_url(&e.url, &UrlPolicy::default()).unwrap();
            table.set(url.url.host_str().unwrap(), answers.clone());
        }
    }
    table
}

#[test]
fn the_corpus_is_large_and_covers_every_reason() {
    let entries = corpus();
    assert!(entries.len() >= 150, "only {} entries", entries.len());
    for r in [
        RefusalReason::Malformed,
        RefusalReason::Scheme,
        RefusalReason::Userinfo,
        RefusalReason::Port,
        RefusalReason::HostName,
        RefusalReason::Address,
    ] {
        assert!(entries.iter().any(|e| e.reason == r), "no {r:?} entry");
    }
}

#[tokio::test]
async fn every_entry_is_refused_with_its_reason() {
    let entries = corpus();
    let table = table_for(&entries);
    let policy = UrlPolicy::default();
    let mut wrong = Vec::new();
    for e in &entries {
        let got = match (check_url(&e.url, &policy), &e.answers) {
            (Err(refusal), None) => Some(refusal),
            (Ok(vetted), Some(_)) => {
                let name = vetted.url.host_str().unwrap().to_owned();
                let resolution = resolve(&*table, &name, &policy).await.unwrap();
                resolution.verdict().err()
            }
            (Ok(v), None) => {
                wrong.push(format!(
                    "line {}: {:?} accepted as {}",
                    e.line, e.url, v.url
                ));
                continue;
            }
            (Err(refusal), Some(_)) => {
                wrong.push(format!(
                    "line {}: {:?} refused before resolution: {refusal}",
                    e.line, e.url
                ));
                continue;
            }
        };
        match got {
            Some(r) if r.reason == e.reason => assert!(!r.detail.is_empty()),
            Some(r) => wrong.push(format!(
                "line {}: {:?} refused as {:?} ({}), expected {:?}",
                e.line, e.url, r.reason, r.detail, e.reason
            )),
            None => wrong.push(format!(
                "line {}: {:?} resolved to allowed addresses",
                e.line, e.url
            )),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[tokio::test]
async fn no_entry_reaches_the_network() {
    let entries = corpus();
    let table = table_for(&entries);
    let recorder = Arc::new(Recorder::default());
    let egress = egress(EgressSettings::default(), &table, &recorder);
    for e in &entries {
        let result = egress.send(outbound(&e.url)).await;
        assert_eq!(result, blocked(), "line {}: {:?}", e.line, e.url);
    }
    recorder.assert_only_loopback();
    assert!(recorder.approved.lock().is_empty());
    assert!(recorder.connected.lock().is_empty());
    // Only names that passed the URL rules were looked up, each once.
    let asked: Vec<String> = table.asked().into_iter().map(|(n, _)| n).collect();
    let with_answers = entries.iter().filter(|e| e.answers.is_some()).count();
    assert_eq!(asked.len(), with_answers, "{asked:?}");
}

#[tokio::test]
async fn development_mode_allows_loopback_and_nothing_else() {
    let entries = corpus();
    let table = table_for(&entries);
    let recorder = Arc::new(Recorder::default());
    let dev = super::dev_settings();
    let policy = dev.url_policy();
    let egress = egress(dev, &table, &recorder);
    let mut allowed = 0;
    for e in &entries {
        let addrs = match check_url(&e.url, &policy) {
            Err(_) => None,
            Ok(v) => match v.host {
                VettedHost::Ip(ip) => Some(vec![ip]),
                VettedHost::Name(_) => {
                    let name = v.url.host_str().unwrap().to_owned();
                    let resolution = resolve(&*table, &name, &policy).await.unwrap();
                    resolution.verdict().ok()
                }
            },
        };
        match addrs {
            // Not sent: nothing listens on loopback port 443 here.
            Some(addrs) => {
                allowed += 1;
                assert!(
                    addrs.iter().all(IpAddr::is_loopback),
                    "line {}: {:?} allowed in development",
                    e.line,
                    e.url
                );
            }
            None => {
                let result = egress.send(outbound(&e.url)).await;
                assert_eq!(result, blocked(), "line {}: {:?}", e.line, e.url);
            }
        }
    }
    assert!(allowed > 0, "development allowed no loopback entry");
    recorder.assert_only_loopback();
    assert!(recorder.connected.lock().is_empty());
}
