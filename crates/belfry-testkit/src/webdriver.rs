//! A small W3C WebDriver client driving headless Chromium through Debian's
//! `chromedriver`, over plain HTTP with the tests' client: start, navigate,
//! find by CSS, click, type, run a script, wait for a condition, take a
//! screenshot, read the browser's console.
//!
//! [`Browser::start`] runs `chromedriver` (`$BELFRY_TEST_CHROMEDRIVER`,
//! default `/usr/bin/chromedriver`) in its own process group on a free
//! port and opens one session of `$BELFRY_TEST_CHROMIUM` (default
//! `/usr/bin/chromium`): `--headless=new`, no sandbox (tests may run as
//! root), 1400×1000, every console message logged. A missing binary is an
//! error naming the packages to install, never a silent skip.
//!
//! Dropping a [`Browser`] kills the whole process group (driver and
//! browser); [`Browser::quit`] ends the session politely first.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::free_port;

/// The key W3C WebDriver names element references by.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long chromedriver may take to answer `/status` ready.
const DRIVER_READY: Duration = Duration::from_secs(30);

/// Polling interval of the `wait_*` helpers.
const POLL: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum WebDriverError {
    #[error(
        "{what} is not installed at {path}: install Debian's `chromium` and `chromium-driver` \
         packages (scripts/test.sh does), or point {variable} at it"
    )]
    Missing {
        what: &'static str,
        path: PathBuf,
        variable: &'static str,
    },
    #[error("cannot start chromedriver: {0}")]
    Spawn(std::io::Error),
    #[error("chromedriver did not become ready within {0:?}")]
    NotReady(Duration),
    #[error("WebDriver {command}: {error}: {message}")]
    Command {
        command: String,
        error: String,
        message: String,
    },
    #[error("WebDriver {command}: transport: {message}")]
    Transport { command: String, message: String },
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout { what: String, timeout: Duration },
}

pub type Result<T> = std::result::Result<T, WebDriverError>;

/// A found element (its WebDriver reference).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element(String);

/// One entry of the browser's console log.
#[derive(Debug, Clone)]
pub struct LogEntry {
    /// `SEVERE`, `WARNING`, `INFO`, `DEBUG`.
    pub level: String,
    pub source: String,
    pub message: String,
}

impl LogEntry {
    pub fn is_severe(&self) -> bool {
        self.level == "SEVERE"
    }
}

/// chromedriver plus one browser session.
#[derive(Debug)]
pub struct Browser {
    driver: Option<Child>,
    /// `http://127.0.0.1:PORT/session/ID`.
    session: String,
    client: reqwest::Client,
}

fn binary(variable: &'static str, default: &str, what: &'static str) -> Result<PathBuf> {
    let path = std::env::var_os(variable).map_or_else(|| PathBuf::from(default), PathBuf::from);
    if path.is_file() {
        Ok(path)
    } else {
        Err(WebDriverError::Missing {
            what,
            path,
            variable,
        })
    }
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session.
    ///
    /// # Errors
    /// A binary is missing, chromedriver does not start, or the session is
    /// refused.
    pub async fn start() -> Result<Browser> {
        let driver_path = binary(
            "BELFRY_TEST_CHROMEDRIVER",
            "/usr/bin/chromedriver",
            "chromedriver",
        )?;
        let chromium = binary("BELFRY_TEST_CHROMIUM", "/usr/bin/chromium", "chromium")?;
        let port = free_port();
        let driver = Command::new(&driver_path)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own group, so dropping the browser kills Chromium too.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(WebDriverError::Spawn)?;
        let client = crate::http_client();
        let base = format!("http://127.0.0.1:{port}");
        let mut browser = Browser {
            driver: Some(driver),
            session: String::new(),
            client,
        };
        browser.wait_ready(&base).await?;
        let answer = browser
            .call(
                reqwest::Method::POST,
                &format!("{base}/session"),
                Some(json!({ "capabilities": { "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": path_text(&chromium),
                        "args": [
                            "--headless=new", "--no-sandbox", "--disable-gpu",
                            "--window-size=1400,1000", "--disable-dev-shm-usage",
                            "--no-first-run", "--no-default-browser-check",
                        ],
                    },
                    "goog:loggingPrefs": { "browser": "ALL" },
                } } })),
                "new session",
            )
            .await?;
        let id = answer["sessionId"]
            .as_str()
            .ok_or_else(|| WebDriverError::Command {
                command: "new session".into(),
                error: "no sessionId".into(),
                message: answer.to_string(),
            })?;
        browser.session = format!("{base}/session/{id}");
        Ok(browser)
    }

    async fn wait_ready(&self, base: &str) -> Result<()> {
        let deadline = tokio::time::Instant::now() + DRIVER_READY;
        loop {
            let ready = self
                .client
                .get(format!("{base}/status"))
                .send()
                .await
                .ok()
                .map(|r| r.json::<Value>());
            if let Some(body) = ready
                && let Ok(body) = body.await
                && body["value"]["ready"] == true
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(WebDriverError::NotReady(DRIVER_READY));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// One WebDriver command; answers its `value`.
    async fn call(
        &self,
        method: reqwest::Method,
        url: &str,
        body: Option<Value>,
        command: &str,
    ) -> Result<Value> {
        let mut request = self.client.request(method, url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let transport = |e: reqwest::Error| WebDriverError::Transport {
            command: command.to_string(),
            message: e.to_string(),
        };
        let answer: Value = request
            .send()
            .await
            .map_err(transport)?
            .json()
            .await
            .map_err(transport)?;
        let value = answer.get("value").cloned().unwrap_or(Value::Null);
        if let Some(error) = value.get("error").and_then(Value::as_str) {
            return Err(WebDriverError::Command {
                command: command.to_string(),
                error: error.to_string(),
                message: value["message"].as_str().unwrap_or_default().to_string(),
            });
        }
        Ok(value)
    }

    async fn session_call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let url = format!("{}{path}", self.session);
        self.call(method, &url, body, path).await
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value> {
        self.session_call(reqwest::Method::POST, path, Some(body))
            .await
    }

    async fn get(&self, path: &str) -> Result<Value> {
        self.session_call(reqwest::Method::GET, path, None).await
    }

    /// Navigates to `url` and waits for the page to load.
    ///
    /// # Errors
    /// The driver refused.
    pub async fn goto(&self, url: &str) -> Result<()> {
        self.post("/url", json!({ "url": url })).await.map(drop)
    }

    /// The first element matching `css`.
    ///
    /// # Errors
    /// None matches (`no such element`).
    pub async fn find(&self, css: &str) -> Result<Element> {
        let value = self
            .post("/element", json!({ "using": "css selector", "value": css }))
            .await?;
        element(&value, css)
    }

    /// Every element matching `css` (maybe none).
    ///
    /// # Errors
    /// The driver refused.
    pub async fn find_all(&self, css: &str) -> Result<Vec<Element>> {
        let value = self
            .post(
                "/elements",
                json!({ "using": "css selector", "value": css }),
            )
            .await?;
        value
            .as_array()
            .map(|items| items.iter().map(|v| element(v, css)).collect())
            .unwrap_or_else(|| Ok(Vec::new()))
    }

    /// Waits until an element matches `css`.
    ///
    /// # Errors
    /// Timeout, or the driver refused.
    pub async fn wait_for(&self, css: &str, timeout: Duration) -> Result<Element> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match self.find(css).await {
                Ok(found) => return Ok(found),
                Err(WebDriverError::Command { error, .. }) if error == "no such element" => {}
                Err(other) => return Err(other),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(WebDriverError::Timeout {
                    what: format!("an element {css:?}"),
                    timeout,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until `script` (a function body; `return` its answer) returns
    /// something truthy; answers that.
    ///
    /// # Errors
    /// Timeout, or the script threw.
    pub async fn wait_until(&self, script: &str, timeout: Duration) -> Result<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let value = self.execute(script, Vec::new()).await?;
            let truthy = match &value {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64().is_some_and(|n| n != 0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return Ok(value);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(WebDriverError::Timeout {
                    what: format!("{script:?} (last answer {value})"),
                    timeout,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Runs `script` (a function body) with `args`; answers its return.
    ///
    /// # Errors
    /// The script threw.
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Result<Value> {
        self.post("/execute/sync", json!({ "script": script, "args": args }))
            .await
    }

    /// Clicks `element` (scrolled into view first by the driver).
    ///
    /// # Errors
    /// Not clickable, or gone.
    pub async fn click(&self, element: &Element) -> Result<()> {
        self.post(&format!("/element/{}/click", element.0), json!({}))
            .await
            .map(drop)
    }

    /// Types `text` into `element`.
    ///
    /// # Errors
    /// Not interactable, or gone.
    pub async fn send_keys(&self, element: &Element, text: &str) -> Result<()> {
        self.post(
            &format!("/element/{}/value", element.0),
            json!({ "text": text }),
        )
        .await
        .map(drop)
    }

    /// The rendered text of `element`.
    ///
    /// # Errors
    /// Gone.
    pub async fn text(&self, element: &Element) -> Result<String> {
        let value = self.get(&format!("/element/{}/text", element.0)).await?;
        Ok(value.as_str().unwrap_or_default().to_string())
    }

    /// The page's current URL.
    ///
    /// # Errors
    /// The driver refused.
    pub async fn url(&self) -> Result<String> {
        let value = self.get("/url").await?;
        Ok(value.as_str().unwrap_or_default().to_string())
    }

    /// A PNG of the viewport.
    ///
    /// # Errors
    /// The driver refused, or the answer is not base64.
    pub async fn screenshot(&self) -> Result<Vec<u8>> {
        let value = self.get("/screenshot").await?;
        base64::engine::general_purpose::STANDARD
            .decode(value.as_str().unwrap_or_default())
            .map_err(|e| WebDriverError::Command {
                command: "screenshot".into(),
                error: "not base64".into(),
                message: e.to_string(),
            })
    }

    /// Saves a screenshot to `path` (its folder is created).
    ///
    /// # Errors
    /// As [`Browser::screenshot`]; a failed write is a `Command` error.
    pub async fn save_screenshot(&self, path: &Path) -> Result<()> {
        let png = self.screenshot().await?;
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(path, &png)
        };
        write().map_err(|e| WebDriverError::Command {
            command: format!("save screenshot to {}", path.display()),
            error: "io".into(),
            message: e.to_string(),
        })
    }

    /// The console messages since the last call (chromedriver's log
    /// endpoint hands each entry out once).
    ///
    /// # Errors
    /// The driver refused.
    pub async fn browser_logs(&self) -> Result<Vec<LogEntry>> {
        let value = self.post("/se/log", json!({ "type": "browser" })).await?;
        Ok(value
            .as_array()
            .map(|entries| {
                entries
                    .iter()
                    .map(|e| LogEntry {
                        level: e["level"].as_str().unwrap_or_default().to_string(),
                        source: e["source"].as_str().unwrap_or_default().to_string(),
                        message: e["message"].as_str().unwrap_or_default().to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Ends the session (closing Chromium), then stops chromedriver.
    pub async fn quit(mut self) {
        let _ = self.session_call(reqwest::Method::DELETE, "", None).await;
        self.kill_group();
        if let Some(mut driver) = self.driver.take() {
            let _ = driver.wait().await;
        }
    }

    fn kill_group(&mut self) {
        if let Some(pid) = self.driver.as_ref().and_then(Child::id) {
            kill_process_group(pid);
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.kill_group();
    }
}

fn element(value: &Value, css: &str) -> Result<Element> {
    value[ELEMENT_KEY]
        .as_str()
        .map(|id| Element(id.to_string()))
        .ok_or_else(|| WebDriverError::Command {
            command: format!("find {css:?}"),
            error: "no element reference".into(),
            message: value.to_string(),
        })
}

#[allow(unsafe_code)]
fn kill_process_group(leader: u32) {
    let Ok(pid) = libc::pid_t::try_from(leader) else {
        return;
    };
    // SAFETY: kill(2) touches no memory of ours; `leader` is our own child,
    // not yet reaped, and leads the group it was started in, so the group
    // holds only chromedriver and the browser it started.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
}

fn path_text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}
