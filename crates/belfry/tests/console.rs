//! The web console (`/ui`) in a real browser: headless Chromium (Debian's
//! `chromium` and `chromium-driver`, driven over WebDriver) against a real
//! `belfry serve` and a real webhook receiver. Every page loads without a
//! console error and shows its data; a redrive, a pause and a resume done
//! by clicking take effect (checked through the API); a read-only key gets
//! no write button; a bulk redrive of 1,000 failed events started with one
//! click delivers them all and the audit log names the key. Screenshots of
//! every page go to `target/test-artifacts/console/`.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use belfry_core::auth::KeySecret;
use belfry_testkit::webdriver::LogEntry;
use belfry_testkit::{BelfryLaunch, BelfryProcess, Browser, Receiver, Response, Rule};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_belfry");

/// Generous bounds: a loaded two-core machine runs debug builds.
const PAGE_DEADLINE: Duration = Duration::from_secs(30);
const DELIVERY_DEADLINE: Duration = Duration::from_secs(60);
const BULK_DEADLINE: Duration = Duration::from_secs(180);

/// A script answering the state of the bulk action shown once it left
/// `running` (null while it runs).
const BULK_FINISHED: &str = "const e = document.querySelector('[data-bulk][data-state]'); \
     return e !== null && e.dataset.state !== 'running' ? e.dataset.state : null;";

/// The node's `/v1` API with a key (or none while the node is open).
struct Api {
    base: String,
    key: Option<String>,
}

impl Api {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request =
            belfry_testkit::http_client().request(method.clone(), format!("{}{path}", self.base));
        if let Some(key) = &self.key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn ok(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let (status, answer) = self.call(method.clone(), path, body).await;
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {status} {answer}"
        );
        answer
    }

    async fn get(&self, path: &str) -> Value {
        self.ok(reqwest::Method::GET, path, None).await
    }

    async fn put(&self, path: &str, body: Value) -> Value {
        self.ok(reqwest::Method::PUT, path, Some(body)).await
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.ok(reqwest::Method::POST, path, Some(body)).await
    }

    /// Polls `path` until `done` holds for its answer.
    async fn wait_for(
        &self,
        path: &str,
        what: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let started = Instant::now();
        loop {
            let answer = self.get(path).await;
            if done(&answer) {
                return answer;
            }
            assert!(
                started.elapsed() < timeout,
                "{what} within {timeout:?}: last {answer}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every event of `tenant` in `status` (pages of 1,000).
    async fn events_in(&self, tenant: &str, status: &str) -> Vec<Value> {
        let mut all = Vec::new();
        let mut cursor = String::new();
        loop {
            let page = self
                .get(&format!(
                    "/v1/tenants/{}/events?status={status}&limit=1000{cursor}",
                    enc(tenant)
                ))
                .await;
            all.extend(page["events"].as_array().cloned().unwrap_or_default());
            match page["next_cursor"].as_str() {
                Some(next) => cursor = format!("&cursor={next}"),
                None => return all,
            }
        }
    }
}

/// Whether the page has a button labelled `label`.
async fn has_button(console: &Console, label: &str) -> bool {
    console
        .browser
        .execute(
            "return [...document.querySelectorAll('main button')].some(b => b.textContent.startsWith(arguments[0]));",
            vec![json!(label)],
        )
        .await
        .unwrap()
        == json!(true)
}

fn enc(text: &str) -> String {
    text.replace('/', "%2F")
}

/// The browser on the console of one node, saving screenshots.
struct Console {
    browser: Browser,
    base: String,
    shots: PathBuf,
}

impl Console {
    async fn start(base: &str) -> Console {
        let browser = Browser::start()
            .await
            .unwrap_or_else(|e| panic!("the console test needs headless Chromium: {e}"));
        Console {
            browser,
            base: base.to_string(),
            shots: common::test_artifacts("console"),
        }
    }

    /// Loads `/ui#{hash}` afresh and waits until page `ready` rendered.
    async fn load(&self, hash: &str, ready: &str) {
        self.browser
            .goto(&format!(
                "{}/ui?load={}#{hash}",
                self.base,
                common::now_ms()
            ))
            .await
            .unwrap();
        self.wait_ready(ready).await;
    }

    /// Goes to `#{hash}` in the loaded page and waits until `ready` rendered.
    async fn open(&self, hash: &str, ready: &str) {
        self.unmark().await;
        self.browser
            .execute(
                "const target = '#' + arguments[0]; \
                 if (location.hash === target) window.dispatchEvent(new HashChangeEvent('hashchange')); \
                 else location.hash = target; \
                 return true;",
                vec![json!(hash)],
            )
            .await
            .unwrap();
        self.wait_ready(ready).await;
    }

    /// Clicks `css` and waits until page `ready` rendered again.
    async fn click_to(&self, css: &str, ready: &str) {
        self.unmark().await;
        self.click(css).await;
        self.wait_ready(ready).await;
    }

    async fn click(&self, css: &str) {
        let element = self
            .browser
            .wait_for(css, PAGE_DEADLINE)
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
        self.browser
            .click(&element)
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    async fn type_into(&self, css: &str, text: &str) {
        let element = self.browser.wait_for(css, PAGE_DEADLINE).await.unwrap();
        self.browser.send_keys(&element, text).await.unwrap();
    }

    /// Forgets which page rendered last, so the next wait sees a new render.
    async fn unmark(&self) {
        self.browser
            .execute(
                "delete document.getElementById('main').dataset.ready; return true;",
                vec![],
            )
            .await
            .unwrap();
    }

    /// Waits until page `name` finished rendering, then checks the console.
    async fn wait_ready(&self, name: &str) {
        let script = format!("return document.getElementById('main').dataset.ready === '{name}';");
        if let Err(e) = self.browser.wait_until(&script, PAGE_DEADLINE).await {
            let banner = self.text("#banner").await;
            let _ = self
                .browser
                .save_screenshot(&self.shots.join(format!("failed-{name}.png")))
                .await;
            panic!(
                "page {name} did not render: {e}; banner {banner:?}; console {:?}",
                self.browser.browser_logs().await
            );
        }
        self.assert_no_console_errors(name).await;
    }

    /// Fails on any error the page logged (script errors, failed loads,
    /// CSP violations: all SEVERE).
    async fn assert_no_console_errors(&self, what: &str) {
        let logs: Vec<LogEntry> = self.browser.browser_logs().await.unwrap();
        let severe: Vec<&LogEntry> = logs.iter().filter(|e| e.is_severe()).collect();
        assert!(
            severe.is_empty(),
            "{what}: console errors {severe:#?} (all: {logs:#?})"
        );
    }

    async fn text(&self, css: &str) -> String {
        match self.browser.find(css).await {
            Ok(element) => self
                .browser
                .text(&element)
                .await
                .unwrap_or_else(|e| panic!("text of {css}: {e}")),
            Err(e) => panic!("find {css}: {e}"),
        }
    }

    /// Waits until `css`'s text contains `needle`.
    async fn wait_text(&self, css: &str, needle: &str) {
        let script = format!(
            "const e = document.querySelector({css}); return e !== null && e.textContent.includes({needle});",
            css = json!(css),
            needle = json!(needle)
        );
        if let Err(e) = self.browser.wait_until(&script, PAGE_DEADLINE).await {
            panic!(
                "{css} never showed {needle:?}: {e}; it shows {:?}",
                self.text(css).await
            );
        }
    }

    async fn count(&self, css: &str) -> usize {
        self.browser.find_all(css).await.unwrap().len()
    }

    async fn shot(&self, name: &str) {
        let path = self.shots.join(format!("{name}.png"));
        self.browser.save_screenshot(&path).await.unwrap();
        eprintln!("screenshot: {}", path.display());
    }
}

/// A node whose tenants hold delivered, failed and future events and two
/// schedules; 3 failed events (the receiver refused them with 400).
async fn populated_node(dir: &std::path::Path, receiver: &Receiver) -> (BelfryProcess, Api) {
    let node = BelfryProcess::start(BelfryLaunch::new(BIN, dir.join("data")))
        .await
        .expect("belfry starts");
    let api = Api {
        base: node.base_url(),
        key: None,
    };
    let shop = "shop/orders";
    api.put(
        &format!("/v1/tenants/{}", enc(shop)),
        json!({ "sink": { "type": "http", "url": receiver.url("/hook") } }),
    )
    .await;
    api.put(
        "/v1/tenants/shop%2Freports",
        json!({ "sink": { "type": "builtin", "processor": "log" },
                "notify": { "url": receiver.url("/notices") } }),
    )
    .await;
    receiver.push_rule(Rule::first(3, Response::status(400)).for_path("/hook"));
    let now = common::rfc3339(common::now_ms());
    let batch = |ids: &[&str], at: &str| {
        json!({ "events": ids.iter().map(|id| json!({ "id": id, "deliver_at": at,
            "payload": format!("{{\"order\": \"{id}\"}}") })).collect::<Vec<_>>() })
    };
    api.post(
        &format!("/v1/tenants/{}/events", enc(shop)),
        batch(&["order-1", "order-2", "order-3"], &now),
    )
    .await;
    api.wait_for(
        &format!("/v1/tenants/{}/events?status=failed", enc(shop)),
        "three failed events",
        DELIVERY_DEADLINE,
        |page| page["events"].as_array().is_some_and(|e| e.len() == 3),
    )
    .await;
    api.post(
        &format!("/v1/tenants/{}/events", enc(shop)),
        batch(&["order-4", "order-5", "order-6"], &now),
    )
    .await;
    api.wait_for(
        &format!("/v1/tenants/{}/events?status=delivered", enc(shop)),
        "three delivered events",
        DELIVERY_DEADLINE,
        |page| page["events"].as_array().is_some_and(|e| e.len() == 3),
    )
    .await;
    let later = common::rfc3339(common::now_ms() + 3_600_000);
    api.post(
        &format!("/v1/tenants/{}/events", enc(shop)),
        batch(&["order-7"], &later),
    )
    .await;
    api.put(
        &format!("/v1/tenants/{}/schedules/nightly-report", enc(shop)),
        json!({ "expression": "30 2 * * *", "time_zone": "Europe/Berlin", "payload": "report" }),
    )
    .await;
    api.put(
        "/v1/tenants/shop%2Freports/schedules/heartbeat",
        json!({ "expression": "@every 2s", "payload": "beat" }),
    )
    .await;
    (node, api)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_console_page_loads_cleanly_and_its_buttons_take_effect() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let (node, mut api) = populated_node(dir.path(), &receiver).await;
    let shop = "shop/orders";
    let console = Console::start(&node.base_url()).await;

    // Open mode (no key exists, loopback): no sign-in, the overview.
    console.load("/", "overview").await;
    let who = console.text("#who").await;
    console.shot("open-mode").await;
    assert!(who.contains("open mode"), "{who:?}");

    // The first admin key closes the node: now the console asks for one.
    let admin = api.post("/v1/keys", json!({ "role": "admin" })).await;
    let admin_secret = admin["secret"].as_str().unwrap().to_string();
    let admin_id = admin["id"].as_str().unwrap().to_string();
    api.key = Some(admin_secret.clone());
    let reader = api
        .post("/v1/keys", json!({ "role": "read", "tenant": shop }))
        .await;
    let reader_secret = reader["secret"].as_str().unwrap().to_string();
    console.load("/overview", "signin").await;
    console.shot("signin").await;
    console.type_into("input[name=key]", &admin_secret).await;
    console
        .click_to("form button[type=submit]", "overview")
        .await;
    let who = console.text("#who").await;
    assert!(who.contains(&admin_id) && who.contains("admin"), "{who}");
    // The key is in the tab's session storage, never in the URL.
    assert!(!console.browser.url().await.unwrap().contains("bfy_"));

    // Overview: plots fill as scrapes arrive.
    console
        .browser
        .wait_until(
            "const c = document.querySelectorAll('svg.chart'); \
             return c.length === 4 && [...c].every(x => Number(x.dataset.points) >= 4);",
            PAGE_DEADLINE,
        )
        .await
        .expect("the overview plots four charts with samples");
    assert!(
        console
            .text("main")
            .await
            .to_lowercase()
            .contains("partitions owned")
    );
    console.assert_no_console_errors("overview polling").await;
    console.shot("overview").await;

    // Tenants.
    console
        .click_to("#nav a[href='#/tenants']", "tenants")
        .await;
    let tenants = console.text("main").await;
    assert!(
        tenants.contains(shop) && tenants.contains("shop/reports"),
        "{tenants}"
    );
    assert!(tenants.contains(&receiver.url("/hook")), "{tenants}");
    assert!(tenants.contains(&receiver.url("/notices")), "{tenants}");
    // The http tenant's circuit breaker, next to its pause state.
    assert!(
        tenants.contains("Circuit") && tenants.contains("closed"),
        "{tenants}"
    );
    console.shot("tenants").await;

    // Events: the list, then the status filter through the form.
    console
        .open(&format!("/events?tenant={}", enc(shop)), "events")
        .await;
    for id in ["order-1", "order-4", "order-7"] {
        console.wait_text("main table", id).await;
    }
    console
        .click("select[name=status] option[value=failed]")
        .await;
    console
        .click_to("form.filters button[type=submit]", "events")
        .await;
    assert_eq!(console.count("main tbody tr").await, 3);
    assert!(console.text("main tbody").await.contains("order-2"));
    assert!(
        console
            .browser
            .url()
            .await
            .unwrap()
            .contains("status=failed")
    );
    console.shot("events").await;

    // One event with every attempt.
    console
        .open(&format!("/events?tenant={}", enc(shop)), "events")
        .await;
    console.click_to("main a[href$='/order-4']", "events").await;
    console.wait_text("main", "Attempts (1)").await;
    assert!(console.text("main table").await.contains("delivered"));
    assert!(
        console
            .text("main pre")
            .await
            .contains("\"order\": \"order-4\"")
    );
    console.shot("event").await;

    // Schedules: pause by clicking; the API agrees; resume on the detail page.
    console
        .open(&format!("/schedules?tenant={}", enc(shop)), "schedules")
        .await;
    console.wait_text("main table", "nightly-report").await;
    console.wait_text("main table", "Europe/Berlin").await;
    console
        .click_to(
            "tr[data-schedule='nightly-report'] button[data-write]",
            "schedules",
        )
        .await;
    let schedule_path = format!("/v1/tenants/{}/schedules/nightly-report", enc(shop));
    assert_eq!(api.get(&schedule_path).await["status"], "paused");
    console
        .wait_text("tr[data-schedule='nightly-report']", "paused")
        .await;
    console
        .wait_text("tr[data-schedule='nightly-report'] button", "Resume")
        .await;
    console.shot("schedules").await;
    console
        .click_to("a[href$='/nightly-report']", "schedules")
        .await;
    console.wait_text("main", "next 10 instants").await;
    assert_eq!(
        console.count("main section:nth-of-type(2) tbody tr").await,
        10
    );
    console.shot("schedule").await;
    console.unmark().await;
    console.click("main .page-head button[data-write]").await;
    api.wait_for(&schedule_path, "the schedule resumed", PAGE_DEADLINE, |s| {
        s["status"] == "active"
    })
    .await;
    console.wait_text("main", "active").await;
    // A schedule with history.
    console
        .open("/schedules/shop%2Freports/heartbeat", "schedules")
        .await;
    console
        .wait_text("main section:last-of-type table", "delivered")
        .await;
    console
        .browser
        .execute(
            "document.querySelector('main section:last-of-type').scrollIntoView(); return true;",
            vec![],
        )
        .await
        .unwrap();
    console.shot("schedule-history").await;

    // Dead letters: three failed; redrive one by clicking; it is delivered.
    console
        .open(&format!("/dead?tenant={}", enc(shop)), "dead")
        .await;
    console
        .wait_text("main .dead-count", "3 failed events match")
        .await;
    assert_eq!(console.count("main tbody tr").await, 3);
    console.shot("dead").await;
    let before = receiver.count();
    console
        .click_to("tr[data-event='order-2'] button[data-write]", "dead")
        .await;
    api.wait_for(
        &format!("/v1/tenants/{}/events/order-2", enc(shop)),
        "the redriven event delivered",
        DELIVERY_DEADLINE,
        |e| e["status"] == "delivered",
    )
    .await;
    assert!(receiver.count() > before);
    console
        .open(&format!("/dead?tenant={}", enc(shop)), "dead")
        .await;
    console
        .wait_text("main .dead-count", "2 failed events match")
        .await;
    // Delete one: the first click only asks, the second deletes it.
    let delete = "tr[data-event='order-3'] button.danger";
    console.click(delete).await;
    console.wait_text(delete, "Really delete?").await;
    assert!(
        api.events_in(shop, "failed").await.len() == 2,
        "asked, not done"
    );
    console.click_to(delete, "dead").await;
    console
        .wait_text("main .dead-count", "1 failed event match")
        .await;
    let (status, _) = api
        .call(
            reqwest::Method::GET,
            &format!("/v1/tenants/{}/events/order-3", enc(shop)),
            None,
        )
        .await;
    assert_eq!(status, 404, "deleted");

    // Cluster: one node owns all 64 partitions.
    console
        .click_to("#nav a[href='#/cluster']", "cluster")
        .await;
    assert_eq!(console.count(".partition").await, 64);
    assert!(console.text("main").await.contains("single node"));
    console.shot("cluster").await;

    // Bulk actions (none yet).
    console.click_to("#nav a[href='#/bulk']", "bulk").await;
    console.wait_text("main", "No bulk action yet").await;
    console.shot("bulk-empty").await;
    // Start one through the form: pause every active schedule of the tenant.
    console
        .click("select[name=action] option[value=pause]")
        .await;
    assert_eq!(
        console
            .browser
            .execute(
                "return document.querySelector('select[name=status]').value;",
                vec![]
            )
            .await
            .unwrap(),
        "active"
    );
    console
        .click_to("form.filters button[type=submit]", "bulk")
        .await;
    let state = console
        .browser
        .wait_until(BULK_FINISHED, PAGE_DEADLINE)
        .await
        .unwrap();
    assert_eq!(state, "completed");
    assert_eq!(api.get(&schedule_path).await["status"], "paused");
    console.shot("bulk-pause").await;
    console.click_to("main a[href='#/bulk']", "bulk").await;
    console.wait_text("main table", "pause").await;

    // The audit log names the admin key for the redrive.
    console.click_to("#nav a[href='#/audit']", "audit").await;
    console.wait_text("main table", "event_redriven").await;
    console.wait_text("main table", "event_deleted").await;
    assert!(console.text("main table").await.contains(&admin_id));
    console.shot("audit").await;

    // A read key: its own tenant, no write button anywhere, no admin page.
    console.click_to("#who button", "signin").await;
    console.type_into("input[name=key]", &reader_secret).await;
    console.click_to("form button[type=submit]", "events").await;
    let nav = console.text("#nav").await;
    assert!(
        !nav.contains("Overview") && !nav.contains("Cluster") && !nav.contains("Audit"),
        "{nav}"
    );
    for (hash, page) in [
        (format!("/events?tenant={}", enc(shop)), "events"),
        (format!("/events/{}/order-1", enc(shop)), "events"),
        (format!("/schedules?tenant={}", enc(shop)), "schedules"),
        (
            format!("/schedules/{}/nightly-report", enc(shop)),
            "schedules",
        ),
        (format!("/dead?tenant={}", enc(shop)), "dead"),
        ("/bulk".to_string(), "bulk"),
        ("/tenants".to_string(), "tenants"),
    ] {
        console.open(&hash, page).await;
        assert_eq!(
            console.count("[data-write]").await,
            0,
            "{hash} offers a write to a read key"
        );
        for label in ["Redrive", "Pause", "Resume", "Cancel", "Start"] {
            assert!(
                !has_button(&console, label).await,
                "{hash}: a {label} button"
            );
        }
    }
    console
        .open(&format!("/dead?tenant={}", enc(shop)), "dead")
        .await;
    console.shot("dead-read-only").await;
    // Admin pages are not offered: the router falls back to the events.
    console.open("/cluster", "events").await;

    console.browser.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_click_redrives_a_thousand_failed_events_and_the_audit_log_names_the_key() {
    const EVENTS: usize = 1000;
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    receiver.reserve(2 * EVENTS);
    receiver.push_rule(Rule::first(EVENTS as u64, Response::status(400)).for_path("/bulk"));
    let admin = KeySecret::generate().unwrap();
    let node = BelfryProcess::start(
        BelfryLaunch::new(BIN, dir.path().join("data"))
            .env("BELFRY_AUTH__BOOTSTRAP_ADMIN_KEY", admin.expose()),
    )
    .await
    .expect("belfry starts");
    let api = Api {
        base: node.base_url(),
        key: Some(admin.expose().to_string()),
    };
    let admin_id = api.get("/v1/whoami").await["key_id"]
        .as_str()
        .unwrap()
        .to_string();
    let tenant = "bulk/tenant";
    api.put(
        &format!("/v1/tenants/{}", enc(tenant)),
        json!({ "sink": { "type": "http", "url": receiver.url("/bulk") } }),
    )
    .await;
    let console = Console::start(&node.base_url()).await;
    console.load("/", "signin").await;
    console.type_into("input[name=key]", admin.expose()).await;
    console
        .click_to("form button[type=submit]", "overview")
        .await;
    // The overview plots the failures as they happen.
    let points = "return Number(document.querySelector('svg.chart')?.dataset.points ?? 0);";
    let now = common::rfc3339(common::now_ms());
    let events: Vec<Value> = (0..EVENTS)
        .map(|i| json!({ "id": format!("e{i:04}"), "deliver_at": now, "payload": format!("{i}") }))
        .collect();
    api.post(
        &format!("/v1/tenants/{}/events", enc(tenant)),
        json!({ "events": events }),
    )
    .await;
    receiver
        .wait_for_count(EVENTS, DELIVERY_DEADLINE)
        .await
        .unwrap();
    let started = Instant::now();
    while api.events_in(tenant, "failed").await.len() < EVENTS {
        assert!(
            started.elapsed() < DELIVERY_DEADLINE,
            "the 1,000 failures were not recorded"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let seen = console
        .browser
        .execute(points, vec![])
        .await
        .unwrap()
        .as_u64()
        .unwrap_or(0);
    console
        .browser
        .wait_until(
            &points.replace("return ", &format!("return {} < ", seen + 1)),
            PAGE_DEADLINE,
        )
        .await
        .expect("the overview keeps sampling");
    console
        .assert_no_console_errors("overview under load")
        .await;
    console.shot("overview-under-load").await;
    console
        .open(&format!("/dead?tenant={}", enc(tenant)), "dead")
        .await;
    console
        .wait_text("main .dead-count", "1,000 failed events match")
        .await;
    assert_eq!(
        console.count("main tbody tr").await,
        50,
        "one page of 50 shown"
    );
    assert!(console.count("main a[rel=next]").await == 1);
    console.shot("dead-1000").await;

    // One click: a bulk redrive, followed on its page until it completes.
    console
        .click_to("main .page-head button.primary[data-write]", "bulk")
        .await;

    let state = console
        .browser
        .wait_until(BULK_FINISHED, BULK_DEADLINE)
        .await
        .expect("the bulk action finishes");
    console.assert_no_console_errors("bulk progress").await;
    console.shot("bulk-action").await;
    assert_eq!(state, "completed");
    assert!(
        console.text("main").await.contains("1,000 of 1,000"),
        "{}",
        console.text("main").await
    );

    // Every one delivered: the receiver got 1,000 failures then 1,000 deliveries.
    receiver
        .wait_for_count(2 * EVENTS, DELIVERY_DEADLINE)
        .await
        .unwrap();
    let started = Instant::now();
    while api.events_in(tenant, "delivered").await.len() < EVENTS {
        assert!(
            started.elapsed() < DELIVERY_DEADLINE,
            "not every redriven event was delivered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(api.events_in(tenant, "failed").await.is_empty());

    // The bulk list, the dead letters emptied, the audit naming the key.
    console.click_to("#nav a[href='#/bulk']", "bulk").await;
    console.wait_text("main table", "completed").await;
    console.shot("bulk").await;
    console
        .open(&format!("/dead?tenant={}", enc(tenant)), "dead")
        .await;
    console
        .wait_text("main .dead-count", "0 failed events match")
        .await;
    console.open("/audit", "audit").await;
    console.wait_text("main table", "bulk_action_created").await;
    assert!(console.text("main table").await.contains(&admin_id));
    console.shot("audit-bulk").await;
    let audit = api.get("/v1/audit?limit=1000").await;
    assert!(
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "bulk_action_created" && e["actor"] == admin_id.as_str()),
        "{audit}"
    );

    console.browser.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_page_shows_every_node_the_leader_and_each_partitions_owner() {
    let url = belfry_testkit::postgres::PgServer::shared()
        .fresh_database()
        .await;
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    for index in 0..3 {
        let launch = BelfryLaunch::new(BIN, dir.path().join(format!("unused-{index}")))
            .arg("--database-url")
            .arg(&url);
        nodes.push(BelfryProcess::start(launch).await.expect("node starts"));
    }
    let console = Console::start(&nodes[0].base_url()).await;
    console.load("/cluster", "cluster").await;
    // The leader spreads the partitions: three owners, every partition owned.
    let spread = "const owners = new Set([...document.querySelectorAll('.partition')] \
                  .map(p => [...p.classList].find(c => /^n\\d$/.test(c)))); \
                  return document.querySelectorAll('main tbody tr').length === 3 \
                  && document.querySelectorAll('.partition').length === 64 \
                  && document.querySelectorAll('.partition.unowned').length === 0 \
                  && owners.size === 3;";
    console
        .browser
        .wait_until(spread, Duration::from_secs(90))
        .await
        .unwrap_or_else(|e| panic!("three nodes sharing the partitions: {e}"));
    console.assert_no_console_errors("cluster polling").await;
    let page = console.text("main").await;
    assert!(page.contains("cluster (PostgreSQL)"), "{page}");
    assert!(page.contains("Master") && page.contains("Slave"), "{page}");
    let term: u64 = console
        .browser
        .execute(
            "return [...document.querySelectorAll('dl.fields dt')] \
             .find(dt => dt.textContent === 'Term').nextElementSibling.textContent;",
            vec![],
        )
        .await
        .unwrap()
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("a term");
    assert!(term >= 1, "{term}");
    console.shot("cluster-three-nodes").await;
    console.browser.quit().await;
}
