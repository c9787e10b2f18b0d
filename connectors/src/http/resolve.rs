//! Name resolution that hands the connector vetted addresses only.
//!
//! ```text
//!  direct client ──name──▶ vetted_addrs ──▶ Lookup (system DNS, or a static table)
//!  reqwest ──name──▶ VettingResolver ─┘  │ every answer checked (check_addr);
//!                                        │ one refused answer refuses the name
//!                                        ▼
//!                  EgressObserver::approve (logs; tests record and fence)
//!                                        ▼
//!  the connection dials exactly these addresses; TLS name and Host stay
//!  the URL's name
//! ```
//!
//! The check happens as part of making each connection, so there is no
//! window between "checked" and "dialled" for DNS rebinding: whatever a name
//! resolves to at connect time is what is checked, every time a new
//! connection is made. The system lookup asks for the absolute name (a
//! trailing dot), so resolver search domains never turn `api.svc` into
//! `api.svc.corp.internal`.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use parking_lot::Mutex;

use super::observe::EgressObserver;
use walhook_pipeline::url_policy::{Refusal, RefusalReason, UrlPolicy, check_addr};

/// A future of a lookup's answers.
pub type Answers = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>>;

/// Where names are looked up: the system resolver in production, a static
/// table in tests and in `walhook check-url --resolve`.
pub trait Lookup: Send + Sync + 'static {
    /// Every address `name` resolves to now (A and AAAA).
    fn lookup(&self, name: &str) -> Answers;
}

/// The system resolver (`getaddrinfo`, on tokio's blocking pool).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup(&self, name: &str) -> Answers {
        // Absolute name: no search domains.
        let absolute = format!("{}.", name.trim_end_matches('.'));
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((absolute.as_str(), 0)).await?;
            Ok(addrs.map(|a| a.ip()).collect())
        })
    }
}

/// A fixed table of answers that records every lookup. A name may have a
/// sequence of answers (the last repeats), to play DNS rebinding; a name
/// not in the table does not exist.
#[derive(Debug, Default)]
pub struct StaticLookup {
    table: Mutex<HashMap<String, Vec<Vec<IpAddr>>>>,
    asked: Mutex<Vec<(String, Vec<IpAddr>)>>,
}

impl StaticLookup {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// `name` resolves to `addrs` from now on.
    pub fn set(&self, name: &str, addrs: Vec<IpAddr>) {
        self.sequence(name, vec![addrs]);
    }

    /// `name` resolves to `answers[0]`, then `answers[1]`, …, then the last
    /// one for ever.
    pub fn sequence(&self, name: &str, answers: Vec<Vec<IpAddr>>) {
        self.table.lock().insert(normalise(name), answers);
    }

    /// Every lookup so far: the name asked and the answers given.
    pub fn asked(&self) -> Vec<(String, Vec<IpAddr>)> {
        self.asked.lock().clone()
    }
}

fn normalise(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl Lookup for StaticLookup {
    fn lookup(&self, name: &str) -> Answers {
        let key = normalise(name);
        let answer = {
            let mut table = self.table.lock();
            table.get_mut(&key).map(|seq| {
                if seq.len() > 1 {
                    seq.remove(0)
                } else {
                    seq[0].clone()
                }
            })
        };
        self.asked
            .lock()
            .push((key.clone(), answer.clone().unwrap_or_default()));
        Box::pin(async move {
            answer.ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("{key} does not exist"))
            })
        })
    }
}

/// What a name resolved to, each answer with its verdict.
#[derive(Debug, Clone)]
pub struct Resolution {
    /// The name looked up.
    pub name: String,
    /// Every answer and whether the address policy allows it.
    pub answers: Vec<(IpAddr, Result<(), Refusal>)>,
}

impl Resolution {
    /// The addresses to dial, or the refusal: a name with any refused
    /// answer (or none) is refused as a whole, since any of its answers may
    /// be the one dialled.
    pub fn verdict(&self) -> Result<Vec<IpAddr>, Refusal> {
        if let Some((_, Err(r))) = self.answers.iter().find(|(_, v)| v.is_err()) {
            return Err(Refusal {
                reason: r.reason,
                detail: format!("{} resolves to a refused address: {}", self.name, r.detail),
            });
        }
        if self.answers.is_empty() {
            return Err(Refusal {
                reason: RefusalReason::Address,
                detail: format!("{} resolves to no address", self.name),
            });
        }
        Ok(self.answers.iter().map(|(ip, _)| *ip).collect())
    }
}

/// Looks `name` up and checks every answer under `policy`. A lookup failure
/// is an `io::Error` (transient: DNS may come back); a refusal is in the
/// [`Resolution`].
pub async fn resolve(
    lookup: &dyn Lookup,
    name: &str,
    policy: &UrlPolicy,
) -> io::Result<Resolution> {
    let addrs = lookup.lookup(name).await?;
    Ok(Resolution {
        name: name.to_owned(),
        answers: addrs
            .into_iter()
            .map(|ip| (ip, check_addr(ip, policy)))
            .collect(),
    })
}

/// Why [`vetted_addrs`] gave no address.
#[derive(Debug)]
pub enum Vetting {
    /// The lookup failed (no such name, resolver trouble).
    Lookup(io::Error),
    /// The policy or the observer refused an answer.
    Refused(Refusal),
}

/// The addresses of `name` (normalised: lower case, no trailing dot), when
/// every answer passes `policy` and `observer` approves them; a refusal is
/// logged. Both HTTP paths resolve through this.
pub async fn vetted_addrs(
    lookup: &dyn Lookup,
    name: &str,
    policy: &UrlPolicy,
    observer: &dyn EgressObserver,
) -> Result<Vec<IpAddr>, Vetting> {
    let resolution = resolve(lookup, name, policy)
        .await
        .map_err(Vetting::Lookup)?;
    let addrs = resolution.verdict().map_err(|refusal| {
        tracing::warn!(
            host = %name,
            reason = refusal.reason.as_str(),
            detail = %refusal.detail,
            "egress refused a resolved address"
        );
        Vetting::Refused(refusal)
    })?;
    if !observer.approve(name, &addrs) {
        return Err(Vetting::Refused(unapproved(name, &addrs)));
    }
    Ok(addrs)
}

fn unapproved(name: &str, addrs: &[IpAddr]) -> Refusal {
    Refusal {
        reason: RefusalReason::Address,
        detail: format!("the egress observer did not approve {name} → {addrs:?}"),
    }
}

/// The operator's egress proxy, whose name and addresses are trusted (it
/// enforces the address policy for the names it resolves itself).
#[derive(Debug, Default)]
pub struct TrustedProxy {
    /// Its host as written in `[egress].proxy`, lower-case.
    pub host: Option<String>,
    /// Addresses it resolved to (or its literal address).
    pub addrs: Mutex<Vec<IpAddr>>,
}

impl TrustedProxy {
    /// Whether `ip` is the proxy's.
    pub fn is_proxy_addr(&self, ip: IpAddr) -> bool {
        self.addrs.lock().contains(&ip)
    }
}

/// The reqwest resolver: [`resolve`], then the observer's approval, then
/// the vetted addresses (port 0: reqwest puts the URL's port in).
#[derive(Clone)]
pub struct VettingResolver {
    lookup: Arc<dyn Lookup>,
    policy: UrlPolicy,
    observer: Arc<dyn EgressObserver>,
    proxy: Arc<TrustedProxy>,
}

impl std::fmt::Debug for VettingResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VettingResolver")
            .field("policy", &self.policy)
            .field("proxy", &self.proxy.host)
            .finish()
    }
}

impl VettingResolver {
    /// A resolver looking names up with `lookup`, allowing what `policy`
    /// allows (and the proxy's own name).
    pub fn new(
        lookup: Arc<dyn Lookup>,
        policy: UrlPolicy,
        observer: Arc<dyn EgressObserver>,
        proxy: Arc<TrustedProxy>,
    ) -> Self {
        VettingResolver {
            lookup,
            policy,
            observer,
            proxy,
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A name the resolver could not look up, as the proxy path's client sees
/// it: a type of its own, so that the egress classifies the failure as DNS
/// by finding it in the error's chain, not by reading the message.
#[derive(Debug, thiserror::Error)]
#[error("could not resolve {name}: {source}")]
pub struct LookupFailed {
    /// The name.
    pub name: String,
    /// The lookup's error.
    #[source]
    pub source: io::Error,
}

impl reqwest::dns::Resolve for VettingResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let me = self.clone();
        let name = normalise(name.as_str());
        Box::pin(async move {
            let is_proxy = me.proxy.host.as_deref() == Some(name.as_str());
            let addrs = if is_proxy {
                let addrs = me
                    .lookup
                    .lookup(&name)
                    .await
                    .map_err(|source| LookupFailed {
                        name: name.clone(),
                        source,
                    })?;
                me.proxy.addrs.lock().extend(addrs.iter().copied());
                if !me.observer.approve(&name, &addrs) {
                    return Err(Box::new(unapproved(&name, &addrs)) as BoxError);
                }
                addrs
            } else {
                match vetted_addrs(&*me.lookup, &name, &me.policy, &*me.observer).await {
                    Ok(addrs) => addrs,
                    Err(Vetting::Lookup(source)) => {
                        return Err(Box::new(LookupFailed { name, source }) as BoxError);
                    }
                    Err(Vetting::Refused(refusal)) => return Err(Box::new(refusal) as BoxError),
                }
            };
            let out: Vec<SocketAddr> = addrs.into_iter().map(|ip| SocketAddr::new(ip, 0)).collect();
            Ok(Box::new(out.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[tokio::test]
    async fn one_refused_answer_refuses_the_name() {
        let table = StaticLookup::new();
        table.set("mixed.example.com", ips(&["93.184.216.34", "fd00::1"]));
        table.set(
            "v6.example.com",
            ips(&["2606:4700::1111", "::ffff:10.0.0.1"]),
        );
        table.set("ok.example.com", ips(&["93.184.216.34", "2606:4700::1111"]));
        let policy = UrlPolicy::default();
        for name in ["mixed.example.com", "v6.example.com"] {
            let r = resolve(&table, name, &policy).await.unwrap();
            assert_eq!(r.answers.iter().filter(|(_, v)| v.is_ok()).count(), 1);
            assert_eq!(r.verdict().unwrap_err().reason, RefusalReason::Address);
        }
        let ok = resolve(&table, "ok.example.com.", &policy).await.unwrap();
        assert_eq!(ok.verdict().unwrap().len(), 2);
        assert!(resolve(&table, "nx.example.com", &policy).await.is_err());
    }

    #[tokio::test]
    async fn sequences_play_rebinding_and_are_recorded() {
        let table = StaticLookup::new();
        table.sequence(
            "rebind.example.com",
            vec![ips(&["127.0.0.1"]), ips(&["10.0.0.1"])],
        );
        assert_eq!(
            table.lookup("rebind.example.com").await.unwrap(),
            ips(&["127.0.0.1"])
        );
        for _ in 0..2 {
            assert_eq!(
                table.lookup("REBIND.example.com.").await.unwrap(),
                ips(&["10.0.0.1"])
            );
        }
        assert_eq!(table.asked().len(), 3);
    }
}
