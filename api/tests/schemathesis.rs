//! Schemathesis (property-based API testing from the OpenAPI document)
//! against the served API with a tenant key: no 5xx, and every response
//! matches the document (status codes, content types, schemas).
//!
//! Python comes from `WALHOOK_PYTHON` (set by `scripts/test.sh` to its
//! virtualenv), else `python3`. Without schemathesis the test fails and
//! says how to install it: a missing tool never passes silently.

use serde_json::json;
use tokio::process::Command;

use crate::support::Api;

const INSTALL: &str = "schemathesis is not installed for this Python. Run scripts/test.sh (it \
    installs tests/python-requirements.txt into $HOME/.cache/walhook-venv and exports \
    WALHOOK_PYTHON), or: python3 -m venv ~/.cache/walhook-venv && \
    ~/.cache/walhook-venv/bin/pip install -r tests/python-requirements.txt && \
    export WALHOOK_PYTHON=~/.cache/walhook-venv/bin/python";

/// The `st` entry point, run through the chosen interpreter.
const ENTRY: &str = "import sys; from schemathesis.cli import schemathesis; sys.argv[0] = 'st'; sys.exit(schemathesis())";

#[tokio::test]
async fn schemathesis_finds_no_server_errors_or_schema_violations() {
    let python = std::env::var("WALHOOK_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python)
        .args(["-c", "import schemathesis"])
        .output()
        .await;
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "{INSTALL}\n({python}: {})",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => panic!("{INSTALL}\n(cannot run {python}: {e})"),
    }

    let api = Api::start().await;
    let key = api.tenant("acme").await;
    // Objects for the generated requests to find: an endpoint, a delivery.
    let ep = api.endpoint(&key, &["invoice.paid"]).await;
    let t = api
        .post(&key, &format!("/v1/webhook-endpoints/{ep}/test"), json!({}))
        .await;
    assert_eq!(t.status, 202, "{t:?}");
    // Tenant routes with the tenant's key, operator routes with the
    // operator token.
    let tenant_header = format!("Authorization: Bearer {key}");
    let operator_header = format!("Authorization: Bearer {}", crate::support::OPERATOR);
    let runs = [
        (tenant_header.as_str(), "--exclude-tag"),
        (operator_header.as_str(), "--include-tag"),
    ];
    for (header, filter) in runs {
        let report = tempfile::tempdir().unwrap();
        let out = Command::new(&python)
            .args(["-c", ENTRY, "run"])
            .arg(format!("{}/openapi.json", api.base))
            .args(["--header", header, filter, "tenants"])
            .args([
                "--checks",
                "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
                "--phases",
                "examples,coverage,fuzzing",
                "--max-examples",
                "25",
                "--seed",
                "20261129",
                "--workers",
                "2",
                "--request-timeout",
                "10",
                "--no-color",
                "--report",
                "junit",
                "--report-dir",
            ])
            .arg(report.path())
            .current_dir(report.path())
            .output()
            .await
            .expect("cannot run schemathesis");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "schemathesis ({filter} tenants) found problems (exit {:?}):\n{stdout}\n{stderr}",
            out.status.code()
        );
        // It really tested something.
        assert!(stdout.contains("passed"), "{stdout}\n{stderr}");
        eprintln!("{stdout}");
    }
    // The generated requests reached the database and left it consistent.
    assert!(api.count("SELECT count(*) FROM walhook.tenants").await >= 1);
}
