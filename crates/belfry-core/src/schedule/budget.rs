//! A tenant's budget of schedule occurrences per minute.
//!
//! Every occurrence is a stored event carrying the schedule's payload and,
//! later, a delivery; 10,000 schedules firing every second would be
//! 600,000 of each a minute from one tenant, all within its pending quota
//! (each schedule keeps only a few pending). So a tenant's schedules share
//! a budget of occurrences per minute, enforced twice:
//!
//! - **when a schedule is created or changed**: the tenant's schedules may
//!   together reach at most the budget in one minute, each counted at its
//!   peak ([`rate_of`]: `@every 1s` is 60, `0 * * * *` is 1, `*/10 * * * *
//!   ?` is 6); a schedule that would pass it is refused. Counted over the
//!   tenant's live schedules, paused ones included (resuming one needs no
//!   check);
//! - **when schedules fire** ([`spend`]): a token bucket per tenant and
//!   node ([`OccurrenceBudget`]) holding a minute's budget, refilled
//!   continuously. Occurrences to deliver that find no token are not
//!   created; the schedule counts them in
//!   [`MissedSummary::over_budget`](super::MissedSummary) and goes on. This
//!   is what holds when the creation check could not (a budget lowered
//!   after the schedules were made, schedules created through several
//!   nodes at once, a catch-up after downtime).

use super::{Fate, Plan, Schedule, ScheduleStatus};
use crate::cron::CronSpec;
use crate::time::Timestamp;

/// The most occurrences `schedule` can have in one minute, counted against
/// its tenant's budget: zero once it has none left to create (completed
/// or deleted).
pub fn rate_of(schedule: &Schedule, spec: &CronSpec) -> u64 {
    match schedule.status {
        ScheduleStatus::Active | ScheduleStatus::Paused => spec.most_per_minute(),
        ScheduleStatus::Completed | ScheduleStatus::Deleted => 0,
    }
}

/// Whether a tenant whose schedules reach `current` occurrences a minute
/// may change one schedule from `old` to `new` under a budget of
/// `per_minute` (0: none). Lowering is always allowed.
pub fn fits(current: u64, old: u64, new: u64, per_minute: u64) -> bool {
    per_minute == 0 || new <= old || current.saturating_sub(old).saturating_add(new) <= per_minute
}

/// One tenant's occurrence tokens on one node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OccurrenceBudget {
    per_minute: u64,
    tokens: f64,
    at: Timestamp,
}

impl OccurrenceBudget {
    /// A full minute's budget at `now`.
    pub fn new(per_minute: u64, now: Timestamp) -> Self {
        OccurrenceBudget {
            per_minute,
            tokens: per_minute as f64,
            at: now,
        }
    }

    /// Takes up to `want` tokens at `now`; returns how many it got.
    pub fn take(&mut self, want: u64, now: Timestamp) -> u64 {
        let elapsed_ms = now.as_millis().saturating_sub(self.at.as_millis()).max(0);
        let capacity = self.per_minute as f64;
        self.tokens = (self.tokens + elapsed_ms as f64 * capacity / 60_000.0).min(capacity);
        self.at = self.at.max(now);
        // Whole tokens only; a hair below a whole one after float
        // refills still counts as whole.
        let whole = (self.tokens + 1e-6).floor().max(0.0) as u64;
        let granted = want.min(whole);
        self.tokens = (self.tokens - granted as f64).max(0.0);
        granted
    }

    /// Whether it is full at `now` (it may then be forgotten).
    pub fn is_full(&self, now: Timestamp) -> bool {
        let elapsed_ms = now.as_millis().saturating_sub(self.at.as_millis()).max(0);
        self.tokens + elapsed_ms as f64 * self.per_minute as f64 / 60_000.0
            >= self.per_minute as f64
    }
}

/// Fits one firing's plan into its tenant's budget: its occurrences to
/// deliver take a token each, in instant order; those left without one are
/// removed from the plan and counted in the schedule's
/// `missed.over_budget`. Occurrences already planned as missed take no
/// token (they are never delivered, and a firing records at most
/// [`super::PlanLimits::max_missed_recorded`] of them). Returns how many
/// were removed.
pub fn spend(plan: &mut Plan, budget: &mut OccurrenceBudget, now: Timestamp) -> u64 {
    let wanted = plan
        .occurrences
        .iter()
        .filter(|o| o.fate == Fate::Deliver)
        .count() as u64;
    if wanted == 0 {
        return 0;
    }
    let mut left = budget.take(wanted, now);
    plan.occurrences.retain(|occurrence| match occurrence.fate {
        Fate::Missed => true,
        Fate::Deliver if left > 0 => {
            left -= 1;
            true
        }
        Fate::Deliver => false,
    });
    let kept = plan
        .occurrences
        .iter()
        .filter(|o| o.fate == Fate::Deliver)
        .count() as u64;
    let removed = wanted - kept;
    plan.schedule.progress.missed.over_budget += removed;
    removed
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cron::CronKind;
    use crate::schedule::{PlanLimits, plan};

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn spec(expression: &str, kind: CronKind) -> CronSpec {
        CronSpec::parse(expression, kind, None).unwrap()
    }

    #[test]
    fn a_schedule_counts_at_its_peak_minute() {
        assert_eq!(spec("@every 1s", CronKind::Every).most_per_minute(), 60);
        assert_eq!(spec("@every 7s", CronKind::Every).most_per_minute(), 9);
        assert_eq!(spec("@every 1h", CronKind::Every).most_per_minute(), 1);
        assert_eq!(spec("0 * * * *", CronKind::Unix).most_per_minute(), 1);
        assert_eq!(spec("* * * * *", CronKind::Unix).most_per_minute(), 1);
        assert_eq!(
            spec("*/10 * * * * ?", CronKind::Quartz).most_per_minute(),
            6
        );
        assert_eq!(spec("* * 9 * * *", CronKind::Spring).most_per_minute(), 60);
    }

    #[test]
    fn a_change_fits_unless_it_raises_the_total_past_the_budget() {
        assert!(fits(590, 0, 10, 600));
        assert!(!fits(595, 0, 10, 600));
        assert!(fits(595, 60, 10, 600), "lowering always fits");
        assert!(fits(900, 10, 60, 0), "0: no budget");
        assert!(!fits(600, 1, 60, 600));
    }

    #[test]
    fn tokens_refill_a_minute_s_budget_per_minute() {
        let mut budget = OccurrenceBudget::new(120, at(0));
        assert_eq!(budget.take(100, at(0)), 100);
        assert_eq!(budget.take(100, at(0)), 20);
        assert_eq!(budget.take(5, at(0)), 0);
        // Two a second.
        assert_eq!(budget.take(5, at(1_000)), 2);
        assert!(!budget.is_full(at(1_000)));
        assert!(budget.is_full(at(61_000)));
        assert_eq!(
            budget.take(500, at(600_000)),
            120,
            "never more than a minute's"
        );
    }

    #[test]
    fn occurrences_past_the_budget_are_counted_not_created() {
        let every = spec("@every 1s", CronKind::Every);
        let schedule = Schedule {
            id: crate::schedule::ScheduleId::new("tick").unwrap(),
            expression: "@every 1s".to_string(),
            kind: "EVERY".to_string(),
            time_zone: "UTC".to_string(),
            payload: None,
            delivery: crate::event::DeliveryOption::FullEvent,
            start_at: None,
            end_at: None,
            max_occurrences: None,
            misfire: crate::schedule::MisfirePolicy::FireOnce,
            catch_up_window: crate::schedule::DEFAULT_CATCH_UP_WINDOW,
            status: ScheduleStatus::Active,
            created_at: at(0),
            updated_at: at(0),
            progress: crate::schedule::Progress::starting_after(at(0)),
            settings: Default::default(),
        };
        let limits = PlanLimits {
            lead: Duration::from_secs(5),
            ..PlanLimits::default()
        };
        let mut budget = OccurrenceBudget::new(3, at(0));
        let mut first = plan(&schedule, &every, at(0), limits);
        assert_eq!(first.occurrences.len(), 5, "1 s to 5 s");
        assert_eq!(spend(&mut first, &mut budget, at(0)), 2);
        let kept: Vec<_> = first.occurrences.iter().map(|o| o.at).collect();
        assert_eq!(
            kept,
            vec![at(1_000), at(2_000), at(3_000)],
            "in instant order"
        );
        assert_eq!(first.schedule.progress.missed.over_budget, 2);
        // The schedule goes on after them; 20 s later one token is back.
        let mut second = plan(&first.schedule, &every, at(20_000), limits);
        assert_eq!(second.occurrences.len(), 20, "6 s to 25 s");
        assert_eq!(spend(&mut second, &mut budget, at(20_000)), 19);
        assert_eq!(second.occurrences.len(), 1);
        assert_eq!(second.schedule.progress.missed.over_budget, 21);
    }
}
