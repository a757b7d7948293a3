//! `belfry schedules …`: recurring schedules through
//! `/v1/tenants/{tenant}/schedules`.

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::events::read_payload;
use super::{
    Client, Connection, Failure, Fields, Paging, query, render_fields, segment, show,
    tenant_item_path,
};

#[derive(Debug, Args)]
pub struct SchedulesArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    pub command: SchedulesCommand,
}

#[derive(Debug, Subcommand)]
pub enum SchedulesCommand {
    /// List a tenant's schedules, by id.
    List(ListArgs),
    /// Show a schedule, its next occurrence and its progress.
    Get(ScheduleRef),
    /// Create a schedule, or replace its definition.
    Put(PutArgs),
    /// Delete a schedule; its future occurrences are cancelled.
    Delete(ScheduleRef),
    /// Create no occurrence until resumed.
    Pause(ScheduleRef),
    /// Continue from now (occurrences during the pause are skipped).
    Resume(ScheduleRef),
}

#[derive(Debug, Args)]
pub struct ScheduleRef {
    /// The tenant
    pub tenant: String,
    /// The schedule's id
    pub id: String,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// The tenant
    pub tenant: String,

    #[command(flatten)]
    pub paging: Paging,
}

#[derive(Debug, Args)]
pub struct PutArgs {
    #[command(flatten)]
    pub schedule: ScheduleRef,

    /// The cron expression ('30 2 * * *'), a macro (@daily) or @every 30s
    #[arg(long, value_name = "EXPR")]
    pub cron: String,

    /// unix (default), quartz, spring, cron4j or every
    #[arg(long = "type", value_name = "TYPE")]
    pub kind: Option<String>,

    /// IANA time zone the expression is read in [default: UTC]
    #[arg(long, value_name = "TZ")]
    pub tz: Option<String>,

    /// Each occurrence's payload: TEXT as is, or @FILE for a file's contents
    #[arg(long, value_name = "TEXT|@FILE")]
    pub payload: Option<String>,

    /// full_event or payload_only, as for events
    #[arg(long, value_name = "MODE")]
    pub delivery: Option<String>,

    /// Attempts before an occurrence fails (else its tenant's)
    #[arg(long, value_name = "N")]
    pub max_attempts: Option<u32>,

    /// How long one attempt may take, in ms (within the node's cap)
    #[arg(long, value_name = "MS")]
    pub attempt_timeout_ms: Option<u64>,

    /// No attempt this long (ms) or longer after an occurrence's instant:
    /// it ends expired (else its tenant's)
    #[arg(long, value_name = "MS")]
    pub max_age_ms: Option<u64>,
}

pub async fn execute(client: &Client, command: SchedulesCommand) -> Result<(), Failure> {
    match command {
        SchedulesCommand::List(args) => {
            let path = format!(
                "/v1/tenants/{}/schedules{}",
                segment("tenant", &args.tenant)?,
                query(&args.paging.pairs())
            );
            show(client, client.get(&path).await, render_list)
        }
        SchedulesCommand::Get(schedule) => show(
            client,
            client.get(&schedule_path(&schedule)?).await,
            render_schedule,
        ),
        SchedulesCommand::Put(args) => {
            let mut body = json!({ "expression": args.cron });
            let optional = [
                ("type", args.kind),
                ("time_zone", args.tz),
                ("payload", args.payload.map(read_payload).transpose()?),
                ("delivery", args.delivery),
            ];
            for (field, value) in optional {
                if let Some(value) = value {
                    body[field] = Value::String(value);
                }
            }
            let numbers = [
                ("max_attempts", args.max_attempts.map(u64::from)),
                ("attempt_timeout_ms", args.attempt_timeout_ms),
                ("max_age_ms", args.max_age_ms),
            ];
            for (field, value) in numbers {
                if let Some(value) = value {
                    body[field] = Value::from(value);
                }
            }
            let path = schedule_path(&args.schedule)?;
            show(client, client.put(&path, &body).await, render_schedule)
        }
        SchedulesCommand::Delete(schedule) => show(
            client,
            client.delete(&schedule_path(&schedule)?).await,
            render_schedule,
        ),
        SchedulesCommand::Pause(schedule) => status_change(client, &schedule, "pause").await,
        SchedulesCommand::Resume(schedule) => status_change(client, &schedule, "resume").await,
    }
}

/// `POST …/schedules/{id}/pause` or `…/resume`.
async fn status_change(client: &Client, schedule: &ScheduleRef, verb: &str) -> Result<(), Failure> {
    let path = format!("{}/{verb}", schedule_path(schedule)?);
    show(client, client.post(&path).await, render_schedule)
}

fn schedule_path(schedule: &ScheduleRef) -> Result<String, Failure> {
    tenant_item_path(&schedule.tenant, "schedules", "schedule id", &schedule.id)
}

fn render_list(answer: &Value) -> String {
    let fields = [
        "id",
        "status",
        "expression",
        "time_zone",
        "next_occurrence",
        "occurrences",
    ];
    render_fields(answer, "schedules", "no schedules", &fields)
}

fn render_schedule(schedule: &Value) -> String {
    Fields::from(
        schedule,
        &[
            "tenant",
            "id",
            "status",
            "expression",
            "type",
            "time_zone",
            "description",
            "next_occurrence",
            "next_occurrence_local",
            "occurrences",
            "last_occurrence",
            "payload",
            "delivery",
            "error",
            "created_at",
            "updated_at",
        ],
    )
    .render()
}
