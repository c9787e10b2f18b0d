//! `walhook doctor`: every precondition of `walhook run` checked in one
//! run, changing nothing, each with its verdict and the exact fix: the
//! captured database (`wal_level`, the role's rights, slots and senders,
//! the slot, the publication, each rule against its table), the platform
//! database (reachable, the schema's migrations), the master key (it
//! opens every sealed secret), the clocks, the egress proxy (it accepts
//! connections), the Fluvio cluster and its topics (partitions, retention,
//! leaders) and the archive's store (a probe object written, read back and
//! removed).

use std::path::PathBuf;
use std::process::ExitCode;

use walhook_connectors::postgres::preflight::{self, Finding, Verdict};

use crate::config::Config;

/// Arguments of `walhook doctor`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The config file to check against the databases it names.
    #[arg(long, short, env = "WALHOOK_CONFIG")]
    pub config: PathBuf,

    /// Print the findings as JSON (`{"ok": bool, "findings": [{"check",
    /// "verdict", "detail", "fix"}]}`) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs every check; exit 0 when none fails (warnings allowed), 1
/// otherwise.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(&args.config)?;
    let mut findings = preflight::check_source(&cfg.source, &cfg.rules).await;
    findings.extend(check_platform(&cfg).await);
    findings.extend(check_reachable(&cfg).await);
    findings.push(check_archive(&cfg).await);
    let ok = findings.iter().all(|f| f.verdict != Verdict::Fail);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "ok": ok, "findings": findings }))?
        );
    } else {
        print!("{}", preflight::render(&findings));
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The platform role owns schema `walhook` and everything in it
/// (`walhook_sql::migrate::rights`), and is no superuser.
fn rights_finding(
    rights: Result<walhook_sql::migrate::rights::Rights, walhook_sql::StoreError>,
) -> Finding {
    let check = "platform.rights";
    let r = match rights {
        Ok(r) => r,
        Err(e) => return Finding::new(check, Verdict::Fail, e.to_string(), None),
    };
    let role = &r.role;
    if r.superuser {
        Finding::new(
            check,
            Verdict::Warn,
            format!("role {role} is a superuser: walhook needs only to own schema walhook"),
            Some("`walhook init` writes walhook-setup.sql with a least-privilege platform role"),
        )
    } else if r.owns_everything() {
        Finding::new(
            check,
            Verdict::Ok,
            format!("role {role} owns schema walhook and everything in it (not a superuser)"),
            None,
        )
    } else {
        Finding::new(
            check,
            Verdict::Fail,
            format!(
                "role {role} {}; {} tables or views and {} functions in it belong to another role \
                 (migrated as another role?): migrations, new day partitions and the archive's \
                 drops would be refused",
                if r.owns_schema {
                    "owns schema walhook"
                } else {
                    "does not own schema walhook"
                },
                r.foreign_relations,
                r.foreign_functions
            ),
            Some(&format!(
                "as a superuser on the platform database: {}",
                r.fix_sql()
            )),
        )
    }
}

/// The platform database, the master key and the clock.
#[allow(clippy::disallowed_methods)] // bare spawn: a connection's driver
async fn check_platform(cfg: &Config) -> Vec<Finding> {
    let mut out = Vec::new();
    let keyring = match cfg.secrets.keyring() {
        Ok(k) => {
            out.push(Finding::new(
                "secrets.master_key",
                Verdict::Ok,
                format!("master key {} is readable", k.current_id()),
                None,
            ));
            Some(k)
        }
        Err(e) => {
            out.push(Finding::new(
                "secrets.master_key",
                Verdict::Fail,
                format!("{e:#}"),
                Some("set [secrets].master_key_file or WALHOOK_MASTER_KEY (`walhook secrets generate-key` makes one)"),
            ));
            None
        }
    };
    let connected = async {
        let options = cfg.platform()?.connect_options()?;
        let (client, conn) = options.config().connect(options.connector()?).await?;
        tokio::spawn(conn);
        let platform = cfg.platform()?.platform()?;
        anyhow::Ok((client, platform))
    };
    let (client, platform) = match connected.await {
        Ok(c) => c,
        Err(e) => {
            out.push(Finding::new(
                "platform.connect",
                Verdict::Fail,
                format!("{e:#}"),
                Some("check [platform].url and that Postgres runs there"),
            ));
            return out;
        }
    };
    out.push(Finding::new(
        "platform.connect",
        Verdict::Ok,
        "the platform database answers".into(),
        None,
    ));
    out.push(rights_finding(
        walhook_sql::migrate::rights::rights(&client).await,
    ));
    match walhook_sql::migrate::status(&client).await {
        Ok(s) if s.pending.is_empty() && s.changed.is_empty() && s.unknown.is_empty() => {
            out.push(Finding::new(
                "platform.schema",
                Verdict::Ok,
                format!(
                    "schema walhook is current (version {})",
                    walhook_sql::migrate::latest()
                ),
                None,
            ));
        }
        Ok(s) => out.push(Finding::new(
            "platform.schema",
            Verdict::Fail,
            format!(
                "schema walhook: {} pending, {} changed after they were applied, {} newer than this binary",
                s.pending.len(),
                s.changed.len(),
                s.unknown.len()
            ),
            Some("`walhook migrate --config FILE --check` says which and what they lock; `walhook migrate --config FILE` applies them"),
        )),
        Err(e) => out.push(Finding::new(
            "platform.schema",
            Verdict::Fail,
            e.to_string(),
            Some("run `walhook migrate --config FILE`"),
        )),
    }
    // Sealed secrets under keys this process does not hold.
    if let Some(keyring) = keyring {
        let platform = platform.with_keyring(keyring);
        match platform.secret_key_counts().await {
            Ok(counts) => {
                let keyring = platform.keyring();
                let held: Vec<String> = keyring
                    .as_ref()
                    .map(|k| k.key_ids().iter().map(|s| s.to_string()).collect())
                    .unwrap_or_default();
                let missing: Vec<String> = counts
                    .iter()
                    .filter(|(id, _)| {
                        id.as_str() != walhook_sql::secrets::PLAIN_KEY_ID && !held.contains(id)
                    })
                    .map(|(id, n)| format!("{id} ({n} rows)"))
                    .collect();
                out.push(if missing.is_empty() {
                    Finding::new(
                        "secrets.sealed",
                        Verdict::Ok,
                        format!(
                            "the configured keys open every sealed secret ({} rows)",
                            counts.iter().map(|(_, n)| n).sum::<i64>()
                        ),
                        None,
                    )
                } else {
                    Finding::new(
                        "secrets.sealed",
                        Verdict::Fail,
                        format!("secrets sealed under keys not configured: {}", missing.join(", ")),
                        Some("add those keys to [secrets].old_key_files (or WALHOOK_OLD_MASTER_KEYS), then run `walhook secrets rotate`"),
                    )
                });
            }
            Err(e) => out.push(Finding::new(
                "secrets.sealed",
                Verdict::Warn,
                format!("could not count sealed secrets: {e}"),
                None,
            )),
        }
    }
    // The clock: leases and retry times compare this host's time with
    // the database's.
    match client
        .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
        .await
    {
        Ok(row) => {
            let theirs: f64 = row.get(0);
            let ours = walhook_pipeline::time::Timestamp::now().0 as f64 / 1e6;
            let skew = ours - theirs;
            out.push(if skew.abs() > 1.0 {
                Finding::new(
                    "clock",
                    Verdict::Warn,
                    format!("this host's clock is {skew:+.1} s off the platform database's"),
                    Some(
                        "synchronise both hosts' clocks (NTP): leases and retry times compare them",
                    ),
                )
            } else {
                Finding::new(
                    "clock",
                    Verdict::Ok,
                    format!(
                        "within {:.0} ms of the platform database's",
                        skew.abs() * 1000.0
                    ),
                    None,
                )
            });
        }
        Err(e) => out.push(Finding::new(
            "clock",
            Verdict::Warn,
            format!("could not read the database's clock: {e}"),
            None,
        )),
    }
    out
}

/// How long a connection to a proxy or a cluster may take.
const REACH: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether `host:port` accepts a TCP connection within [`REACH`].
async fn reachable(host: &str, port: u16) -> Result<(), String> {
    match tokio::time::timeout(REACH, tokio::net::TcpStream::connect((host, port))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {REACH:?}")),
    }
}

/// The egress proxy and the Fluvio cluster's topics, when the config
/// names them.
async fn check_reachable(cfg: &Config) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Some(proxy) = &cfg.egress.proxy {
        out.push(match proxy.parsed() {
            Err(e) => Finding::new("egress.proxy", Verdict::Fail, e, Some("correct [egress].proxy")),
            Ok(url) => {
                let host = url.host_str().unwrap_or_default().to_owned();
                let port = url.port_or_known_default().unwrap_or(80);
                match reachable(&host, port).await {
                    Ok(()) => Finding::new(
                        "egress.proxy",
                        Verdict::Ok,
                        format!("the egress proxy {host}:{port} accepts connections"),
                        None,
                    ),
                    Err(e) => Finding::new(
                        "egress.proxy",
                        Verdict::Fail,
                        format!("the egress proxy {host}:{port} does not accept connections: {e}"),
                        Some("start the proxy, or correct [egress].proxy: every attempt goes through it"),
                    ),
                }
            }
        });
    }
    if cfg.log.kind == crate::config::LogKind::Fluvio {
        let topics = crate::pipeline::log_topics(cfg);
        let endpoint = cfg.log.endpoint.clone();
        match walhook_connectors::fluvio::FluvioLog::inspect(cfg.log.fluvio_settings(), topics)
            .await
        {
            Err(e) => out.push(Finding::new(
                "log.fluvio",
                Verdict::Fail,
                walhook_pipeline::supervise::error_chain(&e),
                Some("start the cluster, or correct [log] (endpoint, TLS)"),
            )),
            Ok(reports) => {
                out.push(Finding::new(
                    "log.fluvio",
                    Verdict::Ok,
                    format!("the Fluvio cluster at {endpoint} answers"),
                    None,
                ));
                for r in reports {
                    let check = format!("log.topic.{}", r.name);
                    out.push(match r.verdict {
                        Ok(detail) => Finding::new(&check, Verdict::Ok, detail, None),
                        Err(why) => Finding::new(
                            &check,
                            Verdict::Fail,
                            format!("topic {:?} {why}", r.name),
                            Some("as the message says: the [log] settings, or new topic names ([log] topic_prefix)"),
                        ),
                    });
                }
            }
        }
    }
    out
}

/// Writes a probe object to the archive's store, reads it back and
/// removes it.
async fn check_archive(cfg: &Config) -> Finding {
    use walhook_pipeline::objstore::ObjectStore;
    let probe = async {
        let store = cfg.archive.open_store().await?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let key = format!("walhook-doctor-probe-{nanos}-{}", std::process::id());
        let body = bytes::Bytes::from_static(b"walhook doctor probe");
        store.put(&key, body.clone()).await?;
        let back = store.get(&key).await?;
        store.delete(&key).await?;
        anyhow::ensure!(
            back.as_ref() == Some(&body),
            "the probe object read back differs from what was written"
        );
        anyhow::Ok(store.describe())
    };
    match probe.await {
        Ok(at) => Finding::new(
            "archive.store",
            Verdict::Ok,
            format!("{at}: a probe object was written, read back and removed"),
            None,
        ),
        Err(e) => Finding::new(
            "archive.store",
            Verdict::Fail,
            format!("{e:#}"),
            Some(
                "check [archive] (the directory's rights, or the bucket, its endpoint and credentials)",
            ),
        ),
    }
}
