//! The bounded in-memory window of near-future events of one partition.
//!
//! # Contract
//! - Entries are ordered by `(due, key)`: ties fire in key order,
//!   deterministically.
//! - The window *covers* every `(due, key)` up to and including its cursor.
//!   Everything the store holds at or before the cursor has been offered to
//!   the window; everything after it is the loader's job. The loader pages the
//!   store from the cursor (exclusive) and calls [`TimerWindow::extend`].
//! - [`TimerWindow::offer`] (a new or moved event) only inserts entries the
//!   window covers; others will be paged in later, so memory stays bounded by
//!   the page size, not by what clients send.
//! - The window is a hint, not the truth: whoever fires an entry reads the
//!   event (at its instant, or shortly before with every later change
//!   invalidating that read) and checks it is still pending for that instant.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::ids::EventKey;
use crate::time::Timestamp;

/// A position in the due order `(due, key)`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DueCursor {
    pub due: Timestamp,
    pub key: EventKey,
}

/// See the module documentation for the contract.
#[derive(Debug, Default)]
pub struct TimerWindow {
    entries: BTreeSet<DueCursor>,
    /// Everything `<=` this has been offered; `None`: nothing loaded yet.
    covered_through: Option<DueCursor>,
}

impl TimerWindow {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The cursor the loader continues from (exclusive).
    pub fn cursor(&self) -> Option<&DueCursor> {
        self.covered_through.as_ref()
    }

    /// Whether `entry` is at or before the cursor.
    pub fn covers(&self, entry: &DueCursor) -> bool {
        self.covered_through.as_ref().is_some_and(|c| entry <= c)
    }

    /// Adds a page from the store and moves the cursor to `through`.
    ///
    /// `through` must not go backwards; a page that would move it back only
    /// adds its entries.
    pub fn extend(&mut self, page: impl IntoIterator<Item = DueCursor>, through: DueCursor) {
        self.entries.extend(page);
        if self.covered_through.as_ref().is_none_or(|c| &through > c) {
            self.covered_through = Some(through);
        }
    }

    /// A new or moved event: kept when the window covers it.
    /// Returns whether it was inserted.
    pub fn offer(&mut self, entry: DueCursor) -> bool {
        if self.covers(&entry) {
            self.entries.insert(entry)
        } else {
            false
        }
    }

    /// Inserts regardless of the cursor (an event the engine itself must
    /// retry soon). Memory stays bounded: such entries are in flight already.
    pub fn insert(&mut self, entry: DueCursor) {
        self.entries.insert(entry);
    }

    pub fn remove(&mut self, entry: &DueCursor) -> bool {
        self.entries.remove(entry)
    }

    /// Keeps at most `max` entries: drops the latest ones and moves the
    /// cursor back to the last entry kept, so the loader pages the dropped
    /// ones in again when their time comes. This is what bounds memory when
    /// clients keep adding events inside the window.
    pub fn shrink_to(&mut self, max: usize) {
        if self.entries.len() <= max || max == 0 {
            return;
        }
        while self.entries.len() > max {
            self.entries.pop_last();
        }
        self.covered_through = self.entries.last().cloned();
    }

    /// The entries after `after` (exclusive; `None`: from the start) due at
    /// or before `through`, in due order.
    pub fn due_between<'a>(
        &'a self,
        after: Option<&DueCursor>,
        through: Timestamp,
    ) -> impl Iterator<Item = &'a DueCursor> + 'a {
        use std::ops::Bound;
        let start = match after {
            Some(after) => Bound::Excluded(after.clone()),
            None => Bound::Unbounded,
        };
        self.entries
            .range((start, Bound::Unbounded))
            .take_while(move |entry| entry.due <= through)
    }

    /// The earliest due instant held.
    pub fn next_due(&self) -> Option<Timestamp> {
        self.entries.first().map(|e| e.due)
    }

    /// Removes and returns up to `max` entries due at or before `now`, in due
    /// order.
    pub fn pop_due(&mut self, now: Timestamp, max: usize) -> Vec<DueCursor> {
        let mut due = Vec::new();
        while due.len() < max {
            match self.entries.first() {
                Some(first) if first.due <= now => {
                    if let Some(entry) = self.entries.pop_first() {
                        due.push(entry);
                    }
                }
                _ => break,
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{EventId, TenantName};

    fn entry(due: i64, id: &str) -> DueCursor {
        DueCursor {
            due: Timestamp::from_millis(due),
            key: EventKey::new(TenantName::new("t").unwrap(), EventId::new(id).unwrap()),
        }
    }

    #[test]
    fn due_between_is_exclusive_after_and_inclusive_through() {
        let mut window = TimerWindow::new();
        window.extend(
            [entry(1, "a"), entry(2, "a"), entry(2, "b"), entry(5, "a")],
            entry(10, "z"),
        );
        let ids = |after: Option<&DueCursor>, through: i64| -> Vec<(i64, String)> {
            window
                .due_between(after, Timestamp::from_millis(through))
                .map(|e| (e.due.as_millis(), e.key.id.as_str().to_string()))
                .collect()
        };
        assert_eq!(ids(None, 2).len(), 3);
        assert_eq!(
            ids(Some(&entry(2, "a")), 5),
            vec![(2, "b".to_string()), (5, "a".to_string())]
        );
        assert!(ids(Some(&entry(5, "a")), 100).is_empty());
    }

    #[test]
    fn offers_beyond_the_cursor_are_left_to_the_loader() {
        let mut window = TimerWindow::new();
        assert!(
            !window.offer(entry(5, "a")),
            "nothing covered before the first load"
        );
        window.extend([entry(1, "x")], entry(10, "m"));
        assert!(window.offer(entry(10, "a")));
        assert!(
            !window.offer(entry(10, "z")),
            "same instant, key after the cursor"
        );
        assert!(!window.offer(entry(11, "a")));
        assert_eq!(window.len(), 2);
    }

    #[test]
    fn pops_in_due_then_key_order_and_never_early() {
        let mut window = TimerWindow::new();
        window.extend(
            [entry(3, "b"), entry(3, "a"), entry(1, "z"), entry(9, "q")],
            entry(100, "~"),
        );
        assert_eq!(window.next_due(), Some(Timestamp::from_millis(1)));
        let fired = window.pop_due(Timestamp::from_millis(3), 10);
        let ids: Vec<_> = fired
            .iter()
            .map(|e| e.key.id.as_str().to_string())
            .collect();
        assert_eq!(ids, ["z", "a", "b"]);
        assert!(window.pop_due(Timestamp::from_millis(8), 10).is_empty());
        assert_eq!(window.pop_due(Timestamp::from_millis(9), 10).len(), 1);
    }

    #[test]
    fn shrinking_moves_the_cursor_back_to_the_last_kept_entry() {
        let mut window = TimerWindow::new();
        window.extend(
            [entry(1, "a"), entry(2, "b"), entry(3, "c")],
            entry(50, "~"),
        );
        window.shrink_to(2);
        assert_eq!(window.len(), 2);
        assert_eq!(window.cursor(), Some(&entry(2, "b")));
        assert!(
            !window.offer(entry(3, "c")),
            "dropped entries are the loader's again"
        );
    }

    #[test]
    fn cursor_never_moves_back() {
        let mut window = TimerWindow::new();
        window.extend([], entry(10, "a"));
        window.extend([entry(2, "b")], entry(5, "a"));
        assert_eq!(window.cursor(), Some(&entry(10, "a")));
        assert_eq!(window.len(), 1);
    }
}
