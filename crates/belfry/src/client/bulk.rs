//! `belfry bulk …`: bulk actions through `/v1/bulk-actions` (cancel,
//! redrive, delete, pause or resume everything a filter matches, in the
//! background on the node).

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{Client, Connection, Failure, Fields, Table, next_page, query, segment, show, text};

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

    /// Events due at or after this instant (RFC 3339)
    #[arg(long, value_name = "INSTANT")]
    pub from: Option<String>,

    /// Events due before this instant (RFC 3339)
    #[arg(long, value_name = "INSTANT")]
    pub to: Option<String>,
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

    /// Actions per page (the node's default when left out)
    #[arg(long, value_name = "N")]
    pub limit: Option<u32>,

    /// Where the previous page ended (its `more: --cursor …` line)
    #[arg(long, value_name = "CURSOR")]
    pub cursor: Option<String>,
}

pub async fn execute(client: &Client, command: BulkCommand) -> Result<(), Failure> {
    match command {
        BulkCommand::Create(args) => {
            let mut filter = json!({ "tenant": args.tenant });
            for (field, value) in [
                ("status", args.status),
                ("from", args.from),
                ("to", args.to),
            ] {
                if let Some(value) = value {
                    filter[field] = Value::String(value);
                }
            }
            let body = json!({ "action": args.action, "filter": filter });
            let answer = client.post_json("/v1/bulk-actions", &body).await?;
            show(client, &answer, render_action);
        }
        BulkCommand::Get(action) => {
            let answer = client.get(&action_path(&action)?).await?;
            show(client, &answer, render_action);
        }
        BulkCommand::List(args) => {
            let path = format!(
                "/v1/bulk-actions{}",
                query(&[
                    ("tenant", args.tenant),
                    ("limit", args.limit.map(|n| n.to_string())),
                    ("cursor", args.cursor),
                ])
            );
            let answer = client.get(&path).await?;
            show(client, &answer, render_list);
        }
        BulkCommand::Cancel(action) => {
            let path = format!("{}/cancel", action_path(&action)?);
            let answer = client.post(&path).await?;
            show(client, &answer, render_action);
        }
    }
    Ok(())
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
    let actions = answer
        .get("bulk_actions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if actions.is_empty() {
        return "no bulk actions\n".into();
    }
    let mut table = Table::new(&[
        "ID",
        "ACTION",
        "STATE",
        "MATCHED",
        "SUCCEEDED",
        "SKIPPED",
        "FAILED",
        "CREATED AT",
        "FILTER",
    ]);
    for action in actions {
        table.row(vec![
            text(action, "id"),
            text(action, "action"),
            text(action, "state"),
            text(action, "matched"),
            text(action, "succeeded"),
            text(action, "skipped"),
            text(action, "failed"),
            text(action, "created_at"),
            filter_text(action),
        ]);
    }
    table.render() + &next_page(answer)
}
