//! One batch of consumed records → one answer per record, through the
//! API's shared validation and write path (`belfry_api::ingest`), and the
//! records that answers and dead letters become.

use belfry_api::ingest::{self, TenantAllowList, V1Answer, Verdict};
use belfry_engine::EngineHandle;
use rdkafka::Message;
use rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage};

use crate::config::Format;

/// Headers a dead letter carries besides the original record's own.
pub mod header {
    /// Why the record was not stored (human-readable).
    pub const REASON: &str = "belfry-dlq-reason";
    /// A stable code: `invalid_json`, `empty_record`, `unknown_tenant`,
    /// `rejected` (BigBen validation), the `/v1` error codes,
    /// `quota_exceeded`, `payload_too_large`.
    pub const CODE: &str = "belfry-dlq-code";
    /// Where the record was read: topic, partition, offset.
    pub const TOPIC: &str = "belfry-dlq-topic";
    pub const PARTITION: &str = "belfry-dlq-partition";
    pub const OFFSET: &str = "belfry-dlq-offset";
}

/// How records are read and whom they may write for.
#[derive(Debug, Clone)]
pub(crate) struct Reader {
    pub(crate) format: Format,
    pub(crate) lapse_offset: std::time::Duration,
    pub(crate) scope: TenantAllowList,
}

/// The answer to one record.
#[derive(Debug, Clone)]
pub(crate) struct Answered {
    pub(crate) verdict: Verdict,
    /// The answer's JSON (BigBen `EventResponse` or `/v1` result).
    pub(crate) response: Vec<u8>,
}

impl Reader {
    /// Validates and stores `messages` in one durable batch, in their order.
    pub(crate) async fn answer(
        &self,
        engine: &EngineHandle,
        messages: &[OwnedMessage],
    ) -> Vec<Answered> {
        match self.format {
            Format::BigBen => self.bigben(engine, messages).await,
            Format::V1 => self.v1(engine, messages).await,
        }
    }

    async fn bigben(&self, engine: &EngineHandle, messages: &[OwnedMessage]) -> Vec<Answered> {
        let mut answers: Vec<Option<Answered>> = vec![None; messages.len()];
        let mut requests = Vec::with_capacity(messages.len());
        let mut slots = Vec::with_capacity(messages.len());
        for (slot, message) in messages.iter().enumerate() {
            let unreadable = |code: &str, message: String| {
                let response = ingest::bigben_unreadable(&message);
                Some(Answered {
                    verdict: Verdict::Rejected {
                        code: code.to_string(),
                        message,
                    },
                    response: to_json(&response),
                })
            };
            match message.payload() {
                None => {
                    answers[slot] = unreadable("empty_record", "the record has no value".into());
                }
                Some(bytes) => match ingest::parse_bigben(bytes) {
                    Ok(request) => {
                        requests.push(request);
                        slots.push(slot);
                    }
                    Err(error) => {
                        answers[slot] = unreadable(
                            "invalid_json",
                            format!("not a BigBen EventRequest: {error}"),
                        );
                    }
                },
            }
        }
        if !requests.is_empty() {
            let scheduled =
                ingest::schedule_bigben(engine, self.lapse_offset, &self.scope, requests).await;
            for (slot, answer) in slots.into_iter().zip(scheduled) {
                answers[slot] = Some(Answered {
                    verdict: answer.verdict,
                    response: to_json(&answer.response),
                });
            }
        }
        finish(answers)
    }

    async fn v1(&self, engine: &EngineHandle, messages: &[OwnedMessage]) -> Vec<Answered> {
        let mut answers: Vec<Option<Answered>> = vec![None; messages.len()];
        let mut records = Vec::with_capacity(messages.len());
        let mut slots = Vec::with_capacity(messages.len());
        for (slot, message) in messages.iter().enumerate() {
            let parsed = match message.payload() {
                None => Err(("empty_record", "the record has no value".to_string())),
                Some(bytes) => ingest::parse_v1(bytes)
                    .map_err(|e| ("invalid_json", format!("not a /v1 event: {e}"))),
            };
            match parsed {
                Ok(record) => {
                    records.push(record);
                    slots.push(slot);
                }
                Err((code, message)) => {
                    let answer = V1Answer::unreadable(&message);
                    answers[slot] = Some(Answered {
                        verdict: Verdict::Rejected {
                            code: code.to_string(),
                            message,
                        },
                        response: to_json(&answer.body),
                    });
                }
            }
        }
        if !records.is_empty() {
            let results = ingest::schedule_v1(engine, &self.scope, records).await;
            for (slot, answer) in slots.into_iter().zip(results) {
                answers[slot] = Some(Answered {
                    response: to_json(&answer.body),
                    verdict: answer.verdict,
                });
            }
        }
        finish(answers)
    }
}

/// Every slot is answered above; a missing one (a bug) is retried, never
/// taken for done.
fn finish(answers: Vec<Option<Answered>>) -> Vec<Answered> {
    answers
        .into_iter()
        .map(|answer| {
            answer.unwrap_or_else(|| {
                tracing::error!("a consumed record was left without an answer");
                Answered {
                    verdict: Verdict::StoreFailed,
                    response: Vec::new(),
                }
            })
        })
        .collect()
}

fn to_json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    // Serializing plain data structures cannot fail.
    serde_json::to_vec(value).unwrap_or_default()
}

/// A record to produce: an answer or a dead letter.
#[derive(Debug, Clone)]
pub(crate) struct Output {
    pub(crate) topic: String,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) payload: Option<Vec<u8>>,
    pub(crate) headers: Option<OwnedHeaders>,
    /// The partition the request was read from.
    pub(crate) source: (String, i32),
}

impl Output {
    /// The answer to `message`, keyed like it.
    pub(crate) fn response(topic: &str, message: &OwnedMessage, response: Vec<u8>) -> Output {
        Output {
            topic: topic.to_string(),
            key: message.key().map(<[u8]>::to_vec),
            payload: Some(response),
            headers: None,
            source: source(message),
        }
    }

    /// `message` itself (key, value, headers) with the reason it was not
    /// stored and where it was read.
    pub(crate) fn dead_letter(
        topic: &str,
        message: &OwnedMessage,
        code: &str,
        reason: &str,
    ) -> Output {
        let mut headers = OwnedHeaders::new();
        if let Some(original) = message.headers() {
            for h in original.iter() {
                headers = headers.insert(Header {
                    key: h.key,
                    value: h.value,
                });
            }
        }
        let partition = message.partition().to_string();
        let offset = message.offset().to_string();
        for (key, value) in [
            (header::REASON, reason),
            (header::CODE, code),
            (header::TOPIC, message.topic()),
            (header::PARTITION, partition.as_str()),
            (header::OFFSET, offset.as_str()),
        ] {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        Output {
            topic: topic.to_string(),
            key: message.key().map(<[u8]>::to_vec),
            payload: message.payload().map(<[u8]>::to_vec),
            headers: Some(headers),
            source: source(message),
        }
    }
}

pub(crate) fn source(message: &OwnedMessage) -> (String, i32) {
    (message.topic().to_string(), message.partition())
}
