//! `belfry events …` and `belfry dead …`: one tenant's events through
//! `/v1/tenants/{tenant}/events`.
//!
//! `dead` is the failed events (`events list --status failed`),
//! `POST …/events/{id}/redrive`, which sends one again, and
//! `POST …/events/{id}/delete`, which deletes a finished one.

use belfry_clock::SystemClock;
use belfry_core::{Clock, Timestamp};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{
    Client, Connection, DueRange, Failure, Fields, Paging, cells, print, query, render_fields,
    render_items, segment, show, tenant_item_path,
};

#[derive(Debug, Args)]
pub struct EventsArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    pub command: EventsCommand,
}

#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// Schedule an event, or move or update it if the id exists.
    Schedule(ScheduleArgs),
    /// Show an event's status.
    Get(EventRef),
    /// List a tenant's events, by id (or by instant when filtered).
    List(ListArgs),
    /// Cancel an event that has not been delivered yet.
    Cancel(CancelArgs),
    /// Show every delivery attempt of an event, oldest first.
    Attempts(EventRef),
}

#[derive(Debug, Args)]
pub struct EventRef {
    /// The tenant (a `/` in it needs no escaping here)
    pub tenant: String,
    /// The event's id
    pub id: String,
}

#[derive(Debug, Args)]
pub struct ScheduleArgs {
    #[command(flatten)]
    pub event: EventRef,

    /// When to deliver: RFC 3339 with an offset or Z
    /// (2030-01-31T09:30:00+01:00), or from now: +30s, +5m, +1h30m, +2d,
    /// +500ms
    #[arg(long, value_name = "INSTANT", required_unless_present = "delay")]
    pub at: Option<String>,

    /// Instead of --at: deliver this long after the node accepts the write
    /// (30s, 5m, 500ms; counted on the node's clock)
    #[arg(long, value_name = "DURATION", conflicts_with = "at")]
    pub delay: Option<String>,

    /// With --delay: debounce. Each write moves the event to --delay after
    /// it, but never past this long after the first write of its pending
    /// series
    #[arg(long, value_name = "DURATION", requires = "delay")]
    pub max_wait: Option<String>,

    /// Only if the event's version is this one (or, for *, if it exists);
    /// else refused (precondition_failed) and nothing changes
    #[arg(long, value_name = "VERSION|*")]
    pub if_match: Option<String>,

    /// The payload: TEXT as is, or @FILE for a file's contents
    #[arg(long, value_name = "TEXT|@FILE")]
    pub payload: Option<String>,

    /// full_event (the receiver gets BigBen's EventResponse JSON) or
    /// payload_only (the payload as is)
    #[arg(long, value_name = "MODE")]
    pub delivery: Option<String>,

    /// Attempts before the event fails (else its tenant's)
    #[arg(long, value_name = "N")]
    pub max_attempts: Option<u32>,

    /// How long one attempt may take, in ms (within the node's cap)
    #[arg(long, value_name = "MS")]
    pub attempt_timeout_ms: Option<u64>,

    /// No attempt at or after this instant: the event ends expired
    /// (RFC 3339, or from now like --at)
    #[arg(long, value_name = "INSTANT")]
    pub expire_at: Option<String>,

    /// No attempt this long (ms) or longer after its instant: the event
    /// ends expired (else its tenant's)
    #[arg(long, value_name = "MS")]
    pub max_age_ms: Option<u64>,
}

#[derive(Debug, Args)]
pub struct CancelArgs {
    #[command(flatten)]
    pub event: EventRef,

    /// Only if the event's version is this one (or, for *, if it exists);
    /// else refused (precondition_failed) and nothing changes
    #[arg(long, value_name = "VERSION|*")]
    pub if_match: Option<String>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// The tenant
    pub tenant: String,

    /// scheduled, retrying, delivered, failed, missed or cancelled
    #[arg(long, value_name = "STATUS")]
    pub status: Option<String>,

    #[command(flatten)]
    pub page: Page,
}

/// Paging and instant bounds of a listing.
#[derive(Debug, Args)]
pub struct Page {
    #[command(flatten)]
    pub due: DueRange,

    #[command(flatten)]
    pub paging: Paging,
}

#[derive(Debug, Args)]
pub struct DeadArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    pub command: DeadCommand,
}

#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// List a tenant's failed events (retries given up or refused with a
    /// 4xx): `events list --status failed`.
    List(DeadListArgs),
    /// Send a failed or missed event again, now, as a new version (its
    /// history is kept).
    Redrive(EventRef),
    /// Delete a finished event and its attempt history (a pending one is
    /// refused: cancel it first). Many at once: `bulk create --action
    /// delete --status failed`.
    Delete(EventRef),
}

#[derive(Debug, Args)]
pub struct DeadListArgs {
    /// The tenant
    pub tenant: String,

    #[command(flatten)]
    pub page: Page,
}

pub async fn execute(client: &Client, command: EventsCommand) -> Result<(), Failure> {
    match command {
        EventsCommand::Schedule(args) => {
            let mut body = json!({});
            match (&args.at, &args.delay, &args.max_wait) {
                (Some(at), _, _) => {
                    body["deliver_at"] = Value::String(instant_arg("--at", at, SystemClock.now())?);
                }
                (None, Some(delay), None) => {
                    body["delay_ms"] = Value::from(duration_arg("--delay", delay)?);
                }
                (None, Some(delay), Some(max_wait)) => {
                    body["debounce"] = json!({
                        "delay_ms": duration_arg("--delay", delay)?,
                        "max_wait_ms": duration_arg("--max-wait", max_wait)?,
                    });
                }
                (None, None, _) => {
                    return Err(Failure::Usage("--at or --delay is required".into()));
                }
            }
            if let Some(payload) = args.payload {
                body["payload"] = Value::String(read_payload(payload)?);
            }
            if let Some(delivery) = args.delivery {
                body["delivery"] = Value::String(delivery);
            }
            if let Some(expire_at) = args.expire_at {
                let expire_at = instant_arg("--expire-at", &expire_at, SystemClock.now())?;
                body["expire_at"] = Value::String(expire_at);
            }
            for (field, value) in [
                ("max_attempts", args.max_attempts.map(u64::from)),
                ("attempt_timeout_ms", args.attempt_timeout_ms),
                ("max_age_ms", args.max_age_ms),
            ] {
                if let Some(value) = value {
                    body[field] = Value::from(value);
                }
            }
            let path = event_path(&args.event)?;
            let answer = client
                .put_if_match(&path, &body, args.if_match.as_deref())
                .await;
            show(client, answer, render_event)
        }
        EventsCommand::Get(event) => {
            show(client, client.get(&event_path(&event)?).await, render_event)
        }
        EventsCommand::Cancel(args) => {
            let path = event_path(&args.event)?;
            let answer = client
                .delete_if_match(&path, args.if_match.as_deref())
                .await;
            show(client, answer, render_event)
        }
        EventsCommand::Attempts(event) => {
            let path = format!("{}/attempts", event_path(&event)?);
            show(client, client.get(&path).await, render_attempts)
        }
        EventsCommand::List(args) => list(client, &args.tenant, args.status, args.page).await,
    }
}

pub async fn execute_dead(client: &Client, command: DeadCommand) -> Result<(), Failure> {
    match command {
        DeadCommand::List(args) => {
            list(client, &args.tenant, Some("failed".into()), args.page).await
        }
        DeadCommand::Redrive(event) => {
            let path = format!("{}/redrive", event_path(&event)?);
            show(client, client.post(&path).await, render_event)
        }
        DeadCommand::Delete(event) => {
            let path = format!("{}/delete", event_path(&event)?);
            // 204: nothing to show but what went.
            client.post(&path).await?;
            if client.json {
                print(
                    &json!({ "tenant": event.tenant, "id": event.id, "deleted": true }).to_string(),
                );
            } else {
                print(&format!("deleted {} of {}", event.id, event.tenant));
            }
            Ok(())
        }
    }
}

async fn list(
    client: &Client,
    tenant: &str,
    status: Option<String>,
    page: Page,
) -> Result<(), Failure> {
    let path = format!(
        "/v1/tenants/{}/events{}",
        segment("tenant", tenant)?,
        query(
            &[
                [("status", status)].as_slice(),
                &page.due.pairs(),
                &page.paging.pairs(),
            ]
            .concat()
        )
    );
    show(client, client.get(&path).await, render_event_list)
}

fn event_path(event: &EventRef) -> Result<String, Failure> {
    tenant_item_path(&event.tenant, "events", "event id", &event.id)
}

/// An instant flag's value (`--at`, `--expire-at`) as the instant to send:
/// RFC 3339 as given (the server keeps its offset semantics), or
/// `+DURATION` from `now`.
fn instant_arg(flag: &str, text: &str, now: Timestamp) -> Result<String, Failure> {
    let text = text.trim();
    let Some(relative) = text.strip_prefix('+') else {
        return match Timestamp::parse_rfc3339(text) {
            Some(_) => Ok(text.to_string()),
            None => Err(Failure::Usage(format!(
                "{flag} {text:?} is neither an RFC 3339 instant with an offset \
                 (2030-01-31T09:30:00Z) nor a time from now (+30s, +5m, +1h30m)"
            ))),
        };
    };
    let offset = duration_ms(relative).ok_or_else(|| {
        Failure::Usage(format!(
            "{flag} {text:?}: a time from now is numbers with units ms, s, m, h, d (+30s, +1h30m)"
        ))
    })?;
    let instant = now
        .as_millis()
        .checked_add(offset)
        .map(Timestamp::from_millis)
        .map(Timestamp::to_rfc3339)
        // to_rfc3339 writes "@…ms" for instants past year 9999.
        .filter(|rendered| !rendered.starts_with('@'))
        .ok_or_else(|| Failure::Usage(format!("{flag} {text:?} is too far in the future")))?;
    Ok(instant)
}

/// A duration flag (`30s`, `1h30m`, `500ms`) in milliseconds.
fn duration_arg(flag: &str, text: &str) -> Result<u64, Failure> {
    duration_ms(text.trim())
        .and_then(|ms| u64::try_from(ms).ok())
        .ok_or_else(|| {
            Failure::Usage(format!(
                "{flag} {text:?}: a duration is numbers with units ms, s, m, h, d (30s, 1h30m)"
            ))
        })
}

/// `1h30m`, `30s`, `500ms` in milliseconds; `None` for anything else or on
/// overflow.
fn duration_ms(text: &str) -> Option<i64> {
    let mut total: i64 = 0;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let number: i64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit_ms = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total = total.checked_add(number.checked_mul(unit_ms)?)?;
    }
    Some(total)
}

/// `--payload`: the text, or with a leading `@` the named file's contents.
pub fn read_payload(payload: String) -> Result<String, Failure> {
    match payload.strip_prefix('@') {
        None => Ok(payload),
        Some(file) => std::fs::read_to_string(file).map_err(|e| {
            Failure::Usage(format!(
                "--payload @{file}: cannot read it as UTF-8 text: {e}"
            ))
        }),
    }
}

fn render_event(event: &Value) -> String {
    let mut fields = Fields::from(
        event,
        &[
            "tenant",
            "id",
            "status",
            "deliver_at",
            "attempts",
            "last_error",
            "next_attempt_at",
            "triggered_at",
            "finished_at",
            "version",
            "delivery",
            "payload",
            "created_at",
            "updated_at",
        ],
    );
    // Shown only when the answer has them (a debounced series, a cancel
    // or a move).
    for name in ["debounce_since", "previous_delivery"] {
        if event.get(name).is_some() {
            fields.add(name, super::text(event, name));
        }
    }
    fields.render()
}

fn render_event_list(answer: &Value) -> String {
    let fields = ["id", "status", "deliver_at", "attempts", "last_error"];
    render_fields(answer, "events", "no events", &fields)
}

fn render_attempts(answer: &Value) -> String {
    let header = ["#", "STARTED AT", "DURATION MS", "OUTCOME", "HTTP", "ERROR"];
    let fields = [
        "number",
        "started_at",
        "duration_ms",
        "outcome",
        "http_status",
        "error",
    ];
    render_items(answer, "attempts", "no attempts yet", &header, |attempt| {
        cells(attempt, &fields)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_instants_add_to_now() {
        let now = Timestamp::parse_rfc3339("2030-01-31T04:00:00Z").unwrap();
        let at = |text: &str| instant_arg("--at", text, now).ok();
        assert_eq!(at("+30s").as_deref(), Some("2030-01-31T04:00:30Z"));
        assert_eq!(at("+1h30m").as_deref(), Some("2030-01-31T05:30:00Z"));
        assert_eq!(at("+250ms").as_deref(), Some("2030-01-31T04:00:00.25Z"));
        assert_eq!(at("+2d").as_deref(), Some("2030-02-02T04:00:00Z"));
        assert_eq!(
            at("2030-01-31T09:30:00+05:30").as_deref(),
            Some("2030-01-31T09:30:00+05:30")
        );
    }

    #[test]
    fn malformed_instants_are_usage_errors_not_panics() {
        let now = Timestamp::parse_rfc3339("2030-01-31T04:00:00Z").unwrap();
        for text in [
            "",
            "+",
            "+s",
            "+30",
            "+30x",
            "+1h30",
            "tomorrow",
            "2030-01-31T09:30:00",
            "+99999999999999999999s",
            "+9223372036854775807d",
            "+100000000d",
            "+30s+",
        ] {
            assert!(
                matches!(instant_arg("--at", text, now), Err(Failure::Usage(_))),
                "{text:?} accepted"
            );
        }
    }
}
