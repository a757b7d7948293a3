//! `belfry tenants …`: where each tenant's events are delivered, through
//! `/v1/tenants`.

use clap::{Args, Subcommand};
use serde_json::{Map, Value, json};

use super::{Client, Connection, Failure, Fields, clean, render_items, segment, show, text};

#[derive(Debug, Args)]
pub struct TenantsArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    pub command: TenantsCommand,
}

#[derive(Debug, Subcommand)]
pub enum TenantsCommand {
    /// List the tenants (those the key may see), by name.
    List,
    /// Show a tenant's sink and notice target.
    Get {
        /// The tenant
        tenant: String,
    },
    /// Register a tenant with a webhook, or replace its sink.
    Put(PutArgs),
    /// Pause a tenant's deliveries: its due events stay pending, in
    /// order, and its workers claim nothing until it is resumed.
    Pause {
        /// The tenant
        tenant: String,
        /// Why (shown in its view and the audit log)
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume a tenant's deliveries: what the pause held back goes out in
    /// due order.
    Resume {
        /// The tenant
        tenant: String,
    },
}

#[derive(Debug, Args)]
pub struct PutArgs {
    /// The tenant
    pub tenant: String,

    /// The webhook its events are POSTed to (http:// or https://). Not
    /// `--url`: that names the node, on every client command.
    #[arg(long, value_name = "URL")]
    pub webhook: String,

    /// A header sent with every delivery, as NAME:VALUE (repeatable)
    #[arg(long = "header", value_name = "NAME:VALUE")]
    pub headers: Vec<String>,

    /// How long a delivery waits for the webhook's answer
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,

    /// Where the tenant's notices go (failed, expired and missed events,
    /// pauses, resumes): a webhook URL
    #[arg(long, value_name = "URL", conflicts_with = "notify_kafka_topic")]
    pub notify_url: Option<String>,

    /// Where the tenant's notices go: a Kafka topic (on nodes built with
    /// Kafka)
    #[arg(long, value_name = "TOPIC")]
    pub notify_kafka_topic: Option<String>,
}

pub async fn execute(client: &Client, command: TenantsCommand) -> Result<(), Failure> {
    match command {
        TenantsCommand::List => show(client, client.get("/v1/tenants").await, render_list),
        TenantsCommand::Get { tenant } => {
            let path = format!("/v1/tenants/{}", segment("tenant", &tenant)?);
            show(client, client.get(&path).await, render_tenant)
        }
        TenantsCommand::Put(args) => {
            let mut sink = json!({ "type": "http", "url": args.webhook });
            if !args.headers.is_empty() {
                sink["headers"] = Value::Object(headers(&args.headers)?);
            }
            if let Some(timeout_ms) = args.timeout_ms {
                sink["timeout_ms"] = json!(timeout_ms);
            }
            let path = format!("/v1/tenants/{}", segment("tenant", &args.tenant)?);
            let mut body = json!({ "sink": sink });
            if let Some(url) = args.notify_url {
                body["notify"] = json!({ "url": url });
            } else if let Some(topic) = args.notify_kafka_topic {
                body["notify"] = json!({ "kafka_topic": topic });
            }
            let answer = client.put(&path, &body).await;
            show(client, answer, render_tenant)
        }
        TenantsCommand::Pause { tenant, reason } => {
            let path = format!("/v1/tenants/{}/pause", segment("tenant", &tenant)?);
            let answer = match reason {
                Some(reason) => client.post_json(&path, &json!({ "reason": reason })).await,
                None => client.post(&path).await,
            };
            show(client, answer, render_tenant)
        }
        TenantsCommand::Resume { tenant } => {
            let path = format!("/v1/tenants/{}/resume", segment("tenant", &tenant)?);
            show(client, client.post(&path).await, render_tenant)
        }
    }
}

fn headers(pairs: &[String]) -> Result<Map<String, Value>, Failure> {
    let mut headers = Map::new();
    for pair in pairs {
        let Some((name, value)) = pair.split_once(':') else {
            // The value may be a secret: name only what is wrong.
            return Err(Failure::Usage(
                "--header must be NAME:VALUE (a colon after the name)".into(),
            ));
        };
        headers.insert(name.trim().to_string(), Value::String(value.trim().into()));
    }
    Ok(headers)
}

/// Where a sink delivers: its URL, topic or processor.
fn target(sink: &Value) -> String {
    ["url", "topic", "processor"]
        .iter()
        .find_map(|field| sink.get(field).and_then(Value::as_str))
        .map(clean)
        .unwrap_or_else(|| "-".into())
}

fn render_list(answer: &Value) -> String {
    let header = ["NAME", "SINK", "TARGET", "PAUSED"];
    render_items(answer, "tenants", "no tenants", &header, |tenant| {
        let sink = tenant.get("sink").unwrap_or(&Value::Null);
        let paused = tenant
            .get("pause")
            .and_then(|pause| pause.get("paused"))
            .and_then(Value::as_bool)
            == Some(true);
        let paused = if paused { "yes" } else { "no" };
        vec![
            text(tenant, "name"),
            text(sink, "type"),
            target(sink),
            paused.to_string(),
        ]
    })
}

fn render_tenant(tenant: &Value) -> String {
    let sink = tenant.get("sink").unwrap_or(&Value::Null);
    let mut fields = Fields::default();
    fields.add("name", text(tenant, "name"));
    fields.add("sink", text(sink, "type"));
    fields.add("target", target(sink));
    if let Some(headers) = sink.get("headers").and_then(Value::as_object) {
        // Values come back as **** (write-only): the names are what helps.
        let names: Vec<String> = headers.keys().map(|n| clean(n)).collect();
        fields.add("headers", names.join(", "));
    }
    if sink.get("timeout_ms").is_some_and(|t| !t.is_null()) {
        fields.add("timeout_ms", text(sink, "timeout_ms"));
    }
    if let Some(notify) = tenant.get("notify").filter(|n| n.is_object()) {
        let target = ["url", "kafka_topic"]
            .into_iter()
            .find_map(|field| notify.get(field).and_then(Value::as_str))
            .map(clean)
            .unwrap_or_default();
        fields.add("notify", target);
    }
    if let Some(pause) = tenant.get("pause").filter(|p| p.is_object()) {
        let paused = pause.get("paused").and_then(Value::as_bool) == Some(true);
        let state = if paused { "paused" } else { "resumed" };
        fields.add(state, format!("since {}", text(pause, "since")));
        if paused && pause.get("reason").is_some_and(Value::is_string) {
            fields.add("reason", text(pause, "reason"));
        }
    }
    // Only in the answer that created the tenant: shown once, like the API.
    if tenant.get("signing_secret").is_some_and(Value::is_string) {
        fields.add("signing_secret", text(tenant, "signing_secret"));
    }
    let mut out = fields.render();
    if tenant.get("signing_secret").is_some_and(Value::is_string) {
        out.push_str("store the signing secret now: it is not shown again\n");
    }
    out
}
