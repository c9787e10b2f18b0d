//! Egress end to end: real deliveries verified by the official customer
//! libraries (PyPI `standardwebhooks` and `svix`) through a secret rotation,
//! redirects not followed, secrets sealed at rest and the master key rotated
//! under load, and `walhook check-url` over the SSRF corpus.
//!
//! The Python libraries come from the virtualenv that `scripts/test.sh`
//! makes (`WALHOOK_PYTHON`); without them these tests fail and say how to
//! install them.

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use walhook_devkit::receiver::{Behaviour, Received};
use walhook_pipeline::ids::EndpointId;
use walhook_pipeline::signing::{SigningSecret, sign_one};

use crate::support::{Child, World, python, run, stdout, walhook, write_master_key};

// ---------------------------------------------------------------------------
// The official libraries, in Python.

const VERIFY_PY: &str = r#"
import json, sys
from importlib.metadata import version
try:
    from standardwebhooks.webhooks import Webhook as Standard
    from svix.webhooks import Webhook as Svix
except ImportError as e:
    print("MISSING: " + str(e))
    sys.exit(3)
cases = json.load(sys.stdin)
results = []
for case in cases:
    body = bytes.fromhex(case["body_hex"])
    verdicts = {}
    for name, cls in (("standardwebhooks", Standard), ("svix", Svix)):
        try:
            cls(case["secret"]).verify(body, case["headers"])
            verdicts[name] = "ok"
        except Exception as e:
            verdicts[name] = type(e).__name__ + ": " + str(e)
    results.append(verdicts)
print(json.dumps({"versions": {"standardwebhooks": version("standardwebhooks"), "svix": version("svix")},
                  "results": results}))
"#;

const INSTALL_HINT: &str = "the official Standard Webhooks libraries are needed: run scripts/test.sh \
     (it creates the virtualenv), or by hand: python3 -m venv ~/.cache/walhook-venv && \
     ~/.cache/walhook-venv/bin/pip install -r tests/python-requirements.txt && \
     export WALHOOK_PYTHON=~/.cache/walhook-venv/bin/python";

/// Fails at once, with the way to install them, when the libraries are
/// missing (before a test spends seconds delivering).
fn require_official_libraries() {
    let python = python();
    let out = Command::new(&python)
        .args(["-c", "import standardwebhooks, svix"])
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "{} cannot import the libraries ({}); {INSTALL_HINT}",
            python.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!("cannot run {} ({e}); {INSTALL_HINT}", python.display()),
    }
}

/// One verification by both libraries.
struct Case {
    label: String,
    secret: String,
    id: String,
    timestamp: String,
    signature: String,
    body: Vec<u8>,
    valid: bool,
}

impl Case {
    fn of(r: &Received, secret: &str, label: &str, valid: bool) -> Case {
        Case {
            label: label.to_owned(),
            secret: secret.to_owned(),
            id: r.webhook_id.clone(),
            timestamp: r.webhook_timestamp.clone(),
            signature: r.signature.clone(),
            body: r.body.to_vec(),
            valid,
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs every case through both libraries; panics on any disagreement with
/// the expectation. Returns the libraries' versions.
fn verify_with_official_libraries(cases: &[Case]) -> serde_json::Value {
    let input = serde_json::Value::Array(
        cases
            .iter()
            .map(|c| {
                serde_json::json!({
                    "secret": c.secret,
                    "headers": {
                        "webhook-id": c.id,
                        "webhook-timestamp": c.timestamp,
                        "webhook-signature": c.signature,
                    },
                    "body_hex": hex(&c.body),
                })
            })
            .collect(),
    );
    let python = python();
    let mut child = Command::new(&python)
        .args(["-c", VERIFY_PY])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {} ({e}); {INSTALL_HINT}", python.display()));
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.to_string().as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{} could not verify: {text}{}\n{INSTALL_HINT}",
        python.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), cases.len());
    let mut wrong = Vec::new();
    for (case, verdicts) in cases.iter().zip(results) {
        for lib in ["standardwebhooks", "svix"] {
            let verdict = verdicts[lib].as_str().unwrap();
            if (verdict == "ok") != case.valid {
                wrong.push(format!(
                    "{lib} on {:?} (expected {}): {verdict}",
                    case.label,
                    if case.valid { "ok" } else { "a rejection" }
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    eprintln!("verified {} cases with {}", cases.len(), report["versions"]);
    report["versions"].clone()
}

// ---------------------------------------------------------------------------

async fn endpoint_with_secret(w: &World, path: &str, types: &[&str]) -> (EndpointId, String) {
    let (id, secret) = w
        .create_endpoint("acme", &w.receiver.url(path), types, |_| {})
        .await;
    w.receiver.set_secrets(path, vec![secret.expose_text()]);
    (id, secret.expose_text())
}

/// Inserts order `n` (tenant acme) and waits for its delivery on `path`.
async fn deliver_order(w: &World, path: &str, n: i64) -> Received {
    w.shop
        .execute("INSERT INTO orders VALUES ($1, 'acme', 1.00)", &[&n])
        .await
        .unwrap();
    let object = n.to_string();
    let is_it = |r: &Received| {
        r.path == path
            && serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["object_id"]
                == object.as_str()
    };
    let arrived = w
        .receiver
        .wait_until(Duration::from_secs(30), |rs| rs.iter().any(is_it))
        .await;
    assert!(arrived, "order {n} not delivered: {}", w.state().await);
    w.receiver.received().into_iter().find(is_it).unwrap()
}

/// Proxy variables in walhook's environment are ignored: customer traffic
/// never goes through a proxy that the URL and address policies did not
/// vet (only `[egress].proxy` names one).
#[tokio::test]
async fn proxy_variables_in_the_environment_are_ignored() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let w = World::new().await;
    // A loopback "proxy" that counts the connections it gets and answers
    // none of them.
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    {
        let connections = connections.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = proxy.accept().await {
                connections.fetch_add(1, Ordering::SeqCst);
                drop(socket);
            }
        });
    }
    endpoint_with_secret(&w, "direct", &["order.created"]).await;
    let env: Vec<(&str, &str)> = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ]
    .into_iter()
    .map(|name| (name, proxy_url.as_str()))
    .collect();
    let child = Child::run_with_env(&w.config(""), &env);
    w.wait_streaming().await;
    for n in 1..=3 {
        let got = deliver_order(&w, "direct", n).await;
        assert_eq!(got.verified, Some(true));
    }
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "a delivery went through the proxy named in the environment"
    );
    child.kill();
}

#[tokio::test]
async fn the_official_libraries_verify_deliveries_through_a_rotation() {
    require_official_libraries();
    let w = World::new().await;
    let (id, first) = endpoint_with_secret(&w, "py", &["order.created"]).await;
    let (_, _) = endpoint_with_secret(&w, "redirect", &["order.created"]).await;
    w.receiver.set_behaviour(
        "redirect",
        Behaviour::Redirect {
            status: 302,
            location: "http://169.254.169.254/latest/meta-data/".into(),
        },
    );
    let child = Child::run(&w.config(""));
    w.wait_streaming().await;
    let mut n = 0i64;
    let mut next = || {
        n += 1;
        n
    };
    let mut cases = Vec::new();

    // Before any rotation: one signature, the first secret.
    for _ in 0..3 {
        let r = deliver_order(&w, "py", next()).await;
        assert_eq!(r.signature.split(' ').count(), 1);
        cases.push(Case::of(&r, &first, "one secret", true));
    }

    // A rotation with the default overlap: both secrets sign until it ends.
    let second = w
        .platform
        .rotate_secret(id, Duration::from_secs(24 * 3600), "test")
        .await
        .unwrap();
    assert_eq!((second.version, second.config_version), (2, 2));
    let second = second.secret.expose_text();
    w.receiver
        .set_secrets("py", vec![first.clone(), second.clone()]);
    let mut overlap = Vec::new();
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < until {
        let r = deliver_order(&w, "py", next()).await;
        if r.signature.split(' ').count() == 2 {
            overlap.push(r);
            break;
        }
    }
    assert_eq!(overlap.len(), 1, "no delivery carried two signatures");
    for _ in 0..2 {
        let r = deliver_order(&w, "py", next()).await;
        assert_eq!(r.signature.split(' ').count(), 2, "{}", r.signature);
        overlap.push(r);
    }
    for r in &overlap {
        cases.push(Case::of(r, &first, "overlap, old secret", true));
        cases.push(Case::of(r, &second, "overlap, new secret", true));
    }

    // What a receiver must reject, built from a real delivery.
    let d = &overlap[0];
    let key = SigningSecret::parse(&second).unwrap();
    let first_sig = d.signature.split(' ').next().unwrap().to_owned();
    let mut bad = |label: &str, edit: &dyn Fn(&mut Case), valid: bool| {
        let mut c = Case::of(d, &second, label, valid);
        edit(&mut c);
        cases.push(c);
    };
    bad(
        "truncated signature",
        &|c| {
            c.signature = c
                .signature
                .split(' ')
                .map(|s| s[..s.len() / 2].to_owned())
                .collect::<Vec<_>>()
                .join(" ")
        },
        false,
    );
    bad("empty v1,", &|c| c.signature = "v1,".into(), false);
    bad(
        "wrong version",
        &|c| c.signature = c.signature.replace("v1,", "v2,"),
        false,
    );
    bad(
        "old secret's signature only, checked with the wrong secret",
        &|c| {
            c.signature = first_sig.clone();
            c.secret = SigningSecret::generate().expose_text();
        },
        false,
    );
    bad(
        "re-serialised body",
        &|c| {
            let v: serde_json::Value = serde_json::from_slice(&c.body).unwrap();
            let pretty = serde_json::to_vec_pretty(&v).unwrap();
            assert_ne!(pretty, c.body);
            c.body = pretty;
        },
        false,
    );
    bad(
        "another webhook-id",
        &|c| c.id = format!("{}x", c.id),
        false,
    );

    // The overlap ends (rotation with none): only the newest secret signs.
    let third = w
        .platform
        .rotate_secret(id, Duration::ZERO, "test")
        .await
        .unwrap();
    let third = third.secret.expose_text();
    // Attempts already under way still carry the overlap's two signatures.
    w.receiver
        .set_secrets("py", vec![first.clone(), second.clone(), third.clone()]);
    // The directory is reloaded within a poll interval: deliver until it
    // has been (bounded by time, not by count: a delivery takes milliseconds).
    let mut after = None;
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < until {
        let r = deliver_order(&w, "py", next()).await;
        if r.signature.split(' ').count() == 1 {
            after = Some(r);
            break;
        }
    }
    let after = after.expect("no delivery signed by the newest secret alone");
    cases.push(Case::of(
        &after,
        &third,
        "after the overlap, new secret",
        true,
    ));
    cases.push(Case::of(
        &after,
        &second,
        "after the overlap, expired secret",
        false,
    ));
    cases.push(Case::of(
        &after,
        &first,
        "after the overlap, first secret",
        false,
    ));

    // Timestamps off by more than the libraries' five minutes, re-signed so
    // that only the time is wrong: relative to now, just before the
    // libraries run (a late verifier only makes an old one older; the one
    // ahead keeps a margin for the verifier's start-up).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    for (label, t, valid) in [
        ("timestamp 301 s old", now - 301, false),
        ("timestamp 305 s ahead", now + 305, false),
        ("timestamp 290 s old, re-signed (control)", now - 290, true),
        (
            "timestamp 290 s ahead, re-signed (control)",
            now + 290,
            true,
        ),
    ] {
        let mut c = Case::of(d, &second, label, valid);
        c.timestamp = t.to_string();
        c.signature = sign_one(&key, &c.id, t, &c.body);
        cases.push(c);
    }
    let cases_len = cases.len();
    let versions = tokio::task::spawn_blocking(move || verify_with_official_libraries(&cases))
        .await
        .unwrap();
    assert!(versions["standardwebhooks"].is_string() && cases_len > 20);

    // Every delivery to the receiver verified with its own code too, and
    // the redirecting endpoint was never followed: one attempt each, a
    // permanent failure.
    let received = w.receiver.received();
    assert!(
        received
            .iter()
            .filter(|r| r.path == "py")
            .all(|r| r.verified == Some(true))
    );
    let redirect: Vec<&Received> = received.iter().filter(|r| r.path == "redirect").collect();
    let ok = w
        .receiver
        .wait_until(Duration::from_secs(10), |rs| {
            rs.iter().filter(|r| r.path == "redirect").count() >= 3
        })
        .await;
    assert!(ok && !redirect.is_empty());
    let rows = w
        .platform_sql
        .query(
            "SELECT d.status::text, d.attempt_count, d.last_error_class FROM walhook.deliveries d \
             JOIN walhook.endpoints e ON e.id = d.endpoint_id WHERE e.url LIKE '%/redirect' \
             AND d.status <> 'pending'",
            &[],
        )
        .await
        .unwrap();
    assert!(rows.len() >= 3);
    for r in rows {
        let (status, attempts, class): (String, i32, Option<String>) =
            (r.get(0), r.get(1), r.get(2));
        assert_eq!(
            (status.as_str(), attempts, class.as_deref()),
            ("failed", 1, Some("http_3xx"))
        );
    }

    // Every attempt names the secrets that signed it: as many as its
    // header carried signatures, and over the run the first alone, the
    // overlap (2, 1) and the third alone.
    let mut seen = std::collections::BTreeSet::new();
    for r in received.iter().filter(|r| r.path == "py") {
        let id: walhook_pipeline::ids::DeliveryId = r.webhook_id.parse().unwrap();
        let attempts = w.platform.attempts_of(id).await.unwrap();
        let versions = attempts[0]
            .secret_versions
            .clone()
            .expect("secret versions recorded");
        assert_eq!(
            versions.len(),
            r.signature.split(' ').count(),
            "{versions:?} for {}",
            r.signature
        );
        seen.insert(versions);
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        vec![vec![1], vec![2, 1], vec![3]]
    );
    // Each rotation made a config version naming its secret, and each
    // ended overlap a retired-secret audit record (written by the node that
    // reloaded its directory).
    let versions = w
        .platform
        .endpoint_versions(&walhook_pipeline::ids::TenantId::new("acme").unwrap(), id)
        .await
        .unwrap()
        .unwrap();
    let secret_of: Vec<(i32, Option<i32>)> = versions
        .iter()
        .map(|v| (v.version, v.secret_version))
        .collect();
    assert_eq!(secret_of, vec![(1, Some(1)), (2, Some(2)), (3, Some(3))]);
    let retired = w
        .platform_sql
        .query(
            "SELECT (detail->>'secret_version')::int4 FROM walhook.audit_log \
             WHERE action = 'endpoint.secret_retired' AND target = $1 ORDER BY 1",
            &[&id.to_string()],
        )
        .await
        .unwrap();
    let retired: Vec<i32> = retired.iter().map(|r| r.get(0)).collect();
    assert_eq!(retired, vec![1, 2], "one audit record per retired secret");
    child.terminate();
}

// ---------------------------------------------------------------------------

#[tokio::test]
async fn secrets_are_ciphertext_and_the_master_key_rotates_under_load() {
    let w = World::new().await;
    let (_, secret) = endpoint_with_secret(&w, "load", &["order.created"]).await;
    let plain = SigningSecret::parse(&secret).unwrap();

    // At rest: sealed, under the world's key, never the secret itself.
    let old_key = walhook_sql::Keyring::new(
        walhook_sql::secrets::MasterKey::read_file(&w.master_key_file).unwrap(),
        vec![],
    );
    let row = w
        .platform_sql
        .query_one("SELECT secret, key_id FROM walhook.endpoint_secrets", &[])
        .await
        .unwrap();
    let (stored, key_id): (Vec<u8>, String) = (row.get(0), row.get(1));
    assert_eq!(key_id, old_key.current_id());
    assert_ne!(stored, plain.expose_bytes());
    assert!(
        !stored
            .windows(plain.expose_bytes().len())
            .any(|w| w == plain.expose_bytes())
    );

    // walhook runs with a new current key; the old one still opens.
    let new_key_file = write_master_key(w.dir.path(), "new.key");
    let new_key = walhook_sql::secrets::MasterKey::read_file(&new_key_file).unwrap();
    let cfg = w.config(&format!(
        "[secrets]\nmaster_key_file = {:?}\nold_key_files = [{:?}]\n",
        new_key_file.display().to_string(),
        w.master_key_file.display().to_string()
    ));
    let child = Child::run(&cfg);
    w.wait_streaming().await;
    for n in 1..=5 {
        deliver_order(&w, "load", n).await;
    }

    // Rotate while orders keep coming.
    let writer = {
        let shop = w.pg.connect("shop").await.unwrap();
        tokio::spawn(async move {
            for n in 100..160i64 {
                shop.execute("INSERT INTO orders VALUES ($1, 'acme', 2.00)", &[&n])
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let rotate = {
        let cfg = cfg.clone();
        tokio::task::spawn_blocking(move || {
            run(walhook().args(["secrets", "rotate", "--config"]).arg(&cfg))
        })
        .await
        .unwrap()
    };
    assert!(
        rotate.status.success(),
        "{}",
        crate::support::stderr(&rotate)
    );
    assert!(
        stdout(&rotate).contains(&format!(
            "re-sealed 1 secrets from {} under {}",
            old_key.current_id(),
            new_key.id()
        )),
        "{}",
        stdout(&rotate)
    );
    writer.await.unwrap();
    let ids: Vec<String> = w
        .platform_sql
        .query("SELECT DISTINCT key_id FROM walhook.endpoint_secrets", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids, vec![new_key.id().to_owned()]);
    let again = run(walhook().args(["secrets", "rotate", "--config"]).arg(&cfg));
    assert!(
        stdout(&again).contains("already sealed"),
        "{}",
        stdout(&again)
    );

    // Every order written around the rotation arrives, verified, first time.
    let want: HashSet<String> = (1..=5)
        .chain(100..160)
        .map(|n: i64| n.to_string())
        .collect();
    let all = w
        .receiver
        .wait_until(Duration::from_secs(60), |rs| {
            let got: HashSet<String> = rs
                .iter()
                .map(|r| {
                    serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["object_id"]
                        .as_str()
                        .unwrap()
                        .to_owned()
                })
                .collect();
            want.is_subset(&got)
        })
        .await;
    assert!(all, "{}", w.state().await);
    assert!(
        w.receiver
            .received()
            .iter()
            .all(|r| r.verified == Some(true))
    );
    let failed: i64 = w
        .platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.attempts WHERE http_status IS DISTINCT FROM 200",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(failed, 0, "an attempt failed around the rotation");
    child.terminate();

    // The old key is retired: walhook runs on the new one alone…
    let cfg = w.config(&format!(
        "[secrets]\nmaster_key_file = {:?}\n",
        new_key_file.display().to_string()
    ));
    let status = stdout(&run(walhook()
        .args(["secrets", "status", "--config"])
        .arg(&cfg)));
    let rows: Vec<&str> = status.lines().skip(1).collect();
    assert_eq!(rows.len(), 1, "{status}");
    assert!(
        rows[0].starts_with(new_key.id()) && rows[0].ends_with(" 1 rows  current"),
        "{status}"
    );
    let child = Child::run(&cfg);
    w.wait_streaming().await;
    deliver_order(&w, "load", 1000).await;
    child.terminate();

    // …and a process holding only the old key refuses to start, naming the
    // key it lacks.
    let cfg = w.config(&format!(
        "[secrets]\nmaster_key_file = {:?}\n",
        w.master_key_file.display().to_string()
    ));
    let out =
        tokio::task::spawn_blocking(move || run(walhook().args(["run", "--config"]).arg(&cfg)))
            .await
            .unwrap();
    assert!(!out.status.success());
    let err = crate::support::stderr(&out);
    assert!(
        err.contains(new_key.id()) && err.contains("old_key_files"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------

#[test]
fn check_url_gives_the_verdict_of_every_corpus_entry_and_sends_nothing() {
    let corpus = include_str!("../connectors/src/http/tests/ssrf-corpus.tsv");
    let mut checked = 0;
    for line in corpus
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let cols: Vec<&str> = line.split('\t').collect();
        let url = cols[1]
            .replace("\\t", "\t")
            .replace("\\n", "\n")
            .replace("\\r", "\r")
            .replace("\\\\", "\\");
        let mut cmd = walhook();
        cmd.arg("check-url");
        if let Some(answers) = cols.get(2) {
            // The name as the resolver is asked it: after IDNA.
            let vetted = walhook_pipeline::url_policy::check_url(
                &url,
                &walhook_pipeline::url_policy::UrlPolicy::default(),
            )
            .unwrap();
            let host = vetted.url.host_str().unwrap().to_owned();
            let answers = if *answers == "-" { "" } else { answers };
            cmd.arg(format!("--resolve={host}={answers}"));
        }
        let out = run(cmd.arg("--").arg(&url));
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(1), "{url:?}: {text}");
        assert!(
            text.contains(&format!("verdict    refused ({})", cols[0])),
            "{url:?}: expected {} in\n{text}",
            cols[0]
        );
        checked += 1;
    }
    assert!(checked >= 150);
}

#[test]
fn check_url_explains_each_address_and_takes_the_policy_from_flags_or_config() {
    let out = run(walhook().args([
        "check-url",
        "https://hooks.example.com/in",
        "--resolve",
        "hooks.example.com=93.184.216.34,10.1.2.3",
    ]));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("address    93.184.216.34  allowed"), "{text}");
    assert!(
        text.contains("address    10.1.2.3  refused: 10.1.2.3 is private 10.0.0.0/8"),
        "{text}"
    );

    let out = run(walhook().args([
        "check-url",
        "https://Hooks.Example.com./in",
        "--resolve",
        "hooks.example.com=93.184.216.34,2606:4700::1111",
    ]));
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("url        https://hooks.example.com./in  (as sent)"),
        "{text}"
    );
    assert!(text.contains("verdict    allowed"), "{text}");

    let port = ["check-url", "https://93.184.216.34:8443/"];
    assert_eq!(run(walhook().args(port)).status.code(), Some(1));
    assert!(
        run(walhook().args(port).args(["--allow-port", "8443"]))
            .status
            .success()
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::support::write_config(dir.path(), "[egress]\nallowed_ports = [443, 8443]\n");
    assert!(
        run(walhook().args(port).arg("--config").arg(&cfg))
            .status
            .success()
    );

    let local = ["check-url", "http://127.0.0.1:8080/hook"];
    let out = run(walhook().args(local));
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("refused (scheme)"));
    let out = run(walhook().args(local).arg("--allow-http-loopback"));
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(stdout(&out).contains("DEVELOPMENT"));

    let out = run(walhook().args([
        "check-url",
        "https://gone.example.com/",
        "--resolve",
        "other.example.com=93.184.216.34",
    ]));
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
}
