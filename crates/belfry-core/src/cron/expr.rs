//! Parsing `(expression, kind, time zone)` into a [`CronSpec`].

use std::fmt;
use std::str::FromStr;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::tz::TimeZone;

use crate::time::Timestamp;

/// Longest expression accepted; real ones are a few dozen characters.
const MAX_EXPRESSION_LEN: usize = 256;
/// Shortest `@every` period: a sub-second schedule is a load test, not a job.
const MIN_INTERVAL_MS: i64 = 1_000;
/// Longest `@every` period (about ten years), so sums cannot overflow.
const MAX_INTERVAL_MS: i64 = 10 * 366 * 24 * 3_600_000;

/// Why an expression, kind or zone was refused. Every message is safe to
/// return to a client: it names the problem and echoes only a bounded piece
/// of the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    #[error("cron expression is empty")]
    Empty,
    #[error("cron expression is longer than {MAX_EXPRESSION_LEN} characters")]
    TooLong,
    #[error("unknown cron type '{0}': expected UNIX, QUARTZ, SPRING, CRON4J or EVERY")]
    UnknownKind(String),
    #[error("{kind} expressions have {expected}, got {got} fields in '{expression}'{hint}")]
    FieldCount {
        kind: CronKind,
        expected: &'static str,
        got: usize,
        expression: String,
        hint: &'static str,
    },
    #[error("invalid {kind} expression '{expression}': {reason}")]
    Invalid {
        kind: CronKind,
        expression: String,
        reason: String,
    },
    #[error("{kind} expression '{expression}' uses {feature}, which is not supported")]
    Unsupported {
        kind: CronKind,
        expression: String,
        feature: &'static str,
    },
    #[error(
        "unknown macro '{0}': expected @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly or @every <duration>"
    )]
    UnknownMacro(String),
    #[error(
        "invalid interval '{0}': expected '@every' and a duration such as 30s, 5m, 1h30m or 1d (units d, h, m, s, ms)"
    )]
    InvalidInterval(String),
    #[error("interval '{0}' is out of range: it must be between 1 second and 3660 days")]
    IntervalOutOfRange(String),
    #[error("unknown time zone '{0}': expected an IANA name such as Europe/Berlin, or UTC")]
    UnknownTimeZone(String),
    #[error("cron expression '{0}' never matches any date")]
    NeverMatches(String),
}

/// The syntax family of an expression (BigBen's `type`, plus `EVERY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CronKind {
    /// 5 fields, minute resolution, Sunday = 0 or 7, day fields OR-ed.
    Unix,
    /// 6–7 fields with seconds and an optional year, Sunday = 1.
    Quartz,
    /// 6 fields with seconds, Sunday = 0 or 7, day fields AND-ed.
    Spring,
    /// 5 fields like UNIX, day fields AND-ed; no `|` lists.
    Cron4j,
    /// `@every <duration>`.
    Every,
}

impl CronKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CronKind::Unix => "UNIX",
            CronKind::Quartz => "QUARTZ",
            CronKind::Spring => "SPRING",
            CronKind::Cron4j => "CRON4J",
            CronKind::Every => "EVERY",
        }
    }
}

impl fmt::Display for CronKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CronKind {
    type Err = CronError;

    /// Case-insensitive; `INTERVAL` is an alias of `EVERY`.
    fn from_str(text: &str) -> Result<Self, CronError> {
        match text.trim().to_ascii_uppercase().as_str() {
            "UNIX" => Ok(CronKind::Unix),
            "QUARTZ" => Ok(CronKind::Quartz),
            "SPRING" => Ok(CronKind::Spring),
            "CRON4J" => Ok(CronKind::Cron4j),
            "EVERY" | "INTERVAL" => Ok(CronKind::Every),
            _ => Err(CronError::UnknownKind(clip(text))),
        }
    }
}

/// A parsed, validated recurring schedule: what fires when, in which zone.
#[derive(Clone)]
pub struct CronSpec {
    /// The expression as given (trimmed, inner whitespace collapsed).
    pub(super) expression: String,
    pub(super) kind: CronKind,
    pub(super) zone_name: String,
    pub(super) zone: TimeZone,
    pub(super) rule: Rule,
}

impl fmt::Debug for CronSpec {
    /// The inputs only: croner's parsed bit fields are thousands of lines.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CronSpec")
            .field("expression", &self.expression)
            .field("kind", &self.kind)
            .field("time_zone", &self.zone_name)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
pub(super) enum Rule {
    // Boxed: a parsed croner pattern is large, an interval two words.
    Calendar(Box<CalendarRule>),
    Interval(IntervalRule),
}

/// A calendar expression: croner matches local civil time; the DST
/// policies decide how civil matches become instants (see the module doc).
#[derive(Debug, Clone)]
pub(super) struct CalendarRule {
    pub(super) cron: Cron,
    /// Normalized fields for descriptions: second, minute, hour,
    /// day-of-month, month, day-of-week, and the year if any.
    pub(super) fields: Fields,
    /// Day-of-week numbers start at Sunday = 1 (Quartz) instead of 0.
    pub(super) quartz_weekdays: bool,
    /// What a matching local time inside a spring-forward gap does.
    pub(super) gap: GapPolicy,
    /// What a matching local time inside a fall-back fold does.
    pub(super) fold: FoldPolicy,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Fields {
    pub(super) second: String,
    pub(super) minute: String,
    pub(super) hour: String,
    pub(super) day_of_month: String,
    pub(super) month: String,
    pub(super) day_of_week: String,
    pub(super) year: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GapPolicy {
    /// Every-hour jobs: the real hour after the gap has the same minutes.
    Skip,
    /// Other jobs: one run at the first instant after the gap.
    FireAtTransition,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FoldPolicy {
    /// Jobs that run every hour or repeat within the hour: both real hours.
    BothInstants,
    /// Fixed-time jobs: once, at the earlier instant.
    FirstInstant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct IntervalRule {
    pub(super) period_ms: i64,
    /// Occurrences are `anchor + k × period`.
    pub(super) anchor: Timestamp,
}

impl CronSpec {
    /// Parses `expression` of `kind` in the IANA zone `time_zone` (UTC when
    /// `None` or blank).
    ///
    /// # Errors
    /// A [`CronError`] naming what is wrong: field count, a field's syntax, a
    /// feature the kind does not have, an unknown zone, an expression that
    /// never matches any date.
    pub fn parse(
        expression: &str,
        kind: CronKind,
        time_zone: Option<&str>,
    ) -> Result<CronSpec, CronError> {
        let (zone_name, zone) = resolve_zone(time_zone)?;
        if expression.len() > MAX_EXPRESSION_LEN {
            return Err(CronError::TooLong);
        }
        let normalized = expression.split_whitespace().collect::<Vec<_>>().join(" ");
        if normalized.is_empty() {
            return Err(CronError::Empty);
        }
        let rule = parse_rule(&normalized, kind)?;
        let spec = CronSpec {
            expression: normalized,
            kind,
            zone_name,
            zone,
            rule,
        };
        // A pattern like `0 0 30 2 *` parses but can never fire; say so now
        // rather than storing a schedule that silently never runs.
        if spec.next_after(Timestamp::from_millis(0)).is_none() && spec.has_no_year_field() {
            return Err(CronError::NeverMatches(clip(&spec.expression)));
        }
        Ok(spec)
    }

    /// Sets the instant interval schedules count from (default: the Unix
    /// epoch, so `@every 30s` fires at :00 and :30 of every minute).
    /// Calendar schedules ignore it.
    #[must_use]
    pub fn with_anchor(mut self, anchor: Timestamp) -> CronSpec {
        if let Rule::Interval(interval) = &mut self.rule {
            interval.anchor = anchor;
        }
        self
    }

    /// The expression as given, whitespace normalized.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    pub fn kind(&self) -> CronKind {
        self.kind
    }

    /// The IANA name of the zone local times are read in (`UTC` by default).
    pub fn time_zone_name(&self) -> &str {
        &self.zone_name
    }

    /// The zone itself, e.g. to render an occurrence in local time.
    pub fn time_zone(&self) -> &TimeZone {
        &self.zone
    }

    /// Whether this is an `@every` schedule (real-time period, no zone).
    pub fn is_interval(&self) -> bool {
        matches!(self.rule, Rule::Interval(_))
    }

    /// The most occurrences it can have in one minute: the seconds its
    /// seconds field matches (one without a seconds field), or an
    /// interval's occurrences per minute, rounded up. What a tenant's
    /// schedule budget counts (see `crate::schedule::budget`).
    pub fn most_per_minute(&self) -> u64 {
        match &self.rule {
            Rule::Calendar(calendar) => {
                let pattern = &calendar.cron.pattern;
                let seconds = (0..60)
                    .filter(|second| pattern.second_match(*second).unwrap_or(false))
                    .count();
                (seconds as u64).max(1)
            }
            Rule::Interval(interval) => {
                let period = u64::try_from(interval.period_ms.max(1)).unwrap_or(1);
                60_000u64.div_ceil(period)
            }
        }
    }

    /// An iterator over the occurrences strictly after `after`, in order.
    pub fn occurrences_after(&self, after: Timestamp) -> Occurrences<'_> {
        Occurrences {
            spec: self,
            cursor: after,
        }
    }

    fn has_no_year_field(&self) -> bool {
        match &self.rule {
            Rule::Calendar(calendar) => calendar.fields.year.is_none(),
            Rule::Interval(_) => true,
        }
    }
}

/// The occurrences of a [`CronSpec`] after an instant; see
/// [`CronSpec::occurrences_after`]. Ends when the schedule has no more.
#[derive(Debug, Clone)]
pub struct Occurrences<'a> {
    spec: &'a CronSpec,
    cursor: Timestamp,
}

impl Iterator for Occurrences<'_> {
    type Item = Timestamp;

    fn next(&mut self) -> Option<Timestamp> {
        let next = self.spec.next_after(self.cursor)?;
        self.cursor = next;
        Some(next)
    }
}

fn resolve_zone(time_zone: Option<&str>) -> Result<(String, TimeZone), CronError> {
    let name = time_zone.map(str::trim).filter(|name| !name.is_empty());
    let Some(name) = name else {
        return Ok(("UTC".to_owned(), TimeZone::UTC));
    };
    if name.len() > 64 {
        return Err(CronError::UnknownTimeZone(clip(name)));
    }
    // Only IANA names: jiff would also accept POSIX TZ strings and paths
    // through other constructors, but `get` looks up the database alone.
    match jiff::tz::db().get(name) {
        Ok(zone) => Ok((zone.iana_name().unwrap_or(name).to_owned(), zone)),
        Err(_) => Err(CronError::UnknownTimeZone(clip(name))),
    }
}

fn parse_rule(expression: &str, kind: CronKind) -> Result<Rule, CronError> {
    if let Some(rest) = strip_prefix_ignore_case(expression, "@every") {
        return parse_interval(expression, rest).map(Rule::Interval);
    }
    if kind == CronKind::Every {
        // Also accept the bare duration: `--type every 30s`.
        return parse_interval(expression, expression).map(Rule::Interval);
    }
    if expression.starts_with('@') {
        let fields = macro_fields(expression)?;
        // Macros mean the same in every kind; parse them as UNIX.
        return parse_calendar(fields, CronKind::Unix, expression)
            .map(|rule| Rule::Calendar(Box::new(rule)));
    }
    parse_calendar(expression, kind, expression).map(|rule| Rule::Calendar(Box::new(rule)))
}

fn macro_fields(expression: &str) -> Result<&'static str, CronError> {
    match expression.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => Ok("0 0 1 1 *"),
        "@monthly" => Ok("0 0 1 * *"),
        "@weekly" => Ok("0 0 * * 0"),
        "@daily" | "@midnight" => Ok("0 0 * * *"),
        "@hourly" => Ok("0 * * * *"),
        _ => Err(CronError::UnknownMacro(clip(expression))),
    }
}

fn parse_calendar(
    fields_text: &str,
    kind: CronKind,
    original: &str,
) -> Result<CalendarRule, CronError> {
    let parts: Vec<&str> = fields_text.split(' ').collect();
    let field_count_error = |expected, hint| CronError::FieldCount {
        kind,
        expected,
        got: parts.len(),
        expression: clip(original),
        hint,
    };
    if kind == CronKind::Cron4j && fields_text.contains('|') {
        // Checked before the field count, which `|` lists would confuse.
        return Err(CronError::Unsupported {
            kind,
            expression: clip(original),
            feature: "several patterns joined with '|' (create one schedule per pattern)",
        });
    }
    // An empty list item (`,`, `1,,2`) leaves a field matching nothing;
    // proving that such an expression never fires took seconds of search.
    if let Some(field) = parts
        .iter()
        .find(|field| field.split(',').any(str::is_empty))
    {
        return Err(CronError::Invalid {
            kind,
            expression: clip(original),
            reason: format!("field '{}' has an empty list item", clip(field)),
        });
    }
    let (parser, fields) = match kind {
        CronKind::Unix | CronKind::Cron4j => {
            if parts.len() != 5 {
                return Err(field_count_error(
                    "5 fields (minute hour day-of-month month day-of-week)",
                    if parts.len() >= 6 {
                        "; use type QUARTZ or SPRING for a seconds field"
                    } else {
                        ""
                    },
                ));
            }
            if kind == CronKind::Cron4j {
                check_cron4j(&parts, original)?;
            }
            let parser = CronParser::builder()
                .seconds(Seconds::Disallowed)
                .year(Year::Disallowed)
                .dom_and_dow(kind == CronKind::Cron4j)
                .build();
            (parser, Fields::from_parts("0", &parts[..5], None))
        }
        CronKind::Quartz => {
            if !(6..=7).contains(&parts.len()) {
                return Err(field_count_error(
                    "6 or 7 fields (second minute hour day-of-month month day-of-week [year])",
                    if parts.len() == 5 {
                        "; use type UNIX for 5 fields"
                    } else {
                        ""
                    },
                ));
            }
            let restricted = |field: &str| field != "?" && field != "*";
            if restricted(parts[3]) && restricted(parts[5]) {
                return Err(CronError::Invalid {
                    kind,
                    expression: clip(original),
                    reason:
                        "day-of-month and day-of-week cannot both be set; put '?' in one of them"
                            .to_owned(),
                });
            }
            let parser = CronParser::builder()
                .seconds(Seconds::Required)
                .year(Year::Optional)
                .alternative_weekdays(true)
                .sloppy_ranges(true)
                .build();
            let year = parts.get(6).map(|year| (*year).to_owned());
            (parser, Fields::from_parts(parts[0], &parts[1..6], year))
        }
        CronKind::Spring => {
            if parts.len() != 6 {
                return Err(field_count_error(
                    "6 fields (second minute hour day-of-month month day-of-week)",
                    if parts.len() == 5 {
                        "; use type UNIX for 5 fields"
                    } else {
                        ""
                    },
                ));
            }
            let parser = CronParser::builder()
                .seconds(Seconds::Required)
                .year(Year::Disallowed)
                .dom_and_dow(true)
                .sloppy_ranges(true)
                .build();
            (parser, Fields::from_parts(parts[0], &parts[1..6], None))
        }
        // `parse_rule` routes EVERY to the interval parser first; a bare
        // calendar text under EVERY is simply not an interval.
        CronKind::Every => return Err(CronError::InvalidInterval(clip(original))),
    };
    let cron = parser
        .parse(fields_text)
        .map_err(|error| CronError::Invalid {
            kind,
            expression: clip(original),
            reason: error.to_string(),
        })?;
    let (gap, fold) = dst_policies(&cron);
    Ok(CalendarRule {
        cron,
        fields,
        quartz_weekdays: kind == CronKind::Quartz,
        gap,
        fold,
    })
}

/// cron4j syntax beyond the 5 standard fields has no faithful mapping:
/// refuse it instead of guessing.
fn check_cron4j(parts: &[&str], original: &str) -> Result<(), CronError> {
    let unsupported = |feature| CronError::Unsupported {
        kind: CronKind::Cron4j,
        expression: clip(original),
        feature,
    };
    let joined = parts.join(" ");
    // `W` is only allowed inside the day name WED.
    let has_nearest_weekday = joined.to_ascii_uppercase().replace("WED", "").contains('W');
    if joined.contains('?') || joined.contains('#') || has_nearest_weekday {
        return Err(unsupported("'?', 'W' or '#' (Quartz extensions)"));
    }
    if parts[4].to_ascii_uppercase().contains('L') {
        return Err(unsupported("'L' in the day-of-week field"));
    }
    Ok(())
}

/// The DST policies follow from the time fields (see the module doc).
fn dst_policies(cron: &Cron) -> (GapPolicy, FoldPolicy) {
    let pattern = &cron.pattern;
    let every_hour = (0..24).all(|hour| pattern.hour_match(hour).unwrap_or(false));
    let seconds = (0..60)
        .filter(|second| pattern.second_match(*second).unwrap_or(false))
        .count();
    let minutes = (0..60)
        .filter(|minute| pattern.minute_match(*minute).unwrap_or(false))
        .count();
    let repeats_within_hour = seconds * minutes > 1;
    let gap = if every_hour {
        GapPolicy::Skip
    } else {
        GapPolicy::FireAtTransition
    };
    let fold = if every_hour || repeats_within_hour {
        FoldPolicy::BothInstants
    } else {
        FoldPolicy::FirstInstant
    };
    (gap, fold)
}

impl Fields {
    fn from_parts(second: &str, rest: &[&str], year: Option<String>) -> Fields {
        Fields {
            second: second.to_owned(),
            minute: rest[0].to_owned(),
            hour: rest[1].to_owned(),
            day_of_month: rest[2].to_owned(),
            month: rest[3].to_owned(),
            day_of_week: rest[4].to_owned(),
            year,
        }
    }
}

/// Parses the text after `@every`: one or more `<number><unit>` terms.
fn parse_interval(original: &str, text: &str) -> Result<IntervalRule, CronError> {
    let invalid = || CronError::InvalidInterval(clip(original));
    let text = text.trim();
    if text.is_empty() {
        return Err(invalid());
    }
    let mut total_ms: i64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 12 {
            return Err(invalid());
        }
        let (number, after_number) = rest.split_at(digits);
        let unit_len = after_number
            .bytes()
            .take_while(u8::is_ascii_alphabetic)
            .count();
        let (unit, after_unit) = after_number.split_at(unit_len);
        let unit_ms: i64 = match unit.to_ascii_lowercase().as_str() {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(invalid()),
        };
        // At most 12 digits, so the parse cannot fail and the product fits.
        let number: i64 = number.parse().map_err(|_| invalid())?;
        total_ms = number
            .checked_mul(unit_ms)
            .and_then(|term| total_ms.checked_add(term))
            .ok_or_else(|| CronError::IntervalOutOfRange(clip(original)))?;
        rest = after_unit.trim_start();
    }
    if !(MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&total_ms) {
        return Err(CronError::IntervalOutOfRange(clip(original)));
    }
    Ok(IntervalRule {
        period_ms: total_ms,
        anchor: Timestamp::from_millis(0),
    })
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

/// Bounds echoed input so error messages stay short.
pub(super) fn clip(text: &str) -> String {
    const MAX: usize = 80;
    if text.chars().count() <= MAX {
        text.to_owned()
    } else {
        let mut clipped: String = text.chars().take(MAX).collect();
        clipped.push('…');
        clipped
    }
}
