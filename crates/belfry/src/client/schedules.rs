//! `belfry schedules …`: recurring schedules through
//! `/v1/tenants/{tenant}/schedules`.

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::events::read_payload;
use super::{Client, Connection, Failure, Fields, Table, next_page, query, segment, show, text};

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

    /// Schedules per page (the node's default when left out)
    #[arg(long, value_name = "N")]
    pub limit: Option<u32>,

    /// Where the previous page ended (its `more: --cursor …` line)
    #[arg(long, value_name = "CURSOR")]
    pub cursor: Option<String>,
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
}

pub async fn execute(client: &Client, command: SchedulesCommand) -> Result<(), Failure> {
    match command {
        SchedulesCommand::List(args) => {
            let path = format!(
                "/v1/tenants/{}/schedules{}",
                segment("tenant", &args.tenant)?,
                query(&[
                    ("limit", args.limit.map(|n| n.to_string())),
                    ("cursor", args.cursor),
                ])
            );
            let answer = client.get(&path).await?;
            show(client, &answer, render_list);
        }
        SchedulesCommand::Get(schedule) => {
            let answer = client.get(&schedule_path(&schedule)?).await?;
            show(client, &answer, render_schedule);
        }
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
            let answer = client.put(&schedule_path(&args.schedule)?, &body).await?;
            show(client, &answer, render_schedule);
        }
        SchedulesCommand::Delete(schedule) => {
            let answer = client.delete(&schedule_path(&schedule)?).await?;
            show(client, &answer, render_schedule);
        }
        SchedulesCommand::Pause(schedule) => {
            let path = format!("{}/pause", schedule_path(&schedule)?);
            let answer = client.post(&path).await?;
            show(client, &answer, render_schedule);
        }
        SchedulesCommand::Resume(schedule) => {
            let path = format!("{}/resume", schedule_path(&schedule)?);
            let answer = client.post(&path).await?;
            show(client, &answer, render_schedule);
        }
    }
    Ok(())
}

fn schedule_path(schedule: &ScheduleRef) -> Result<String, Failure> {
    Ok(format!(
        "/v1/tenants/{}/schedules/{}",
        segment("tenant", &schedule.tenant)?,
        segment("schedule id", &schedule.id)?
    ))
}

fn render_list(answer: &Value) -> String {
    let schedules = answer
        .get("schedules")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if schedules.is_empty() {
        return "no schedules\n".into();
    }
    let mut table = Table::new(&[
        "ID",
        "STATUS",
        "EXPRESSION",
        "TIME ZONE",
        "NEXT OCCURRENCE",
        "OCCURRENCES",
    ]);
    for schedule in schedules {
        table.row(vec![
            text(schedule, "id"),
            text(schedule, "status"),
            text(schedule, "expression"),
            text(schedule, "time_zone"),
            text(schedule, "next_occurrence"),
            text(schedule, "occurrences"),
        ]);
    }
    table.render() + &next_page(answer)
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
