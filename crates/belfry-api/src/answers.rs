//! What large answers may take of the node's memory.
//!
//! A listing of 1,000 events of 256 KiB is a quarter of a gigabyte; a
//! client that reads it slowly keeps it in memory for as long as it reads,
//! and many such clients would take the node. So:
//!
//! - one answer holds at most [`ApiOptions::max_answer_bytes`] of items
//!   (always at least one, so paging makes progress; an item is bounded by
//!   the payload limit): a listing stops early and answers its
//!   continuation cursor as usual; a pull claim grants events until their
//!   payloads would pass it (the worker claims again for the rest);
//! - the node holds at most [`ApiOptions::max_answer_bytes_in_flight`] of
//!   such answers at once, from before their store reads until their last
//!   byte is handed to the connection. A request that finds the budget
//!   spent waits up to [`BUSY_WAIT`], then gets `503 answers_busy` with
//!   `Retry-After`. A claim's answer takes room when there is some but is
//!   never held back: its leases are granted already (and a claim may
//!   long-poll for 30 s, too long to hold room while it waits);
//! - the connection's write timeout (`server.write_timeout_ms`) bounds how
//!   long a client that stops reading keeps its answer.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{ApiError, Code, V1Error};
use crate::options::ApiOptions;

/// How long a request waits for room in the node's answer budget.
pub const BUSY_WAIT: Duration = Duration::from_secs(2);
/// Bytes handed to the connection per frame: the connection's buffer takes
/// a few of these, not the whole answer at once.
const FRAME_BYTES: usize = 64 * 1024;
/// Permits count KiB (a semaphore holds at most `usize::MAX >> 3`
/// permits, and KiB are fine enough).
const UNIT: usize = 1024;

/// The node's budget of answer bytes in flight; cheap to clone.
#[derive(Debug, Clone)]
pub struct AnswerBudget {
    permits: Arc<Semaphore>,
    /// Bytes one answer reserves before it is built.
    per_answer: usize,
    /// The whole budget, in permits.
    total_units: usize,
}

/// Room in the budget for one answer being built; shrunk to the answer's
/// size when it is built, released when its body is done or dropped.
#[derive(Debug)]
pub struct Reservation {
    permit: OwnedSemaphorePermit,
}

impl AnswerBudget {
    pub fn new(options: &ApiOptions) -> AnswerBudget {
        let total_units = options.max_answer_bytes_in_flight.div_ceil(UNIT).max(1);
        AnswerBudget {
            permits: Arc::new(Semaphore::new(total_units)),
            per_answer: options.max_answer_bytes.max(1),
            total_units,
        }
    }

    /// Bytes of items one answer may hold.
    pub fn per_answer(&self) -> usize {
        self.per_answer
    }

    /// Reserves room for one answer of up to [`Self::per_answer`] bytes.
    ///
    /// # Errors
    /// The budget stayed spent for [`BUSY_WAIT`]: `503 answers_busy`, in
    /// the `/v1` envelope, with `Retry-After`.
    pub async fn reserve(&self) -> Result<Reservation, Response> {
        let units = self.per_answer.div_ceil(UNIT).min(self.total_units);
        let units = u32::try_from(units).unwrap_or(u32::MAX);
        match tokio::time::timeout(BUSY_WAIT, self.permits.clone().acquire_many_owned(units)).await
        {
            Ok(Ok(permit)) => Ok(Reservation { permit }),
            // The semaphore is never closed; a timeout is the busy case.
            Ok(Err(_)) | Err(_) => Err(busy()),
        }
    }

    /// An answer already made that must go out whatever the budget (a
    /// claim's leases are granted; a claim may wait 30 s, too long to
    /// hold room while it waits): it holds room if there is some, and is
    /// never delayed or refused.
    pub fn answer_now(&self, json: Vec<u8>) -> Response {
        let units = u32::try_from(json.len().div_ceil(UNIT).max(1)).unwrap_or(u32::MAX);
        let reservation = self
            .permits
            .clone()
            .try_acquire_many_owned(units)
            .ok()
            .map(|permit| Reservation { permit });
        json_response(json, reservation)
    }

    /// Bytes currently reserved by answers (for tests and metrics).
    pub fn in_flight_bytes(&self) -> usize {
        (self.total_units - self.permits.available_permits()) * UNIT
    }
}

fn busy() -> Response {
    let mut response = V1Error(ApiError::new(
        Code::AnswersBusy,
        "the node is sending too many large answers to slow clients; retry later",
    ))
    .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(1));
    response
}

impl Reservation {
    /// A `200 application/json` answer of `json`, holding this
    /// reservation (shrunk to its size) until its last byte is sent.
    pub fn answer(mut self, json: Vec<u8>) -> Response {
        let keep = json.len().div_ceil(UNIT).max(1);
        if let Some(extra) = self.permit.num_permits().checked_sub(keep)
            && extra > 0
        {
            drop(self.permit.split(extra));
        }
        json_response(json, Some(self))
    }
}

fn json_response(json: Vec<u8>, reservation: Option<Reservation>) -> Response {
    let body = AnswerBody {
        json: Bytes::from(json),
        sent: 0,
        reservation,
    };
    let mut response = Body::new(body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// An answer handed out in frames of [`FRAME_BYTES`], each a copy, so
/// that the whole answer is freed together with its reservation when the
/// last frame is taken (or the connection ends first).
struct AnswerBody {
    json: Bytes,
    sent: usize,
    reservation: Option<Reservation>,
}

impl http_body::Body for AnswerBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let end = (this.sent + FRAME_BYTES).min(this.json.len());
        if this.sent == end {
            return Poll::Ready(None);
        }
        let frame = Bytes::copy_from_slice(&this.json[this.sent..end]);
        this.sent = end;
        if end == this.json.len() {
            this.json = Bytes::new();
            this.sent = 0;
            this.reservation = None;
        }
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }

    fn is_end_stream(&self) -> bool {
        self.sent == self.json.len()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact((self.json.len() - self.sent) as u64)
    }
}

/// Records of the first store read of a byte-bounded listing: 16 events of
/// the largest default payload (256 KiB) fill the default answer budget.
/// Later reads take as many as the room left holds at the largest size
/// seen ([`Page::items_that_fit`]).
pub(crate) const FIRST_READ: usize = 16;

/// Room kept for the end of a page, `],"next_cursor":"…"}` (a cursor is at
/// most a few hundred bytes).
const PAGE_END_BYTES: usize = 1024;

/// A listing answered in byte-bounded pages: the key its items are
/// answered under and their type. Its OpenAPI schema is made by
/// `openapi::schema::list_page!`.
pub(crate) trait Listing {
    /// `{"<KEY>": [...], "next_cursor": ...}`; plain ASCII, nothing to
    /// escape.
    const KEY: &'static str;
    type Item<'a>: serde::Serialize;
}

/// `{"<key>": [...], "next_cursor": ...}` of listing `L`, written item by
/// item into one buffer (no tree of values, no copy of a payload but the
/// one written), refusing the item that would pass the answer's byte
/// budget.
pub(crate) struct Page<L: Listing> {
    json: Vec<u8>,
    budget: usize,
    count: usize,
    /// Most items answered (`limit` of the request).
    limit: usize,
    /// The largest item written, in bytes.
    largest: usize,
    listing: PhantomData<L>,
}

impl<L: Listing> Page<L> {
    pub(crate) fn new(budget: usize) -> Page<L> {
        let mut json = Vec::with_capacity(budget.min(64 * 1024));
        json.push(b'{');
        json.extend_from_slice(format!("\"{}\":[", L::KEY).as_bytes());
        Page {
            json,
            budget,
            count: 0,
            limit: usize::MAX,
            largest: 0,
            listing: PhantomData,
        }
    }

    /// The page holds at most `limit` items.
    pub(crate) fn up_to(mut self, limit: usize) -> Page<L> {
        self.limit = limit;
        self
    }

    /// Writes `item`; `false` (nothing written) when the page holds its
    /// limit, or when the item would pass the budget and the page already
    /// holds one.
    ///
    /// # Errors
    /// The item does not serialize (a bug; logged, answered 500).
    pub(crate) fn push(&mut self, item: &L::Item<'_>) -> Result<bool, V1Error> {
        if self.count == self.limit {
            return Ok(false);
        }
        let start = self.json.len();
        if self.count > 0 {
            self.json.push(b',');
        }
        serde_json::to_writer(&mut self.json, item).map_err(|error| {
            tracing::error!(%error, "an item of a page did not serialize");
            V1Error(ApiError::internal())
        })?;
        if self.count > 0 && self.json.len() + PAGE_END_BYTES > self.budget {
            self.json.truncate(start);
            return Ok(false);
        }
        self.largest = self.largest.max(self.json.len() - start);
        self.count += 1;
        Ok(true)
    }

    /// How many more items of the largest size seen fit (at least one).
    pub(crate) fn items_that_fit(&self) -> usize {
        let room = self.budget.saturating_sub(self.json.len() + PAGE_END_BYTES);
        (room / self.largest.max(1)).max(1)
    }

    /// Fills the page from a store read in batches: a first small read
    /// ([`FIRST_READ`]), then as many records as the room left holds at
    /// the largest size seen, plus one that tells whether more exist.
    /// `read(at, n)` answers up to `n` records after `at`; `add` writes one
    /// record and moves `at` past it, or answers `false` when the page is
    /// full. Answers whether records were left out.
    ///
    /// # Errors
    /// Those of `read` and `add`.
    pub(crate) async fn fill<R, C: Clone, Read>(
        &mut self,
        at: &mut C,
        mut read: impl FnMut(C, usize) -> Read,
        mut add: impl FnMut(&mut Self, &R, &mut C) -> Result<bool, V1Error>,
    ) -> Result<bool, V1Error>
    where
        Read: Future<Output = Result<Vec<R>, V1Error>>,
    {
        let mut batch = FIRST_READ.min(self.limit.saturating_add(1));
        loop {
            let records = read(at.clone(), batch).await?;
            for record in &records {
                if !add(self, record, at)? {
                    return Ok(true);
                }
            }
            if records.len() < batch {
                return Ok(false);
            }
            batch = self.items_that_fit().min(self.limit - self.count) + 1;
        }
    }

    /// The whole answer's JSON.
    pub(crate) fn finish(mut self, next_cursor: Option<&str>) -> Vec<u8> {
        self.json.extend_from_slice(b"],\"next_cursor\":");
        match next_cursor {
            // Cursors are hex digits and `t`: nothing to escape.
            Some(cursor) => {
                self.json.push(b'"');
                self.json.extend_from_slice(cursor.as_bytes());
                self.json.push(b'"');
            }
            None => self.json.extend_from_slice(b"null"),
        }
        self.json.push(b'}');
        self.json
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    struct Strings;
    impl Listing for Strings {
        const KEY: &'static str = "events";
        type Item<'a> = &'a str;
    }

    struct Numbers;
    impl Listing for Numbers {
        const KEY: &'static str = "schedules";
        type Item<'a> = u32;
    }

    fn budget(per_answer: usize, in_flight: usize) -> AnswerBudget {
        AnswerBudget::new(&ApiOptions {
            max_answer_bytes: per_answer,
            max_answer_bytes_in_flight: in_flight,
            ..ApiOptions::default()
        })
    }

    #[tokio::test]
    async fn an_answer_holds_its_size_until_its_body_is_read() {
        let budget = budget(64 * 1024, 128 * 1024);
        let reservation = budget.reserve().await.unwrap();
        assert_eq!(budget.in_flight_bytes(), 64 * 1024);
        let json = vec![b'x'; 10_000];
        let response = reservation.answer(json.clone());
        assert_eq!(budget.in_flight_bytes(), 10 * 1024);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.as_ref(), json.as_slice());
        assert_eq!(budget.in_flight_bytes(), 0);
    }

    #[tokio::test]
    async fn a_spent_budget_answers_busy_after_the_wait_and_frees_when_dropped() {
        let budget = budget(64 * 1024, 100 * 1024);
        let held = budget
            .reserve()
            .await
            .unwrap()
            .answer(vec![b'x'; 60 * 1024]);
        let refused = budget.reserve().await.unwrap_err();
        assert_eq!(
            refused.status(),
            axum::http::StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
        drop(held);
        assert!(budget.reserve().await.is_ok());
    }

    #[test]
    fn a_page_refuses_the_item_past_its_budget_but_always_holds_one() {
        let big = "x".repeat(3_000);
        let mut page = Page::<Strings>::new(2_000);
        assert!(
            page.push(&big.as_str()).unwrap(),
            "the first item always fits"
        );
        assert!(!page.push(&"y").unwrap());
        assert_eq!(page.items_that_fit(), 1);
        let json = page.finish(Some("t00ab"));
        let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(value["events"].as_array().unwrap().len(), 1);
        assert_eq!(value["next_cursor"], "t00ab");

        let mut page = Page::<Numbers>::new(4_000);
        for n in 0..5 {
            assert!(page.push(&n).unwrap());
        }
        let value: serde_json::Value = serde_json::from_slice(&page.finish(None)).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"schedules": [0, 1, 2, 3, 4], "next_cursor": null})
        );
    }

    #[tokio::test]
    async fn the_body_is_sized_and_sent_in_frames() {
        let budget = budget(1 << 20, 1 << 20);
        let response = budget
            .reserve()
            .await
            .unwrap()
            .answer(vec![b'y'; 3 * FRAME_BYTES + 1]);
        let mut body = response.into_body();
        assert_eq!(
            http_body::Body::size_hint(&body).exact(),
            Some(3 * FRAME_BYTES as u64 + 1)
        );
        let mut frames = 0;
        while let Some(frame) = body.frame().await {
            assert!(frame.unwrap().into_data().unwrap().len() <= FRAME_BYTES);
            frames += 1;
        }
        assert_eq!(frames, 4);
    }
}
