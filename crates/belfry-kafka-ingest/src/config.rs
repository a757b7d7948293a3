//! `[kafka.ingest]`: where requests come from, where answers and bad
//! records go, and the consumer's settings. Each field's doc comment is the
//! user reference (`docs/kafka.md`'s table is rendered from it).

use std::collections::BTreeMap;
use std::time::Duration;

use belfry_core::config::{ConfigKeys, Problems};
use serde::{Deserialize, Serialize};

/// What one record holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// A BigBen `EventRequest` (`mode` `UPSERT` or `REMOVE`), validated
    /// exactly as `POST /events/schedule` validates one item.
    #[default]
    BigBen,
    /// A `/v1` event: the body of `PUT /v1/tenants/{t}/events/{id}` plus
    /// `tenant` and `id`, or `{"tenant", "id", "cancel": true}`.
    V1,
}

/// `[kafka.ingest]`. Present: this node consumes requests from `topics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct IngestOptions {
    /// `host:port,...` of the Kafka cluster. Required.
    #[config(default = "required")]
    pub bootstrap_servers: String,
    /// Topics the requests are read from. Required.
    #[config(default = "required")]
    pub topics: Vec<String>,
    /// The consumer group. Every node of a cluster uses the same group, so
    /// each partition of the topics is read by one node at a time.
    pub group_id: String,
    /// What one record holds: `bigben` (a BigBen `EventRequest`) or `v1` (a
    /// `/v1` event with `tenant` and `id`).
    pub format: Format,
    /// Where the answer to each record goes (BigBen `EventResponse`, or the
    /// `/v1` result), keyed like the request. None: no answers.
    pub response_topic: Option<String>,
    /// Where records that can never be stored go (not JSON, invalid fields,
    /// unknown or not allowed tenant, over a quota), with the reason in
    /// their headers. Required: a bad record is never dropped silently.
    #[config(default = "required")]
    pub dead_letter_topic: String,
    /// Tenants records may schedule for. Required: the tenants' names, or
    /// `["*"]` for every registered tenant (whoever may write the topics
    /// may then schedule for all of them; `*` cannot be combined with
    /// names). Records for other tenants are dead-lettered as
    /// `unknown_tenant`.
    #[config(default = "required")]
    pub allowed_tenants: Vec<String>,
    /// Most records stored in one durable batch.
    pub max_batch: usize,
    /// How long a batch waits for more records after its first one. `0`:
    /// take only what has arrived.
    #[serde(with = "belfry_core::time::serde_millis", rename = "batch_linger_ms")]
    pub batch_linger: Duration,
    /// How often stored offsets (those of records already written to the
    /// store) are committed to Kafka in the background. A crash re-reads at
    /// most about this much.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "commit_interval_ms"
    )]
    pub commit_interval: Duration,
    /// First wait before a batch is tried again after the store (or the
    /// answer/dead-letter producer) failed; doubles up to 5 s.
    #[serde(with = "belfry_core::time::serde_millis", rename = "retry_backoff_ms")]
    pub retry_backoff: Duration,
    /// More librdkafka consumer settings (e.g. `security.protocol`,
    /// `session.timeout.ms`, `auto.offset.reset`). The settings the
    /// guarantees rest on cannot be changed here (listed below).
    pub consumer: BTreeMap<String, String>,
    /// More librdkafka settings of the producer of answers and dead
    /// letters (e.g. `security.protocol`, `linger.ms`). It is idempotent
    /// with `acks=all`; those cannot be changed (listed below).
    pub producer: BTreeMap<String, String>,
}

/// Consumer settings Belfry owns: offsets are stored by Belfry after the
/// write, committed every `commit_interval_ms`.
pub const RESERVED_CONSUMER: &[&str] = &[
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.commit.interval.ms",
    "enable.partition.eof",
];

/// Producer settings Belfry owns.
pub const RESERVED_PRODUCER: &[&str] = &[
    "bootstrap.servers",
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "transactional.id",
];

impl Default for IngestOptions {
    fn default() -> Self {
        IngestOptions {
            bootstrap_servers: String::new(),
            topics: Vec::new(),
            group_id: "belfry-ingest".to_string(),
            format: Format::default(),
            response_topic: None,
            dead_letter_topic: String::new(),
            allowed_tenants: Vec::new(),
            max_batch: 2_000,
            batch_linger: Duration::from_millis(5),
            commit_interval: Duration::from_secs(1),
            retry_backoff: Duration::from_millis(200),
            consumer: BTreeMap::new(),
            producer: BTreeMap::new(),
        }
    }
}

impl IngestOptions {
    /// Refuses a section that cannot run, naming each problem's key.
    pub fn validate(&self, problems: &mut Problems) {
        if self.bootstrap_servers.trim().is_empty() {
            problems.push(format!("{} is required", problems.key("bootstrap_servers")));
        }
        if self.topics.is_empty() || self.topics.iter().any(|t| t.trim().is_empty()) {
            problems.push(format!(
                "{} must name at least one topic, and no empty one",
                problems.key("topics")
            ));
        }
        if self.group_id.trim().is_empty() {
            problems.push(format!("{} must not be empty", problems.key("group_id")));
        }
        if self.dead_letter_topic.trim().is_empty() {
            problems.push(format!(
                "{} is required: records that can never be stored go there (nothing is \
                 dropped silently)",
                problems.key("dead_letter_topic")
            ));
        }
        if self
            .response_topic
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            problems.push(format!(
                "{} must not be empty (leave it out for no answers)",
                problems.key("response_topic")
            ));
        }
        for (name, output) in [
            ("dead_letter_topic", Some(&self.dead_letter_topic)),
            ("response_topic", self.response_topic.as_ref()),
        ] {
            if let Some(topic) = output
                && self.topics.contains(topic)
            {
                problems.push(format!(
                    "{} ({topic:?}) must not be one of {} (Belfry would read its own output)",
                    problems.key(name),
                    problems.key("topics")
                ));
            }
        }
        if let Err(error) = belfry_api::ingest::TenantAllowList::new(&self.allowed_tenants) {
            problems.push(format!("{}: {error}", problems.key("allowed_tenants")));
        }
        problems.at_least_one("max_batch", self.max_batch);
        problems.at_least_one("commit_interval_ms", self.commit_interval);
        problems.at_least_one("retry_backoff_ms", self.retry_backoff);
        for (section, settings, reserved) in [
            ("consumer", &self.consumer, RESERVED_CONSUMER),
            ("producer", &self.producer, RESERVED_PRODUCER),
        ] {
            for name in settings.keys() {
                if reserved.contains(&name.as_str()) {
                    problems.push(format!(
                        "{}.\"{name}\" is set by Belfry and cannot be changed",
                        problems.key(section)
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(options: &IngestOptions) -> Vec<String> {
        Problems::check("kafka.ingest", |problems| options.validate(problems))
            .err()
            .map(|error| error.problems().to_vec())
            .unwrap_or_default()
    }

    fn valid() -> IngestOptions {
        IngestOptions {
            bootstrap_servers: "127.0.0.1:9092".into(),
            topics: vec!["requests".into()],
            dead_letter_topic: "requests-dlq".into(),
            allowed_tenants: vec!["acme".into()],
            ..IngestOptions::default()
        }
    }

    #[test]
    fn a_complete_section_is_valid() {
        assert_eq!(problems(&valid()), Vec::<String>::new());
        let every = IngestOptions {
            allowed_tenants: vec!["*".into()],
            ..valid()
        };
        assert_eq!(problems(&every), Vec::<String>::new());
    }

    #[test]
    fn allowed_tenants_must_say_whom_it_allows() {
        for (allowed, needle) in [
            (vec![], "must list the tenants"),
            (
                vec!["*".to_string(), "acme".to_string()],
                "cannot be combined",
            ),
        ] {
            let options = IngestOptions {
                allowed_tenants: allowed,
                ..valid()
            };
            let problems = problems(&options).join("\n");
            assert!(
                problems.contains("kafka.ingest.allowed_tenants") && problems.contains(needle),
                "{problems}"
            );
        }
    }

    #[test]
    fn every_problem_names_its_key() {
        let options = IngestOptions {
            bootstrap_servers: " ".into(),
            topics: vec!["requests".into()],
            group_id: String::new(),
            response_topic: Some("requests".into()),
            dead_letter_topic: String::new(),
            allowed_tenants: vec![String::new()],
            max_batch: 0,
            commit_interval: Duration::ZERO,
            consumer: [("enable.auto.commit".to_string(), "false".to_string())].into(),
            producer: [("acks".to_string(), "1".to_string())].into(),
            ..IngestOptions::default()
        };
        let problems = problems(&options).join("\n");
        for needle in [
            "kafka.ingest.bootstrap_servers is required",
            "kafka.ingest.group_id",
            "kafka.ingest.dead_letter_topic is required",
            "kafka.ingest.response_topic (\"requests\") must not be one of kafka.ingest.topics",
            "kafka.ingest.allowed_tenants",
            "kafka.ingest.max_batch",
            "kafka.ingest.commit_interval_ms",
            "kafka.ingest.consumer.\"enable.auto.commit\" is set by Belfry",
            "kafka.ingest.producer.\"acks\" is set by Belfry",
        ] {
            assert!(
                problems.contains(needle),
                "{needle} missing in:\n{problems}"
            );
        }
    }

    #[test]
    fn reads_toml_names_and_refuses_unknown_keys() {
        let options: IngestOptions = serde_json::from_value(serde_json::json!({
            "bootstrap_servers": "b:9092", "topics": ["t"], "dead_letter_topic": "d",
            "format": "v1", "batch_linger_ms": 0, "commit_interval_ms": 250,
        }))
        .unwrap();
        assert_eq!(options.format, Format::V1);
        assert_eq!(options.commit_interval, Duration::from_millis(250));
        assert!(options.batch_linger.is_zero());
        let unknown = serde_json::from_value::<IngestOptions>(serde_json::json!({ "topic": "t" }));
        assert!(unknown.is_err());
        let format =
            serde_json::from_value::<IngestOptions>(serde_json::json!({ "format": "xml" }));
        assert!(format.is_err());
    }
}
