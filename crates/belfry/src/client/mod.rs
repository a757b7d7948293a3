//! The command-line client: `belfry events|tenants|schedules|dead|bulk|cluster …`
//! talk to a running node over its `/v1` HTTP API.
//!
//! - [`Connection`]: `--url` (`BELFRY_URL`), `--key` (`BELFRY_KEY`, sent as
//!   `Authorization: Bearer …`, never printed) and `--json`;
//! - [`Client`]: one request, its answer or a [`Failure`];
//! - [`Table`] and [`Fields`]: aligned text for people; `--json` prints the
//!   server's answer as it came.
//!
//! Exit codes: 0 success, 1 the server refused (4xx), 2 bad input (clap's
//! usage errors and ours), 3 the node cannot be reached, 4 a server error
//! (5xx, or an answer that is not JSON).

pub mod bulk;
pub mod cluster;
pub mod events;
pub mod schedules;
pub mod tenants;

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Method;
use serde_json::Value;

/// How to reach the node; every client command takes these, before or
/// after its subcommand.
#[derive(Debug, Args)]
pub struct Connection {
    /// The node's base URL
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "BELFRY_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub url: String,

    /// API key (bfy_…), sent as `Authorization: Bearer`
    // hide_env_values: `--help` must not print the key from the environment.
    #[arg(
        long,
        global = true,
        value_name = "KEY",
        env = "BELFRY_KEY",
        hide_env_values = true
    )]
    pub key: Option<String>,

    /// Print the server's JSON answer as is, for scripts
    #[arg(long, global = true)]
    pub json: bool,
}

/// Why a command did not succeed; each maps to an exit code.
#[derive(Debug)]
pub enum Failure {
    /// Bad input found before asking the server: exit 2.
    Usage(String),
    /// The server refused the request (4xx): exit 1.
    Refused(String),
    /// The node could not be reached: exit 3.
    Unreachable(String),
    /// The server failed (5xx) or answered nonsense: exit 4.
    Server(String),
}

impl Failure {
    fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            Failure::Refused(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Unreachable(_) => 3,
            Failure::Server(_) => 4,
        })
    }

    fn message(&self) -> &str {
        match self {
            Failure::Usage(m)
            | Failure::Refused(m)
            | Failure::Unreachable(m)
            | Failure::Server(m) => m,
        }
    }
}

/// A node's answer: the body as sent (for `--json`) and parsed.
pub struct Answer {
    pub raw: String,
    pub value: Value,
}

/// An HTTP client bound to one node.
pub struct Client {
    base: String,
    key: Option<String>,
    pub json: bool,
    http: reqwest::Client,
}

/// Generous: a listing of a thousand events from a loaded node takes a
/// while, but a hung node must not hang a script forever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Client {
    fn new(connection: Connection) -> Result<Client, Failure> {
        let base = connection.url.trim_end_matches('/').to_string();
        let parsed = reqwest::Url::parse(&base)
            .map_err(|e| Failure::Usage(format!("--url {base:?} is not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
            return Err(Failure::Usage(format!(
                "--url {base:?} must be http://HOST[:PORT] or https://HOST[:PORT]"
            )));
        }
        // An empty BELFRY_KEY (exported but blank) means no key.
        let key = connection.key.filter(|k| !k.is_empty());
        if key
            .as_deref()
            .is_some_and(|k| !k.bytes().all(|b| b.is_ascii_graphic()))
        {
            // Checked here: reqwest would refuse the header with an error
            // that might quote it.
            return Err(Failure::Usage(
                "--key must be printable ASCII without spaces".into(),
            ));
        }
        // The workspace builds reqwest without a default crypto provider;
        // Err only means one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .tls_backend_rustls()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Failure::Usage(format!("cannot set up the HTTP client: {e}")))?;
        Ok(Client {
            base,
            key,
            json: connection.json,
            http,
        })
    }

    pub async fn get(&self, path: &str) -> Result<Answer, Failure> {
        self.send(Method::GET, path, None).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Result<Answer, Failure> {
        self.send(Method::PUT, path, Some(body)).await
    }

    /// `PUT` with `If-Match: if_match` when given.
    pub async fn put_if_match(
        &self,
        path: &str,
        body: &Value,
        if_match: Option<&str>,
    ) -> Result<Answer, Failure> {
        self.send_if_match(Method::PUT, path, Some(body), if_match)
            .await
    }

    /// `DELETE` with `If-Match: if_match` when given.
    pub async fn delete_if_match(
        &self,
        path: &str,
        if_match: Option<&str>,
    ) -> Result<Answer, Failure> {
        self.send_if_match(Method::DELETE, path, None, if_match)
            .await
    }

    /// A POST without a body (the action is in the path).
    pub async fn post(&self, path: &str) -> Result<Answer, Failure> {
        self.send(Method::POST, path, None).await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Answer, Failure> {
        self.send(Method::POST, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> Result<Answer, Failure> {
        self.send(Method::DELETE, path, None).await
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, Failure> {
        self.send_if_match(method, path, body, None).await
    }

    async fn send_if_match(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
    ) -> Result<Answer, Failure> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method, &url);
        if let Some(key) = &self.key {
            request = request.bearer_auth(key);
        }
        if let Some(tag) = if_match {
            request = request.header(reqwest::header::IF_MATCH, if_match_tag(tag));
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| Failure::Unreachable(transport_error(&self.base, &e)))?;
        let status = response.status();
        let raw = response
            .text()
            .await
            .map_err(|e| Failure::Unreachable(transport_error(&self.base, &e)))?;
        if status.is_success() {
            let value = if raw.trim().is_empty() {
                Value::Null
            } else {
                serde_json::from_str(&raw).map_err(|_| {
                    Failure::Server(format!(
                        "{} answered {status} with a body that is not JSON: {}",
                        self.base,
                        excerpt(&raw)
                    ))
                })?
            };
            return Ok(Answer { raw, value });
        }
        let message = error_message(status, &raw);
        if status.is_client_error() {
            Err(Failure::Refused(message))
        } else {
            Err(Failure::Server(message))
        }
    }
}

/// `*`, or a version as an entity tag (quoted, as `ETag` answers it).
fn if_match_tag(tag: &str) -> String {
    if tag == "*" || tag.starts_with('"') {
        tag.to_string()
    } else {
        format!("\"{tag}\"")
    }
}

/// The message of the `/v1` error envelope `{"error": {"code", "message"}}`,
/// with the code and status; a short excerpt for any other body.
fn error_message(status: reqwest::StatusCode, raw: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(raw).ok();
    let envelope = parsed.as_ref().and_then(|v| v.get("error"));
    match envelope {
        Some(error) => {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("(no message)");
            let code = error.get("code").and_then(Value::as_str).unwrap_or("?");
            format!("{} ({code}, HTTP {})", clean(message), status.as_u16())
        }
        None if raw.trim().is_empty() => format!("HTTP {status}"),
        None => format!("HTTP {status}: {}", excerpt(raw)),
    }
}

/// Names the node's URL, and why it could not be reached.
fn transport_error(base: &str, error: &reqwest::Error) -> String {
    // reqwest's Display names only the top level ("error sending request");
    // the cause (connection refused, DNS) is further down the chain.
    let mut cause = String::new();
    let mut source = std::error::Error::source(error);
    while let Some(s) = source {
        cause = s.to_string();
        source = s.source();
    }
    let what = if error.is_timeout() {
        "no answer in time from".to_string()
    } else {
        "cannot connect to".to_string()
    };
    if cause.is_empty() {
        format!("{what} {base}")
    } else {
        format!("{what} {base}: {cause}")
    }
}

fn excerpt(raw: &str) -> String {
    let text = clean(raw.trim());
    match text.char_indices().nth(200) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

/// Control characters (a payload's newlines, a terminal escape in a
/// hostile answer) shown escaped, so a cell stays on its line and cannot
/// drive the terminal.
pub fn clean(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Characters a name keeps unencoded in a path segment (RFC 3986's
/// unreserved set); everything else, `/` above all, is percent-encoded.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `/v1/tenants/{tenant}/{collection}/{id}`; `what` names the id in an
/// error.
pub fn tenant_item_path(
    tenant: &str,
    collection: &str,
    what: &str,
    id: &str,
) -> Result<String, Failure> {
    Ok(format!(
        "/v1/tenants/{}/{collection}/{}",
        segment("tenant", tenant)?,
        segment(what, id)?
    ))
}

/// One path segment for a tenant name, event or schedule id.
pub fn segment(what: &str, name: &str) -> Result<String, Failure> {
    // URL parsers resolve "." and ".." (encoded or not) as dot segments,
    // so such a name cannot be addressed by a path at all.
    if name.is_empty() || name == "." || name == ".." {
        return Err(Failure::Usage(format!(
            "{what} {name:?} cannot be written in a URL path"
        )));
    }
    Ok(utf8_percent_encode(name, SEGMENT).to_string())
}

/// A query string from the pairs that are set (`?a=1&b=2`, or empty).
pub fn query(pairs: &[(&str, Option<String>)]) -> String {
    let mut out = String::new();
    for (name, value) in pairs {
        if let Some(value) = value {
            out.push(if out.is_empty() { '?' } else { '&' });
            let _ = write!(out, "{name}={}", utf8_percent_encode(value, SEGMENT));
        }
    }
    out
}

/// Runs one client command on a fresh single-threaded runtime and turns
/// its outcome into the exit code, the failure on stderr.
pub fn run<F>(connection: Connection, command: F) -> ExitCode
where
    F: AsyncFnOnce(&Client) -> Result<(), Failure>,
{
    let outcome = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(async {
            let client = Client::new(connection)?;
            command(&client).await
        }),
        Err(error) => Err(Failure::Usage(format!(
            "cannot start the async runtime: {error}"
        ))),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("belfry: {}", failure.message());
            failure.exit_code()
        }
    }
}

/// Writes to stdout; a closed pipe (`belfry events list | head`) ends
/// the output quietly instead of panicking like `println!`.
pub fn print(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    if !text.ends_with('\n') {
        let _ = stdout.write_all(b"\n");
    }
    let _ = stdout.flush();
}

/// Prints the answer: its raw JSON with `--json`, else what `render`
/// makes of it. Takes the request's outcome so a command is one line.
pub fn show(
    client: &Client,
    answer: Result<Answer, Failure>,
    render: impl FnOnce(&Value) -> String,
) -> Result<(), Failure> {
    let answer = answer?;
    if client.json {
        print(&answer.raw);
    } else {
        print(&render(&answer.value));
    }
    Ok(())
}

/// The array `field` of an answer; empty when it is missing.
pub fn items<'a>(answer: &'a Value, field: &str) -> &'a [Value] {
    answer
        .get(field)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// The named fields of `value` as cells, in this order.
pub fn cells(value: &Value, fields: &[&str]) -> Vec<String> {
    fields.iter().map(|field| text(value, field)).collect()
}

/// A column's header from the field it shows: `deliver_at` → `DELIVER AT`.
pub fn column(field: &str) -> String {
    field.to_uppercase().replace('_', " ")
}

/// A listing of the `fields` of each item, each under its [`column`].
pub fn render_fields(answer: &Value, field: &str, none: &str, fields: &[&str]) -> String {
    let header: Vec<String> = fields.iter().map(|f| column(f)).collect();
    render_items(answer, field, none, &header, |item| cells(item, fields))
}

/// A listing: `none` when its `field` array is empty, else a table with a
/// row per item, then the next-page line (when the answer has one).
pub fn render_items<S: AsRef<str>>(
    answer: &Value,
    field: &str,
    none: &str,
    header: &[S],
    row: impl Fn(&Value) -> Vec<String>,
) -> String {
    let items = items(answer, field);
    if items.is_empty() {
        return format!("{none}\n");
    }
    let mut table = Table::new(header);
    for item in items {
        table.row(row(item));
    }
    table.render() + &next_page(answer)
}

/// Paging of a listing.
#[derive(Debug, Args)]
pub struct Paging {
    /// Items per page (the node's default when left out)
    #[arg(long, value_name = "N")]
    pub limit: Option<u32>,

    /// Where the previous page ended (its `more: --cursor …` line)
    #[arg(long, value_name = "CURSOR")]
    pub cursor: Option<String>,
}

impl Paging {
    /// The query pairs, for [`query`].
    pub fn pairs(self) -> [(&'static str, Option<String>); 2] {
        [
            ("limit", self.limit.map(|n| n.to_string())),
            ("cursor", self.cursor),
        ]
    }
}

/// Bounds on the events' due instants.
#[derive(Debug, Args)]
pub struct DueRange {
    /// Events due at or after this instant (RFC 3339)
    #[arg(long, value_name = "INSTANT")]
    pub from: Option<String>,

    /// Events due before this instant (RFC 3339)
    #[arg(long, value_name = "INSTANT")]
    pub to: Option<String>,
}

impl DueRange {
    /// The named bounds that are set, for a query or a filter.
    pub fn pairs(self) -> [(&'static str, Option<String>); 2] {
        [("from", self.from), ("to", self.to)]
    }
}

/// A JSON field as text for a cell: strings as they are, `null` or
/// missing as `-`.
pub fn text(value: &Value, field: &str) -> String {
    match value.get(field) {
        None | Some(Value::Null) => "-".to_string(),
        Some(Value::String(s)) => clean(s),
        Some(other) => clean(&other.to_string()),
    }
}

/// Rows under a header, each column as wide as its widest cell.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<S: AsRef<str>>(header: &[S]) -> Table {
        Table {
            header: header.iter().map(|h| h.as_ref().to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate().take(columns) {
                if i + 1 == columns {
                    line.push_str(cell);
                } else {
                    let pad = widths[i] - cell.chars().count();
                    let _ = write!(line, "{cell}{}  ", " ".repeat(pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `name: value` lines with the values aligned, for one object.
#[derive(Default)]
pub struct Fields {
    lines: Vec<(String, String)>,
}

impl Fields {
    pub fn add(&mut self, name: &str, value: String) {
        self.lines.push((name.to_string(), value));
    }

    /// The named fields of `value`, in this order.
    pub fn from(value: &Value, names: &[&str]) -> Fields {
        let mut fields = Fields::default();
        for name in names {
            fields.add(name, text(value, name));
        }
        fields
    }

    pub fn render(&self) -> String {
        let width = self
            .lines
            .iter()
            .map(|(n, _)| n.chars().count())
            .max()
            .unwrap_or(0);
        let mut out = String::new();
        for (name, value) in &self.lines {
            let _ = writeln!(
                out,
                "{name}:{} {value}",
                " ".repeat(width - name.chars().count())
            );
        }
        out
    }
}

/// The line that tells how to get the next page of a listing, if any.
pub fn next_page(value: &Value) -> String {
    match value.get("next_cursor").and_then(Value::as_str) {
        Some(cursor) => format!("more: --cursor {}\n", clean(cursor)),
        None => String::new(),
    }
}
