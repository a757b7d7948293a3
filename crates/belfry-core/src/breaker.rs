//! The circuit breaker of each tenant endpoint (its HTTP URL or Kafka
//! topic), as one node sees it.
//!
//! While an endpoint keeps failing, its due events wait instead of each
//! spending an attempt: after [`BreakerPolicy::failure_threshold`]
//! consecutive transient failures the circuit *opens*; nothing is sent for
//! a cool-down; then one delivery goes out as a *probe* (the circuit is
//! *half-open*): an answer other than a transient failure closes it (held
//! events go out in due order, late by the outage), a transient failure
//! opens it again for twice the cool-down, at most
//! [`BreakerPolicy::max_cool_down`].
//!
//! What counts: attempts whose verdict is [`Verdict::Retry`] (5xx, 429,
//! timeouts, refused connections) are failures; a delivered attempt resets
//! the count; a permanent refusal (4xx) is neither (the endpoint answered,
//! the event was at fault). Only attempts admitted in the circuit's
//! current state count: those still in flight when it opened (or closed)
//! are recorded on their events as usual, but neither re-open it, extend
//! its cool-down nor close it; only the probe decides.
//!
//! The state is each node's own, in memory: a node judges the endpoints it
//! delivers to. It starts closed, and starts over when the tenant's sink
//! changes. Pull and built-in sinks have no circuit.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{ConfigKeys, Problems};
use crate::ids::TenantName;
use crate::retry::Verdict;
use crate::tenant::SinkConfig;
use crate::time::Timestamp;

/// When a tenant endpoint's circuit opens, and for how long.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerPolicy {
    /// Consecutive transient failures (5xx, 408, 429, timeouts, connection
    /// errors) of a tenant's HTTP or Kafka endpoint that open its circuit:
    /// its due events then wait, spending no attempt, while one probe
    /// delivery per cool-down tests the endpoint. `0`: no circuit breaker.
    pub failure_threshold: u32,
    /// How long an open circuit sends nothing before its first probe.
    #[serde(with = "crate::time::serde_millis", rename = "cool_down_ms")]
    pub cool_down: Duration,
    /// Each failed probe doubles the cool-down, up to this.
    #[serde(with = "crate::time::serde_millis", rename = "max_cool_down_ms")]
    pub max_cool_down: Duration,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        BreakerPolicy {
            failure_threshold: 5,
            cool_down: Duration::from_secs(5),
            max_cool_down: Duration::from_secs(60),
        }
    }
}

impl BreakerPolicy {
    /// No breaker: every delivery goes out.
    pub fn disabled() -> Self {
        BreakerPolicy {
            failure_threshold: 0,
            ..BreakerPolicy::default()
        }
    }

    pub fn enabled(&self) -> bool {
        self.failure_threshold > 0
    }

    /// Refuses a zero cool-down and a maximum below it, naming their keys.
    pub fn validate(&self, problems: &mut Problems) {
        problems.at_least_one("cool_down_ms", self.cool_down);
        if self.max_cool_down < self.cool_down {
            problems.push(format!(
                "{} ({}) must not be less than {} ({})",
                problems.key("max_cool_down_ms"),
                self.max_cool_down.as_millis(),
                problems.key("cool_down_ms"),
                self.cool_down.as_millis()
            ));
        }
    }
}

/// A circuit's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    /// Deliveries go out.
    Closed,
    /// Nothing goes out until the cool-down ends.
    Open,
    /// One probe delivery is out; its outcome closes or opens the circuit.
    HalfOpen,
}

impl CircuitState {
    pub fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        }
    }
}

/// The state a circuit's inner state shows as.
fn public(state: State) -> CircuitState {
    match state {
        State::Closed { .. } => CircuitState::Closed,
        State::Open { .. } => CircuitState::Open,
        State::HalfOpen => CircuitState::HalfOpen,
    }
}

impl Transition {
    /// Whether the tenant's notice target hears of it: a circuit opening
    /// from closed, and closing. A failed probe reopening it is not news.
    pub fn is_noticed(&self) -> bool {
        matches!(
            (self.from, self.to),
            (CircuitState::Closed, CircuitState::Open) | (_, CircuitState::Closed)
        )
    }
}

/// What the breaker says of a delivery about to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Send it, and report its outcome with this pass
    /// ([`Breakers::record`]).
    Send(Pass),
    /// Do not send it: no attempt, nothing recorded; the event waits. Ask
    /// again at `until` (the cool-down's end), or, when `None` (a probe is
    /// out), once the probe's outcome is known.
    Hold { until: Option<Timestamp> },
}

/// The leave to send one delivery: tells its outcome apart from those of
/// deliveries admitted in another state of the circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// `None`: the sink has no circuit (or the breaker is off).
    of: Option<(u64, bool)>,
}

impl Pass {
    /// Whether this delivery is the probe of a half-open circuit.
    pub fn is_probe(&self) -> bool {
        self.of.is_some_and(|(_, probe)| probe)
    }
}

/// A circuit changed state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub from: CircuitState,
    pub to: CircuitState,
    pub at: Timestamp,
    /// Why, in a sentence.
    pub reason: String,
    /// When the next probe may go out (an opened circuit).
    pub next_probe_at: Option<Timestamp>,
}

/// What recording an outcome did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorded {
    pub transition: Option<Transition>,
    /// Said of the attempt in its history (the probe, the attempt that
    /// opened the circuit): [`Recorded::annotate`] adds it to its error.
    pub note: Option<String>,
}

impl Recorded {
    /// The attempt's error with the note appended.
    pub fn annotate(&self, error: Option<String>) -> Option<String> {
        match (&self.note, error) {
            (None, error) => error,
            (Some(note), None) => Some(note.clone()),
            (Some(note), Some(error)) => Some(format!("{error}; {note}")),
        }
    }
}

/// A circuit as views show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircuitView {
    pub state: CircuitState,
    /// When it entered its state; `None`: closed since this node started
    /// (or since the sink changed).
    pub since: Option<Timestamp>,
    /// Transient failures in a row counted while closed.
    pub consecutive_failures: u32,
    /// When the next probe may go out, while open.
    pub next_probe_at: Option<Timestamp>,
}

impl CircuitView {
    fn closed() -> Self {
        CircuitView {
            state: CircuitState::Closed,
            since: None,
            consecutive_failures: 0,
            next_probe_at: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Timestamp,
    },
    /// The probe is out.
    HalfOpen,
}

/// One tenant endpoint's circuit.
#[derive(Debug, Clone)]
struct Circuit {
    /// The sink it judges: another sink starts a new circuit.
    sink: SinkConfig,
    state: State,
    since: Option<Timestamp>,
    /// The cool-down of the last opening (doubled by each failed probe).
    cool_down: Duration,
    /// Bumped by every transition: a pass counts only in its own.
    generation: u64,
}

/// Every tenant endpoint's circuit on this node (see the module
/// documentation).
#[derive(Debug, Clone)]
pub struct Breakers {
    policy: BreakerPolicy,
    circuits: HashMap<TenantName, Circuit>,
    /// Generations are unique node-wide, so a pass of a circuit started
    /// over (its sink changed) counts in none of its successors.
    generations: u64,
}

impl Breakers {
    pub fn new(policy: BreakerPolicy) -> Self {
        Breakers {
            policy,
            circuits: HashMap::new(),
            generations: 0,
        }
    }

    pub fn policy(&self) -> &BreakerPolicy {
        &self.policy
    }

    /// Whether a delivery of `tenant`, delivering to `sink`, may start at
    /// `now`. An open circuit whose cool-down is over lets this one out as
    /// its probe, and goes half-open (the transition is returned).
    pub fn admit(
        &mut self,
        tenant: &TenantName,
        sink: &SinkConfig,
        now: Timestamp,
    ) -> (Admission, Option<Transition>) {
        if !self.policy.enabled() || !has_circuit(sink) {
            return (Admission::Send(Pass { of: None }), None);
        }
        let reset = self.refresh(tenant, sink, now);
        let (state, generation) = {
            let circuit = &self.circuits[tenant];
            (circuit.state, circuit.generation)
        };
        match state {
            State::Closed { .. } => (
                Admission::Send(Pass {
                    of: Some((generation, false)),
                }),
                reset,
            ),
            State::Open { until } if now < until => (Admission::Hold { until: Some(until) }, None),
            State::Open { .. } => {
                let generation = self.next_generation();
                let circuit = self.circuits.get_mut(tenant).expect("just found");
                circuit.state = State::HalfOpen;
                circuit.since = Some(now);
                circuit.generation = generation;
                let transition = Transition {
                    from: CircuitState::Open,
                    to: CircuitState::HalfOpen,
                    at: now,
                    reason: "the cool-down ended: one probe delivery goes out".to_string(),
                    next_probe_at: None,
                };
                (
                    Admission::Send(Pass {
                        of: Some((generation, true)),
                    }),
                    Some(transition),
                )
            }
            State::HalfOpen => (Admission::Hold { until: None }, None),
        }
    }

    /// Records the outcome of a delivery admitted with `pass`.
    pub fn record(
        &mut self,
        tenant: &TenantName,
        pass: Pass,
        verdict: Verdict,
        now: Timestamp,
    ) -> Recorded {
        let Some((generation, probe)) = pass.of else {
            return Recorded::default();
        };
        let threshold = self.policy.failure_threshold;
        let first_cool_down = self.policy.cool_down;
        let max_cool_down = self.policy.max_cool_down;
        let Some(circuit) = self.circuits.get(tenant) else {
            return Recorded::default();
        };
        if circuit.generation != generation {
            // Admitted before the circuit last changed: counts for nothing.
            return Recorded::default();
        }
        let state = circuit.state;
        match (state, probe, verdict) {
            (State::Closed { failures }, false, Verdict::Retry) => {
                let failures = failures + 1;
                if failures < threshold {
                    self.set(tenant, State::Closed { failures });
                    return Recorded::default();
                }
                let until = now.plus(first_cool_down);
                let generation = self.next_generation();
                let circuit = self.circuits.get_mut(tenant).expect("found above");
                circuit.cool_down = first_cool_down;
                circuit.generation = generation;
                circuit.state = State::Open { until };
                circuit.since = Some(now);
                let reason = format!(
                    "{failures} consecutive transient failures, next probe in {}",
                    seconds(first_cool_down)
                );
                Recorded {
                    note: Some(format!("the circuit opened after {reason}")),
                    transition: Some(Transition {
                        from: CircuitState::Closed,
                        to: CircuitState::Open,
                        at: now,
                        reason,
                        next_probe_at: Some(until),
                    }),
                }
            }
            (State::Closed { .. }, false, Verdict::Delivered) => {
                self.set(tenant, State::Closed { failures: 0 });
                Recorded::default()
            }
            (State::HalfOpen, true, Verdict::Retry) => {
                let cool_down = circuit.cool_down.saturating_mul(2).min(max_cool_down);
                let until = now.plus(cool_down);
                let generation = self.next_generation();
                let circuit = self.circuits.get_mut(tenant).expect("found above");
                circuit.cool_down = cool_down;
                circuit.generation = generation;
                circuit.state = State::Open { until };
                circuit.since = Some(now);
                let reason = format!("the probe failed, next probe in {}", seconds(cool_down));
                Recorded {
                    note: Some(format!("probe: {reason}")),
                    transition: Some(Transition {
                        from: CircuitState::HalfOpen,
                        to: CircuitState::Open,
                        at: now,
                        reason,
                        next_probe_at: Some(until),
                    }),
                }
            }
            (State::HalfOpen, true, Verdict::Delivered | Verdict::Permanent) => {
                let generation = self.next_generation();
                let circuit = self.circuits.get_mut(tenant).expect("found above");
                circuit.cool_down = first_cool_down;
                circuit.generation = generation;
                circuit.state = State::Closed { failures: 0 };
                circuit.since = Some(now);
                let reason = "the probe was answered: deliveries resume".to_string();
                Recorded {
                    note: Some("probe: the circuit closed".to_string()),
                    transition: Some(Transition {
                        from: CircuitState::HalfOpen,
                        to: CircuitState::Closed,
                        at: now,
                        reason,
                        next_probe_at: None,
                    }),
                }
            }
            // A permanent refusal: the endpoint answered, the event was at
            // fault. Neither a failure nor a success of the endpoint.
            _ => Recorded::default(),
        }
    }

    /// A probe admitted with `pass` was not sent after all (its delivery
    /// was dropped): the circuit may probe again at once.
    pub fn abandon(&mut self, tenant: &TenantName, pass: Pass, now: Timestamp) {
        let Some((generation, true)) = pass.of else {
            return;
        };
        let next = self.next_generation();
        if let Some(circuit) = self.circuits.get_mut(tenant)
            && circuit.generation == generation
            && circuit.state == State::HalfOpen
        {
            circuit.state = State::Open { until: now };
            circuit.generation = next;
        }
    }

    /// `tenant`'s circuit for its sink `sink`; `None` when that sink has
    /// none (or the breaker is off).
    pub fn view(&self, tenant: &TenantName, sink: &SinkConfig) -> Option<CircuitView> {
        if !self.policy.enabled() || !has_circuit(sink) {
            return None;
        }
        let Some(circuit) = self.circuits.get(tenant).filter(|c| c.sink == *sink) else {
            return Some(CircuitView::closed());
        };
        Some(match circuit.state {
            State::Closed { failures } => CircuitView {
                state: CircuitState::Closed,
                since: circuit.since,
                consecutive_failures: failures,
                next_probe_at: None,
            },
            State::Open { until } => CircuitView {
                state: CircuitState::Open,
                since: circuit.since,
                consecutive_failures: 0,
                next_probe_at: Some(until),
            },
            State::HalfOpen => CircuitView {
                state: CircuitState::HalfOpen,
                since: circuit.since,
                consecutive_failures: 0,
                next_probe_at: None,
            },
        })
    }

    /// Circuits not closed (open or half-open).
    pub fn not_closed(&self) -> usize {
        self.circuits
            .values()
            .filter(|c| !matches!(c.state, State::Closed { .. }))
            .count()
    }

    /// Forgets `tenant`'s circuit (the tenant was removed); an open one
    /// ends closed.
    pub fn forget(&mut self, tenant: &TenantName, now: Timestamp) -> Option<Transition> {
        let circuit = self.circuits.remove(tenant)?;
        (!matches!(circuit.state, State::Closed { .. })).then(|| Transition {
            from: public(circuit.state),
            to: CircuitState::Closed,
            at: now,
            reason: "the tenant was removed".to_string(),
            next_probe_at: None,
        })
    }

    /// `tenant`'s sink is now `sink` (its config was replaced): a circuit
    /// that judged another sink starts over closed; an open one reports
    /// that transition.
    pub fn reconfigured(
        &mut self,
        tenant: &TenantName,
        sink: &SinkConfig,
        now: Timestamp,
    ) -> Option<Transition> {
        if !self.circuits.contains_key(tenant) {
            return None;
        }
        if !has_circuit(sink) {
            return self.forget(tenant, now);
        }
        self.refresh(tenant, sink, now)
    }

    /// Makes sure `tenant` has a circuit for `sink`: a new, closed one when
    /// there is none or it judged another sink (the transition to closed
    /// of that one, if it was not closed).
    fn refresh(
        &mut self,
        tenant: &TenantName,
        sink: &SinkConfig,
        now: Timestamp,
    ) -> Option<Transition> {
        let replaced = match self.circuits.get(tenant) {
            Some(circuit) if circuit.sink == *sink => return None,
            Some(circuit) => !matches!(circuit.state, State::Closed { .. }),
            None => false,
        };
        let from = self
            .circuits
            .get(tenant)
            .map_or(CircuitState::Closed, |circuit| public(circuit.state));
        let generation = self.next_generation();
        self.circuits.insert(
            tenant.clone(),
            Circuit {
                sink: sink.clone(),
                state: State::Closed { failures: 0 },
                since: replaced.then_some(now),
                cool_down: self.policy.cool_down,
                generation,
            },
        );
        replaced.then(|| Transition {
            from,
            to: CircuitState::Closed,
            at: now,
            reason: "the tenant's sink changed".to_string(),
            next_probe_at: None,
        })
    }

    /// Changes a closed circuit's count (no transition).
    fn set(&mut self, tenant: &TenantName, state: State) {
        if let Some(circuit) = self.circuits.get_mut(tenant) {
            circuit.state = state;
        }
    }

    fn next_generation(&mut self) -> u64 {
        self.generations += 1;
        self.generations
    }
}

/// Whether deliveries to `sink` go through a circuit: HTTP and Kafka
/// endpoints (a pull tenant's workers come to it; a built-in processor
/// runs in the node).
pub fn has_circuit(sink: &SinkConfig) -> bool {
    matches!(sink, SinkConfig::Http(_) | SinkConfig::Kafka(_))
}

/// `5 s`, `1.5 s`.
fn seconds(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::{BuiltinTarget, HttpTarget, PullTarget};

    fn ts(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn acme() -> TenantName {
        TenantName::new("acme".to_string()).unwrap()
    }

    fn http(url: &str) -> SinkConfig {
        SinkConfig::Http(HttpTarget {
            url: url.to_string(),
            headers: Default::default(),
            timeout_ms: None,
            delivery: Default::default(),
        })
    }

    fn breakers() -> Breakers {
        Breakers::new(BreakerPolicy {
            failure_threshold: 3,
            cool_down: Duration::from_secs(5),
            max_cool_down: Duration::from_secs(60),
        })
    }

    fn send(b: &mut Breakers, sink: &SinkConfig, now: i64) -> Pass {
        match b.admit(&acme(), sink, ts(now)) {
            (Admission::Send(pass), _) => pass,
            other => panic!("expected a send, got {other:?}"),
        }
    }

    /// Fails `n` sends in a row at `now`; the last recording's result.
    fn fail(b: &mut Breakers, sink: &SinkConfig, n: u32, now: i64) -> Recorded {
        let mut last = Recorded::default();
        for _ in 0..n {
            let pass = send(b, sink, now);
            last = b.record(&acme(), pass, Verdict::Retry, ts(now));
        }
        last
    }

    fn state(b: &Breakers, sink: &SinkConfig) -> CircuitState {
        b.view(&acme(), sink).unwrap().state
    }

    #[test]
    fn consecutive_transient_failures_open_the_circuit() {
        let sink = http("http://a/hook");
        let mut b = breakers();
        assert_eq!(fail(&mut b, &sink, 2, 0), Recorded::default());
        assert_eq!(b.view(&acme(), &sink).unwrap().consecutive_failures, 2);
        let opened = fail(&mut b, &sink, 1, 100);
        let transition = opened.transition.clone().unwrap();
        assert_eq!(transition.to, CircuitState::Open);
        assert_eq!(transition.next_probe_at, Some(ts(5_100)));
        assert_eq!(
            opened.annotate(Some("HTTP 503 Service Unavailable".to_string())),
            Some(
                "HTTP 503 Service Unavailable; the circuit opened after 3 consecutive \
                 transient failures, next probe in 5 s"
                    .to_string()
            )
        );
        assert_eq!(
            b.view(&acme(), &sink).unwrap(),
            CircuitView {
                state: CircuitState::Open,
                since: Some(ts(100)),
                consecutive_failures: 0,
                next_probe_at: Some(ts(5_100)),
            }
        );
        assert_eq!(b.not_closed(), 1);
        // Events that come due wait for the cool-down.
        assert_eq!(
            b.admit(&acme(), &sink, ts(5_099)),
            (
                Admission::Hold {
                    until: Some(ts(5_100))
                },
                None
            )
        );
    }

    #[test]
    fn a_delivery_resets_the_count_and_a_permanent_refusal_does_not_count() {
        let sink = http("http://a/hook");
        let mut b = breakers();
        fail(&mut b, &sink, 2, 0);
        let pass = send(&mut b, &sink, 1);
        b.record(&acme(), pass, Verdict::Delivered, ts(1));
        fail(&mut b, &sink, 2, 2);
        let pass = send(&mut b, &sink, 3);
        assert_eq!(
            b.record(&acme(), pass, Verdict::Permanent, ts(3)),
            Recorded::default()
        );
        assert_eq!(b.view(&acme(), &sink).unwrap().consecutive_failures, 2);
        assert_eq!(state(&b, &sink), CircuitState::Closed);
        assert!(fail(&mut b, &sink, 1, 4).transition.is_some());
    }

    #[test]
    fn one_probe_after_the_cool_down_closes_or_reopens_with_a_longer_one() {
        let sink = http("http://a/hook");
        let mut b = breakers();
        fail(&mut b, &sink, 3, 0);
        // The cool-down is over: exactly one probe goes out.
        let (admission, transition) = b.admit(&acme(), &sink, ts(5_000));
        let Admission::Send(probe) = admission else {
            panic!("expected the probe, got {admission:?}");
        };
        assert!(probe.is_probe());
        assert_eq!(transition.unwrap().to, CircuitState::HalfOpen);
        assert_eq!(state(&b, &sink), CircuitState::HalfOpen);
        assert_eq!(
            b.admit(&acme(), &sink, ts(5_001)).0,
            Admission::Hold { until: None }
        );
        // It fails: open for twice as long.
        let failed = b.record(&acme(), probe, Verdict::Retry, ts(5_200));
        assert_eq!(
            failed.annotate(Some("timed out".to_string())),
            Some("timed out; probe: the probe failed, next probe in 10 s".to_string())
        );
        assert_eq!(
            failed.transition.as_ref().unwrap().next_probe_at,
            Some(ts(15_200))
        );
        assert_eq!(
            b.admit(&acme(), &sink, ts(15_199)).0,
            Admission::Hold {
                until: Some(ts(15_200))
            }
        );
        let probe = send(&mut b, &sink, 15_200);
        assert!(probe.is_probe());
        let closed = b.record(&acme(), probe, Verdict::Delivered, ts(15_300));
        assert_eq!(closed.transition.as_ref().unwrap().to, CircuitState::Closed);
        assert_eq!(
            closed.annotate(None),
            Some("probe: the circuit closed".to_string())
        );
        assert_eq!(
            b.view(&acme(), &sink).unwrap(),
            CircuitView {
                state: CircuitState::Closed,
                since: Some(ts(15_300)),
                consecutive_failures: 0,
                next_probe_at: None,
            }
        );
        assert_eq!(b.not_closed(), 0);
        // Closed: everything goes out; the next opening starts at the
        // first cool-down again.
        assert!(!send(&mut b, &sink, 15_301).is_probe());
        let reopened = fail(&mut b, &sink, 3, 20_000);
        assert_eq!(reopened.transition.unwrap().next_probe_at, Some(ts(25_000)));
    }

    #[test]
    fn a_probe_answered_with_a_permanent_refusal_closes_the_circuit() {
        let sink = http("http://a/hook");
        let mut b = breakers();
        fail(&mut b, &sink, 3, 0);
        let probe = send(&mut b, &sink, 5_000);
        let closed = b.record(&acme(), probe, Verdict::Permanent, ts(5_001));
        assert_eq!(closed.transition.unwrap().to, CircuitState::Closed);
    }

    #[test]
    fn the_cool_down_doubles_up_to_its_cap() {
        let sink = http("http://a/hook");
        let mut b = breakers();
        fail(&mut b, &sink, 3, 0);
        let mut now = 0;
        let mut cool_downs = Vec::new();
        let mut until = 5_000;
        for _ in 0..6 {
            now = until;
            let probe = send(&mut b, &sink, now);
            assert!(probe.is_probe());
            let next = b
                .record(&acme(), probe, Verdict::Retry, ts(now))
                .transition
                .unwrap()
                .next_probe_at
                .unwrap();
            cool_downs.push((next.as_millis() - now) / 1_000);
            until = next.as_millis();
        }
        assert_eq!(cool_downs, vec![10, 20, 40, 60, 60, 60]);
        assert!(now > 0);
    }

    #[test]
    fn outcomes_of_deliveries_admitted_in_another_state_count_for_nothing() {
        let sink = http("http://a/hook");
        let mut b = breakers();
        // Five in flight when the endpoint goes down.
        let in_flight: Vec<Pass> = (0..5).map(|_| send(&mut b, &sink, 0)).collect();
        for pass in &in_flight[..3] {
            b.record(&acme(), *pass, Verdict::Retry, ts(10));
        }
        assert_eq!(state(&b, &sink), CircuitState::Open);
        // The other two fail after it opened: no new opening, same probe time.
        assert_eq!(
            b.record(&acme(), in_flight[3], Verdict::Retry, ts(20)),
            Recorded::default()
        );
        // One succeeds: only the probe closes the circuit.
        assert_eq!(
            b.record(&acme(), in_flight[4], Verdict::Delivered, ts(30)),
            Recorded::default()
        );
        assert_eq!(
            b.view(&acme(), &sink).unwrap().next_probe_at,
            Some(ts(5_010))
        );
        // After the close, failures of before the opening do not count.
        let probe = send(&mut b, &sink, 5_010);
        b.record(&acme(), probe, Verdict::Delivered, ts(5_020));
        let late = b.record(&acme(), in_flight[0], Verdict::Retry, ts(5_030));
        assert_eq!(late, Recorded::default());
        assert_eq!(b.view(&acme(), &sink).unwrap().consecutive_failures, 0);
    }

    #[test]
    fn an_abandoned_probe_lets_the_next_delivery_probe() {
        let sink = http("http://a/hook");
        let mut b = breakers();
        fail(&mut b, &sink, 3, 0);
        let probe = send(&mut b, &sink, 5_000);
        b.abandon(&acme(), probe, ts(5_001));
        assert_eq!(state(&b, &sink), CircuitState::Open);
        let again = send(&mut b, &sink, 5_001);
        assert!(again.is_probe());
        // Its late outcome counts for nothing.
        assert_eq!(
            b.record(&acme(), probe, Verdict::Delivered, ts(5_002)),
            Recorded::default()
        );
        assert_eq!(state(&b, &sink), CircuitState::HalfOpen);
    }

    #[test]
    fn a_changed_sink_starts_a_closed_circuit() {
        let old = http("http://a/hook");
        let new = http("http://b/hook");
        let mut b = breakers();
        fail(&mut b, &old, 3, 0);
        let in_flight = b.admit(&acme(), &old, ts(1));
        assert!(matches!(in_flight.0, Admission::Hold { .. }));
        assert_eq!(state(&b, &new), CircuitState::Closed);
        // The first delivery to the new sink closes the old circuit.
        let (admission, reset) = b.admit(&acme(), &new, ts(2));
        assert!(matches!(admission, Admission::Send(pass) if !pass.is_probe()));
        assert_eq!(reset.unwrap().reason, "the tenant's sink changed");
        assert_eq!(state(&b, &new), CircuitState::Closed);
        assert_eq!(b.not_closed(), 0);
        // A replaced config reports it at once.
        fail(&mut b, &new, 3, 10);
        assert_eq!(b.reconfigured(&acme(), &new, ts(11)), None);
        assert_eq!(
            b.reconfigured(&acme(), &old, ts(12)).unwrap().to,
            CircuitState::Closed
        );
        assert_eq!(b.not_closed(), 0);
        let pull = SinkConfig::Pull(PullTarget::default());
        fail(&mut b, &old, 3, 20);
        assert!(b.reconfigured(&acme(), &pull, ts(21)).is_some());
        assert!(b.view(&acme(), &pull).is_none());
        assert_eq!(b.not_closed(), 0);
    }

    #[test]
    fn only_http_and_kafka_sinks_have_a_circuit_and_threshold_zero_turns_it_off() {
        let pull = SinkConfig::Pull(PullTarget::default());
        let log = SinkConfig::Builtin(BuiltinTarget {
            processor: "log".to_string(),
        });
        let mut b = breakers();
        for sink in [&pull, &log] {
            assert!(b.view(&acme(), sink).is_none());
            for _ in 0..10 {
                let (Admission::Send(pass), None) = b.admit(&acme(), sink, ts(0)) else {
                    panic!("no circuit, no hold");
                };
                assert_eq!(
                    b.record(&acme(), pass, Verdict::Retry, ts(0)),
                    Recorded::default()
                );
            }
        }
        let sink = http("http://a/hook");
        let mut off = Breakers::new(BreakerPolicy::disabled());
        assert!(off.view(&acme(), &sink).is_none());
        for _ in 0..10 {
            let (Admission::Send(pass), None) = off.admit(&acme(), &sink, ts(0)) else {
                panic!("a disabled breaker holds nothing");
            };
            off.record(&acme(), pass, Verdict::Retry, ts(0));
        }
        assert_eq!(off.not_closed(), 0);
    }

    #[test]
    fn forgetting_an_open_circuit_reports_it_closed() {
        let sink = http("http://a/hook");
        let mut b = breakers();
        assert_eq!(b.forget(&acme(), ts(0)), None);
        fail(&mut b, &sink, 3, 0);
        assert_eq!(b.forget(&acme(), ts(1)).unwrap().to, CircuitState::Closed);
        assert_eq!(b.not_closed(), 0);
    }

    #[test]
    fn the_policy_refuses_a_zero_or_inverted_cool_down() {
        let bad = BreakerPolicy {
            failure_threshold: 5,
            cool_down: Duration::from_secs(10),
            max_cool_down: Duration::from_secs(5),
        };
        let error = Problems::check("engine.circuit_breaker", |p| bad.validate(p)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "engine.circuit_breaker.max_cool_down_ms (5000) must not be less than \
             engine.circuit_breaker.cool_down_ms (10000)"
        );
        assert!(Problems::check("b", |p| BreakerPolicy::default().validate(p)).is_ok());
    }
}
