//! Authentication and tenant isolation over real HTTP: the real router on
//! a real TCP listener (loopback), a real engine and embedded store, and a
//! hand-written HTTP/1.1 client (so tests control every header, `Host`
//! and `Origin` included). Tried as a hostile client would.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use belfry_api::{Auth, AuthMode, AuthOptions, auth};
use belfry_clock::SystemClock;
use belfry_core::auth::{ApiKey, AuditAction, KeySecret, Role};
use belfry_core::bulk::{BulkAction, BulkActionId, BulkFilter, BulkKind};
use belfry_core::{Clock, TenantName, Timestamp};
use belfry_engine::EngineOptions;
use belfry_store::SharedStore;
use common::{FUTURE, FaultScope, Harness, encode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The router served on 127.0.0.1 (an ephemeral port).
struct Served {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    async fn start(h: &Harness, options: AuthOptions) -> Served {
        Served::start_on(h, options, h.store.clone()).await
    }

    /// [`Served::start`] with the keys read from `store`.
    async fn start_on(h: &Harness, options: AuthOptions, store: SharedStore) -> Served {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut state = h.state.clone();
        state.auth = Arc::new(Auth::new(options, store, addr, Arc::new(SystemClock)));
        let app = belfry_api::router(state);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Served {
            addr,
            stop: Some(stop),
            task,
        }
    }

    /// Stops serving (the app's engine handles go with it).
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }

    async fn call(&self, request: Call<'_>) -> Reply {
        send(self.addr, request).await
    }
}

/// One request; `key` goes in `Authorization: Bearer`.
#[derive(Debug, Clone, Default)]
struct Call<'a> {
    method: &'a str,
    path: String,
    key: Option<&'a str>,
    body: Option<Value>,
    /// `Some(None)`: no Content-Type even with a body.
    content_type: Option<Option<&'a str>>,
    raw_body: Option<&'a str>,
    headers: Vec<(&'a str, &'a str)>,
}

impl<'a> Call<'a> {
    fn new(method: &'a str, path: impl Into<String>) -> Self {
        Call {
            method,
            path: path.into(),
            ..Call::default()
        }
    }
    fn key(mut self, key: &'a str) -> Self {
        self.key = Some(key);
        self
    }
    fn json(mut self, body: Value) -> Self {
        self.body = Some(body);
        self
    }
    fn raw(mut self, content_type: Option<&'a str>, body: &'a str) -> Self {
        self.content_type = Some(content_type);
        self.raw_body = Some(body);
        self
    }
    fn header(mut self, name: &'a str, value: &'a str) -> Self {
        self.headers.push((name, value));
        self
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: HashMap<String, String>,
    body: Value,
    text: String,
}

impl Reply {
    fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or_default()
    }
}

/// HTTP/1.1 with `Connection: close`: write the request, read to EOF.
async fn send(addr: SocketAddr, call: Call<'_>) -> Reply {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let body: Vec<u8> = match (&call.body, call.raw_body) {
        (_, Some(raw)) => raw.as_bytes().to_vec(),
        (Some(json), None) => serde_json::to_vec(json).unwrap(),
        (None, None) => Vec::new(),
    };
    let mut head = format!(
        "{} {} HTTP/1.1\r\nConnection: close\r\n",
        call.method, call.path
    );
    if !call
        .headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("host"))
    {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in &call.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(key) = call.key {
        head.push_str(&format!("Authorization: Bearer {key}\r\n"));
    }
    match call.content_type {
        Some(Some(ct)) => head.push_str(&format!("Content-Type: {ct}\r\n")),
        Some(None) => {}
        None if call.body.is_some() => head.push_str("Content-Type: application/json\r\n"),
        None => {}
    }
    if !body.is_empty() || call.method != "GET" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut raw))
        .await
        .expect("an answer within 20 s")
        .unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut payload = raw[split + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: HashMap<String, String> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    if headers
        .get("transfer-encoding")
        .is_some_and(|te| te.contains("chunked"))
    {
        payload = dechunk(&payload);
    }
    let text = String::from_utf8_lossy(&payload).into_owned();
    let body = if payload.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&payload).unwrap_or_else(|_| Value::String(text.clone()))
    };
    Reply {
        status,
        headers,
        body,
        text,
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&data[..line_end]).unwrap().trim(), 16)
                .unwrap();
        if size == 0 {
            return out;
        }
        let start = line_end + 2;
        out.extend_from_slice(&data[start..start + size]);
        data = &data[start + size + 2..];
    }
}

fn now() -> Timestamp {
    SystemClock.now()
}

/// A key stored directly (as the CLI does); returns its secret.
async fn stored_key(
    store: &SharedStore,
    tenant: Option<&str>,
    role: Role,
    expires_at: Option<Timestamp>,
) -> String {
    let secret = KeySecret::generate().unwrap();
    let key = ApiKey::new(
        &secret,
        tenant.map(|t| TenantName::new(t).unwrap()),
        role,
        now(),
        expires_at,
    )
    .unwrap();
    assert!(store.put_api_key(key).await.unwrap());
    secret.expose().to_string()
}

/// The id of the (finished) bulk action [`two_tenants`] stores for `tenant`.
fn bulk_action_id(tenant: &str) -> BulkActionId {
    BulkActionId::parse(&format!("bulk_000000000001{tenant}Action")).unwrap()
}

/// Two tenants with an event, a schedule and a finished bulk action each,
/// registered by `admin`.
async fn two_tenants(h: &Harness, node: &Served, admin: &str) {
    for tenant in ["acme", "beta"] {
        let mut action = BulkAction::new(
            bulk_action_id(tenant),
            BulkKind::Redrive,
            BulkFilter {
                tenant: TenantName::new(tenant).unwrap(),
                status: None,
                from: None,
                to: None,
            },
            None,
            now(),
        );
        action.cancel(now()).unwrap();
        assert!(h.store.create_bulk_action(action).await.unwrap());
    }
    for tenant in ["acme", "beta"] {
        let t = encode(tenant);
        let reply = node
            .call(
                Call::new("PUT", format!("/v1/tenants/{t}"))
                    .key(admin)
                    .json(json!({ "sink": { "type": "http",
                        "url": format!("http://{tenant}-user:{tenant}-password@127.0.0.1:9/{tenant}-hook"),
                        "headers": { "Authorization": format!("Bearer {tenant}-webhook-secret") } } })),
            )
            .await;
        assert_eq!(reply.status, 201, "{reply:?}");
        let reply = node
            .call(
                Call::new("PUT", format!("/v1/tenants/{t}/events/e1"))
                    .key(admin)
                    .json(json!({ "deliver_at": FUTURE, "payload": format!("{tenant}-private-payload") })),
            )
            .await;
        assert_eq!(reply.status, 201, "{reply:?}");
        let reply = node
            .call(
                Call::new("PUT", format!("/v1/tenants/{t}/schedules/s1"))
                    .key(admin)
                    .json(json!({ "expression": "0 0 1 1 *", "payload": format!("{tenant}-schedule-payload") })),
            )
            .await;
        assert_eq!(reply.status, 201, "{reply:?}");
    }
}

/// Every route, aimed at tenant `t`, with what another tenant's write key
/// gets.
fn routes(t: &str) -> Vec<(Call<'static>, u16)> {
    let e = encode(t);
    let v1 = format!("/v1/tenants/{e}");
    vec![
        (Call::new("GET", "/events/cluster"), 403),
        (
            Call::new("POST", "/events/tenant/register").json(json!({ "tenant": t,
                "type": "CUSTOM_CLASS", "props": { "eventProcessorClass": "log" } })),
            404,
        ),
        (Call::new("GET", "/events/tenants"), 200),
        (
            Call::new("POST", "/events/schedule").json(json!([{ "id": "e9", "tenant": t,
                "eventTime": FUTURE, "payload": "p" }])),
            // Every item refused (unknown tenant): BigBen's 400.
            400,
        ),
        (
            // BigBen's REMOVE: another tenant's event is an unknown one.
            Call::new("POST", "/events/schedule").json(json!([{ "id": "e1", "tenant": t,
                "mode": "REMOVE" }])),
            200,
        ),
        (
            Call::new("GET", format!("/events/find?tenant={e}&id=e1")),
            404,
        ),
        (
            Call::new("POST", format!("/events/dryrun?tenant={e}&id=e1")),
            404,
        ),
        (
            Call::new("POST", "/cron").json(json!({ "tenant": t, "id": "c9",
                "expression": "0 0 1 1 *" })),
            400,
        ),
        (Call::new("GET", format!("/cron/{e}/s1")), 200),
        (Call::new("DELETE", format!("/cron/{e}/s1/*")), 404),
        (Call::new("GET", "/v1/tenants"), 200),
        (Call::new("GET", v1.clone()), 404),
        (
            Call::new("PUT", v1.clone())
                .json(json!({ "sink": { "type": "builtin", "processor": "log" } })),
            404,
        ),
        (Call::new("DELETE", v1.clone()), 404),
        (
            Call::new("POST", format!("{v1}/signing-secrets/rotate")).json(json!({})),
            404,
        ),
        (Call::new("GET", format!("{v1}/events")), 404),
        (
            Call::new("POST", format!("{v1}/events"))
                .json(json!({ "events": [{ "id": "e9", "deliver_at": FUTURE }] })),
            404,
        ),
        (Call::new("GET", format!("{v1}/events/e1")), 404),
        (
            Call::new("PUT", format!("{v1}/events/e1")).json(json!({ "deliver_at": FUTURE })),
            404,
        ),
        (Call::new("DELETE", format!("{v1}/events/e1")), 404),
        (Call::new("GET", format!("{v1}/events/e1/attempts")), 404),
        (Call::new("GET", format!("{v1}/schedules")), 404),
        (Call::new("GET", format!("{v1}/schedules/s1")), 404),
        (
            Call::new("PUT", format!("{v1}/schedules/s1"))
                .json(json!({ "expression": "* * * * *" })),
            404,
        ),
        (Call::new("DELETE", format!("{v1}/schedules/s1")), 404),
        (
            Call::new("POST", format!("{v1}/schedules/s1/pause")).json(json!({})),
            404,
        ),
        (
            Call::new("POST", format!("{v1}/schedules/s1/resume")).json(json!({})),
            404,
        ),
        (
            Call::new("GET", format!("{v1}/schedules/s1/occurrences")),
            404,
        ),
        (
            Call::new("GET", "/v1/cron/preview?expression=0%200%201%201%20%2A"),
            200,
        ),
        (
            Call::new("POST", "/v1/bulk-actions")
                .json(json!({ "action": "cancel", "filter": { "tenant": t } })),
            404,
        ),
        (
            Call::new("GET", format!("/v1/bulk-actions?tenant={e}")),
            404,
        ),
        (
            Call::new("GET", format!("/v1/bulk-actions/{}", bulk_action_id(t))),
            404,
        ),
        (
            Call::new(
                "POST",
                format!("/v1/bulk-actions/{}/cancel", bulk_action_id(t)),
            ),
            404,
        ),
        (Call::new("GET", "/v1/cluster"), 403),
        (Call::new("GET", "/v1/keys"), 200),
        (
            Call::new("POST", "/v1/keys").json(json!({ "tenant": t, "role": "write" })),
            403,
        ),
        (Call::new("DELETE", "/v1/keys/key_abc"), 403),
        (Call::new("GET", "/v1/audit"), 403),
    ]
}

/// Tenants, events, schedules, keys and the audit log, to compare before
/// and after what must change nothing.
async fn everything(h: &Harness) -> Value {
    // `last_used_at` moves with every use (once a minute): not a change.
    let keys: Vec<_> = h
        .store
        .list_api_keys()
        .await
        .unwrap()
        .into_iter()
        .map(|mut key| {
            key.last_used_at = None;
            key
        })
        .collect();
    let audit = h
        .store
        .list_audit(belfry_store::AuditPageParams {
            after: None,
            limit: 10_000,
        })
        .await
        .unwrap();
    let bulk_actions = h
        .store
        .list_bulk_actions(belfry_store::ListBulkActionsParams {
            tenant: None,
            before: None,
            limit: 10_000,
        })
        .await
        .unwrap();
    json!({
        "store": h.snapshot(&["acme", "beta"]).await,
        "keys": serde_json::to_value(&keys).unwrap(),
        "audit": serde_json::to_value(&audit).unwrap(),
        "bulk_actions": serde_json::to_value(&bulk_actions).unwrap(),
    })
}

/// An open node whose store cannot tell whether keys exist does not let a
/// keyless request in, and answers it as the outage it is (503
/// `store_unavailable`, retry), not as a missing key (401). Once the
/// store answers again the node is open again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_request_is_503_while_the_store_cannot_tell_whether_keys_exist() {
    let h = Harness::start().await;
    let node = Served::start_on(&h, AuthOptions::default(), h.faulty.clone()).await;
    h.faults.set(
        FaultScope::KeyReads,
        belfry_store::StoreError::Unavailable("key listing down".into()),
    );
    // The node asks the store again at most once a second; until then it
    // keeps its last answer (open). Never a 401 meanwhile.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let answer = node.call(Call::new("GET", "/v1/tenants")).await;
        if answer.status != 200 {
            break answer;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never asked the store"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(
        refused.body["error"]["code"], "store_unavailable",
        "{refused:?}"
    );
    assert!(h.faults.injected() >= 1, "the key listing was asked");
    assert!(
        !refused.body.to_string().contains("key listing down"),
        "no internals in the answer: {refused:?}"
    );

    h.faults.clear();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let open = node.call(Call::new("GET", "/v1/tenants")).await;
        if open.status == 200 {
            break;
        }
        assert_eq!(open.status, 503, "{open:?}");
        assert!(
            std::time::Instant::now() < deadline,
            "still refused: {open:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_on_loopback_until_the_first_key_then_keys_are_required() {
    let h = Harness::start().await;
    let node = Served::start(&h, AuthOptions::default()).await;

    // No key anywhere: the quick start works without one.
    let open = node.call(Call::new("GET", "/v1/tenants")).await;
    assert_eq!(open.status, 200, "{open:?}");

    // The first key, created open (as an operator on the machine would).
    let created = node
        .call(Call::new("POST", "/v1/keys").json(json!({ "tenant": null, "role": "admin" })))
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let secret = created.body["secret"].as_str().unwrap().to_string();
    assert!(KeySecret::parse(&secret).is_ok(), "{secret}");
    assert_eq!(created.body["role"], "admin");
    assert_eq!(created.body["tenant"], Value::Null);
    assert!(created.body["id"].as_str().unwrap().starts_with("key_"));
    for field in ["expires_at", "created_at"] {
        assert!(created.body.get(field).is_some(), "{field}");
    }
    // Stored only as a hash.
    let stored = h.store.list_api_keys().await.unwrap();
    assert_eq!(stored.len(), 1);
    assert!(!serde_json::to_string(&stored).unwrap().contains(&secret));

    // From now on keys are required: 401 with a Bearer challenge.
    let closed = node.call(Call::new("GET", "/v1/tenants")).await;
    assert_eq!(closed.status, 401, "{closed:?}");
    assert_eq!(closed.code(), "unauthorized");
    assert!(closed.headers["www-authenticate"].starts_with("Bearer"));
    let with_key = node
        .call(Call::new("GET", "/v1/tenants").key(&secret))
        .await;
    assert_eq!(with_key.status, 200, "{with_key:?}");
    // BigBen's routes answer in BigBen's envelope.
    let bigben = node.call(Call::new("GET", "/events/tenants")).await;
    assert_eq!(bigben.status, 401);
    assert!(bigben.body["message"].is_string(), "{bigben:?}");
    // The health check stays public.
    assert_eq!(node.call(Call::new("GET", "/ping")).await.status, 200);

    node.stop().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_refuses_a_missing_or_bad_key_and_changes_nothing() {
    let h = Harness::start().await;
    let admin = stored_key(&h.store, None, Role::Admin, None).await;
    let node = Served::start(&h, AuthOptions::default()).await;
    two_tenants(&h, &node, &admin).await;
    let before = everything(&h).await;

    let valid = KeySecret::generate().unwrap();
    let typo = {
        let mut s = admin.clone();
        let last = s.pop().unwrap();
        s.push(if last == 'a' { 'b' } else { 'a' });
        s
    };
    let expired = stored_key(
        &h.store,
        Some("beta"),
        Role::Write,
        Some(Timestamp::from_millis(now().as_millis() - 1)),
    )
    .await;
    let before_keys = everything(&h).await;
    let bad_keys: [Option<&str>; 5] = [
        None,
        Some("not-a-key"),
        Some(&typo),
        Some(valid.expose()),
        Some(&expired),
    ];
    for (call, _) in routes("beta") {
        for key in bad_keys {
            let mut call = call.clone();
            call.key = key;
            let what = format!("{} {} with {key:?}", call.method, call.path);
            let reply = node.call(call).await;
            assert_eq!(reply.status, 401, "{what}: {reply:?}");
            assert!(
                reply.headers["www-authenticate"].starts_with("Bearer"),
                "{what}"
            );
            assert!(!reply.text.contains("beta-"), "{what}: {reply:?}");
        }
    }
    // An Authorization header that is not Bearer is no key either.
    let basic = node
        .call(Call::new("GET", "/v1/tenants").header("Authorization", "Basic YWRtaW46YWRtaW4="))
        .await;
    assert_eq!(basic.status, 401);
    assert_eq!(everything(&h).await, before_keys);
    assert_ne!(before, before_keys, "the expired key was stored");

    node.stop().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_key_sees_nothing_and_changes_nothing() {
    let h = Harness::start().await;
    let admin = stored_key(&h.store, None, Role::Admin, None).await;
    let acme = stored_key(&h.store, Some("acme"), Role::Write, None).await;
    let node = Served::start(&h, AuthOptions::default()).await;
    two_tenants(&h, &node, &admin).await;
    let before = everything(&h).await;

    for (call, expected) in routes("beta") {
        let what = format!("{} {}", call.method, call.path);
        let call_is_v1 = call.path.starts_with("/v1/");
        let reply = node.call(call.key(&acme)).await;
        assert_eq!(reply.status, expected, "{what}: {reply:?}");
        for secret in [
            "beta-private",
            "beta-schedule",
            "beta-hook",
            "beta-webhook",
            "beta-user",
        ] {
            assert!(
                !reply.text.contains(secret),
                "{what} leaked {secret}: {reply:?}"
            );
        }
        if expected == 403 && call_is_v1 {
            assert_eq!(reply.code(), "forbidden", "{what}");
        }
    }
    assert_eq!(
        everything(&h).await,
        before,
        "a foreign key changed something"
    );

    // No existence oracle: a registered and an unknown tenant look alike.
    for path in [
        "/v1/tenants/{}/events/e1",
        "/v1/tenants/{}",
        "/v1/tenants/{}/schedules/s1",
        "/v1/bulk-actions?tenant={}",
    ] {
        let beta = node
            .call(Call::new("GET", path.replace("{}", "beta")).key(&acme))
            .await;
        let gamma = node
            .call(Call::new("GET", path.replace("{}", "gamma")).key(&acme))
            .await;
        assert_eq!(
            (beta.status, beta.code()),
            (gamma.status, gamma.code()),
            "{path}"
        );
        assert_eq!(beta.text.replace("beta", "gamma"), gamma.text, "{path}");
    }
    let remove = |t: &'static str| {
        Call::new("POST", "/events/schedule")
            .json(json!([{ "id": "e1", "tenant": t, "mode": "REMOVE" }]))
    };
    let beta = node.call(remove("beta").key(&acme)).await;
    let gamma = node.call(remove("gamma").key(&acme)).await;
    assert_eq!(
        (beta.status, beta.text.replace("beta", "gamma")),
        (gamma.status, gamma.text.clone())
    );
    assert!(h.event("beta", "e1").await.unwrap().status.is_pending());
    let find = |t: &'static str| Call::new("GET", format!("/events/find?tenant={t}&id=e1"));
    let beta = node.call(find("beta").key(&acme)).await;
    let gamma = node.call(find("gamma").key(&acme)).await;
    assert_eq!((beta.status, &beta.body), (gamma.status, &gamma.body));

    // Listings show only the key's own tenant; BigBen's schedule refuses
    // the foreign item like an unknown tenant and stores the own one.
    let listed = node.call(Call::new("GET", "/v1/tenants").key(&acme)).await;
    let names: Vec<&str> = listed.body["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["acme"]);
    let bigben = node
        .call(Call::new("GET", "/events/tenants").key(&acme))
        .await;
    assert_eq!(bigben.body.as_object().unwrap().len(), 1, "{bigben:?}");
    let scheduled = node
        .call(
            Call::new("POST", "/events/schedule")
                .key(&acme)
                .json(json!([
                    { "id": "x1", "tenant": "acme", "eventTime": FUTURE, "payload": "p" },
                    { "id": "x1", "tenant": "beta", "eventTime": FUTURE, "payload": "p" },
                ])),
        )
        .await;
    // BigBen's 206: partly accepted.
    assert_eq!(scheduled.status, 206, "{scheduled:?}");
    assert_eq!(
        scheduled.body[0]["eventStatus"], "ACCEPTED",
        "{scheduled:?}"
    );
    assert_eq!(
        scheduled.body[1]["eventStatus"], "REJECTED",
        "{scheduled:?}"
    );
    assert!(h.event("acme", "x1").await.is_some());
    assert!(h.event("beta", "x1").await.is_none());

    // The key works on its own tenant, BigBen's routes included.
    let own = node
        .call(Call::new("GET", "/v1/tenants/acme/events/e1").key(&acme))
        .await;
    assert_eq!(own.status, 200, "{own:?}");
    assert_eq!(own.body["payload"], "acme-private-payload");
    let own = node
        .call(Call::new("GET", "/events/find?tenant=acme&id=e1").key(&acme))
        .await;
    assert_eq!(own.status, 200, "{own:?}");
    let own = node
        .call(
            Call::new("POST", "/events/tenant/register").key(&acme).json(json!({
                "tenant": "acme", "type": "CUSTOM_CLASS", "props": { "eventProcessorClass": "log" } })),
        )
        .await;
    assert_eq!(own.status, 200, "{own:?}");
    assert_eq!(own.body.as_object().unwrap().len(), 1, "{own:?}");

    node.stop().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_key_cannot_write() {
    let h = Harness::start().await;
    let admin = stored_key(&h.store, None, Role::Admin, None).await;
    let reader = stored_key(&h.store, Some("acme"), Role::Read, None).await;
    let worker = stored_key(&h.store, Some("acme"), Role::Worker, None).await;
    let node = Served::start(&h, AuthOptions::default()).await;
    two_tenants(&h, &node, &admin).await;
    let before = everything(&h).await;

    for key in [&reader, &worker] {
        for (call, _) in routes("acme") {
            let what = format!("{} {}", call.method, call.path);
            let write = call.method != "GET";
            let reply = node.call(call.key(key)).await;
            if write {
                assert_eq!(reply.status, 403, "{what}: {reply:?}");
            } else {
                assert!(
                    reply.status == 200 || reply.status == 403,
                    "{what}: {reply:?}"
                );
            }
        }
        let own = node
            .call(Call::new("GET", "/v1/tenants/acme/events/e1").key(key))
            .await;
        assert_eq!(own.status, 200, "{own:?}");
    }
    assert_eq!(everything(&h).await, before);

    node.stop().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_expire_rotate_and_revoke_at_once() {
    let h = Harness::start().await;
    let admin = stored_key(&h.store, None, Role::Admin, None).await;
    let node = Served::start(&h, AuthOptions::default()).await;
    let create = |body: Value| Call::new("POST", "/v1/keys").key(&admin).json(body);

    // Bad requests: unknown role, admin with a tenant, tenant key without
    // one, an expiry in the past, unknown fields.
    for body in [
        json!({ "tenant": "acme", "role": "root" }),
        json!({ "tenant": "acme", "role": "admin" }),
        json!({ "tenant": null, "role": "write" }),
        json!({ "tenant": "acme", "role": "write", "expires_at": "2001-01-01T00:00:00Z" }),
        json!({ "tenant": "acme", "role": "write", "expires_at": "soon" }),
        json!({ "tenant": "acme", "role": "write", "scope": "all" }),
    ] {
        let reply = node.call(create(body.clone())).await;
        assert_eq!(reply.status, 400, "{body}: {reply:?}");
    }

    // Two live keys for one tenant (rotation), one with an expiry.
    let first = node
        .call(create(json!({ "tenant": "acme", "role": "write" })))
        .await;
    assert_eq!(first.status, 201, "{first:?}");
    let second = node
        .call(create(json!({ "tenant": "acme", "role": "read",
                             "expires_at": "2099-01-01T00:00:00Z" })))
        .await;
    assert_eq!(second.status, 201, "{second:?}");
    assert_eq!(second.body["expires_at"], "2099-01-01T00:00:00Z");
    let (k1, k2) = (
        first.body["secret"].as_str().unwrap().to_string(),
        second.body["secret"].as_str().unwrap().to_string(),
    );
    for key in [&k1, &k2] {
        let reply = node
            .call(Call::new("GET", "/v1/tenants/acme/events").key(key))
            .await;
        assert_eq!(reply.status, 200, "{reply:?}");
    }

    // Listings never show a secret or its hash; a tenant key sees its own
    // tenant's keys only.
    let listed = node.call(Call::new("GET", "/v1/keys").key(&admin)).await;
    assert_eq!(
        listed.body["keys"].as_array().unwrap().len(),
        3,
        "{listed:?}"
    );
    assert!(
        !listed.text.contains("bfy_") && !listed.text.contains("hash"),
        "{listed:?}"
    );
    let own = node.call(Call::new("GET", "/v1/keys").key(&k1)).await;
    assert_eq!(own.body["keys"].as_array().unwrap().len(), 2, "{own:?}");

    // Revoking the first leaves the second working, at once.
    let id = first.body["id"].as_str().unwrap();
    let revoked = node
        .call(Call::new("DELETE", format!("/v1/keys/{id}")).key(&admin))
        .await;
    assert_eq!(revoked.status, 204, "{revoked:?}");
    let gone = node
        .call(Call::new("GET", "/v1/tenants/acme/events").key(&k1))
        .await;
    assert_eq!(gone.status, 401, "{gone:?}");
    let kept = node
        .call(Call::new("GET", "/v1/tenants/acme/events").key(&k2))
        .await;
    assert_eq!(kept.status, 200, "{kept:?}");
    let again = node
        .call(Call::new("DELETE", format!("/v1/keys/{id}")).key(&admin))
        .await;
    assert_eq!((again.status, again.code()), (404, "key_not_found"));

    // An expired key is refused like an unknown one.
    let expired = stored_key(
        &h.store,
        Some("acme"),
        Role::Write,
        Some(Timestamp::from_millis(now().as_millis() - 1)),
    )
    .await;
    let reply = node
        .call(Call::new("GET", "/v1/tenants/acme/events").key(&expired))
        .await;
    assert_eq!(reply.status, 401, "{reply:?}");
    assert!(
        reply.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expired")
    );

    // Use is recorded (at most once a minute), off the request path.
    let deadline = tokio::time::Instant::now() + common::DEADLINE;
    loop {
        let keys = h.store.list_api_keys().await.unwrap();
        let k2_hash = KeySecret::parse(&k2).unwrap().hash();
        if keys
            .iter()
            .any(|k| k.hash == k2_hash && k.last_used_at.is_some())
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "last_used_at never set"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    node.stop().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_only_secrets_are_masked_in_every_answer() {
    let h = Harness::start().await;
    let node = Served::start(&h, AuthOptions::default()).await;
    let secret_parts = ["s3cret-token", "hunter2"];
    let registered = node
        .call(Call::new("POST", "/events/tenant/register").json(json!({
            "tenant": "acme", "type": "HTTP",
            "props": { "url": "http://svc:hunter2@127.0.0.1:9/hook",
                       "headers": { "Authorization": "Bearer s3cret-token" } } })))
        .await;
    assert_eq!(registered.status, 200, "{registered:?}");
    // BigBen's shape is kept, with masked values.
    assert_eq!(
        registered.body["acme"]["props"],
        json!({ "url": "http://****@127.0.0.1:9/hook", "headers": { "Authorization": "****" } })
    );
    let put = node
        .call(Call::new("PUT", "/v1/tenants/beta").json(json!({ "sink": {
            "type": "http", "url": "http://svc:hunter2@127.0.0.1:9/hook",
            "headers": { "X-Token": "s3cret-token" } } })))
        .await;
    assert_eq!(put.status, 201, "{put:?}");
    assert_eq!(put.body["sink"]["headers"]["X-Token"], "****");
    for path in [
        "/events/tenants",
        "/v1/tenants",
        "/v1/tenants/acme",
        "/v1/tenants/beta",
    ] {
        let reply = node.call(Call::new("GET", path)).await;
        assert_eq!(reply.status, 200, "{path}");
        for part in secret_parts {
            assert!(!reply.text.contains(part), "{path} shows {part}: {reply:?}");
        }
    }
    for reply in [&registered, &put] {
        for part in secret_parts {
            assert!(!reply.text.contains(part), "{reply:?}");
        }
    }
    // The stored configuration keeps the real values (deliveries need them).
    let stored = h
        .store
        .get_tenant(&TenantName::new("acme").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(
        serde_json::to_string(&stored.sink)
            .unwrap()
            .contains("s3cret-token")
    );

    node.stop().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browsers_cannot_forge_writes_while_open() {
    let h = Harness::start().await;
    let node = Served::start(&h, AuthOptions::default()).await;
    h.register_log("acme").await;
    let schedule = node
        .call(
            Call::new("PUT", "/v1/tenants/acme/schedules/s1")
                .json(json!({ "expression": "0 0 1 1 *" })),
        )
        .await;
    assert_eq!(schedule.status, 201, "{schedule:?}");
    let before = everything(&h).await;
    let pause = "/v1/tenants/acme/schedules/s1/pause";

    for content_type in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let reply = node
            .call(Call::new("POST", pause).raw(Some(content_type), "{}"))
            .await;
        assert_eq!(
            (reply.status, reply.code()),
            (415, "unsupported_media_type"),
            "{content_type}"
        );
        // BigBen's routes too.
        let reply = node
            .call(Call::new("POST", "/events/tenant/register").raw(
                Some(content_type),
                r#"{"tenant":"evil","type":"CUSTOM_CLASS","props":{"eventProcessorClass":"log"}}"#,
            ))
            .await;
        assert_eq!(reply.status, 415, "{content_type}: {reply:?}");
    }
    // A bodiless write from a page (Origin / Sec-Fetch-*) is refused.
    for (name, value) in [
        ("Origin", "http://evil.example"),
        ("Sec-Fetch-Site", "cross-site"),
    ] {
        let reply = node
            .call(Call::new("POST", pause).raw(None, "").header(name, value))
            .await;
        assert_eq!(
            (reply.status, reply.code()),
            (403, "browser_write_refused"),
            "{name}"
        );
        let reply = node
            .call(
                Call::new("DELETE", "/v1/tenants/acme/schedules/s1")
                    .raw(None, "")
                    .header(name, value),
            )
            .await;
        assert_eq!(reply.status, 403, "{name}");
    }
    assert_eq!(
        everything(&h).await,
        before,
        "a forged write changed something"
    );
    // curl's bodiless POST (no Origin) still works, and JSON always does.
    let curl = node.call(Call::new("POST", pause).raw(None, "")).await;
    assert_eq!(curl.status, 200, "{curl:?}");
    let resumed = node
        .call(
            Call::new("POST", "/v1/tenants/acme/schedules/s1/resume")
                .json(json!({}))
                .header("Origin", "http://localhost"),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");

    node.stop().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_allow_list_guards_the_open_mode() {
    let h = Harness::start().await;
    let options = AuthOptions {
        allowed_hosts: vec!["belfry.internal".into()],
        ..AuthOptions::default()
    };
    let node = Served::start(&h, options).await;
    let port = node.addr.port().to_string();
    for host in [
        "evil.example",
        "evil.example:8080",
        "10.1.2.3",
        "localhost.evil.example",
    ] {
        let reply = node
            .call(Call::new("GET", "/v1/tenants").header("Host", host))
            .await;
        assert_eq!(
            (reply.status, reply.code()),
            (403, "host_not_allowed"),
            "{host}"
        );
    }
    for host in [
        format!("localhost:{port}"),
        "localhost".to_string(),
        format!("127.0.0.1:{port}"),
        // Any loopback address: a page loaded from an address is that
        // address's own origin, no rebinding.
        "127.0.0.2".to_string(),
        format!("[::1]:{port}"),
        "belfry.internal:443".to_string(),
        "LOCALHOST".to_string(),
    ] {
        let reply = node
            .call(Call::new("GET", "/v1/tenants").header("Host", &host))
            .await;
        assert_eq!(reply.status, 200, "{host}: {reply:?}");
    }
    // With keys, a key is the protection: any Host is served.
    let admin = stored_key(&h.store, None, Role::Admin, None).await;
    let reply = node
        .call(
            Call::new("GET", "/v1/tenants")
                .key(&admin)
                .header("Host", "evil.example"),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");

    node.stop().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_its_rate_gets_429_with_retry_after() {
    let h = Harness::start().await;
    let first = stored_key(&h.store, Some("acme"), Role::Read, None).await;
    let second = stored_key(&h.store, Some("acme"), Role::Read, None).await;
    let options = AuthOptions {
        rate_limit_per_key: 1,
        rate_limit_burst: 3,
        ..AuthOptions::default()
    };
    let node = Served::start(&h, options).await;
    let call = |key| Call::new("GET", "/v1/tenants/acme/events").key(key);
    // The burst passes (the refill during these requests is at most one).
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(node.call(call(&first)).await.status);
    }
    assert!(statuses[..3].iter().all(|s| *s == 200), "{statuses:?}");
    let limited = node.call(call(&first)).await;
    assert_eq!(
        (limited.status, limited.code()),
        (429, "rate_limited"),
        "{limited:?}"
    );
    let retry_after: u64 = limited.headers["retry-after"].parse().unwrap();
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    // BigBen's envelope for BigBen's routes.
    let bigben = node
        .call(Call::new("GET", "/events/tenants").key(&first))
        .await;
    assert_eq!(bigben.status, 429);
    assert!(bigben.body["message"].is_string());
    // Another key has its own budget.
    assert_eq!(node.call(call(&second)).await.status, 200);

    node.stop().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_names_the_key_never_the_secret_and_is_purged_like_history() {
    let engine_options = EngineOptions {
        shutdown_grace: Duration::from_millis(500),
        history_retention: Duration::ZERO,
        ..EngineOptions::default()
    };
    let h = Harness::with_engine_options(Default::default(), engine_options).await;
    let admin = stored_key(&h.store, None, Role::Admin, None).await;
    let admin_id = h.store.list_api_keys().await.unwrap()[0].id.to_string();
    let node = Served::start(&h, AuthOptions::default()).await;

    let created = node
        .call(
            Call::new("POST", "/v1/keys")
                .key(&admin)
                .json(json!({ "tenant": "acme", "role": "write" })),
        )
        .await;
    let acme = created.body["secret"].as_str().unwrap().to_string();
    let acme_id = created.body["id"].as_str().unwrap().to_string();
    let log_sink = json!({ "sink": { "type": "builtin", "processor": "log" } });
    for call in [
        Call::new("PUT", "/v1/tenants/acme")
            .key(&acme)
            .json(log_sink.clone()),
        Call::new("PUT", "/v1/tenants/acme")
            .key(&acme)
            .json(log_sink.clone()),
        Call::new("POST", "/events/tenant/register")
            .key(&admin)
            .json(json!({
            "tenant": "beta", "type": "CUSTOM_CLASS", "props": { "eventProcessorClass": "log" } })),
        // Removing a tenant revokes its keys (this one included).
        Call::new("DELETE", "/v1/tenants/acme").key(&acme),
    ] {
        let what = format!("{} {}", call.method, call.path);
        let reply = node.call(call).await;
        assert!(reply.status < 300, "{what}: {reply:?}");
    }
    let log = node.call(Call::new("GET", "/v1/audit").key(&admin)).await;
    assert_eq!(log.status, 200, "{log:?}");
    let entries = log.body["entries"].as_array().unwrap();
    let seen: Vec<(&str, &str, Option<&str>)> = entries
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap(),
                e["actor"].as_str().unwrap(),
                e["tenant"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("key_created", admin_id.as_str(), Some("acme")),
            ("tenant_registered", acme_id.as_str(), Some("acme")),
            ("tenant_changed", acme_id.as_str(), Some("acme")),
            ("tenant_registered", admin_id.as_str(), Some("beta")),
            ("tenant_deleted", acme_id.as_str(), Some("acme")),
            ("key_revoked", acme_id.as_str(), Some("acme")),
        ],
        "{log:?}"
    );
    assert_eq!(entries[0]["target"], acme_id.as_str());
    assert!(!log.text.contains("bfy_"), "{log:?}");
    assert!(
        entries
            .iter()
            .all(|e| e["at"].is_string() && e["id"].is_string())
    );

    // Paged: two at a time through `next`.
    let mut paged = Vec::new();
    let mut path = "/v1/audit?limit=2".to_string();
    loop {
        let page = node.call(Call::new("GET", path.clone()).key(&admin)).await;
        assert_eq!(page.status, 200, "{page:?}");
        paged.extend(page.body["entries"].as_array().unwrap().clone());
        match page.body["next"].as_str() {
            Some(next) => path = format!("/v1/audit?limit=2&after={}", encode(next)),
            None => break,
        }
    }
    assert_eq!(&paged, entries);
    for bad in [
        "/v1/audit?limit=0",
        "/v1/audit?limit=x",
        "/v1/audit?after=nope",
    ] {
        assert_eq!(
            node.call(Call::new("GET", bad).key(&admin)).await.status,
            400,
            "{bad}"
        );
    }

    // Kept like history: with zero retention the sweep takes it all.
    h.state.engine.purge_now().await.unwrap();
    let purged = node.call(Call::new("GET", "/v1/audit").key(&admin)).await;
    assert_eq!(purged.body["entries"], json!([]), "{purged:?}");

    node.stop().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bootstrap_key_is_seeded_once_and_startup_refuses_open_public_listeners() {
    let h = Harness::start().await;
    let loopback: SocketAddr = "127.0.0.1:8080".parse().unwrap();
    let public: SocketAddr = "0.0.0.0:8080".parse().unwrap();
    let v6: SocketAddr = "[::]:8080".parse().unwrap();
    let defaults = AuthOptions::default();

    // No key: loopback runs open, anything else refuses.
    assert!(
        auth::check_startup(&defaults, &h.store, loopback)
            .await
            .is_ok()
    );
    for listen in [public, v6, "10.1.2.3:80".parse().unwrap()] {
        let refused = auth::check_startup(&defaults, &h.store, listen)
            .await
            .unwrap_err();
        assert!(refused.contains("refusing"), "{refused}");
    }
    let none = AuthOptions {
        mode: AuthMode::None,
        ..AuthOptions::default()
    };
    assert!(auth::check_startup(&none, &h.store, public).await.is_ok());

    // The bootstrap key: stored once, audited, and then the node starts.
    let secret = KeySecret::generate().unwrap();
    let options = AuthOptions {
        bootstrap_admin_key: Some(secret.expose().to_string()),
        ..AuthOptions::default()
    };
    let id = auth::seed_bootstrap_key(&options, &h.store, now())
        .await
        .unwrap();
    assert!(id.is_some());
    assert_eq!(
        auth::seed_bootstrap_key(&options, &h.store, now())
            .await
            .unwrap(),
        None
    );
    assert_eq!(h.store.list_api_keys().await.unwrap().len(), 1);
    assert!(
        auth::check_startup(&defaults, &h.store, public)
            .await
            .is_ok()
    );
    let audit = h
        .store
        .list_audit(belfry_store::AuditPageParams {
            after: None,
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (audit[0].actor.as_str(), audit[0].action),
        ("bootstrap", AuditAction::KeyCreated)
    );

    let node = Served::start(&h, options).await;
    let reply = node
        .call(Call::new("GET", "/v1/cluster").key(secret.expose()))
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(node.call(Call::new("GET", "/v1/cluster")).await.status, 401);

    // In mode "none" every request is let in, keys or not.
    let open = Served::start(&h, none).await;
    assert_eq!(open.call(Call::new("GET", "/v1/cluster")).await.status, 200);
    assert_eq!(
        open.call(Call::new("GET", "/v1/cluster").key("bfy_whatever"))
            .await
            .status,
        200
    );

    open.stop().await;
    node.stop().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_names_with_slashes_are_matched_decoded() {
    let h = Harness::start().await;
    let key = stored_key(&h.store, Some("shop/orders"), Role::Write, None).await;
    let node = Served::start(&h, AuthOptions::default()).await;
    let put = node
        .call(
            Call::new("PUT", "/v1/tenants/shop%2Forders")
                .key(&key)
                .json(json!({ "sink": { "type": "builtin", "processor": "log" } })),
        )
        .await;
    assert_eq!(put.status, 201, "{put:?}");
    for path in [
        "/v1/tenants/shop%2Forders/events",
        "/cron/shop%2Forders/s1",
        "/events/find?tenant=shop%2Forders&id=nope",
    ] {
        let reply = node.call(Call::new("GET", path).key(&key)).await;
        assert!(
            reply.status == 200 || reply.body["status"] == "not found",
            "{path}: {reply:?}"
        );
    }
    let other = node
        .call(Call::new("GET", "/v1/tenants/shop%2Fother/events").key(&key))
        .await;
    assert_eq!(other.status, 404, "{other:?}");
    node.stop().await;
    h.shutdown().await;
}

/// `POST /v1/keys` with `key` (none while open): the secret and the id.
async fn created_key(node: &Served, key: Option<&str>, body: Value) -> (String, String) {
    let mut call = Call::new("POST", "/v1/keys").json(body);
    call.key = key;
    let created = node.call(call).await;
    assert_eq!(created.status, 201, "{created:?}");
    (
        created.body["secret"].as_str().unwrap().to_string(),
        created.body["id"].as_str().unwrap().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whoami_describes_the_key_and_answers_without_one() {
    let h = Harness::start().await;
    let node = Served::start(&h, AuthOptions::default()).await;

    // Open (no key exists): everyone is admin, and told so.
    let open = node.call(Call::new("GET", "/v1/whoami")).await;
    assert_eq!(open.status, 200, "{open:?}");
    assert_eq!(
        open.body,
        json!({ "key_id": null, "role": "admin", "tenant": null, "can_write": true, "open": true })
    );

    // Keys made through the API: the node closes at once.
    let (admin, admin_id) = created_key(&node, None, json!({ "role": "admin" })).await;
    let (reader, reader_id) = created_key(
        &node,
        Some(&admin),
        json!({ "tenant": "acme", "role": "read" }),
    )
    .await;
    let (writer, writer_id) = created_key(
        &node,
        Some(&admin),
        json!({ "tenant": "acme", "role": "write" }),
    )
    .await;

    // Keys exist now: no key is "nobody" (200, not 401, so a sign-in page
    // can ask), a bad key is refused as anywhere.
    let anonymous = node.call(Call::new("GET", "/v1/whoami")).await;
    assert_eq!(anonymous.status, 200, "{anonymous:?}");
    assert_eq!(
        anonymous.body,
        json!({ "key_id": null, "role": null, "tenant": null, "can_write": false, "open": false })
    );
    let bad = node
        .call(Call::new("GET", "/v1/whoami").key("bfy_not-a-key"))
        .await;
    assert_eq!(bad.status, 401, "{bad:?}");
    // Nothing else opened up: other routes still need a key.
    assert_eq!(node.call(Call::new("GET", "/v1/tenants")).await.status, 401);

    for (secret, id, role, tenant, can_write) in [
        (&admin, &admin_id, "admin", Value::Null, true),
        (&reader, &reader_id, "read", json!("acme"), false),
        (&writer, &writer_id, "write", json!("acme"), true),
    ] {
        let me = node.call(Call::new("GET", "/v1/whoami").key(secret)).await;
        assert_eq!(me.status, 200, "{me:?}");
        assert_eq!(
            me.body,
            json!({ "key_id": id, "role": role, "tenant": tenant,
                    "can_write": can_write, "open": false }),
        );
        assert!(!me.text.contains(secret.as_str()));
    }
    node.stop().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_without_a_key_under_a_strict_policy() {
    let h = Harness::start().await;
    stored_key(&h.store, None, Role::Admin, None).await;
    let node = Served::start(&h, AuthOptions::default()).await;
    assert_eq!(node.call(Call::new("GET", "/v1/tenants")).await.status, 401);

    for (path, content_type) in [
        ("/ui", "text/html; charset=utf-8"),
        ("/ui/", "text/html; charset=utf-8"),
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/console.css", "text/css; charset=utf-8"),
        ("/ui/favicon.svg", "image/svg+xml"),
    ] {
        // Any Host: the files hold no data (the allow-list guards open mode).
        let page = node
            .call(Call::new("GET", path).header("Host", "console.example"))
            .await;
        assert_eq!(page.status, 200, "{path}: {page:?}");
        assert_eq!(page.headers["content-type"], content_type, "{path}");
        let policy = &page.headers["content-security-policy"];
        for directive in [
            "default-src 'self'",
            "script-src 'self'",
            "frame-ancestors 'none'",
            "object-src 'none'",
        ] {
            assert!(policy.contains(directive), "{path}: {policy}");
        }
        assert!(!policy.contains("unsafe"), "{path}: {policy}");
        assert_eq!(page.headers["x-content-type-options"], "nosniff");
        assert_eq!(page.headers["x-frame-options"], "DENY");
        assert_eq!(page.headers["cache-control"], "no-cache");

        // Revalidation: the same version answers 304 without a body.
        let etag = page.headers["etag"].clone();
        let again = node
            .call(Call::new("GET", path).header("If-None-Match", &etag))
            .await;
        assert_eq!(again.status, 304, "{path}: {again:?}");
        assert!(again.text.is_empty());
        let other = node
            .call(Call::new("GET", path).header("If-None-Match", "\"0\""))
            .await;
        assert_eq!(other.status, 200, "{path}");
    }
    // The page loads its scripts from files only: no inline script.
    let html = node.call(Call::new("GET", "/ui")).await.text;
    assert!(html.contains("<script type=\"module\" src=\"/ui/app.js\"></script>"));
    assert_eq!(html.matches("<script").count(), 1, "{html}");

    for missing in ["/ui/nope.js", "/ui/..%2Fapp.js", "/ui/app.js%00"] {
        let answer = node.call(Call::new("GET", missing)).await;
        assert_eq!(answer.status, 404, "{missing}: {answer:?}");
        assert!(answer.headers.contains_key("content-security-policy"));
    }
    // Writes are not routes of the console.
    let write = node.call(Call::new("POST", "/ui").json(json!({}))).await;
    assert_eq!(write.status, 405, "{write:?}");
    node.stop().await;
    h.shutdown().await;
}
