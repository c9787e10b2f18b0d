//! Endpoint ownership proofs end to end, through `walhook run`'s real
//! dispatcher: a receiver that echoes its request (body or headers) stays
//! unverified and is told what to answer; one that answers the documented
//! proof is verified and receives, during a rotation overlap with either
//! secret; and the Python and Node.js receivers printed in docs/api.md,
//! read from that page and run as real servers on loopback, are verified.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use walhook_devkit::receiver::VerificationAnswer;

use crate::support::api::{Http, insert_order, onboard, start, wait_verified};
use crate::support::python;

/// The judge reads exactly what the egress keeps of an answer: a change of
/// either limit alone would make documented answers fail unseen.
#[test]
fn the_judge_reads_every_byte_the_egress_keeps() {
    assert_eq!(
        walhook_pipeline::dispatch::verify::MAX_ANSWER_BYTES,
        walhook_connectors::http::sink::EXCERPT_MAX_BYTES
    );
}

async fn create(api: &Http, key: &str, url: &str) -> (String, String) {
    let (s, created) = api
        .post(
            key,
            "/v1/webhook-endpoints",
            json!({"url": url, "event_types": ["order.created"]}),
        )
        .await;
    assert_eq!(s, 201, "{created}");
    assert_eq!(created["endpoint"]["verification"]["state"], "pending");
    (
        created["endpoint"]["id"].as_str().unwrap().to_owned(),
        created["secret"].as_str().unwrap().to_owned(),
    )
}

/// Waits until endpoint `id` has a failed check on record; returns its
/// `verification`.
async fn wait_failed(api: &Http, key: &str, id: &str) -> Value {
    let body = api
        .wait_for(
            key,
            &format!("/v1/webhook-endpoints/{id}"),
            "a failed ownership check on record",
            |b| b["verification"]["last_error"].is_string(),
        )
        .await;
    body["verification"].clone()
}

async fn succeeded(api: &Http, key: &str, id: &str) -> Value {
    api.wait_for(
        key,
        &format!("/v1/webhook-deliveries?endpoint_id={id}&status=succeeded"),
        "a delivery that succeeded",
        |b| b["data"].as_array().is_some_and(|d| !d.is_empty()),
    )
    .await
}

/// An echo of the request, body or headers, does not prove ownership: the
/// endpoint stays pending, receives nothing, and its record says what to
/// answer. The proof passes, by the old or the new secret of a rotation.
#[tokio::test]
async fn an_echo_stays_unverified_and_the_proof_passes() {
    let (w, child, api) = start("").await;
    let key = onboard(&w, &api, "acme").await;
    w.receiver
        .answer_verification("echo-body", VerificationAnswer::EchoBody);
    w.receiver
        .answer_verification("echo-headers", VerificationAnswer::EchoHeaders);
    let mut ids = Vec::new();
    for path in ["echo-body", "echo-headers", "proof"] {
        let (id, secret) = create(&api, &key, &w.receiver.url(path)).await;
        w.receiver.set_secrets(path, vec![secret]);
        ids.push(id);
    }
    let (body_id, headers_id, proof_id) = (&ids[0], &ids[1], &ids[2]);
    insert_order(&w, 1, "acme").await;

    wait_verified(&api, &key, proof_id).await;
    succeeded(&api, &key, proof_id).await;
    assert_eq!(w.receiver.verification_signed("proof"), Some(true));
    for (id, path) in [(body_id, "echo-body"), (headers_id, "echo-headers")] {
        let v = wait_failed(&api, &key, id).await;
        assert_eq!(v["state"], "pending", "{path}: {v}");
        let why = v["last_error"].as_str().unwrap();
        assert!(
            why.contains("echoed")
                && why.contains("\"proof\"")
                && why.contains("walhook-verification.v1."),
            "{path}: {why}"
        );
        assert!(w.receiver.verifications(path) >= 1, "{path}");
    }
    // The proving endpoint's delivery went out long ago; the echoing ones
    // still hold theirs.
    for id in [body_id, headers_id] {
        let (_, pending) = api
            .get(
                &key,
                &format!("/v1/webhook-deliveries?endpoint_id={id}&status=pending"),
            )
            .await;
        assert_eq!(
            pending["data"].as_array().map(Vec::len),
            Some(1),
            "{pending}"
        );
    }
    assert_eq!(w.receiver.arrivals("echo-body"), 0);
    assert_eq!(w.receiver.arrivals("echo-headers"), 0);

    // A rotation overlap: the receiver still proves with the old secret,
    // then only with the new one; both pass.
    let (s, rotated) = api
        .post(
            &key,
            &format!("/v1/webhook-endpoints/{proof_id}/rotate-secret"),
            json!({}),
        )
        .await;
    assert_eq!(s, 200, "{rotated}");
    let new_secret = rotated["secret"].as_str().unwrap().to_owned();
    let reverify = |id: String| {
        let api = &api;
        let key = &key;
        async move {
            let (s, body) = api
                .post(
                    key,
                    &format!("/v1/webhook-endpoints/{id}/verify"),
                    json!({}),
                )
                .await;
            assert_eq!(s, 202, "{body}");
            wait_verified(api, key, &id).await;
        }
    };
    reverify(proof_id.clone()).await;
    w.receiver.set_secrets("proof", vec![new_secret]);
    reverify(proof_id.clone()).await;

    // The echo learns the proof: a new check passes and the waiting
    // delivery goes out.
    w.receiver
        .answer_verification("echo-body", VerificationAnswer::Proof);
    reverify(body_id.clone()).await;
    succeeded(&api, &key, body_id).await;
    assert!(child.terminate().success());
}

/// The fenced block of `language` in docs/api.md's "Endpoint ownership
/// checks" section.
fn documented(language: &str) -> String {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/api.md"))
        .expect("docs/api.md");
    let section = doc
        .split("## Endpoint ownership checks")
        .nth(1)
        .expect("the section");
    let start = section
        .find(&format!("```{language}\n"))
        .unwrap_or_else(|| panic!("no {language} block"))
        + language.len()
        + 4;
    let len = section[start..].find("```").unwrap();
    let code = section[start..start + len].to_owned();
    let lines = code.lines().count();
    assert!(lines <= 7, "the {language} snippet grew to {lines} lines");
    code
}

/// A documented snippet served over HTTP on loopback: it answers ownership
/// checks with the documented function and the secret read from a file (the
/// test learns the secret only from the answer that creates the endpoint,
/// so a check arriving first waits for the file), and 200 `{}` to
/// deliveries.
const PYTHON_SERVER: &str = r#"
import http.server, pathlib, sys, time
secret_file = pathlib.Path(sys.argv[1])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        out = b"{}"
        if self.headers.get("walhook-event-type") == "webhook.verification":
            deadline = time.time() + 10
            while not secret_file.exists() and time.time() < deadline:
                time.sleep(0.05)
            out = verification_answer(body, secret_file.read_text().strip())
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

const NODE_SERVER: &str = r#"
const http = require("node:http");
const fs = require("node:fs");
// `node -e CODE FILE`: the file is the last argument.
const secretFile = process.argv[process.argv.length - 1];
const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", async () => {
    const body = Buffer.concat(chunks).toString();
    let out = "{}";
    if (req.headers["walhook-event-type"] === "webhook.verification") {
      const deadline = Date.now() + 10000;
      while (!fs.existsSync(secretFile) && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 50));
      }
      out = verificationAnswer(body, fs.readFileSync(secretFile, "utf8").trim());
    }
    res.writeHead(200, { "content-type": "application/json" });
    res.end(out);
  });
});
server.listen(0, "127.0.0.1", () => console.log(server.address().port));
"#;

/// A receiver process, killed when dropped.
struct Served {
    child: std::process::Child,
    port: u16,
    secret_file: PathBuf,
}

impl Served {
    fn start(program: &Path, args: &[&str], secret_file: PathBuf) -> Served {
        let mut child = Command::new(program)
            .args(args)
            .arg(&secret_file)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{} printed {line:?}, not its port", program.display()));
        Served {
            child,
            port,
            secret_file,
        }
    }

    /// Hands the receiver its secret (written whole, then renamed).
    fn give_secret(&self, secret: &str) {
        let tmp = self.secret_file.with_extension("tmp");
        std::fs::write(&tmp, secret).unwrap();
        std::fs::rename(&tmp, &self.secret_file).unwrap();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The receivers docs/api.md prints, in Python (the test virtualenv's
/// interpreter, `WALHOOK_PYTHON`) and Node.js, each wrapped in a plain HTTP
/// server: both are verified through the real dispatcher and then receive
/// their endpoint's delivery.
#[tokio::test]
async fn the_documented_python_and_node_receivers_are_verified() {
    let (w, child, api) = start("").await;
    let key = onboard(&w, &api, "acme").await;
    let python_code = format!("{}\n{PYTHON_SERVER}", documented("python"));
    let node_code = format!("{}\n{NODE_SERVER}", documented("js"));
    let receivers = [
        (
            "python",
            Served::start(
                &python(),
                &["-c", &python_code],
                w.dir.path().join("python.secret"),
            ),
        ),
        (
            "node",
            Served::start(
                Path::new("node"),
                &["-e", &node_code],
                w.dir.path().join("node.secret"),
            ),
        ),
    ];
    let mut ids = Vec::new();
    for (name, served) in &receivers {
        let url = format!("http://127.0.0.1:{}/{name}", served.port);
        let (id, secret) = create(&api, &key, &url).await;
        served.give_secret(&secret);
        ids.push((name, id));
    }
    insert_order(&w, 7, "acme").await;
    for (name, id) in &ids {
        wait_verified(&api, &key, id).await;
        let (_, detail) = api.get(&key, &format!("/v1/webhook-endpoints/{id}")).await;
        assert_eq!(
            detail["verification"]["state"], "verified",
            "the {name} receiver: {detail}"
        );
        let delivered = succeeded(&api, &key, id).await;
        assert_eq!(
            delivered["data"][0]["event_type"], "order.created",
            "{name}"
        );
    }
    drop(receivers);
    assert!(child.terminate().success());
}
