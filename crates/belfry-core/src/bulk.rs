//! Bulk actions: one action (cancel, redrive, delete, pause, resume) over every
//! item of one tenant that a filter matches, run in the background page by
//! page, resumable after a restart, and advanced by one runner at a time.
//!
//! This module holds the pure parts: the stored record ([`BulkAction`]),
//! its states, the filter and its validation, the progress arithmetic and
//! the claim rule. The engine's runner (`belfry_engine::bulk`) pages
//! through the items, applies the commands and saves the progress; the
//! stores persist the record with a compare-and-set on its
//! [`BulkAction::revision`].
//!
//! # Progress
//! After every page the runner adds the page's tally to
//! [`BulkAction::progress`] and moves [`BulkAction::cursor`] past the page,
//! in one compare-and-set. `matched` counts the items the filter listed;
//! each of them is exactly one of `succeeded`, `skipped` (its state no
//! longer allowed the action, e.g. a failed event already redriven) or
//! `failed` (its write failed), so `matched == succeeded + skipped +
//! failed` holds after every save ([`BulkProgress::is_balanced`]).
//!
//! # Claims: one runner at a time
//! Every node runs a runner. A runner works on an action only while it
//! holds its [`BulkClaim`]: it takes a running action that is unclaimed,
//! already its own, or whose claim expired ([`BulkAction::claimable_by`]),
//! and renews the claim with every progress save. Safety does not rest on
//! clocks: every save is a compare-and-set on the revision, so of two
//! runners that both believe they hold the claim only one save lands; the
//! other re-reads the record, sees the claim is not its own and stops.
//! A save that lost only to a cancel (the API changed the state, not the
//! claim) is merged into the fresh record and saved again, so the counts of
//! a page that was applied are never lost.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::auth::{KeyError, base62_fixed, random_base62};
use crate::event::{CommandOutcome, EventStatus};
use crate::ids::TenantName;
use crate::schedule::ScheduleStatus;
use crate::time::Timestamp;

/// Hex digits of the creation instant at the start of an id.
const ID_TIME_LEN: usize = 12;
/// Base62 characters of this process's id sequence after it (62^4 ≈ 14.8M
/// ids before it wraps).
const ID_SEQUENCE_LEN: usize = 4;
/// Random base62 characters last.
const ID_RANDOM_LEN: usize = 6;
const ID_PREFIX: &str = "bulk_";

/// How many ids this process has made: orders ids made in one millisecond.
static ID_SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// A bulk action's id: `bulk_`, the creation instant (12 lower-case hex
/// digits of its milliseconds), this process's id sequence (4 base62
/// characters) and 6 random base62 characters. Ids sort by creation time
/// (byte order, which both stores use), and ids one node makes in the same
/// millisecond by the order it made them, so "newest first" is descending
/// id order. Ids two nodes make in the same millisecond have no order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct BulkActionId(String);

impl BulkActionId {
    /// A new id for an action created at `now`.
    ///
    /// # Errors
    /// [`KeyError::Random`] if the random source failed.
    pub fn generate(now: Timestamp) -> Result<BulkActionId, KeyError> {
        // Instants before 1970 or after the year 10889 do not fit the
        // field; clamped, they still give valid (if unordered) ids.
        let millis = now.as_millis().clamp(0, (1 << (4 * ID_TIME_LEN)) - 1);
        let sequence = ID_SEQUENCE.fetch_add(1, Ordering::Relaxed);
        Ok(BulkActionId(format!(
            "{ID_PREFIX}{millis:0width$x}{}{}",
            base62_fixed(sequence, ID_SEQUENCE_LEN),
            random_base62(ID_RANDOM_LEN)?,
            width = ID_TIME_LEN
        )))
    }

    /// An id as a client sent it or a store holds it; `None` if it cannot
    /// be one (so lookups of garbage never reach the store).
    pub fn parse(text: &str) -> Option<BulkActionId> {
        let rest = text.strip_prefix(ID_PREFIX)?;
        if rest.len() != ID_TIME_LEN + ID_SEQUENCE_LEN + ID_RANDOM_LEN || !rest.is_ascii() {
            return None;
        }
        let (time, random) = rest.split_at(ID_TIME_LEN);
        let time_ok = time
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        (time_ok && random.bytes().all(|b| b.is_ascii_alphanumeric()))
            .then(|| BulkActionId(text.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BulkActionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for BulkActionId {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        BulkActionId::parse(&text).ok_or_else(|| format!("{text:?} is not a bulk action id"))
    }
}

impl From<BulkActionId> for String {
    fn from(id: BulkActionId) -> String {
        id.0
    }
}

/// A new random name for a runner in [`BulkClaim`]s (a cluster node's;
/// a single node calls itself `local`).
pub fn runner_id() -> String {
    format!("runner_{}", uuid::Uuid::now_v7().simple())
}

/// What a bulk action does to each item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BulkKind {
    /// Cancel pending events.
    Cancel,
    /// Send failed or missed events again, each as a new version.
    Redrive,
    /// Delete finished events with their history. Needs a status filter
    /// (one finished status), so nothing is deleted by omission.
    Delete,
    /// Pause active schedules.
    Pause,
    /// Resume paused schedules.
    Resume,
}

/// What a [`BulkKind`] acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkTarget {
    Events,
    Schedules,
}

impl BulkKind {
    pub const ALL: [BulkKind; 5] = [
        BulkKind::Cancel,
        BulkKind::Redrive,
        BulkKind::Delete,
        BulkKind::Pause,
        BulkKind::Resume,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BulkKind::Cancel => "cancel",
            BulkKind::Redrive => "redrive",
            BulkKind::Delete => "delete",
            BulkKind::Pause => "pause",
            BulkKind::Resume => "resume",
        }
    }

    /// # Errors
    /// Anything but `cancel`, `redrive`, `delete`, `pause` or `resume`.
    pub fn parse(text: &str) -> Result<BulkKind, BulkError> {
        BulkKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == text)
            .ok_or_else(|| BulkError::UnknownAction(text.to_string()))
    }

    pub fn target(self) -> BulkTarget {
        match self {
            BulkKind::Cancel | BulkKind::Redrive | BulkKind::Delete => BulkTarget::Events,
            BulkKind::Pause | BulkKind::Resume => BulkTarget::Schedules,
        }
    }

    /// Whether this action can change an item in `status`: a filter on any
    /// other status could never match anything it acts on.
    pub fn acts_on(self, status: StatusFilter) -> bool {
        match (self, status) {
            (BulkKind::Cancel, StatusFilter::Event(status)) => status.is_pending(),
            (BulkKind::Redrive, StatusFilter::Event(status)) => {
                matches!(status, EventStatus::Failed | EventStatus::Missed)
            }
            (BulkKind::Delete, StatusFilter::Event(status)) => !status.is_pending(),
            (BulkKind::Pause, StatusFilter::Schedule(status)) => status == ScheduleStatus::Active,
            (BulkKind::Resume, StatusFilter::Schedule(status)) => status == ScheduleStatus::Paused,
            _ => false,
        }
    }

    /// The statuses [`BulkKind::acts_on`] accepts, for messages.
    fn acted_on(self) -> &'static str {
        match self {
            BulkKind::Cancel => "scheduled or retrying events",
            BulkKind::Redrive => "failed or missed events",
            BulkKind::Delete => "delivered, failed, missed or cancelled events",
            BulkKind::Pause => "active schedules",
            BulkKind::Resume => "paused schedules",
        }
    }

    /// How the outcome of one event command counts: what the action is
    /// for (`succeeded`), or an item whose state no longer allowed it
    /// (`skipped`: a cancel of an event that finished meanwhile, a redrive
    /// of one already redriven). Anything else is a failure. (A delete
    /// runs no command: an event it finds still pending, or gone, is
    /// `skipped`.)
    pub fn classify(self, outcome: &CommandOutcome) -> ItemOutcome {
        match (self, outcome) {
            (BulkKind::Cancel, CommandOutcome::Cancelled)
            | (BulkKind::Redrive, CommandOutcome::Redriven) => ItemOutcome::Succeeded,
            (BulkKind::Cancel, CommandOutcome::NotFound | CommandOutcome::AlreadyFinished(_))
            | (BulkKind::Redrive, CommandOutcome::NotFound | CommandOutcome::NotRedrivable(_)) => {
                ItemOutcome::Skipped
            }
            _ => ItemOutcome::Failed,
        }
    }
}

impl fmt::Display for BulkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The status an action's items are filtered by: an event's for event
/// actions, a schedule's for schedule actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusFilter {
    Event(EventStatus),
    Schedule(ScheduleStatus),
}

impl StatusFilter {
    pub fn as_str(self) -> &'static str {
        match self {
            StatusFilter::Event(status) => status.as_str(),
            StatusFilter::Schedule(status) => status.as_str(),
        }
    }
}

/// Which items of one tenant an action acts on. Event actions filter as
/// the event listing does (`status`, and `from`/`to` on the instant the
/// client asked for); schedule actions by the schedule's status only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkFilter {
    pub tenant: TenantName,
    pub status: Option<StatusFilter>,
    /// Inclusive lower bound on the event's instant.
    pub from: Option<Timestamp>,
    /// Exclusive upper bound on the event's instant.
    pub to: Option<Timestamp>,
}

impl BulkFilter {
    /// Checks that the filter makes sense for `kind`.
    ///
    /// # Errors
    /// [`BulkError::EventFilterOnSchedules`] (`from`/`to` for a schedule
    /// action), [`BulkError::WrongStatusKind`] (a schedule status for an
    /// event action or the reverse), [`BulkError::StatusNeverActs`] (a
    /// status the action never changes: nothing could ever succeed),
    /// [`BulkError::StatusRequired`] (a delete without a status).
    pub fn validate(&self, kind: BulkKind) -> Result<(), BulkError> {
        if kind == BulkKind::Delete && self.status.is_none() {
            return Err(BulkError::StatusRequired(kind));
        }
        if kind.target() == BulkTarget::Schedules && (self.from.is_some() || self.to.is_some()) {
            return Err(BulkError::EventFilterOnSchedules(kind));
        }
        if let Some(status) = self.status {
            let fits = matches!(
                (kind.target(), status),
                (BulkTarget::Events, StatusFilter::Event(_))
                    | (BulkTarget::Schedules, StatusFilter::Schedule(_))
            );
            if !fits {
                return Err(BulkError::WrongStatusKind(kind));
            }
            if !kind.acts_on(status) {
                return Err(BulkError::StatusNeverActs {
                    kind,
                    status: status.as_str(),
                });
            }
        }
        Ok(())
    }

    /// The event status filtered by, if any.
    pub fn event_status(&self) -> Option<EventStatus> {
        match self.status {
            Some(StatusFilter::Event(status)) => Some(status),
            _ => None,
        }
    }

    /// Whether a schedule in `status` passes the filter.
    pub fn matches_schedule(&self, status: ScheduleStatus) -> bool {
        match self.status {
            Some(StatusFilter::Schedule(wanted)) => wanted == status,
            Some(StatusFilter::Event(_)) => false,
            None => true,
        }
    }
}

/// Why a bulk action request was refused. Safe to show to a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BulkError {
    #[error("unknown action {0:?}; expected cancel, redrive, delete, pause or resume")]
    UnknownAction(String),
    #[error("{} acts on {}; name one of these statuses in the filter", .0, .0.acted_on())]
    StatusRequired(BulkKind),
    #[error("{0} acts on schedules, which are filtered by status only; from and to filter events")]
    EventFilterOnSchedules(BulkKind),
    #[error("{} acts on {}; filter them by a status of theirs", .0, .0.acted_on())]
    WrongStatusKind(BulkKind),
    #[error("{kind} acts on {} only; status {status} never matches one", .kind.acted_on())]
    StatusNeverActs {
        kind: BulkKind,
        status: &'static str,
    },
}

/// Where a bulk action is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BulkState {
    /// Pages are still being worked through (or wait for a runner).
    Running,
    /// Every matching item was handled.
    Completed,
    /// Stopped by a client; the pages handled before stay handled.
    Cancelled,
    /// Stopped by an error that retrying did not cure (see `error`).
    Failed,
}

impl BulkState {
    pub fn as_str(self) -> &'static str {
        match self {
            BulkState::Running => "running",
            BulkState::Completed => "completed",
            BulkState::Cancelled => "cancelled",
            BulkState::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<BulkState> {
        [
            BulkState::Running,
            BulkState::Completed,
            BulkState::Cancelled,
            BulkState::Failed,
        ]
        .into_iter()
        .find(|state| state.as_str() == text)
    }

    pub fn is_finished(self) -> bool {
        self != BulkState::Running
    }
}

/// What happened to one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemOutcome {
    Succeeded,
    /// Its state no longer allowed the action.
    Skipped,
    /// Its write failed.
    Failed,
}

/// Counts of items; see the module doc.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkProgress {
    pub matched: u64,
    pub succeeded: u64,
    pub skipped: u64,
    pub failed: u64,
}

impl BulkProgress {
    /// Counts one matched item.
    pub fn count(&mut self, outcome: ItemOutcome) {
        self.matched += 1;
        match outcome {
            ItemOutcome::Succeeded => self.succeeded += 1,
            ItemOutcome::Skipped => self.skipped += 1,
            ItemOutcome::Failed => self.failed += 1,
        }
    }

    /// Adds another tally (a page's) to this one.
    pub fn add(&mut self, other: &BulkProgress) {
        self.matched = self.matched.saturating_add(other.matched);
        self.succeeded = self.succeeded.saturating_add(other.succeeded);
        self.skipped = self.skipped.saturating_add(other.skipped);
        self.failed = self.failed.saturating_add(other.failed);
    }

    /// Every matched item is counted exactly once.
    pub fn is_balanced(&self) -> bool {
        u128::from(self.matched)
            == u128::from(self.succeeded) + u128::from(self.skipped) + u128::from(self.failed)
    }
}

/// Where the next page starts (exclusive): the last item handled. Events
/// are listed in `(instant, id)` order, so `at` is that event's instant;
/// schedules in id order (`at` is `None`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkCursor {
    pub at: Option<Timestamp>,
    pub id: String,
}

/// One page's work, as the runner saves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageReport {
    pub tally: BulkProgress,
    /// The page's last item; `None` for an empty page.
    pub cursor: Option<BulkCursor>,
    /// No item is left after this page.
    pub last: bool,
}

/// The runner working on an action, and until when (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkClaim {
    pub runner: String,
    /// The claim lapses at this instant unless renewed.
    pub until: Timestamp,
}

/// A stored bulk action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkAction {
    pub id: BulkActionId,
    pub kind: BulkKind,
    pub filter: BulkFilter,
    pub state: BulkState,
    pub progress: BulkProgress,
    /// After the last item handled; `None` before the first page.
    pub cursor: Option<BulkCursor>,
    /// The key that created it; `None` in open mode.
    pub created_by: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub finished_at: Option<Timestamp>,
    /// Why it failed (state `failed`).
    pub error: Option<String>,
    /// Set while a runner works on it; never on a finished action.
    pub claim: Option<BulkClaim>,
    /// Incremented by the store with every update: the compare-and-set
    /// token. 0 when created.
    pub revision: u64,
}

impl BulkAction {
    /// A new running action. The filter must have passed
    /// [`BulkFilter::validate`] for `kind`.
    pub fn new(
        id: BulkActionId,
        kind: BulkKind,
        filter: BulkFilter,
        created_by: Option<String>,
        now: Timestamp,
    ) -> BulkAction {
        BulkAction {
            id,
            kind,
            filter,
            state: BulkState::Running,
            progress: BulkProgress::default(),
            cursor: None,
            created_by,
            created_at: now,
            updated_at: now,
            finished_at: None,
            error: None,
            claim: None,
            revision: 0,
        }
    }

    pub fn tenant(&self) -> &TenantName {
        &self.filter.tenant
    }

    /// Whether `runner` may work on this action at `now`: it is running,
    /// and unclaimed, claimed by `runner` already, or its claim lapsed.
    pub fn claimable_by(&self, runner: &str, now: Timestamp) -> bool {
        self.state == BulkState::Running
            && self
                .claim
                .as_ref()
                .is_none_or(|claim| claim.runner == runner || claim.until <= now)
    }

    /// Whether `runner` holds the claim (lapsed or not).
    pub fn held_by(&self, runner: &str) -> bool {
        self.claim
            .as_ref()
            .is_some_and(|claim| claim.runner == runner)
    }

    /// This action claimed by `runner` until `now + lease` (a new claim,
    /// a takeover of a lapsed one, or a renewal), to be saved with a
    /// compare-and-set; `None` if [`BulkAction::claimable_by`] says no.
    pub fn claimed(&self, runner: &str, now: Timestamp, lease: Duration) -> Option<BulkAction> {
        self.claimable_by(runner, now).then(|| BulkAction {
            claim: Some(BulkClaim {
                runner: runner.to_string(),
                until: now.plus(lease),
            }),
            ..self.clone()
        })
    }

    /// Adds a page's work: its tally, the cursor past it, and — on the
    /// last page of a running action — completion. Applies to a cancelled
    /// action too (a page applied before the cancel was seen still
    /// counts). A finished action keeps no claim.
    pub fn record_page(&mut self, page: &PageReport, now: Timestamp) {
        self.progress.add(&page.tally);
        if let Some(cursor) = &page.cursor {
            self.cursor = Some(cursor.clone());
        }
        if page.last && self.state == BulkState::Running {
            self.finish(BulkState::Completed, now);
        }
        self.updated_at = now;
        if self.state.is_finished() {
            self.claim = None;
        }
    }

    /// Stops a running action.
    ///
    /// # Errors
    /// The state it already finished in. Its claim is kept, so that the
    /// runner's page in progress can still be counted.
    pub fn cancel(&mut self, now: Timestamp) -> Result<(), BulkState> {
        if self.state.is_finished() {
            return Err(self.state);
        }
        self.finish(BulkState::Cancelled, now);
        self.updated_at = now;
        Ok(())
    }

    /// Ends a running action as failed, with the reason.
    pub fn fail(&mut self, error: String, now: Timestamp) {
        if self.state == BulkState::Running {
            self.finish(BulkState::Failed, now);
            self.error = Some(error);
        }
        self.updated_at = now;
        self.claim = None;
    }

    /// Gives the claim up (a runner stopping cleanly), so another runner
    /// may take the action at once.
    pub fn release(&mut self, runner: &str) {
        if self.held_by(runner) {
            self.claim = None;
        }
    }

    fn finish(&mut self, state: BulkState, now: Timestamp) {
        self.state = state;
        self.finished_at = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn filter(status: Option<StatusFilter>) -> BulkFilter {
        BulkFilter {
            tenant: TenantName::new("acme").unwrap(),
            status,
            from: None,
            to: None,
        }
    }

    fn action() -> BulkAction {
        BulkAction::new(
            BulkActionId::generate(ts(1_000)).unwrap(),
            BulkKind::Redrive,
            filter(Some(StatusFilter::Event(EventStatus::Failed))),
            Some("key_a".into()),
            ts(1_000),
        )
    }

    fn page(matched: u64, last: bool) -> PageReport {
        let mut tally = BulkProgress::default();
        for n in 0..matched {
            tally.count(match n % 3 {
                0 => ItemOutcome::Succeeded,
                1 => ItemOutcome::Skipped,
                _ => ItemOutcome::Failed,
            });
        }
        PageReport {
            tally,
            cursor: (matched > 0).then(|| BulkCursor {
                at: Some(ts(5)),
                id: format!("e{matched}"),
            }),
            last,
        }
    }

    /// "Newest first" holds within a millisecond: ids one process makes in
    /// the same millisecond sort in the order they were made, whatever
    /// other threads make meanwhile.
    #[test]
    fn ids_made_in_one_millisecond_sort_in_the_order_they_were_made() {
        let at = ts(1_800_000_000_000);
        let ids: Vec<BulkActionId> = (0..1_000)
            .map(|_| BulkActionId::generate(at).unwrap())
            .collect();
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
        }
    }

    #[test]
    fn ids_sort_by_creation_time_and_parse_back() {
        let early = BulkActionId::generate(ts(1_700_000_000_000)).unwrap();
        let late = BulkActionId::generate(ts(1_700_000_000_001)).unwrap();
        assert!(early < late);
        assert_eq!(early.as_str().len(), ID_PREFIX.len() + 22);
        assert_eq!(BulkActionId::parse(early.as_str()), Some(early.clone()));
        assert_ne!(
            early,
            BulkActionId::generate(ts(1_700_000_000_000)).unwrap()
        );
        let json = serde_json::to_string(&early).unwrap();
        assert_eq!(serde_json::from_str::<BulkActionId>(&json).unwrap(), early);
        for junk in [
            "",
            "bulk_",
            "key_0000000000000123456789",
            "bulk_00000000000g0123456789",
            "bulk_000000000000012345678",
            "bulk_0000000000000123456789x",
            "bulk_000000000000012345678é",
            "bulk_00000000000A0123456789",
        ] {
            assert_eq!(BulkActionId::parse(junk), None, "{junk:?}");
        }
        assert!(serde_json::from_str::<BulkActionId>("\"../x\"").is_err());
        // Out-of-range instants still give valid ids.
        assert!(BulkActionId::parse(BulkActionId::generate(ts(-5)).unwrap().as_str()).is_some());
    }

    #[test]
    fn kinds_parse_and_name_their_targets() {
        for kind in BulkKind::ALL {
            assert_eq!(BulkKind::parse(kind.as_str()), Ok(kind));
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::Value::String(kind.as_str().into())
            );
        }
        assert_eq!(
            BulkKind::parse("purge"),
            Err(BulkError::UnknownAction("purge".into()))
        );
        assert_eq!(BulkKind::Delete.target(), BulkTarget::Events);
        assert_eq!(BulkKind::Cancel.target(), BulkTarget::Events);
        assert_eq!(BulkKind::Resume.target(), BulkTarget::Schedules);
    }

    #[test]
    fn filters_are_checked_against_the_action() {
        let event = |s| Some(StatusFilter::Event(s));
        let schedule = |s| Some(StatusFilter::Schedule(s));
        assert_eq!(filter(None).validate(BulkKind::Redrive), Ok(()));
        assert_eq!(filter(None).validate(BulkKind::Pause), Ok(()));
        assert_eq!(
            filter(None).validate(BulkKind::Delete),
            Err(BulkError::StatusRequired(BulkKind::Delete))
        );
        for finished in [
            EventStatus::Delivered,
            EventStatus::Failed,
            EventStatus::Missed,
            EventStatus::Cancelled,
        ] {
            assert_eq!(filter(event(finished)).validate(BulkKind::Delete), Ok(()));
        }
        assert!(matches!(
            filter(event(EventStatus::Scheduled)).validate(BulkKind::Delete),
            Err(BulkError::StatusNeverActs { .. })
        ));
        assert_eq!(
            filter(event(EventStatus::Missed)).validate(BulkKind::Redrive),
            Ok(())
        );
        assert_eq!(
            filter(event(EventStatus::Retrying)).validate(BulkKind::Cancel),
            Ok(())
        );
        assert_eq!(
            filter(schedule(ScheduleStatus::Paused)).validate(BulkKind::Resume),
            Ok(())
        );
        assert_eq!(
            filter(event(EventStatus::Delivered)).validate(BulkKind::Redrive),
            Err(BulkError::StatusNeverActs {
                kind: BulkKind::Redrive,
                status: "delivered"
            })
        );
        assert!(matches!(
            filter(event(EventStatus::Failed)).validate(BulkKind::Cancel),
            Err(BulkError::StatusNeverActs { .. })
        ));
        assert!(matches!(
            filter(schedule(ScheduleStatus::Active)).validate(BulkKind::Resume),
            Err(BulkError::StatusNeverActs { .. })
        ));
        assert_eq!(
            filter(event(EventStatus::Failed)).validate(BulkKind::Pause),
            Err(BulkError::WrongStatusKind(BulkKind::Pause))
        );
        assert_eq!(
            filter(schedule(ScheduleStatus::Active)).validate(BulkKind::Cancel),
            Err(BulkError::WrongStatusKind(BulkKind::Cancel))
        );
        let timed = BulkFilter {
            from: Some(ts(1)),
            ..filter(None)
        };
        assert_eq!(timed.validate(BulkKind::Redrive), Ok(()));
        assert_eq!(
            timed.validate(BulkKind::Pause),
            Err(BulkError::EventFilterOnSchedules(BulkKind::Pause))
        );
        // Every message names what the action acts on.
        let message = filter(event(EventStatus::Delivered))
            .validate(BulkKind::Redrive)
            .unwrap_err()
            .to_string();
        assert!(message.contains("failed or missed"), "{message}");
    }

    #[test]
    fn schedule_filters_match_by_status() {
        assert!(filter(None).matches_schedule(ScheduleStatus::Completed));
        let paused = filter(Some(StatusFilter::Schedule(ScheduleStatus::Paused)));
        assert!(paused.matches_schedule(ScheduleStatus::Paused));
        assert!(!paused.matches_schedule(ScheduleStatus::Active));
        assert_eq!(paused.event_status(), None);
        assert_eq!(
            filter(Some(StatusFilter::Event(EventStatus::Failed))).event_status(),
            Some(EventStatus::Failed)
        );
    }

    #[test]
    fn command_outcomes_are_classified_per_action() {
        use CommandOutcome as O;
        let redrive = BulkKind::Redrive;
        assert_eq!(redrive.classify(&O::Redriven), ItemOutcome::Succeeded);
        assert_eq!(
            redrive.classify(&O::NotRedrivable(EventStatus::Scheduled)),
            ItemOutcome::Skipped
        );
        assert_eq!(redrive.classify(&O::NotFound), ItemOutcome::Skipped);
        assert_eq!(redrive.classify(&O::Cancelled), ItemOutcome::Failed);
        let cancel = BulkKind::Cancel;
        assert_eq!(cancel.classify(&O::Cancelled), ItemOutcome::Succeeded);
        assert_eq!(
            cancel.classify(&O::AlreadyFinished(EventStatus::Delivered)),
            ItemOutcome::Skipped
        );
        assert_eq!(cancel.classify(&O::Redriven), ItemOutcome::Failed);
    }

    #[test]
    fn pages_add_up_and_the_last_one_completes() {
        let mut action = action();
        action.record_page(&page(200, false), ts(2_000));
        assert_eq!(action.state, BulkState::Running);
        assert_eq!(action.progress.matched, 200);
        assert!(action.progress.is_balanced());
        assert_eq!(action.cursor.as_ref().unwrap().id, "e200");
        // An empty last page keeps the cursor.
        action.record_page(&page(0, true), ts(3_000));
        assert_eq!(action.state, BulkState::Completed);
        assert_eq!(action.finished_at, Some(ts(3_000)));
        assert_eq!(action.updated_at, ts(3_000));
        assert_eq!(action.cursor.as_ref().unwrap().id, "e200");
        assert!(action.progress.is_balanced());
        assert_eq!(
            action.progress,
            BulkProgress {
                matched: 200,
                succeeded: 67,
                skipped: 67,
                failed: 66
            }
        );
    }

    #[test]
    fn one_runner_at_a_time_and_a_lapsed_claim_is_taken_over() {
        let lease = Duration::from_secs(10);
        let action = action();
        assert!(action.claimable_by("a", ts(1_000)));
        let held = action.claimed("a", ts(1_000), lease).unwrap();
        assert!(held.held_by("a") && !held.held_by("b"));
        assert_eq!(held.claim.as_ref().unwrap().until, ts(11_000));
        // Renewed by its holder, refused to another until it lapses.
        assert!(held.claimed("a", ts(5_000), lease).is_some());
        assert!(!held.claimable_by("b", ts(10_999)));
        assert!(held.claimed("b", ts(10_999), lease).is_none());
        let taken = held.claimed("b", ts(11_000), lease).unwrap();
        assert!(taken.held_by("b"));
        // Released: anyone at once.
        let mut released = taken.clone();
        released.release("a");
        assert!(released.held_by("b"), "only the holder releases");
        released.release("b");
        assert!(released.claimable_by("c", ts(11_000)));
        // Finished actions are never claimed.
        let mut done = taken;
        done.record_page(&page(3, true), ts(12_000));
        assert_eq!(done.claim, None);
        assert!(!done.claimable_by("b", ts(12_000)));
    }

    #[test]
    fn a_cancel_keeps_the_claim_for_the_page_in_progress() {
        let mut action = action()
            .claimed("a", ts(1_000), Duration::from_secs(10))
            .unwrap();
        assert_eq!(action.cancel(ts(1_500)), Ok(()));
        assert_eq!(action.state, BulkState::Cancelled);
        assert_eq!(action.finished_at, Some(ts(1_500)));
        assert!(action.held_by("a"));
        assert!(!action.claimable_by("a", ts(1_500)));
        // The runner's page, applied before it saw the cancel, counts.
        action.record_page(&page(5, false), ts(1_600));
        assert_eq!(action.state, BulkState::Cancelled);
        assert_eq!(action.finished_at, Some(ts(1_500)));
        assert_eq!(action.progress.matched, 5);
        assert_eq!(action.claim, None);
        assert_eq!(action.cancel(ts(2_000)), Err(BulkState::Cancelled));
    }

    #[test]
    fn failing_ends_a_running_action_with_its_reason() {
        let mut action = action()
            .claimed("a", ts(1_000), Duration::from_secs(10))
            .unwrap();
        action.fail("store corrupt".into(), ts(2_000));
        assert_eq!(action.state, BulkState::Failed);
        assert_eq!(action.error.as_deref(), Some("store corrupt"));
        assert_eq!(action.claim, None);
        assert_eq!(action.cancel(ts(3_000)), Err(BulkState::Failed));
    }

    #[test]
    fn records_round_trip_through_json() {
        let mut action = action();
        action.record_page(&page(4, false), ts(1_500));
        let json = serde_json::to_string(&action).unwrap();
        assert_eq!(serde_json::from_str::<BulkAction>(&json).unwrap(), action);
        for state in [
            BulkState::Running,
            BulkState::Completed,
            BulkState::Cancelled,
            BulkState::Failed,
        ] {
            assert_eq!(BulkState::parse(state.as_str()), Some(state));
        }
        assert_eq!(BulkState::parse("done"), None);
    }

    proptest::proptest! {
        /// Whatever the pages, every matched item is counted once.
        #[test]
        fn progress_stays_balanced(pages in proptest::collection::vec((0u64..300, proptest::bool::ANY), 0..20)) {
            let mut action = action();
            let mut matched = 0;
            for (n, (size, last)) in pages.iter().enumerate() {
                action.record_page(&page(*size, *last), ts(2_000 + n as i64));
                matched += size;
                proptest::prop_assert!(action.progress.is_balanced());
            }
            proptest::prop_assert_eq!(action.progress.matched, matched);
            proptest::prop_assert_eq!(
                action.state == BulkState::Completed,
                pages.iter().any(|(_, last)| *last)
            );
        }
    }
}
