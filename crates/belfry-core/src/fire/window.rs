//! The bounded, tenant-fair window of near-future events of one partition.
//!
//! # Contract
//! - Entries are ordered by `(due, key)`; ties fire in key order.
//! - The window *covers* every entry up to and including its cursor, except
//!   for a tenant with an *overflow* mark: that tenant's entries after the
//!   mark are in the store but not held (they were evicted for capacity, or
//!   skipped while paging), and a per-tenant page brings them back. Every
//!   covered entry the store holds has been offered to the window.
//! - Entries live in one lane per tenant, so a tenant that cannot fire (its
//!   deliveries are stuck) is skipped in O(log n), never scanned, and the
//!   tenant holding the most entries is the one evicted when the window is
//!   over capacity: a backlog of one tenant cannot push another's events out.
//! - The engine's internal entries (ids with the internal mark: schedule
//!   control events, failure notices) are always covered up to the cursor
//!   and never evicted, and a blocked lane still fires them
//!   ([`FairWindow::pop_internal_held`]): a paused tenant's schedules go on
//!   planning and its notices go out. There are few of them per tenant
//!   (its schedules due within the window, its notice slots).
//! - The window is a hint: whoever fires an entry checks the event's record.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;

use crate::ids::{EventId, EventKey, TenantName};
use crate::time::Timestamp;
use crate::timer::DueCursor;

#[derive(Debug, Default)]
struct Lane {
    entries: BTreeSet<(Timestamp, EventId)>,
    /// The internal entries among `entries`.
    internal: BTreeSet<(Timestamp, EventId)>,
    /// Entries of this tenant after this cursor (exclusive) and up to the
    /// window's cursor are not held.
    overflow: Option<DueCursor>,
    /// The tenant may not fire more right now (see [`FairWindow::set_blocked`]).
    blocked: bool,
}

impl Lane {
    fn first(&self) -> Option<Timestamp> {
        self.entries.first().map(|(due, _)| *due)
    }

    /// Its client entries: what eviction and the blocked lanes' cap count.
    fn clients(&self) -> usize {
        self.entries.len() - self.internal.len()
    }

    fn first_internal(&self) -> Option<Timestamp> {
        self.internal.first().map(|(due, _)| *due)
    }
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct FairWindow {
    lanes: HashMap<TenantName, Lane>,
    /// `(earliest due, tenant)` of every lane that holds entries.
    heads: BTreeSet<(Timestamp, TenantName)>,
    /// The subset of `heads` whose tenant is not blocked.
    ready: BTreeSet<(Timestamp, TenantName)>,
    /// `(earliest internal entry, tenant)` of every lane holding one.
    internal_heads: BTreeSet<(Timestamp, TenantName)>,
    held: usize,
    covered_through: Option<DueCursor>,
}

/// One tenant's entries evicted at once, in order.
#[derive(Debug, Default)]
pub struct EvictedRun(pub(crate) BTreeSet<(Timestamp, EventId)>);

impl EvictedRun {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn cursor_of(tenant: &TenantName, due: Timestamp, id: &EventId) -> DueCursor {
    DueCursor {
        due,
        key: EventKey::new(tenant.clone(), id.clone()),
    }
}

impl FairWindow {
    pub fn new() -> Self {
        Self::default()
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.held
    }

    pub fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// The cursor the loader continues from (exclusive).
    pub fn cursor(&self) -> Option<&DueCursor> {
        self.covered_through.as_ref()
    }

    /// Whether `entry` is covered: at or before the cursor, and not in its
    /// tenant's overflow (an internal entry never is).
    pub fn covers(&self, entry: &DueCursor) -> bool {
        let within = self.covered_through.as_ref().is_some_and(|c| entry <= c);
        within
            && (entry.key.id.is_internal()
                || self
                    .lanes
                    .get(&entry.key.tenant)
                    .and_then(|lane| lane.overflow.as_ref())
                    .is_none_or(|overflow| entry <= overflow))
    }

    pub fn contains(&self, entry: &DueCursor) -> bool {
        self.lanes
            .get(&entry.key.tenant)
            .is_some_and(|lane| lane.entries.contains(&(entry.due, entry.key.id.clone())))
    }

    /// Tenants with an overflow mark, with it.
    pub fn overflows(&self) -> impl Iterator<Item = (&TenantName, &DueCursor)> {
        self.lanes
            .iter()
            .filter_map(|(tenant, lane)| lane.overflow.as_ref().map(|o| (tenant, o)))
    }

    /// A tenant's overflow mark, if it has one.
    pub fn overflow_of(&self, tenant: &TenantName) -> Option<&DueCursor> {
        self.lanes
            .get(tenant)
            .and_then(|lane| lane.overflow.as_ref())
    }

    /// The held entry of `entry`'s tenant right before it, if any.
    pub fn lane_before(&self, entry: &DueCursor) -> Option<(Timestamp, EventId)> {
        self.lanes
            .get(&entry.key.tenant)?
            .entries
            .range(..(entry.due, entry.key.id.clone()))
            .next_back()
            .cloned()
    }

    /// Tenants marked blocked.
    pub fn blocked_tenants(&self) -> Vec<TenantName> {
        self.lanes
            .iter()
            .filter(|(_, lane)| lane.blocked)
            .map(|(tenant, _)| tenant.clone())
            .collect()
    }

    /// Blocked tenants holding more than `max` entries.
    pub fn blocked_over(&self, max: usize) -> Vec<TenantName> {
        self.lanes
            .iter()
            .filter(|(_, lane)| lane.blocked && lane.clients() > max)
            .map(|(tenant, _)| tenant.clone())
            .collect()
    }

    /// Client entries held for `tenant` (its internal ones not counted).
    pub fn held_by(&self, tenant: &TenantName) -> usize {
        self.lanes.get(tenant).map_or(0, Lane::clients)
    }

    pub fn is_blocked(&self, tenant: &TenantName) -> bool {
        self.lanes.get(tenant).is_some_and(|lane| lane.blocked)
    }

    /// Moves the cursor forward to `through` (never back).
    pub fn advance_cursor(&mut self, through: DueCursor) {
        if self.covered_through.as_ref().is_none_or(|c| &through > c) {
            self.covered_through = Some(through);
        }
    }

    /// Sets or clears a tenant's overflow mark.
    pub fn set_overflow(&mut self, tenant: &TenantName, overflow: Option<DueCursor>) {
        match overflow {
            Some(mark) => self.lane_mut(tenant).overflow = Some(mark),
            None => {
                if let Some(lane) = self.lanes.get_mut(tenant) {
                    lane.overflow = None;
                }
                self.drop_lane_if_idle(tenant);
            }
        }
    }

    /// Inserts a covered entry (or any entry when `force`: an entry the
    /// engine itself must retry). Returns whether it was inserted.
    pub fn insert(&mut self, entry: DueCursor, force: bool) -> bool {
        if !force && !self.covers(&entry) {
            return false;
        }
        let DueCursor { due, key } = entry;
        let old_head = self.lanes.get(&key.tenant).and_then(Lane::first);
        let old_internal = self.lanes.get(&key.tenant).and_then(Lane::first_internal);
        let lane = self.lane_mut(&key.tenant);
        let internal = key.id.is_internal();
        if internal {
            lane.internal.insert((due, key.id.clone()));
        }
        if !lane.entries.insert((due, key.id)) {
            return false;
        }
        self.held += 1;
        self.head_changed(&key.tenant, old_head);
        if internal {
            self.internal_changed(&key.tenant, old_internal);
        }
        true
    }

    /// Removes an entry; returns whether it was held.
    pub fn remove(&mut self, entry: &DueCursor) -> bool {
        let Some(lane) = self.lanes.get_mut(&entry.key.tenant) else {
            return false;
        };
        let old_head = lane.first();
        if !lane.entries.remove(&(entry.due, entry.key.id.clone())) {
            return false;
        }
        self.held -= 1;
        self.head_changed(&entry.key.tenant, old_head);
        self.forget_internal(&entry.key.tenant, entry.due, &entry.key.id);
        self.drop_lane_if_idle(&entry.key.tenant);
        true
    }

    /// Marks a tenant as (not) able to fire now; blocked tenants keep their
    /// entries but are skipped by [`FairWindow::pop_ready`].
    pub fn set_blocked(&mut self, tenant: &TenantName, blocked: bool) {
        let Some(lane) = self.lanes.get_mut(tenant) else {
            if blocked {
                self.lane_mut(tenant).blocked = true;
            }
            return;
        };
        if lane.blocked == blocked {
            return;
        }
        lane.blocked = blocked;
        if let Some(head) = lane.first() {
            if blocked {
                self.ready.remove(&(head, tenant.clone()));
            } else {
                self.ready.insert((head, tenant.clone()));
            }
        }
        if !blocked {
            self.drop_lane_if_idle(tenant);
        }
    }

    /// The earliest held entry of a tenant that may fire.
    pub fn next_ready(&self) -> Option<Timestamp> {
        self.ready.first().map(|(due, _)| *due)
    }

    /// The earliest held entry of any tenant.
    pub fn next_due(&self) -> Option<Timestamp> {
        self.heads.first().map(|(due, _)| *due)
    }

    /// Entries due at or before `now` (held, not fired yet: waiting for a
    /// slot, or their tenant is blocked), and the earliest instant among
    /// them. Walks only the overdue entries of each lane: for metrics,
    /// read a few times a minute.
    pub fn overdue(&self, now: Timestamp) -> (usize, Option<Timestamp>) {
        let oldest = self.next_due().filter(|due| *due <= now);
        if oldest.is_none() {
            return (0, None);
        }
        let count = self
            .heads
            .iter()
            .take_while(|(due, _)| *due <= now)
            .filter_map(|(_, tenant)| self.lanes.get(tenant))
            .map(|lane| {
                lane.entries
                    .iter()
                    .take_while(|(due, _)| *due <= now)
                    .count()
            })
            .sum();
        (count, oldest)
    }

    /// Removes and returns the earliest entry due at or before `now` among
    /// tenants that may fire.
    pub fn pop_ready(&mut self, now: Timestamp) -> Option<DueCursor> {
        let (due, tenant) = self.ready.first().cloned()?;
        if due > now {
            return None;
        }
        let lane = self.lanes.get_mut(&tenant)?;
        let (due, id) = lane.entries.pop_first()?;
        self.held -= 1;
        self.head_changed(&tenant, Some(due));
        self.forget_internal(&tenant, due, &id);
        let entry = cursor_of(&tenant, due, &id);
        self.drop_lane_if_idle(&tenant);
        Some(entry)
    }

    /// Removes and returns the earliest internal entry due at or before
    /// `now` of a blocked tenant: a lane held for its tenant's deliveries
    /// (paused, its endpoint failing, at its outstanding bound) still
    /// plans its schedules and sends its notices.
    pub fn pop_internal_held(&mut self, now: Timestamp) -> Option<DueCursor> {
        let (due, tenant, id) = self
            .internal_heads
            .iter()
            .take_while(|(due, _)| *due <= now)
            .find_map(|(_, tenant)| {
                let lane = self.lanes.get(tenant).filter(|lane| lane.blocked)?;
                let (due, id) = lane.internal.first()?;
                Some((*due, tenant.clone(), id.clone()))
            })?;
        let entry = cursor_of(&tenant, due, &id);
        self.remove(&entry);
        Some(entry)
    }

    /// The earliest internal entry of a blocked tenant (see
    /// [`FairWindow::pop_internal_held`]).
    pub fn next_internal_held(&self) -> Option<Timestamp> {
        self.internal_heads
            .iter()
            .find(|(_, tenant)| self.lanes.get(tenant).is_some_and(|lane| lane.blocked))
            .map(|(due, _)| *due)
    }

    /// Entries due at or before `through`, after the per-tenant marks given
    /// by `after` (exclusive), in due order per tenant, tenants in head
    /// order; at most `max`. Of a blocked tenant only the first
    /// `blocked_first` entries of its lane count: those fire first once it
    /// may fire again, while reading further into a hung tenant's backlog
    /// would fill the read-ahead with records that cannot fire. Of every
    /// tenant at most `budget(tenant)` entries are returned.
    pub fn due_through(
        &self,
        through: Timestamp,
        after: impl Fn(&TenantName) -> Option<(Timestamp, EventId)>,
        max: usize,
        blocked_first: usize,
        budget: impl Fn(&TenantName) -> usize,
    ) -> Vec<DueCursor> {
        let mut found = Vec::new();
        for (head, tenant) in &self.heads {
            if *head > through || found.len() >= max {
                break;
            }
            let Some(lane) = self.lanes.get(tenant) else {
                continue;
            };
            let allowed = budget(tenant);
            if allowed == 0 {
                continue;
            }
            let mark = after(tenant);
            let eligible = if lane.blocked {
                blocked_first
            } else {
                usize::MAX
            };
            let entries: Box<dyn Iterator<Item = &(Timestamp, EventId)>> = if lane.blocked {
                // At most `blocked_first` steps from the head, then skip
                // what was already requested.
                Box::new(
                    lane.entries
                        .iter()
                        .take(eligible)
                        .filter(move |e| mark.as_ref().is_none_or(|m| *e > m)),
                )
            } else {
                let start = match mark {
                    Some(mark) => Bound::Excluded(mark),
                    None => Bound::Unbounded,
                };
                Box::new(lane.entries.range((start, Bound::Unbounded)))
            };
            for (due, id) in entries.take(allowed) {
                if *due > through || found.len() >= max {
                    break;
                }
                found.push(cursor_of(tenant, *due, id));
            }
        }
        found
    }

    /// Evicts entries until at most `max` are held: always the latest
    /// entries of the tenant holding the most, whose overflow mark moves
    /// back so a per-tenant page brings them in again later. Each run of
    /// one tenant's evicted entries is passed to `evicted` (no cursor is
    /// built per entry: a hung tenant's lane may lose tens of thousands at
    /// once); returns how many were evicted.
    pub fn evict_to(
        &mut self,
        max: usize,
        evicted: &mut impl FnMut(&TenantName, EvictedRun),
    ) -> usize {
        let mut total = 0;
        while self.held > max {
            // The two largest lanes: evict the largest down to the second's
            // size (at least one entry), so a loop of few rounds suffices.
            // Ties go to the greatest tenant name: deterministic, whatever
            // the map's order.
            let mut largest: Option<(usize, &TenantName)> = None;
            let mut second = 0;
            for (tenant, lane) in &self.lanes {
                let candidate = (lane.clients(), tenant);
                match largest {
                    Some(top) if candidate <= top => second = second.max(candidate.0),
                    _ => {
                        if let Some((top, _)) = largest {
                            second = second.max(top);
                        }
                        largest = Some(candidate);
                    }
                }
            }
            let largest = largest.map(|(n, tenant)| (tenant, n));
            let Some((tenant, top)) = largest else { break };
            let tenant = tenant.clone();
            let count = (top - second).max(1).min(self.held - max);
            let n = self.evict_latest(&tenant, count, evicted);
            if n == 0 {
                break;
            }
            total += n;
        }
        total
    }

    /// Evicts a tenant's latest entries until it holds at most `max`; its
    /// overflow mark moves back as in [`FairWindow::evict_to`].
    pub fn evict_tenant_to(
        &mut self,
        tenant: &TenantName,
        max: usize,
        evicted: &mut impl FnMut(&TenantName, EvictedRun),
    ) -> usize {
        let excess = self.held_by(tenant).saturating_sub(max);
        if excess == 0 {
            return 0;
        }
        self.evict_latest(tenant, excess, evicted)
    }

    fn evict_latest(
        &mut self,
        tenant: &TenantName,
        count: usize,
        evicted: &mut impl FnMut(&TenantName, EvictedRun),
    ) -> usize {
        let Some(lane) = self.lanes.get_mut(tenant) else {
            return 0;
        };
        // The first entry evicted, walked to from the nearer end (a hung
        // tenant's lane keeps a few of many).
        let len = lane.entries.len();
        let first_evicted = match count {
            0 => None,
            // The `count`-th client entry from the end.
            n if !lane.internal.is_empty() => lane
                .entries
                .iter()
                .rev()
                .filter(|(_, id)| !id.is_internal())
                .take(n)
                .last(),
            n if n >= len => lane.entries.first(),
            n if n <= len / 2 => lane.entries.iter().nth_back(n - 1),
            n => lane.entries.iter().nth(len - n),
        };
        let Some(first_evicted) = first_evicted.cloned() else {
            return 0;
        };
        let old_head = lane.first();
        // One split instead of an entry-by-entry removal: a hung tenant's
        // lane may lose tens of thousands at once.
        let mut tail = lane.entries.split_off(&first_evicted);
        // The mark goes after the last client entry kept: internal entries
        // stay (they are few, and an overflow mark does not cover them).
        let last_kept = lane.entries.last().cloned();
        for kept in lane.internal.range(&first_evicted..) {
            tail.remove(kept);
            lane.entries.insert(kept.clone());
        }
        let n = tail.len();
        if n == 0 {
            return 0;
        }
        // Everything of this tenant after the last entry kept is the
        // per-tenant loader's again. With nothing kept, the mark goes just
        // before the earliest evicted instant (a reload may then re-read a
        // few entries at the instant before it: inserting is idempotent).
        let mark = match last_kept.as_ref() {
            Some((kept_due, kept_id)) => cursor_of(tenant, *kept_due, kept_id),
            None => DueCursor {
                due: first_evicted.0.minus(std::time::Duration::from_millis(1)),
                key: EventKey::before_all(),
            },
        };
        lane.overflow = Some(match lane.overflow.take() {
            Some(existing) if existing < mark => existing,
            _ => mark,
        });
        self.held -= n;
        self.head_changed(tenant, old_head);
        evicted(tenant, EvictedRun(tail));
        n
    }

    /// Drops everything, the cursor and every mark included.
    pub fn clear(&mut self) {
        *self = FairWindow::default();
    }

    fn lane_mut(&mut self, tenant: &TenantName) -> &mut Lane {
        self.lanes.entry(tenant.clone()).or_default()
    }

    fn head_changed(&mut self, tenant: &TenantName, old: Option<Timestamp>) {
        let Some(lane) = self.lanes.get(tenant) else {
            return;
        };
        let new = lane.first();
        if new == old {
            return;
        }
        if let Some(old) = old {
            self.heads.remove(&(old, tenant.clone()));
            self.ready.remove(&(old, tenant.clone()));
        }
        if let Some(new) = new {
            self.heads.insert((new, tenant.clone()));
            if !lane.blocked {
                self.ready.insert((new, tenant.clone()));
            }
        }
    }

    /// `(due, id)` left `tenant`'s lane: forgotten if it was internal.
    fn forget_internal(&mut self, tenant: &TenantName, due: Timestamp, id: &EventId) {
        if !id.is_internal() {
            return;
        }
        let Some(lane) = self.lanes.get_mut(tenant) else {
            return;
        };
        let old = lane.first_internal();
        if lane.internal.remove(&(due, id.clone())) {
            self.internal_changed(tenant, old);
        }
    }

    fn internal_changed(&mut self, tenant: &TenantName, old: Option<Timestamp>) {
        let new = self.lanes.get(tenant).and_then(Lane::first_internal);
        if new == old {
            return;
        }
        if let Some(old) = old {
            self.internal_heads.remove(&(old, tenant.clone()));
        }
        if let Some(new) = new {
            self.internal_heads.insert((new, tenant.clone()));
        }
    }

    fn drop_lane_if_idle(&mut self, tenant: &TenantName) {
        if self
            .lanes
            .get(tenant)
            .is_some_and(|lane| lane.entries.is_empty() && lane.overflow.is_none() && !lane.blocked)
        {
            self.lanes.remove(tenant);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(due: i64, tenant: &str, id: &str) -> DueCursor {
        DueCursor {
            due: Timestamp::from_millis(due),
            key: EventKey::new(TenantName::new(tenant).unwrap(), EventId::new(id).unwrap()),
        }
    }

    fn tenant(name: &str) -> TenantName {
        TenantName::new(name).unwrap()
    }

    #[test]
    fn pops_in_due_order_across_tenants_and_never_early() {
        let mut window = FairWindow::new();
        window.advance_cursor(entry(100, "~", "~"));
        for e in [entry(3, "b", "x"), entry(1, "a", "y"), entry(2, "a", "z")] {
            assert!(window.insert(e, false));
        }
        assert_eq!(window.pop_ready(Timestamp::from_millis(0)), None);
        let order: Vec<_> =
            std::iter::from_fn(|| window.pop_ready(Timestamp::from_millis(3))).collect();
        assert_eq!(
            order,
            [entry(1, "a", "y"), entry(2, "a", "z"), entry(3, "b", "x")]
        );
        assert!(window.is_empty());
    }

    #[test]
    fn overdue_counts_held_entries_past_their_instant_blocked_ones_too() {
        let mut window = FairWindow::new();
        window.advance_cursor(entry(100, "~", "~"));
        assert_eq!(window.overdue(Timestamp::from_millis(50)), (0, None));
        for e in [
            entry(5, "a", "x"),
            entry(9, "a", "y"),
            entry(60, "a", "z"),
            entry(7, "b", "w"),
        ] {
            window.insert(e, false);
        }
        window.set_blocked(&tenant("b"), true);
        assert_eq!(
            window.overdue(Timestamp::from_millis(8)),
            (2, Some(Timestamp::from_millis(5)))
        );
        assert_eq!(
            window.overdue(Timestamp::from_millis(59)),
            (3, Some(Timestamp::from_millis(5)))
        );
        assert_eq!(window.overdue(Timestamp::from_millis(4)), (0, None));
    }

    #[test]
    fn a_blocked_tenant_is_skipped_not_scanned() {
        let mut window = FairWindow::new();
        window.advance_cursor(entry(100, "~", "~"));
        for i in 0..1_000 {
            window.insert(entry(1, "hung", &format!("e{i}")), false);
        }
        window.insert(entry(5, "ok", "e"), false);
        window.set_blocked(&tenant("hung"), true);
        assert_eq!(window.next_ready(), Some(Timestamp::from_millis(5)));
        assert_eq!(
            window.pop_ready(Timestamp::from_millis(5)),
            Some(entry(5, "ok", "e"))
        );
        assert_eq!(window.pop_ready(Timestamp::from_millis(5)), None);
        window.set_blocked(&tenant("hung"), false);
        assert_eq!(
            window.pop_ready(Timestamp::from_millis(5)).map(|e| e.due),
            Some(Timestamp::from_millis(1))
        );
    }

    #[test]
    fn eviction_takes_the_largest_tenant_and_marks_its_overflow() {
        let mut window = FairWindow::new();
        window.advance_cursor(entry(100, "~", "~"));
        for i in 0..10 {
            window.insert(entry(i, "big", &format!("e{i:02}")), false);
        }
        window.insert(entry(50, "small", "s"), false);
        let mut evicted = Vec::new();
        let count = window.evict_to(6, &mut |tenant, run| {
            evicted.extend(run.0.iter().map(|(due, id)| cursor_of(tenant, *due, id)));
        });
        assert_eq!(count, 5);
        assert_eq!(evicted.len(), 5);
        assert!(evicted.iter().all(|e| e.key.tenant == tenant("big")));
        assert_eq!(window.held_by(&tenant("big")), 5);
        assert_eq!(window.held_by(&tenant("small")), 1);
        // The evicted entries are no longer covered; earlier ones are.
        assert!(!window.covers(&entry(7, "big", "e07")));
        assert!(window.covers(&entry(3, "big", "e03")));
        assert!(!window.insert(entry(9, "big", "e09"), false));
        // Other tenants are unaffected.
        assert!(window.insert(entry(60, "small", "t"), false));
    }

    #[test]
    fn cursor_never_moves_back_and_offers_beyond_it_are_left_to_the_loader() {
        let mut window = FairWindow::new();
        assert!(!window.insert(entry(5, "t", "a"), false));
        window.advance_cursor(entry(10, "t", "m"));
        window.advance_cursor(entry(5, "t", "a"));
        assert_eq!(window.cursor(), Some(&entry(10, "t", "m")));
        assert!(window.insert(entry(10, "t", "a"), false));
        assert!(!window.insert(entry(10, "t", "z"), false));
        assert!(window.insert(entry(11, "t", "z"), true), "forced");
    }

    fn internal(due: i64, tenant_name: &str, rest: &str) -> DueCursor {
        DueCursor {
            due: Timestamp::from_millis(due),
            key: EventKey::new(tenant(tenant_name), EventId::internal(rest).unwrap()),
        }
    }

    #[test]
    fn internal_entries_are_never_evicted_nor_behind_an_overflow_mark() {
        let mut window = FairWindow::new();
        window.advance_cursor(entry(100, "~", "~"));
        for e in [
            entry(1, "t", "a"),
            entry(2, "t", "b"),
            internal(3, "t", "notice/1"),
            entry(4, "t", "c"),
            internal(5, "t", "schedule/s"),
        ] {
            assert!(window.insert(e, false));
        }
        assert_eq!(window.held_by(&tenant("t")), 3, "client entries only");
        let mut runs = Vec::new();
        let evicted = window.evict_tenant_to(&tenant("t"), 1, &mut |_, run| runs.push(run.len()));
        assert_eq!(evicted, 2);
        assert_eq!(window.held_by(&tenant("t")), 1);
        // The mark is after the last client entry kept ("a"): "b" and "c"
        // come back by a page; the internal ones stay and stay covered.
        assert_eq!(window.overflow_of(&tenant("t")), Some(&entry(1, "t", "a")));
        assert!(!window.covers(&entry(4, "t", "c")));
        assert!(window.covers(&internal(9, "t", "notice/2")));
        assert!(window.contains(&internal(3, "t", "notice/1")));
        assert!(window.contains(&internal(5, "t", "schedule/s")));
        // Blocked, it fires only its internal entries, in due order.
        window.set_blocked(&tenant("t"), true);
        assert_eq!(window.pop_ready(Timestamp::from_millis(10)), None);
        assert_eq!(window.next_internal_held(), Some(Timestamp::from_millis(3)));
        assert_eq!(
            window.pop_internal_held(Timestamp::from_millis(10)),
            Some(internal(3, "t", "notice/1"))
        );
        assert_eq!(
            window.pop_internal_held(Timestamp::from_millis(10)),
            Some(internal(5, "t", "schedule/s"))
        );
        assert_eq!(window.pop_internal_held(Timestamp::from_millis(10)), None);
        assert_eq!(window.next_internal_held(), None);
        window.set_blocked(&tenant("t"), false);
        assert_eq!(
            window.pop_ready(Timestamp::from_millis(10)),
            Some(entry(1, "t", "a"))
        );
        assert!(window.is_empty());
    }
}
