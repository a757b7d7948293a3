//! The configuration reference: a Markdown table of every key, rendered
//! from the option structs' doc comments ([`ConfigKeys`]) and defaults.
//! README.md's table and the tables of `docs/kafka.md` are this output;
//! tests fail when they differ.

use belfry_core::config::{ConfigKeys, KeyDoc};
use serde::Serialize;
use serde_json::Value;

use crate::config::{Config, FLAGS};

/// Every key of the node: key, flag and environment variable, default,
/// meaning (`belfry config reference`).
pub fn node_table() -> String {
    let defaults = defaults_of(&Config::default());
    let mut table = String::from("| key | flag / env | default | meaning |\n|---|---|---|---|\n");
    for doc in Config::config_keys() {
        let mut setters: Vec<String> = FLAGS
            .iter()
            .filter(|(key, _)| *key == doc.key)
            .map(|(_, flag)| format!("`{flag}`"))
            .collect();
        setters.push(env_of(&doc));
        table.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            doc.key,
            setters.join(", "),
            default_of(&doc, &defaults),
            cell(doc.doc)
        ));
    }
    table
}

/// The keys of one section, relative to it: key, default, meaning (the
/// tables of `docs/kafka.md`).
#[cfg(test)]
pub fn section_table<T: ConfigKeys + Serialize>(defaults: &T) -> String {
    let defaults = defaults_of(defaults);
    let mut table = String::from("| key | default | meaning |\n|---|---|---|\n");
    for doc in T::config_keys() {
        table.push_str(&format!(
            "| `{}` | {} | {} |\n",
            doc.key,
            default_of(&doc, &defaults),
            cell(doc.doc)
        ));
    }
    table
}

fn defaults_of(defaults: &impl Serialize) -> Value {
    serde_json::to_value(defaults).expect("the defaults serialize")
}

/// `BELFRY_` and the key, upper case, `__` between sections.
fn env_of(doc: &KeyDoc) -> String {
    if doc.toml_only {
        return "(TOML)".to_string();
    }
    format!(
        "`{}{}`",
        crate::config::ENV_PREFIX,
        doc.key
            .to_ascii_uppercase()
            .replace('.', crate::config::ENV_SPLIT)
    )
}

fn default_of(doc: &KeyDoc, defaults: &Value) -> String {
    if let Some(shown) = doc.default {
        return shown.to_string();
    }
    match lookup(defaults, &doc.key) {
        None | Some(Value::Null) => "none".to_string(),
        Some(Value::String(text)) => format!("`{text}`"),
        Some(value) => format!("`{value}`"),
    }
}

/// The value at the dotted `key`; `None` inside a table of sections
/// (`limits.tenants."NAME"`), which has no default entries.
fn lookup<'a>(defaults: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.')
        .try_fold(defaults, |value, part| value.get(part))
}

/// One table cell: a `|` would end it.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::PathBuf;

    use clap::CommandFactory;

    use super::*;

    /// Checks that the Markdown table after `heading` in `path` (from the
    /// repository's root) is `expected`. `BELFRY_TEST_UPDATE_DOCS=1`
    /// rewrites it instead.
    fn check_table(path: &str, heading: &str, expected: &str) {
        let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(path);
        let text = std::fs::read_to_string(&file).unwrap();
        let after = text
            .find(&format!("\n{heading}\n"))
            .unwrap_or_else(|| panic!("{path} has no heading {heading:?}"));
        let start = after
            + text[after..]
                .find("\n|")
                .unwrap_or_else(|| panic!("{path} has no table after {heading:?}"))
            + 1;
        let end = text[start..]
            .find("\n\n")
            .map_or(text.len(), |offset| start + offset + 1);
        if &text[start..end] == expected {
            return;
        }
        if std::env::var_os("BELFRY_TEST_UPDATE_DOCS").is_some() {
            let updated = format!("{}{expected}{}", &text[..start], &text[end..]);
            std::fs::write(&file, updated).unwrap();
            return;
        }
        panic!(
            "{path}: the table under {heading:?} is not the reference rendered from the option \
             structs' doc comments. Change the doc comments, not the table; replace the table \
             with (or run this test with BELFRY_TEST_UPDATE_DOCS=1):\n\n{expected}"
        );
    }

    #[test]
    fn the_readme_table_is_the_reference() {
        check_table("README.md", "## Configuration", &node_table());
    }

    #[test]
    fn the_kafka_sink_table_is_the_reference() {
        check_table(
            "docs/kafka.md",
            "### Node settings (`sinks.kafka`)",
            &section_table(&belfry_sinks::kafka::KafkaSinkOptions::default()),
        );
    }

    #[cfg(feature = "kafka")]
    #[test]
    fn the_kafka_ingest_table_is_the_reference() {
        check_table(
            "docs/kafka.md",
            "### Configuration",
            &section_table(&belfry_kafka_ingest::IngestOptions::default()),
        );
    }

    /// The derived keys are the keys the loader reads: every leaf of the
    /// serialized defaults (a table of sections counts as one) is listed
    /// once, and nothing else is.
    #[test]
    fn the_reference_lists_every_key_once() {
        let docs = Config::config_keys();
        let listed: Vec<String> = docs
            .iter()
            .map(|doc| match doc.key.split_once(".\"NAME\"") {
                Some((table, _)) => table.to_string(),
                None => doc.key.clone(),
            })
            .collect();
        let mut leaves = BTreeSet::new();
        collect_leaves(&defaults_of(&Config::default()), String::new(), &mut leaves);
        assert_eq!(listed.iter().cloned().collect::<BTreeSet<_>>(), leaves);
        let unique: BTreeSet<&String> = docs.iter().map(|doc| &doc.key).collect();
        assert_eq!(unique.len(), docs.len(), "a key is listed twice");
    }

    fn collect_leaves(value: &Value, key: String, leaves: &mut BTreeSet<String>) {
        match value {
            Value::Object(fields) if !fields.is_empty() => {
                for (name, field) in fields {
                    let nested = if key.is_empty() {
                        name.clone()
                    } else {
                        format!("{key}.{name}")
                    };
                    collect_leaves(field, nested, leaves);
                }
            }
            _ => {
                leaves.insert(key);
            }
        }
    }

    #[test]
    fn every_flag_is_a_serve_flag_of_a_listed_key() {
        let cli = crate::cli::Cli::command();
        let serve = cli.find_subcommand("serve").unwrap();
        let keys: BTreeSet<String> = Config::config_keys().into_iter().map(|d| d.key).collect();
        for (key, flag) in FLAGS {
            assert!(keys.contains(*key), "{key}");
            let long = flag.trim_start_matches("--");
            assert!(
                serve
                    .get_arguments()
                    .any(|arg| arg.get_long() == Some(long)),
                "{flag}"
            );
        }
    }

    #[test]
    fn cells_show_defaults_env_and_flags() {
        let table = node_table();
        for row in [
            "| `listen` | `--listen`, `BELFRY_LISTEN` | `127.0.0.1:8080` |",
            "| `engine.retry.multiplier` | `BELFRY_ENGINE__RETRY__MULTIPLIER` | `2.0` |",
            "| `http.connect_timeout_ms` | `BELFRY_HTTP__CONNECT_TIMEOUT_MS` | `2000` |",
            "| `limits.tenants.\"NAME\".max_deliveries_per_second` | (TOML) | none |",
            "| `advertise` | `--advertise`, `BELFRY_ADVERTISE` | the listen address |",
        ] {
            assert!(table.contains(row), "{row} missing in:\n{table}");
        }
    }
}
