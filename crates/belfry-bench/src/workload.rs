//! The events of a run and their pre-serialized request bodies.
//!
//! Event `n` has the client id `e<n>` and a due instant computed up front,
//! so the receiver can check each delivery against what was asked for
//! without any lookup table beyond one `Vec<i64>`.

use std::fmt::Write as _;

use bytes::Bytes;

/// Every event of a run: its due instant, by index.
#[derive(Debug, Clone)]
pub struct Workload {
    pub tenant: String,
    /// `due_ms[n]`: when event `e<n>` is due, in ms since the UNIX epoch.
    pub due_ms: Vec<i64>,
    pub payload_bytes: usize,
}

impl Workload {
    /// `count` events, due uniformly over `[first_due_ms, first_due_ms +
    /// spread_ms)` in id order.
    pub fn uniform(
        tenant: &str,
        count: usize,
        first_due_ms: i64,
        spread_ms: u64,
        payload_bytes: usize,
    ) -> Self {
        let spread = spread_ms as f64;
        let due_ms = (0..count)
            .map(|n| first_due_ms + (n as f64 * spread / count.max(1) as f64) as i64)
            .collect();
        Workload {
            tenant: tenant.to_string(),
            due_ms,
            payload_bytes,
        }
    }

    pub fn len(&self) -> usize {
        self.due_ms.len()
    }

    /// The event index of a client id `e<n>` of this workload.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        let n: usize = id.strip_prefix('e')?.parse().ok()?;
        (n < self.len()).then_some(n)
    }

    /// Request bodies of `batch` events each (the last may be shorter), in
    /// due order, with how many events each carries. Built before the clock
    /// starts so the generator spends its CPU on sending only.
    pub fn request_bodies(&self, batch: usize) -> Vec<(Bytes, usize)> {
        let batch = batch.max(1);
        let writer = BodyWriter::new(&self.tenant, self.payload_bytes);
        self.due_ms
            .chunks(batch)
            .enumerate()
            .map(|(chunk, dues)| {
                let events = dues
                    .iter()
                    .enumerate()
                    .map(|(o, &due)| (chunk * batch + o, due));
                (writer.body("e", events), dues.len())
            })
            .collect()
    }

    /// [`Workload::request_bodies`] as `POST /v1/tenants/{t}/events`
    /// batches, each event with its own delivery policy (`--policy`).
    pub fn v1_request_bodies(&self, batch: usize) -> Vec<(Bytes, usize)> {
        let payload = "x".repeat(self.payload_bytes);
        self.due_ms
            .chunks(batch.max(1))
            .enumerate()
            .map(|(chunk, dues)| {
                let mut body = String::with_capacity(dues.len() * (220 + payload.len()) + 16);
                body.push_str(r#"{"events":["#);
                for (offset, &due) in dues.iter().enumerate() {
                    if offset > 0 {
                        body.push(',');
                    }
                    let id = chunk * batch.max(1) + offset;
                    // Writing into a String cannot fail.
                    let _ = write!(
                        body,
                        r#"{{"id":"e{id}","deliver_at":"{}.{:03}Z","payload":"{payload}","max_attempts":10,"backoff":{{"initial_delay_ms":500,"multiplier":2.0,"max_delay_ms":30000}},"max_age_ms":600000}}"#,
                        rfc3339_second(due.div_euclid(1000)),
                        due.rem_euclid(1000),
                    );
                }
                body.push_str("]}");
                (Bytes::from(body), dues.len())
            })
            .collect()
    }
}

/// Writes `POST /events/schedule` bodies for one tenant, for workloads
/// built up front ([`Workload::request_bodies`]) or request by request
/// (the `mixed` ingest stream and the `hung` tenants' millions).
#[derive(Debug, Clone)]
pub struct BodyWriter {
    /// The tenant as a JSON string, quotes included.
    tenant_json: String,
    /// A JSON string's content of 'x' characters: no escaping needed.
    payload: String,
}

impl BodyWriter {
    pub fn new(tenant: &str, payload_bytes: usize) -> Self {
        BodyWriter {
            tenant_json: serde_json::to_string(tenant).unwrap_or_else(|_| "\"bench\"".into()),
            payload: "x".repeat(payload_bytes),
        }
    }

    /// One request body: events `(n, due_ms)` with client ids
    /// `<prefix><n>`.
    pub fn body(&self, prefix: &str, events: impl Iterator<Item = (usize, i64)>) -> Bytes {
        let (lower, _) = events.size_hint();
        let mut body = String::with_capacity(lower.max(1) * (90 + self.payload.len()) + 2);
        body.push('[');
        let mut last_second = i64::MIN;
        let mut second_text = String::new();
        for (offset, (id, due)) in events.enumerate() {
            if offset > 0 {
                body.push(',');
            }
            // Formatting the date is the costly part: reuse it within a
            // second.
            let second = due.div_euclid(1000);
            if second != last_second {
                last_second = second;
                second_text = rfc3339_second(second);
            }
            // Writing into a String cannot fail.
            let _ = write!(
                body,
                r#"{{"id":"{prefix}{id}","tenant":{},"eventTime":"{second_text}.{:03}Z","payload":"{}"}}"#,
                self.tenant_json,
                due.rem_euclid(1000),
                self.payload
            );
        }
        body.push(']');
        Bytes::from(body)
    }
}

impl BodyWriter {
    /// One BigBen `EventRequest` (`mode` `UPSERT`) on its own, as a Kafka
    /// ingest record carries it: event `<prefix><id>` due at `due_ms`.
    pub fn request(&self, prefix: &str, id: usize, due_ms: i64) -> String {
        format!(
            r#"{{"id":"{prefix}{id}","tenant":{},"eventTime":"{}.{:03}Z","payload":"{}","mode":"UPSERT"}}"#,
            self.tenant_json,
            rfc3339_second(due_ms.div_euclid(1000)),
            due_ms.rem_euclid(1000),
            self.payload
        )
    }
}

/// `2030-01-31T04:00:30` (UTC, no fraction, no zone) for a second since
/// the epoch.
fn rfc3339_second(second: i64) -> String {
    match jiff::Timestamp::from_second(second) {
        Ok(ts) => ts.strftime("%Y-%m-%dT%H:%M:%S").to_string(),
        // Out of jiff's range (year ±9999): not a date anyone schedules.
        Err(_) => "9999-12-31T23:59:59".to_string(),
    }
}

/// The current wall-clock time in ms since the UNIX epoch.
pub fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

/// The wall-clock ms `ms` from now.
pub fn ms_from_now(ms: u64) -> i64 {
    now_ms() + i64::try_from(ms).unwrap_or(i64::MAX)
}

/// Parses a scheduled instant sent by a node or a peer: integer
/// milliseconds since the epoch, or RFC 3339 with an offset.
pub fn parse_instant_ms(text: &str) -> Option<i64> {
    let text = text.trim();
    if let Ok(ms) = text.parse::<i64>() {
        return Some(ms);
    }
    if let Ok(seconds) = text.parse::<f64>() {
        // A float is taken as seconds since the epoch (Python's time.time()).
        return Some((seconds * 1000.0).round() as i64);
    }
    text.parse::<jiff::Timestamp>()
        .ok()
        .map(|ts| ts.as_millisecond())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_valid_bigben_batches_in_due_order() {
        let workload = Workload::uniform("t/a", 5, 1_900_000_000_123, 1000, 3);
        let bodies = workload.request_bodies(2);
        assert_eq!(
            bodies.iter().map(|(_, n)| *n).collect::<Vec<_>>(),
            [2, 2, 1]
        );
        let second: serde_json::Value = serde_json::from_slice(&bodies[1].0).unwrap();
        assert_eq!(second[0]["id"], "e2");
        assert_eq!(second[0]["tenant"], "t/a");
        assert_eq!(second[0]["payload"], "xxx");
        let when = second[0]["eventTime"].as_str().unwrap();
        assert_eq!(parse_instant_ms(when), Some(workload.due_ms[2]));
        assert_eq!(workload.due_ms[2], 1_900_000_000_123 + 400);
        assert_eq!(workload.index_of("e4"), Some(4));
        assert_eq!(workload.index_of("e5"), None);
        assert_eq!(workload.index_of("x1"), None);
    }

    #[test]
    fn a_single_request_is_a_bigben_upsert() {
        let writer = BodyWriter::new("t/a", 2);
        let request: serde_json::Value =
            serde_json::from_str(&writer.request("e", 7, 1_900_000_000_123)).unwrap();
        assert_eq!(request["id"], "e7");
        assert_eq!(request["tenant"], "t/a");
        assert_eq!(request["mode"], "UPSERT");
        assert_eq!(request["payload"], "xx");
        let when = request["eventTime"].as_str().unwrap();
        assert_eq!(parse_instant_ms(when), Some(1_900_000_000_123));
    }

    #[test]
    fn instants_parse_in_every_form_a_peer_sends() {
        assert_eq!(parse_instant_ms("1700000000123"), Some(1_700_000_000_123));
        assert_eq!(parse_instant_ms("1700000000.5"), Some(1_700_000_000_500));
        assert_eq!(
            parse_instant_ms("2023-11-14T22:13:20.123Z"),
            Some(1_700_000_000_123)
        );
        assert_eq!(
            parse_instant_ms("2023-11-14T23:13:20.123+01:00"),
            Some(1_700_000_000_123)
        );
        assert_eq!(parse_instant_ms("soon"), None);
    }
}
