//! Recurring-schedule expressions and their next-fire computation.
//!
//! A [`CronSpec`] is parsed from `(expression, kind, time zone)` and answers
//! one question: *when does it fire next, strictly after this instant?*
//! ([`CronSpec::next_after`], [`CronSpec::occurrences_after`]). It also
//! describes itself in English ([`CronSpec::describe`]), and
//! [`OccurrenceId`] names each firing deterministically.
//!
//! # Layout
//! - `expr`: kinds, parsing, validation, [`CronSpec`] itself;
//! - `next`: the next-fire search and its DST rules;
//! - `describe`: English descriptions;
//! - `occurrence`: occurrence ids.
//!
//! # Kinds
//! | kind | fields | notes |
//! |---|---|---|
//! | `UNIX` | 5: minute hour day-of-month month day-of-week | Sunday is 0 or 7; when both day fields are restricted, either may match (Vixie cron) |
//! | `QUARTZ` | 6–7: second minute hour day-of-month month day-of-week \[year\] | Sunday is 1; `?`, `L`, `W`, `#`; one day field must be `?` or `*` |
//! | `SPRING` | 6: second minute hour day-of-month month day-of-week | Sunday is 0 or 7; both day fields must match |
//! | `CRON4J` | 5, like `UNIX` | both day fields must match; `|` lists and other extensions are rejected |
//! | `EVERY` | `@every 30s`, `@every 1h30m` | a fixed period in real time |
//!
//! Every kind also accepts the macros `@yearly`/`@annually`, `@monthly`,
//! `@weekly`, `@daily`/`@midnight`, `@hourly` (midnight and minute 0 in the
//! schedule's zone) and `@every <duration>`.
//!
//! # Time zones and daylight-saving time
//! Calendar expressions are matched against the local time of the spec's
//! IANA zone (UTC by default). Local time is not a straight line: on a
//! spring-forward day some local times never happen (the *gap*), on a
//! fall-back day some happen twice (the *fold*). Belfry's rules, chosen so
//! that no run is lost or doubled:
//!
//! - **Fixed-time jobs** (the hour field is not `*`, e.g. `30 2 * * *`) fire
//!   exactly once per matching local time:
//!   - a time in the gap fires once at the first instant after the gap
//!     (`02:30` in Europe/Berlin on 2027-03-28 fires at `03:00` CEST); several
//!     gap times, or a gap time and the time right after the gap, collapse
//!     into that one run;
//!   - a time in the fold fires at its *first* instant only (`01:30` in
//!     America/New_York on 2027-11-07 fires at `01:30` EDT, not again at
//!     `01:30` EST).
//! - **Jobs that repeat within the hour or run every hour** keep their rhythm
//!   in real time through both transitions:
//!   - every hour (the hour field is `*`, e.g. `0 * * * *`, `*/15 * * * *`,
//!     `*/5 * * * * ?`): a gap time is skipped, because the real hour after
//!     the gap carries the same minutes, and a fold time fires at *both*
//!     instants, because both are real hours. So `0 * * * *` fires every real
//!     hour (twice at local `01:00` on a New York fall-back day) and
//!     `*/15 * * * *` every 15 real minutes: no hour-long pause, no doubled
//!     run. (For the rare zones whose shift is not a whole hour, e.g.
//!     Australia/Lord_Howe, this is still the rule, but the rhythm then
//!     bends by the size of the shift.)
//!   - a job restricted to some hours but repeating within them (more than
//!     one second/minute combination per hour, e.g. `*/15 0-5 * * *`) fires
//!     at both instants of a fold time, and its gap times collapse into one
//!     run at the first instant after the gap.
//! - **Interval schedules** (`@every`) are anchored in real time (from the
//!   Unix epoch unless [`CronSpec::with_anchor`] says otherwise) and ignore
//!   zones and DST altogether.
//!
//! croner 4 (used here to parse expressions and to search local calendar
//! time) has DST rules of its own, and they differ: it calls a job
//! fixed-time only when second, minute and hour are each a single value, so
//! on a spring-forward day `30 2,14 * * *` loses its 02:30 run and
//! `*/15 2 * * *` loses the whole day (both tested in `tests`). Belfry
//! therefore asks croner only for matches in *local civil time* (where no
//! DST exists) and maps them to instants itself, one constant-offset stretch
//! of the zone's timeline at a time (see `next`). On ordinary days the two
//! agree (a property test checks it).
//!
//! # Occurrence ids
//! See [`OccurrenceId`]: `"{schedule_id}@{instant}"` with the instant in
//! RFC 3339 UTC, e.g. `nightly-report@2027-03-28T01:00:00Z`.

mod describe;
mod expr;
mod next;
mod occurrence;

#[cfg(test)]
mod oracle_tests;
#[cfg(test)]
mod tests;

pub use expr::{CronError, CronKind, CronSpec, Occurrences};
pub use occurrence::OccurrenceId;
