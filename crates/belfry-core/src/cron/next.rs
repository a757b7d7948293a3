//! The next-fire search.
//!
//! A zone's timeline is a chain of *segments*: stretches of real time with
//! one constant UTC offset, separated by transitions. Inside a segment local
//! time runs straight, so "the first local time that matches, mapped back
//! with this segment's offset" is the answer there. The search walks
//! segments forward from the requested instant:
//!
//! 1. at a segment's start after a spring-forward gap, a fixed-time job
//!    whose pattern matches a local time inside the gap fires once, at the
//!    transition instant;
//! 2. inside the segment, croner finds the first matching local time at or
//!    after the lower bound; a fixed-time job's lower bound skips the local
//!    times the previous segment already lived through (the second pass of a
//!    fold);
//! 3. a match beyond the segment's local end belongs to a later segment:
//!    step to it (or jump close to the match when it is far away).
//!
//! croner is only ever asked about local civil time, where no DST exists.

use jiff::civil::DateTime;
use jiff::tz::{Offset, TimeZone};
use jiff::{SignedDuration, Timestamp as JiffTimestamp};

use super::expr::{CalendarRule, CronSpec, FoldPolicy, GapPolicy, IntervalRule, Rule};
use crate::time::Timestamp;

/// A bound on segments visited per search. Each visit is one croner call;
/// DST zones have two segments a year, so this covers ~5,000 years of
/// stepping, and far matches are reached by jumping anyway.
const MAX_SEGMENT_VISITS: u32 = 10_000;
/// More than any UTC offset (jiff caps them below 26 h): a local time `c`
/// always names an instant within `c ± OFFSET_BOUND` read as UTC.
const OFFSET_BOUND_SECS: i64 = 26 * 3_600;
/// A match this far past the current segment is reached by a jump.
const JUMP_THRESHOLD_SECS: i64 = 7 * 86_400;

impl CronSpec {
    /// The first occurrence strictly after `after`, or `None` when the
    /// schedule has no more (a Quartz year in the past, or beyond year 9999).
    ///
    /// # Contract
    /// Calendar occurrences are whole seconds and follow the DST rules in the
    /// [module doc](super); interval occurrences are `anchor + k × period`.
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        match &self.rule {
            Rule::Interval(interval) => next_interval(interval, after),
            Rule::Calendar(calendar) => next_calendar(calendar, &self.zone, after),
        }
    }
}

fn next_interval(interval: &IntervalRule, after: Timestamp) -> Option<Timestamp> {
    let anchor = i128::from(interval.anchor.as_millis());
    let period = i128::from(interval.period_ms);
    let elapsed = i128::from(after.as_millis()) - anchor;
    let steps = elapsed.div_euclid(period) + 1;
    let next = anchor + steps * period;
    i64::try_from(next).ok().map(Timestamp::from_millis)
}

/// One constant-offset stretch of a zone's timeline, in whole seconds.
struct Segment {
    /// The transition that began it; `None` before the zone's first one.
    start: Option<i64>,
    /// The offset in force before `start`.
    previous_offset: Option<Offset>,
    offset: Offset,
    /// The next transition; `None` after the zone's last one.
    end: Option<i64>,
}

impl Segment {
    fn containing(zone: &TimeZone, second: i64) -> Option<Segment> {
        let instant = JiffTimestamp::from_second(second).ok()?;
        let offset = zone.to_offset(instant);
        // `preceding` is strictly before its argument: nudge past `instant`
        // so a transition exactly at `instant` counts as this segment's start.
        let just_after = instant.checked_add(SignedDuration::from_nanos(1)).ok()?;
        let start = zone.preceding(just_after).next().map(|t| t.timestamp());
        let previous_offset = start
            .and_then(|start| start.checked_sub(SignedDuration::from_nanos(1)).ok())
            .map(|before| zone.to_offset(before));
        let end = zone.following(instant).next().map(|t| t.timestamp());
        Some(Segment {
            start: start.map(|t| t.as_second()),
            previous_offset,
            offset,
            end: end.map(|t| t.as_second()),
        })
    }
}

fn next_calendar(rule: &CalendarRule, zone: &TimeZone, after: Timestamp) -> Option<Timestamp> {
    // Occurrences are whole seconds: the first candidate is the next one.
    let mut from = after.as_millis().div_euclid(1_000) + 1;
    for _ in 0..MAX_SEGMENT_VISITS {
        let segment = Segment::containing(zone, from)?;

        // 1. A fixed-time run displaced by the spring-forward gap that
        //    ends exactly where this segment starts.
        if let (Some(start), Some(previous)) = (segment.start, segment.previous_offset)
            && rule.gap == GapPolicy::FireAtTransition
            && start == from
            && previous.seconds() < segment.offset.seconds()
        {
            let gap_begin = civil(start, previous)?;
            let gap_end = civil(start, segment.offset)?;
            if first_match_at_or_after(rule, gap_begin).is_some_and(|m| m < gap_end) {
                return Some(Timestamp::from_millis(start * 1_000));
            }
        }

        // 2. The first local match inside this segment.
        let mut lower = civil(from, segment.offset)?;
        if rule.fold == FoldPolicy::FirstInstant
            && let (Some(start), Some(previous)) = (segment.start, segment.previous_offset)
            && previous.seconds() > segment.offset.seconds()
        {
            // The local times [start+offset, start+previous) were already
            // lived through before the fall-back; a fixed-time job ran then.
            lower = lower.max(civil(start, previous)?);
        }
        let found = first_match_at_or_after(rule, lower)?;
        let found_instant = instant(found, segment.offset)?;
        let inside = segment.end.is_none_or(|end| found_instant < end);
        if inside {
            if rule.fold == FoldPolicy::FirstInstant
                && !is_first_instant(zone, found, found_instant)
            {
                // Only when transitions crowd closer than a fold's length.
                from = found_instant + 1;
                continue;
            }
            return Some(Timestamp::from_millis(found_instant.checked_mul(1_000)?));
        }

        // 3. The match lies in a later segment.
        let end = segment.end?;
        let naive = found.to_zoned(TimeZone::UTC).ok()?.timestamp().as_second();
        let jump_to = naive - OFFSET_BOUND_SECS;
        let next_is_fold = zone
            .to_offset(JiffTimestamp::from_second(end).ok()?)
            .seconds()
            < segment.offset.seconds();
        // Everything before `found` in local time has no match, and every
        // segment and gap that ends before `jump_to` lies wholly before
        // `found` in local time. The fold right after this segment may repeat
        // local times below `lower`, so it is always visited.
        from = if !next_is_fold && jump_to > end + JUMP_THRESHOLD_SECS {
            jump_to
        } else {
            end
        };
    }
    None
}

/// croner's first local match at or after `at` (inclusive); `None` when it
/// finds none before its search limit (year 5000).
fn first_match_at_or_after(rule: &CalendarRule, at: DateTime) -> Option<DateTime> {
    rule.cron.find_next_occurrence(&at, true).ok()
}

fn civil(second: i64, offset: Offset) -> Option<DateTime> {
    let instant = JiffTimestamp::from_second(second).ok()?;
    Some(offset.to_datetime(instant))
}

fn instant(local: DateTime, offset: Offset) -> Option<i64> {
    offset.to_timestamp(local).ok().map(|t| t.as_second())
}

/// Whether `instant` is the earliest instant the zone gives `local`.
fn is_first_instant(zone: &TimeZone, local: DateTime, instant: i64) -> bool {
    zone.to_ambiguous_timestamp(local)
        .earlier()
        .is_ok_and(|earliest| earliest.as_second() == instant)
}
