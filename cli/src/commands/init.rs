//! `walhook init`: reads the business schema of the captured database and
//! writes a commented `walhook.toml` (a rule per table and operation, or an
//! outbox rule), an idempotent `walhook-setup.sql` with the least-privilege
//! roles, and a master key when there is none. It changes nothing in the
//! database; the SQL is for an administrator to read and apply.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use walhook_connectors::postgres::connect::connect_sql;
use walhook_connectors::postgres::init::{self, Selection, render};
use walhook_pgtls::{ConnectOptions, DatabaseUrl, TlsFields};

/// Arguments of `walhook init`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  walhook init --source postgres://admin@db:5432/shop \\\n      \
    --tables public.orders,public.order_lines,public.outbox --out /etc/walhook\n  \
    psql postgres://admin@db:5432/shop -v ON_ERROR_STOP=1 -f /etc/walhook/walhook-setup.sql\n  \
    walhook migrate --config /etc/walhook/walhook.toml && walhook doctor --config /etc/walhook/walhook.toml"
)]
pub struct Args {
    /// The captured database, as a role that can read its catalog (an
    /// administrator): `postgres://admin@host:5432/shop`. Only read; the
    /// written config logs in as --source-role instead, without a password.
    #[arg(long, value_name = "URL")]
    pub source: String,

    /// The platform database walhook keeps its state in (the written config
    /// logs in there as --platform-role). Default: the --source server,
    /// database `walhook`.
    #[arg(long, value_name = "URL")]
    pub platform: Option<String>,

    /// The tables to capture, `schema.table` or `table` (in `public`),
    /// comma separated. Default: every table of --schemas.
    #[arg(long, value_delimiter = ',', value_name = "TABLES")]
    pub tables: Vec<String>,

    /// The schemas whose tables are captured when --tables is not given,
    /// comma separated. Default: every schema but the system ones and
    /// `walhook`.
    #[arg(long, value_delimiter = ',', value_name = "SCHEMAS")]
    pub schemas: Vec<String>,

    /// The role capture logs in as (REPLICATION, SELECT on the tables).
    #[arg(long, default_value = "walhook_source")]
    pub source_role: String,

    /// The role that owns the platform schema `walhook`.
    #[arg(long, default_value = "walhook_platform")]
    pub platform_role: String,

    /// `[source] name`: part of every event id.
    #[arg(long, default_value = "main")]
    pub name: String,

    /// The replication slot.
    #[arg(long, default_value = "walhook")]
    pub slot: String,

    /// The publication.
    #[arg(long, default_value = "walhook")]
    pub publication: String,

    /// The folder to write walhook.toml, walhook-setup.sql and master.key
    /// into.
    #[arg(long, default_value = ".")]
    pub out: PathBuf,

    /// Overwrite walhook.toml and walhook-setup.sql when they exist (a
    /// master key is never overwritten).
    #[arg(long)]
    pub force: bool,
}

/// Reads the schema and writes the files.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    for (flag, value) in [
        ("--source-role", &args.source_role),
        ("--platform-role", &args.platform_role),
        ("--slot", &args.slot),
        ("--publication", &args.publication),
    ] {
        if value.is_empty()
            || value.len() > 63
            || !value
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            anyhow::bail!(
                "{flag} {value:?}: use 1 to 63 lower-case letters, digits and `_` (an unquoted \
                 Postgres name)"
            );
        }
    }
    let config = args.out.join("walhook.toml");
    let setup = args.out.join("walhook-setup.sql");
    if !args.force {
        for path in [&config, &setup] {
            if path.exists() {
                anyhow::bail!(
                    "{} exists; pass --force to overwrite it (or --out for another folder)",
                    path.display()
                );
            }
        }
    }
    let options = ConnectOptions::parse(
        &DatabaseUrl::new(args.source.clone()),
        "--source",
        &TlsFields::default(),
    )
    .context("--source")?;
    let client = connect_sql(&options).await.context("--source")?;
    let selection = Selection {
        tables: args.tables.clone(),
        schemas: args.schemas.clone(),
    };
    let shapes = init::introspect(&client, &selection).await?;
    let plan = init::plan(&shapes);
    if plan.tables.is_empty() {
        anyhow::bail!(
            "no table to capture in {} (tables read: {}); name them with --tables or --schemas",
            options.config().get_dbname().unwrap_or("the database"),
            shapes.len()
        );
    }
    let (source_url, source_database) = init::as_role(&args.source, &args.source_role, None)
        .map_err(|e| anyhow::anyhow!("--source: {e}"))?;
    let (platform_url, platform_database) = match &args.platform {
        Some(url) => init::as_role(url, &args.platform_role, None),
        None => init::as_role(&args.source, &args.platform_role, Some("walhook")),
    }
    .map_err(|e| anyhow::anyhow!("--platform: {e}"))?;
    let targets = render::Targets {
        source_url,
        platform_url,
        source_database,
        platform_database,
        source_name: args.name.clone(),
        slot: args.slot.clone(),
        publication: args.publication.clone(),
        source_role: args.source_role.clone(),
        platform_role: args.platform_role.clone(),
        master_key_file: "master.key".into(),
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("--out {}: cannot create it", args.out.display()))?;
    write(&config, &render::config_toml(&plan, &targets), 0o640)?;
    write(&setup, &render::setup_sql(&plan, &targets), 0o644)?;
    let key = args.out.join("master.key");
    let key_note = write_master_key(&key)?;

    let rules: usize = plan
        .tables
        .iter()
        .map(|p| match p.kind {
            init::ProposalKind::Rows { .. } => 3,
            init::ProposalKind::Outbox { .. } => 1,
        })
        .sum();
    println!(
        "read {} tables: {} with rules ({rules} rules), {} skipped",
        shapes.len(),
        plan.tables.len(),
        plan.skipped.len()
    );
    for p in &plan.tables {
        for r in p.review.iter().filter(|r| r.starts_with("REVIEW")) {
            println!("  {}: {r}", p.table.qualified());
        }
    }
    for s in &plan.skipped {
        println!("  skipped {}: {}", s.table, s.why);
    }
    println!("wrote {}", config.display());
    println!("wrote {}", setup.display());
    println!("{key_note}");
    println!(
        "next: review {}, apply {} as a superuser (psql -v ON_ERROR_STOP=1 -f …), then \
         walhook migrate, walhook doctor and walhook run with --config {}",
        config.display(),
        setup.display(),
        config.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn write(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Writes a new master key (mode 600) unless one exists.
fn write_master_key(path: &Path) -> anyhow::Result<String> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut file) => {
            file.write_all(walhook_sql::secrets::MasterKey::generate_text().as_bytes())
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(format!(
                "wrote {} (a new master key: back it up; without it the signing secrets cannot \
                 be opened)",
                path.display()
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Ok(format!("kept {} (it exists)", path.display()))
        }
        Err(e) => Err(e).with_context(|| format!("cannot write {}", path.display())),
    }
}
