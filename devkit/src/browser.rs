//! Headless Chromium driven through chromedriver's W3C WebDriver API, for
//! the browser tests of walhook's HTML pages (the reconciliation report,
//! the console). A small client of our own over `reqwest`: a session, CSS
//! lookups, clicks, typing, text, attributes, rectangles and screenshots.
//!
//! Chromium and chromedriver come from Debian's packages
//! (`scripts/ensure-chromium.sh`), or from `WALHOOK_CHROMIUM` and
//! `WALHOOK_CHROMEDRIVER`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

/// W3C WebDriver's key for an element reference.
pub const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A binary from an environment variable or its Debian path.
pub fn tool(var: &str, default: &str) -> Option<PathBuf> {
    let path = std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
    path.is_file().then_some(path)
}

/// chromedriver on a free loopback port, killed when dropped.
pub struct Driver {
    _child: Child,
    base: String,
}

impl Driver {
    /// Starts chromedriver from `binary` and waits until it listens.
    pub async fn start(binary: &Path) -> Driver {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let mut child = Command::new(binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        // chromedriver says when it listens; wait for that line rather than
        // polling, then keep draining its output so it never blocks on a
        // full pipe.
        let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let ready = async {
            while let Some(line) = lines.next_line().await.expect("chromedriver's output") {
                eprintln!("chromedriver: {line}");
                if line.contains("started successfully") {
                    return true;
                }
            }
            false
        };
        let ready = tokio::time::timeout(Duration::from_secs(30), ready).await;
        assert!(
            matches!(ready, Ok(true)),
            "chromedriver did not start on port {port} within 30 s"
        );
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("chromedriver: {line}");
            }
        });
        Driver {
            _child: child,
            base: format!("http://127.0.0.1:{port}"),
        }
    }
}

/// One WebDriver session.
pub struct Session {
    http: reqwest::Client,
    url: String,
}

impl Session {
    /// A headless Chromium (`chromium`, its profile in `profile`).
    pub async fn new(driver: &Driver, chromium: &Path, profile: &Path) -> Session {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("an HTTP client");
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1280,2000",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        }}});
        let response = http
            .post(format!("{}/session", driver.base))
            .json(&capabilities)
            .send()
            .await
            .expect("chromedriver answers");
        let body: Value = response.json().await.expect("a JSON answer");
        let id = body["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {body}"))
            .to_owned();
        Session {
            http,
            url: format!("{}/session/{id}", driver.base),
        }
    }

    /// The `value` of a WebDriver answer, failing on a WebDriver error.
    async fn call(&self, request: reqwest::RequestBuilder, what: &str) -> Value {
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let status = response.status();
        let body: Value = response
            .json()
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(status.is_success(), "{what}: {status} {body}");
        body["value"].clone()
    }

    /// GET a command of the session.
    pub async fn get(&self, path: &str) -> Value {
        self.call(self.http.get(format!("{}{path}", self.url)), path)
            .await
    }

    /// POST a command of the session.
    pub async fn post(&self, path: &str, body: Value) -> Value {
        self.call(
            self.http.post(format!("{}{path}", self.url)).json(&body),
            path,
        )
        .await
    }

    /// Element ids for a CSS selector.
    pub async fn find(&self, css: &str) -> Vec<String> {
        let found = self
            .post("/elements", json!({"using": "css selector", "value": css}))
            .await;
        found
            .as_array()
            .expect("a list of elements")
            .iter()
            .map(|e| {
                e[ELEMENT]
                    .as_str()
                    .unwrap_or_else(|| panic!("not an element: {e}"))
                    .to_owned()
            })
            .collect()
    }

    /// The rendered text of the element.
    pub async fn text(&self, element: &str) -> String {
        let text = self.get(&format!("/element/{element}/text")).await;
        text.as_str().expect("text").to_owned()
    }

    /// The element's attribute `name`.
    pub async fn attribute(&self, element: &str, name: &str) -> String {
        let value = self
            .get(&format!("/element/{element}/attribute/{name}"))
            .await;
        value
            .as_str()
            .unwrap_or_else(|| panic!("no {name} on {element}"))
            .to_owned()
    }

    /// The element's rendered rectangle: x, y, width, height in CSS pixels.
    pub async fn rect(&self, element: &str) -> [f64; 4] {
        let r = self.get(&format!("/element/{element}/rect")).await;
        ["x", "y", "width", "height"].map(|k| r[k].as_f64().expect("a number"))
    }

    /// Opens `url` and waits for the page to load.
    pub async fn goto(&self, url: &str) {
        self.post("/url", json!({ "url": url })).await;
    }

    /// The current page's URL.
    pub async fn current_url(&self) -> String {
        self.get("/url")
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The one element matching `css`, failing when there is not exactly one.
    pub async fn one(&self, css: &str) -> String {
        let found = self.find(css).await;
        assert_eq!(found.len(), 1, "{css}: {} elements", found.len());
        found[0].clone()
    }

    /// Types `text` into the element.
    pub async fn type_into(&self, element: &str, text: &str) {
        self.post(
            &format!("/element/{element}/value"),
            json!({ "text": text }),
        )
        .await;
    }

    /// Clicks the element (a link or a button: the browser follows it).
    pub async fn click(&self, element: &str) {
        self.post(&format!("/element/{element}/click"), json!({}))
            .await;
    }

    /// Clicks a link or a submit button and waits until the browser left
    /// the page (the clicked element is gone from the document), so that
    /// what is read next is the page it led to.
    pub async fn click_and_wait(&self, element: &str) {
        self.click(element).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let answer = self
                .http
                .get(format!("{}/element/{element}/name", self.url))
                .send()
                .await
                .expect("chromedriver answers");
            if !answer.status().is_success() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the click on {element} did not lead to another page within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The next command waits for the new page to load; ask for one.
        self.current_url().await;
    }

    /// The rendered text of the first element matching `css` ("" if none).
    pub async fn text_of(&self, css: &str) -> String {
        match self.find(css).await.first() {
            Some(e) => self.text(e).await,
            None => String::new(),
        }
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> Vec<u8> {
        let png = self.get("/screenshot").await;
        base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("a base64 screenshot"))
            .expect("a PNG")
    }

    /// Saves a screenshot to `path`.
    pub async fn save_screenshot(&self, path: &Path) {
        std::fs::write(path, self.screenshot().await)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }

    /// Ends the session (closes the browser).
    pub async fn close(self) {
        let _closed = self.http.delete(&self.url).send().await;
    }
}
