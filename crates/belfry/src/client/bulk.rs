//! `belfry bulk …`: bulk actions through `/v1/bulk-actions` (cancel,
//! redrive, delete, pause or resume everything a filter matches, in the
//! background on the node).

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{
    Client, Connection, DueRange, Failure, Fields, Paging, cells, column, query, render_items,
    segment, show, text,
};

#[derive(Debug, Args)]
pub struct BulkArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    pub command: BulkCommand,
}

#[derive(Debug, Subcommand)]
pub enum BulkCommand {
    /// Start a bulk action over one tenant's events (cancel, redrive, delete) or
    /// schedules (pause, resume); it runs on the node, follow it with
    /// `bulk get`.
    Create(CreateArgs),
    /// Show a bulk action and its progress.
    Get(ActionRef),
    /// List bulk actions, newest first.
    List(ListArgs),
    /// Stop a running bulk action after the page in progress.
    Cancel(ActionRef),
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The tenant whose events or schedules it acts on
    #[arg(long, value_name = "TENANT")]
    pub tenant: String,

    /// cancel, redrive, delete (events), pause or resume (schedules)
    #[arg(long, value_name = "ACTION")]
    pub action: String,

    /// Only items in this status: an event's (scheduled, retrying, failed,
    /// missed; delivered, failed, missed or cancelled for delete, which
    /// requires one) or a schedule's (active, paused)
    #[arg(long, value_name = "STATUS")]
    pub status: Option<String>,

    #[command(flatten)]
    pub due: DueRange,
}

#[derive(Debug, Args)]
pub struct ActionRef {
    /// The bulk action's id (bulk_…)
    pub id: String,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this tenant's (a tenant key lists its own)
    #[arg(long, value_name = "TENANT")]
    pub tenant: Option<String>,

    #[command(flatten)]
    pub paging: Paging,
}

pub async fn execute(client: &Client, command: BulkCommand) -> Result<(), Failure> {
    match command {
        BulkCommand::Create(args) => {
            let mut filter = json!({ "tenant": args.tenant });
            let status = [("status", args.status)];
            for (field, value) in status.into_iter().chain(args.due.pairs()) {
                if let Some(value) = value {
                    filter[field] = Value::String(value);
                }
            }
            let body = json!({ "action": args.action, "filter": filter });
            let answer = client.post_json("/v1/bulk-actions", &body).await;
            show(client, answer, render_action)
        }
        BulkCommand::Get(action) => show(
            client,
            client.get(&action_path(&action)?).await,
            render_action,
        ),
        BulkCommand::List(args) => {
            let tenant = [("tenant", args.tenant)];
            let path = format!(
                "/v1/bulk-actions{}",
                query(&[tenant.as_slice(), &args.paging.pairs()].concat())
            );
            show(client, client.get(&path).await, render_list)
        }
        BulkCommand::Cancel(action) => {
            let path = format!("{}/cancel", action_path(&action)?);
            show(client, client.post(&path).await, render_action)
        }
    }
}

fn action_path(action: &ActionRef) -> Result<String, Failure> {
    Ok(format!(
        "/v1/bulk-actions/{}",
        segment("bulk action id", &action.id)?
    ))
}

/// `tenant status=failed from=… to=…`: the filter on one line.
fn filter_text(action: &Value) -> String {
    let filter = action.get("filter").cloned().unwrap_or(Value::Null);
    let mut parts = vec![text(&filter, "tenant")];
    for field in ["status", "from", "to"] {
        if filter.get(field).is_some_and(|v| !v.is_null()) {
            parts.push(format!("{field}={}", text(&filter, field)));
        }
    }
    parts.join(" ")
}

fn render_action(action: &Value) -> String {
    let mut fields = Fields::from(action, &["id", "action"]);
    fields.add("filter", filter_text(action));
    for name in [
        "state",
        "matched",
        "succeeded",
        "skipped",
        "failed",
        "error",
        "created_by",
        "created_at",
        "updated_at",
        "finished_at",
    ] {
        fields.add(name, text(action, name));
    }
    fields.render()
}

fn render_list(answer: &Value) -> String {
    let fields = [
        "id",
        "action",
        "state",
        "matched",
        "succeeded",
        "skipped",
        "failed",
        "created_at",
    ];
    let mut header: Vec<String> = fields.iter().map(|f| column(f)).collect();
    header.push("FILTER".into());
    render_items(
        answer,
        "bulk_actions",
        "no bulk actions",
        &header,
        |action| {
            let mut row = cells(action, &fields);
            row.push(filter_text(action));
            row
        },
    )
}
