//! `walhook check-url`: the egress policy's verdict on a URL, without
//! sending anything.
//!
//! It runs the same checks as delivery: the URL rules (as the API does at
//! registration), then, for a host name, a lookup and the address policy on
//! every answer (as the resolver does at connect time). It prints each step
//! and exits 0 when the URL is allowed, 1 when it is refused, and 3 when the
//! name does not resolve (delivery would retry then). No request is ever
//! made; the only traffic is the DNS lookup, which `--resolve` replaces.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use walhook_connectors::http::EgressSettings;
use walhook_connectors::http::resolve::{Lookup, StaticLookup, SystemLookup, resolve};
use walhook_pipeline::url_policy::{Refusal, VettedHost, check_url};

/// Arguments of `walhook check-url`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The URL to check, as a customer would register it.
    pub url: String,
    /// Read the policy from this config file's [egress] section (ports, the
    /// development switch, a proxy); nothing else in it is needed.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Also allow this port (repeatable; 443 is allowed unless the config
    /// says otherwise).
    #[arg(long = "allow-port", value_name = "PORT")]
    pub allow_ports: Vec<u16>,
    /// The development policy: http and any port to loopback literals, and
    /// loopback addresses for names. Never in production.
    #[arg(long)]
    pub allow_http_loopback: bool,
    /// Answer NAME with these addresses instead of asking DNS
    /// (NAME=ADDR[,ADDR…]; repeatable), to see what would happen if a name
    /// resolved so.
    #[arg(long, value_name = "NAME=ADDRS")]
    pub resolve: Vec<String>,
}

fn egress_section(path: &std::path::Path) -> anyhow::Result<EgressSettings> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    let table: toml::Table = toml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))
        .with_context(|| format!("config file {}", path.display()))?;
    let settings: EgressSettings = match table.get("egress") {
        Some(v) => v.clone().try_into().map_err(|e: toml::de::Error| {
            anyhow::anyhow!("[egress]: {}", e.to_string().trim_end())
        })?,
        None => EgressSettings::default(),
    };
    settings.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(settings)
}

fn static_table(entries: &[String]) -> anyhow::Result<StaticLookup> {
    let table = StaticLookup::new();
    for entry in entries {
        let Some((name, addrs)) = entry.split_once('=') else {
            bail!("--resolve {entry:?}: write NAME=ADDR[,ADDR…]");
        };
        let addrs = addrs
            .split(',')
            .filter(|a| !a.is_empty())
            .map(|a| a.trim().parse::<IpAddr>())
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("--resolve {entry:?}: not an IP address"))?;
        table.set(name, addrs);
    }
    Ok(table)
}

fn refused(r: &Refusal) -> ExitCode {
    println!("verdict    refused ({}): {}", r.reason.as_str(), r.detail);
    ExitCode::from(1)
}

/// Checks the URL and prints the verdict.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut settings = match &args.config {
        Some(path) => egress_section(path)?,
        None => EgressSettings::default(),
    };
    settings.allowed_ports.extend(&args.allow_ports);
    settings.allow_http_loopback |= args.allow_http_loopback;
    settings.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let policy = settings.url_policy();
    println!(
        "policy     https on ports {:?}{}",
        policy.allowed_ports,
        if policy.allow_http_loopback {
            "; DEVELOPMENT: loopback allowed"
        } else {
            ""
        }
    );
    let vetted = match check_url(&args.url, &policy) {
        Ok(v) => v,
        Err(r) => return Ok(refused(&r)),
    };
    println!("url        {}  (as sent)", vetted.url);
    println!("port       {}", vetted.port);
    let name = match &vetted.host {
        VettedHost::Ip(ip) => {
            println!("address    {ip}  allowed (literal)");
            println!("verdict    allowed");
            return Ok(ExitCode::SUCCESS);
        }
        VettedHost::Name(name) => name.clone(),
    };
    println!("host       {name}");
    if settings.proxy.is_some() {
        println!(
            "note       [egress].proxy is set: the proxy resolves {name} and must enforce the address policy"
        );
    }
    let lookup: Box<dyn Lookup> = if args.resolve.is_empty() {
        Box::new(SystemLookup)
    } else {
        Box::new(static_table(&args.resolve)?)
    };
    let resolution = match resolve(&*lookup, &name, &policy).await {
        Ok(r) => r,
        Err(e) => {
            println!("verdict    unresolved: {name} does not resolve ({e}); delivery would retry");
            return Ok(ExitCode::from(3));
        }
    };
    for (ip, verdict) in &resolution.answers {
        match verdict {
            Ok(()) => println!("address    {ip}  allowed"),
            Err(r) => println!("address    {ip}  refused: {}", r.detail),
        }
    }
    match resolution.verdict() {
        Ok(_) => {
            println!("verdict    allowed");
            Ok(ExitCode::SUCCESS)
        }
        Err(r) => Ok(refused(&r)),
    }
}
