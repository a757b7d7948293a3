//! `belfry cluster`: what the node last saw of the cluster (`GET
//! /v1/cluster`): the leader and its term, each node and its partitions.

use std::fmt::Write as _;

use clap::Args;
use serde_json::Value;

use super::{Client, Connection, Failure, Fields, Table, items, show, text};

#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub connection: Connection,
}

pub async fn execute(client: &Client) -> Result<(), Failure> {
    show(client, client.get("/v1/cluster").await, render)
}

fn render(status: &Value) -> String {
    let leader = status.get("leader").unwrap_or(&Value::Null);
    let mut fields = Fields::default();
    fields.add("mode", text(status, "mode"));
    fields.add("leader", text(leader, "node"));
    fields.add("leader address", text(leader, "address"));
    fields.add("term", text(leader, "term"));
    let mut out = fields.render();
    out.push('\n');

    let mut table = Table::new(&[
        "NODE",
        "ADDRESS",
        "ROLE",
        "HEARTBEAT AGE MS",
        "PARTITIONS",
        "OWNED",
    ]);
    let nodes = items(status, "nodes");
    for node in nodes {
        let partitions = partition_numbers(node.get("partitions"));
        table.row(vec![
            text(node, "id"),
            text(node, "address"),
            text(node, "role"),
            text(node, "heartbeat_age_ms"),
            partitions.len().to_string(),
            ranges(&partitions),
        ]);
    }
    out.push_str(&table.render());

    let unowned = partition_numbers(status.get("unowned"));
    if !unowned.is_empty() {
        let _ = writeln!(
            out,
            "\nunowned: {} partitions: {}",
            unowned.len(),
            ranges(&unowned)
        );
    }
    let moving: Vec<String> = nodes
        .iter()
        .flat_map(|node| {
            let from = text(node, "id");
            node.get("partitions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|p| p.get("moving_to").is_some_and(Value::is_string))
                .map(move |p| {
                    format!(
                        "partition {} {from} -> {}",
                        text(p, "partition"),
                        text(p, "moving_to")
                    )
                })
        })
        .collect();
    for line in moving {
        let _ = writeln!(out, "moving: {line}");
    }
    out
}

fn partition_numbers(partitions: Option<&Value>) -> Vec<u64> {
    let mut numbers: Vec<u64> = partitions
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("partition").and_then(Value::as_u64))
        .collect();
    numbers.sort_unstable();
    numbers
}

/// `0-31,40,42-43`: a node's share on one line, however many it owns.
fn ranges(numbers: &[u64]) -> String {
    let mut out = Vec::new();
    let mut iter = numbers.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while end
            .checked_add(1)
            .is_some_and(|next| iter.peek() == Some(&next))
        {
            end += 1;
            iter.next();
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    if out.is_empty() {
        "-".into()
    } else {
        out.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::ranges;

    #[test]
    fn partitions_are_shown_as_ranges() {
        assert_eq!(ranges(&[]), "-");
        assert_eq!(ranges(&[0, 1, 2, 3, 7, 9, 10]), "0-3,7,9-10");
        assert_eq!(ranges(&[u64::MAX]), u64::MAX.to_string());
    }
}
