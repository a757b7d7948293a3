//! Unit tests of the pull queue; the randomized simulation against an
//! oracle is in `tests/pull_simulation.rs`.

use std::time::Duration;

use super::limits::{LEASE_EXPIRED_CODE, MAX_QUEUED_CALLS_PER_LEASE};
use super::*;
use crate::event::{DeliveryOption, EventRecord, EventStatus};
use crate::fire::Finish;
use crate::ids::{EventId, EventKey, EventVersion, QueueName, TenantName, WorkerId};
use crate::partition::PartitionId;
use crate::retry::{RetryPolicy, Verdict};
use crate::time::Timestamp;
use crate::timer::DueCursor;

const SECOND: i64 = 1_000;

fn ts(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms)
}

fn tenant(name: &str) -> TenantName {
    TenantName::new(name).unwrap()
}

fn key(tenant_name: &str, id: &str) -> EventKey {
    EventKey::new(tenant(tenant_name), EventId::new(id).unwrap())
}

fn policy() -> DeliveryPolicy {
    DeliveryPolicy {
        max_attempts: 3,
        retry: RetryPolicy {
            fast_retries: 1,
            initial_delay: Duration::from_secs(1),
            multiplier: 2.0,
            max_delay: Duration::from_secs(60),
            backlog_limit: Duration::from_secs(3600),
        },
        expires_at: None,
    }
}

/// A ready entry of `tenant_name/id` due at `due` in `queue`, version
/// `v-{id}`, with `attempts` attempts made, in partition 0 of epoch 1.
fn ready_in(tenant_name: &str, id: &str, due: i64, queue: &str, attempts: u32) -> ReadyEntry {
    let key = key(tenant_name, id);
    ReadyEntry {
        entry: DueCursor {
            due: ts(due),
            key: key.clone(),
        },
        partition: PartitionId(0),
        epoch: 1,
        record: EventRecord {
            debounce_since: None,
            key,
            partition: PartitionId(0),
            version: EventVersion::from_string(format!("v-{id}")),
            event_time: ts(due),
            payload: Some(format!("payload {id}")),
            delivery: DeliveryOption::FullEvent,
            status: EventStatus::Scheduled,
            next_fire_at: Some(ts(due)),
            attempts,
            last_error: None,
            triggered_at: None,
            created_at: ts(0),
            updated_at: ts(0),
            finished_at: None,
            settings: Default::default(),
        },
        queue: QueueName::new(queue).unwrap(),
        policy: policy(),
    }
}

fn ready(tenant_name: &str, id: &str, due: i64) -> ReadyEntry {
    ready_in(tenant_name, id, due, "default", 0)
}

/// The queue and a clock, with helpers that play the runtime.
struct Harness {
    queue: PullQueue,
    now: i64,
    next_call: u64,
}

impl Harness {
    fn new() -> Self {
        Harness::with(PullConfig::default())
    }

    fn with(config: PullConfig) -> Self {
        Harness {
            queue: PullQueue::new(config, NonceSource::from_seed(1)),
            now: 0,
            next_call: 0,
        }
    }

    fn at(&mut self, now: i64) -> &mut Self {
        self.now = now;
        self
    }

    fn handle(&mut self, input: Input) -> Vec<Action> {
        self.queue.handle(input, ts(self.now))
    }

    fn offer(&mut self, entries: Vec<ReadyEntry>) -> Vec<Action> {
        self.handle(Input::Ready(entries))
    }

    fn call_id(&mut self) -> CallId {
        self.next_call += 1;
        CallId(self.next_call)
    }

    fn claim(
        &mut self,
        tenant_name: &str,
        max: u32,
        lease_ms: u64,
        wait_ms: u64,
    ) -> (CallId, Vec<Action>) {
        self.claim_in(tenant_name, max, lease_ms, wait_ms, None)
    }

    /// A claim of the events of `queues` only (all: `None`).
    fn claim_in(
        &mut self,
        tenant_name: &str,
        max: u32,
        lease_ms: u64,
        wait_ms: u64,
        queues: Option<&[&str]>,
    ) -> (CallId, Vec<Action>) {
        let call = self.call_id();
        let actions = self.handle(Input::Claim {
            call,
            tenant: tenant(tenant_name),
            request: ClaimRequest {
                worker: WorkerId::new("w-1").unwrap(),
                max_events: max,
                max_bytes: usize::MAX,
                lease: Duration::from_millis(lease_ms),
                wait: Duration::from_millis(wait_ms),
                queues: queues.map(|names| {
                    names
                        .iter()
                        .map(|name| QueueName::new(*name).unwrap())
                        .collect()
                }),
            },
        });
        (call, actions)
    }

    fn call(&mut self, lease: &LeaseId, request: LeaseCall) -> (CallId, Vec<Action>) {
        let call = self.call_id();
        let actions = self.handle(Input::Call {
            call,
            lease: lease.clone(),
            request,
        });
        (call, actions)
    }

    /// Answers every write in `actions` with `result`; returns what that
    /// led to.
    fn persist(&mut self, actions: &[Action], result: PersistResult) -> Vec<Action> {
        let mut out = Vec::new();
        for action in actions {
            let (op, n) = match action {
                Action::PersistGrants { op, grants, .. } => (*op, grants.len()),
                Action::PersistLease { op, .. } => (*op, 1),
                _ => continue,
            };
            out.extend(self.handle(Input::Persisted {
                op,
                results: vec![result.clone(); n],
            }));
        }
        out
    }

    /// A call whose write succeeds: its reply and every other action.
    fn call_done(&mut self, lease: &LeaseId, request: LeaseCall) -> (Reply, Vec<Action>) {
        let (call, actions) = self.call(lease, request);
        let mut all = actions.clone();
        all.extend(self.persist(&actions, PersistResult::Done));
        (reply_to(call, &all), all)
    }

    /// Claims with no wait and records the grants: the leases.
    fn grant(&mut self, tenant_name: &str, max: u32, lease_ms: u64) -> Vec<GrantedLease> {
        let (call, actions) = self.claim(tenant_name, max, lease_ms, 0);
        let done = self.persist(&actions, PersistResult::Done);
        match reply_to(call, &[actions, done].concat()) {
            Reply::Leases(leases) => leases,
            other => panic!("expected leases, got {other:?}"),
        }
    }
}

fn reply_to(call: CallId, actions: &[Action]) -> Reply {
    let replies: Vec<&Reply> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Reply { call: c, reply } if *c == call => Some(reply),
            _ => None,
        })
        .collect();
    match replies[..] {
        [reply] => reply.clone(),
        _ => panic!("expected one reply to {call:?} in {actions:#?}"),
    }
}

fn no_reply(call: CallId, actions: &[Action]) -> bool {
    !actions
        .iter()
        .any(|a| matches!(a, Action::Reply { call: c, .. } if *c == call))
}

fn finishes(actions: &[Action]) -> Vec<(String, Finish)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Finish { entry, finish, .. } => {
                Some((entry.key.id.as_str().to_string(), finish.clone()))
            }
            _ => None,
        })
        .collect()
}

fn lease_change(actions: &[Action]) -> LeaseChange {
    let changes: Vec<&LeaseChange> = actions
        .iter()
        .filter_map(|a| match a {
            Action::PersistLease { change, .. } => Some(change),
            _ => None,
        })
        .collect();
    match changes[..] {
        [change] => change.clone(),
        _ => panic!("expected one lease write in {actions:#?}"),
    }
}

fn ids(leases: &[GrantedLease]) -> Vec<&str> {
    leases.iter().map(|l| l.record.key.id.as_str()).collect()
}

fn lost() -> Reply {
    Reply::Error(PullError::LeaseLost)
}

#[test]
fn a_claim_stops_before_the_payload_bytes_would_pass_its_bound_but_grants_one() {
    let mut h = Harness::new();
    // Payloads "payload a" … : 9 bytes each.
    h.at(5 * SECOND).offer(
        ["a", "b", "c", "d", "e"]
            .iter()
            .map(|id| ready("t", id, SECOND))
            .collect(),
    );
    let mut granted = Vec::new();
    for max_bytes in [20, 1, usize::MAX] {
        let call = h.call_id();
        let request = ClaimRequest {
            max_bytes,
            ..ClaimBody {
                worker_id: Some("w-1".into()),
                max_events: Some(10),
                ..ClaimBody::default()
            }
            .validate()
            .unwrap()
        };
        let actions = h.handle(Input::Claim {
            call,
            tenant: tenant("t"),
            request,
        });
        let done = h.persist(&actions, PersistResult::Done);
        let Reply::Leases(leases) = reply_to(call, &[actions, done].concat()) else {
            panic!("expected leases");
        };
        granted.push(
            leases
                .iter()
                .map(|l| l.record.key.id.as_str().to_string())
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(granted, [vec!["a", "b"], vec!["c"], vec!["d", "e"]]);
}

#[test]
fn a_claim_with_nothing_ready_and_no_wait_answers_empty() {
    let mut h = Harness::new();
    let (call, actions) = h.claim("t", 10, 30_000, 0);
    assert_eq!(reply_to(call, &actions), Reply::Leases(Vec::new()));
    assert_eq!(h.queue.waiters_len(), 0);
    assert_eq!(h.queue.stats().timed_out, 1);
}

#[test]
fn a_grant_is_recorded_before_the_worker_sees_it() {
    let mut h = Harness::new();
    h.at(5 * SECOND)
        .offer(vec![ready_in("t", "a", 4 * SECOND, "default", 1)]);
    let (call, actions) = h.claim("t", 10, 30_000, 0);
    assert!(
        no_reply(call, &actions),
        "answered before the grant was recorded"
    );
    let [
        Action::PersistGrants {
            grants,
            call: for_call,
            ..
        },
    ] = &actions[..]
    else {
        panic!("{actions:?}");
    };
    assert_eq!(*for_call, call);
    let grant = &grants[0];
    assert_eq!(grant.lease.attempt(), 2, "attempts made + 1");
    assert_eq!(grant.lease.epoch(), 1);
    assert_eq!(grant.lease.version().as_str(), "v-a");
    assert_eq!(grant.leased_at, ts(5 * SECOND));
    assert_eq!(grant.expires_at, ts(35 * SECOND));
    assert_eq!(grant.deadline_at, ts(4 * SECOND + 3_600 * SECOND));
    assert_eq!(grant.worker.as_str(), "w-1");
    assert_eq!(h.queue.granting_len(), 1);
    let done = h.persist(&actions, PersistResult::Done);
    let Reply::Leases(leases) = reply_to(call, &done) else {
        panic!();
    };
    let lease = &leases[0];
    assert_eq!(lease.lease, grant.lease);
    assert_eq!((lease.attempt, lease.max_attempts), (2, 3));
    assert_eq!(lease.due_at, ts(4 * SECOND));
    assert_eq!(lease.heartbeat_interval, Duration::from_secs(10));
    assert_eq!(lease.record.payload.as_deref(), Some("payload a"));
    assert_eq!((h.queue.leases_len(), h.queue.granting_len()), (1, 0));
    assert!(
        h.queue
            .holds(&key("t", "a"), &EventVersion::from_string("v-a".into()))
    );
}

#[test]
fn the_last_attempt_gets_its_whole_lease_past_the_deadline() {
    let mut h = Harness::new();
    let late = 3_600 * SECOND - 5 * SECOND;
    h.at(late).offer(vec![ready("t", "a", 0)]);
    let lease = h.grant("t", 1, 30_000).remove(0);
    assert_eq!(lease.expires_at, ts(late + 30 * SECOND));
    assert_eq!(lease.deadline_at, lease.expires_at);
    let (reply, _) = h
        .at(late + 10 * SECOND)
        .call_done(&lease.lease, LeaseCall::Heartbeat { extend: None });
    assert_eq!(
        reply,
        Reply::Heartbeat {
            expires_at: lease.deadline_at,
            cancel_requested: false
        }
    );
}

#[test]
fn a_ready_entry_answers_the_oldest_waiter_of_its_tenant_only() {
    let mut h = Harness::new();
    let (a_call, _) = h.claim("a", 5, 30_000, 10_000);
    let (b_old, _) = h.at(1).claim("b", 5, 30_000, 10_000);
    let (b_new, _) = h.at(2).claim("b", 5, 30_000, 10_000);
    assert_eq!(h.queue.waiting_of(&tenant("b")), 2);
    let actions = h.at(3).offer(vec![ready("b", "x", 3)]);
    let [Action::PersistGrants { call, .. }] = &actions[..] else {
        panic!("{actions:?}");
    };
    assert_eq!(*call, b_old);
    let done = h.persist(&actions, PersistResult::Done);
    assert!(matches!(reply_to(b_old, &done), Reply::Leases(l) if ids(&l) == ["x"]));
    assert!(no_reply(b_new, &done) && no_reply(a_call, &done));
    // The next entry goes to the next waiter in line.
    let actions = h.at(4).offer(vec![ready("b", "y", 4)]);
    assert!(matches!(&actions[..], [Action::PersistGrants { call, .. }] if *call == b_new));
    assert_eq!(h.queue.waiting_of(&tenant("a")), 1);
}

#[test]
fn due_order_inside_a_queue_and_queues_in_turn() {
    let mut h = Harness::new();
    h.at(100).offer(vec![
        ready_in("t", "big-3", 30, "big", 0),
        ready_in("t", "big-1", 10, "big", 0),
        ready_in("t", "big-2", 20, "big", 0),
        ready_in("t", "big-4", 40, "big", 0),
        ready_in("t", "small-1", 50, "small", 0),
        ready_in("t", "small-2", 60, "small", 0),
    ]);
    let leases = h.grant("t", 5, 30_000);
    assert_eq!(
        ids(&leases),
        ["big-1", "small-1", "big-2", "small-2", "big-3"]
    );
    assert_eq!(ids(&h.grant("t", 5, 30_000)), ["big-4"]);
}

#[test]
fn a_claim_naming_queues_gets_only_theirs_and_lets_others_pass() {
    let mut h = Harness::new();
    let (small, _) = h.claim_in("t", 1, 30_000, 20_000, Some(&["small"]));
    let (any, _) = h.claim("t", 1, 30_000, 20_000);
    let actions = h.at(100).offer(vec![
        ready_in("t", "big-1", 10, "big", 0),
        ready_in("t", "small-1", 50, "small", 0),
    ]);
    let done = h.persist(&actions, PersistResult::Done);
    let all = [actions, done].concat();
    let leased = |call| match reply_to(call, &all) {
        Reply::Leases(leases) => leases,
        other => panic!("expected leases, got {other:?}"),
    };
    assert_eq!(
        ids(&leased(small)),
        ["small-1"],
        "the older claim, its queue"
    );
    assert_eq!(ids(&leased(any)), ["big-1"]);
    let leases = leased(small);
    assert_eq!(leases[0].queue.as_str(), "small");
    // A claim of a queue with nothing ready waits; the entry of another
    // queue stays for a claim that takes it, even a newer one.
    let (other, actions) = h.claim_in("t", 1, 30_000, 20_000, Some(&["other"]));
    assert!(no_reply(other, &actions));
    let actions = h.offer(vec![ready_in("t", "big-2", 20, "big", 0)]);
    assert!(no_reply(other, &actions));
    assert_eq!(
        h.queue
            .ready_in(&tenant("t"), &QueueName::new("big").unwrap()),
        1
    );
    assert_eq!(ids(&h.grant("t", 5, 30_000)), ["big-2"]);
    assert_eq!(
        h.queue.waiting_of(&tenant("t")),
        1,
        "the other claim still waits"
    );
    let actions = h.offer(vec![ready_in("t", "other-1", 30, "other", 0)]);
    let done = h.persist(&actions, PersistResult::Done);
    match reply_to(other, &[actions, done].concat()) {
        Reply::Leases(leases) => assert_eq!(ids(&leases), ["other-1"]),
        reply => panic!("expected leases, got {reply:?}"),
    }
}

#[test]
fn a_waiter_times_out_with_an_empty_answer() {
    let mut h = Harness::new();
    let (call, actions) = h.at(1_000).claim("t", 1, 30_000, 20_000);
    assert!(actions.is_empty());
    assert_eq!(h.queue.next_wake(), Some(ts(21_000)));
    assert!(h.at(20_999).handle(Input::Tick).is_empty());
    let actions = h.at(21_000).handle(Input::Tick);
    assert_eq!(reply_to(call, &actions), Reply::Leases(Vec::new()));
    assert_eq!((h.queue.waiters_len(), h.queue.next_wake()), (0, None));
}

#[test]
fn waiters_are_bounded_in_total_and_per_tenant() {
    let mut h = Harness::with(PullConfig {
        max_waiters: 3,
        max_waiters_per_tenant: 2,
        ..PullConfig::default()
    });
    h.claim("a", 1, 30_000, 10_000);
    h.claim("a", 1, 30_000, 10_000);
    let (call, actions) = h.claim("a", 1, 30_000, 10_000);
    assert_eq!(
        reply_to(call, &actions),
        Reply::Error(PullError::TooManyWaiters)
    );
    h.claim("b", 1, 30_000, 10_000);
    let (call, actions) = h.claim("c", 1, 30_000, 10_000);
    assert_eq!(
        reply_to(call, &actions),
        Reply::Error(PullError::TooManyWaiters)
    );
    assert_eq!(PullError::TooManyWaiters.code(), "too_many_waiters");
    assert_eq!(h.queue.waiters_len(), 3);
}

#[test]
fn entries_past_the_ready_bounds_early_or_twice_go_back_to_their_core() {
    let mut h = Harness::with(PullConfig {
        max_ready: 3,
        max_ready_per_tenant: 2,
        refused_pause: Duration::from_millis(700),
        ..PullConfig::default()
    });
    let actions = h.at(100).offer(vec![
        ready("a", "1", 10),
        ready("a", "2", 10),
        ready("a", "3", 10),
        ready("b", "1", 10),
        ready("c", "1", 10),
        ready("d", "early", 101),
    ]);
    assert_eq!(
        finishes(&actions),
        [
            ("3".to_string(), Finish::RetryAt(ts(800))),
            ("1".to_string(), Finish::RetryAt(ts(800))),
            ("early".to_string(), Finish::RetryAt(ts(101))),
        ]
    );
    assert_eq!(
        (h.queue.ready_len(), h.queue.ready_of(&tenant("a"))),
        (3, 2)
    );
    let actions = h.offer(vec![ready("a", "1", 10)]);
    assert_eq!(
        finishes(&actions),
        [("1".to_string(), Finish::RetryAt(ts(800)))]
    );
    let stats = h.queue.stats();
    assert_eq!((stats.refused, stats.early, stats.duplicates), (2, 1, 1));
}

#[test]
fn a_heartbeat_extends_from_now_never_past_the_deadline() {
    let mut h = Harness::new();
    h.at(0).offer(vec![ready("t", "a", 0)]);
    let lease = h.grant("t", 1, 30_000).remove(0);
    assert_eq!(h.queue.next_wake(), Some(ts(30 * SECOND)));
    let (call, actions) = h
        .at(20 * SECOND)
        .call(&lease.lease, LeaseCall::Heartbeat { extend: None });
    assert_eq!(
        lease_change(&actions),
        LeaseChange::Extend {
            expires_at: ts(50 * SECOND)
        }
    );
    assert!(
        no_reply(call, &actions),
        "answered before the extension was recorded"
    );
    let done = h.persist(&actions, PersistResult::Done);
    assert_eq!(
        reply_to(call, &done),
        Reply::Heartbeat {
            expires_at: ts(50 * SECOND),
            cancel_requested: false
        }
    );
    assert_eq!(h.queue.next_wake(), Some(ts(50 * SECOND)));
    // A shorter extension shortens it; a long one stops at the deadline.
    let (reply, _) = h.at(21 * SECOND).call_done(
        &lease.lease,
        LeaseCall::Heartbeat {
            extend: Some(Duration::from_secs(2)),
        },
    );
    assert!(matches!(reply, Reply::Heartbeat { expires_at, .. } if expires_at == ts(23 * SECOND)));
    let (reply, _) = h.at(22 * SECOND).call_done(
        &lease.lease,
        LeaseCall::Heartbeat {
            extend: Some(Duration::from_secs(12 * 3600)),
        },
    );
    assert!(
        matches!(reply, Reply::Heartbeat { expires_at, .. } if expires_at == lease.deadline_at)
    );
}

#[test]
fn complete_records_delivery_and_a_repeat_gets_the_same_answer() {
    let mut h = Harness::new();
    h.offer(vec![ready("t", "a", 0)]);
    let lease = h.at(10).grant("t", 1, 30_000).remove(0);
    let result = Some(r#"{"ok":true}"#.to_string());
    let (call, actions) = h.at(510).call(
        &lease.lease,
        LeaseCall::Complete {
            result: result.clone(),
        },
    );
    let LeaseChange::Resolve {
        resolution,
        report: Some(report),
    } = lease_change(&actions)
    else {
        panic!("{actions:?}");
    };
    assert_eq!(resolution, Resolution::Delivered { result });
    assert_eq!(
        (report.started_at, report.duration_ms, report.verdict),
        (ts(10), 500, Verdict::Delivered)
    );
    assert!(
        finishes(&actions).is_empty(),
        "finished before it was recorded"
    );
    let done = h.persist(&actions, PersistResult::Done);
    assert_eq!(reply_to(call, &done), Reply::Completed);
    assert_eq!(finishes(&done), [("a".to_string(), Finish::Done)]);
    assert_eq!(h.queue.leases_len(), 0);
    // Idempotent for the same lease, and nothing else on it works.
    let (call, actions) = h
        .at(60 * SECOND)
        .call(&lease.lease, LeaseCall::Complete { result: None });
    assert_eq!(reply_to(call, &actions), Reply::Completed);
    assert_eq!(actions.len(), 1, "answered from the remembered outcome");
    for request in [
        LeaseCall::Heartbeat { extend: None },
        LeaseCall::Release {
            delay: Duration::ZERO,
        },
        LeaseCall::Fail(fail_request(false, None)),
    ] {
        let (call, actions) = h.call(&lease.lease, request);
        assert_eq!(reply_to(call, &actions), lost());
    }
    assert_eq!(h.queue.stats().completed, 1);
}

fn fail_request(permanent: bool, retry_after: Option<Duration>) -> FailRequest {
    FailRequest {
        code: "db_down".into(),
        message: "connection refused".into(),
        retry_after,
        permanent,
    }
}

#[test]
fn a_retriable_failure_schedules_the_next_attempt_after_the_back_off() {
    let mut h = Harness::new();
    h.offer(vec![ready("t", "a", 0)]);
    let lease = h.at(100).grant("t", 1, 30_000).remove(0);
    let (call, actions) = h
        .at(200)
        .call(&lease.lease, LeaseCall::Fail(fail_request(false, None)));
    let LeaseChange::Resolve { resolution, report } = lease_change(&actions) else {
        panic!();
    };
    assert_eq!(resolution, Resolution::Retry { at: ts(1_200) });
    let report = report.unwrap();
    assert_eq!(report.verdict, Verdict::Retry);
    assert_eq!(report.error.as_deref(), Some("db_down: connection refused"));
    let done = h.persist(&actions, PersistResult::Done);
    let answer = Reply::Failed {
        next_attempt_at: Some(ts(1_200)),
    };
    assert_eq!(reply_to(call, &done), answer);
    assert_eq!(finishes(&done), [("a".to_string(), Finish::Done)]);
    // A repeat is answered the same way; a complete is not.
    let (call, actions) = h.call(&lease.lease, LeaseCall::Fail(fail_request(false, None)));
    assert_eq!(reply_to(call, &actions), answer);
    let (call, actions) = h.call(&lease.lease, LeaseCall::Complete { result: None });
    assert_eq!(reply_to(call, &actions), lost());
}

#[test]
fn retry_after_permanent_and_the_last_attempt() {
    let mut h = Harness::new();
    h.offer(vec![
        ready_in("t", "later", 0, "default", 0),
        ready_in("t", "fatal", 0, "default", 0),
        ready_in("t", "last", 0, "default", 2),
    ]);
    let leases = h.grant("t", 3, 30_000);
    let by_id = |id: &str| {
        leases
            .iter()
            .find(|l| l.record.key.id.as_str() == id)
            .unwrap()
            .lease
            .clone()
    };
    let (reply, all) = h.at(50).call_done(
        &by_id("later"),
        LeaseCall::Fail(fail_request(false, Some(Duration::from_millis(250)))),
    );
    assert_eq!(
        reply,
        Reply::Failed {
            next_attempt_at: Some(ts(300))
        }
    );
    assert!(
        matches!(lease_change(&all), LeaseChange::Resolve { resolution: Resolution::Retry { at }, .. } if at == ts(300))
    );
    let (reply, all) = h.call_done(&by_id("fatal"), LeaseCall::Fail(fail_request(true, None)));
    assert_eq!(
        reply,
        Reply::Failed {
            next_attempt_at: None
        }
    );
    let LeaseChange::Resolve {
        resolution: Resolution::Dead { reason },
        report,
    } = lease_change(&all)
    else {
        panic!();
    };
    assert_eq!(reason, "db_down: connection refused");
    assert_eq!(report.unwrap().verdict, Verdict::Permanent);
    let (reply, all) = h.call_done(
        &by_id("last"),
        LeaseCall::Fail(fail_request(false, Some(Duration::ZERO))),
    );
    assert_eq!(
        reply,
        Reply::Failed {
            next_attempt_at: None
        }
    );
    let LeaseChange::Resolve {
        resolution: Resolution::Dead { reason },
        ..
    } = lease_change(&all)
    else {
        panic!();
    };
    assert!(
        reason.starts_with("gave up after 3 attempts (max_attempts reached)"),
        "{reason}"
    );
    assert_eq!(h.queue.stats().failed, 3);
}

#[test]
fn a_release_counts_no_attempt() {
    let mut h = Harness::new();
    h.offer(vec![ready("t", "a", 0)]);
    let lease = h.grant("t", 1, 30_000).remove(0);
    let (reply, all) = h.at(40).call_done(
        &lease.lease,
        LeaseCall::Release {
            delay: Duration::from_millis(500),
        },
    );
    assert_eq!(
        reply,
        Reply::Released {
            next_attempt_at: ts(540)
        }
    );
    assert_eq!(
        lease_change(&all),
        LeaseChange::Resolve {
            resolution: Resolution::Released { at: ts(540) },
            report: None
        }
    );
    assert_eq!(finishes(&all), [("a".to_string(), Finish::Done)]);
    assert_eq!(h.queue.stats().released, 1);
}

#[test]
fn an_expired_lease_is_a_failed_attempt_and_a_late_complete_is_lease_lost() {
    let mut h = Harness::new();
    h.offer(vec![ready("t", "a", 0)]);
    let lease = h.grant("t", 1, 5_000).remove(0);
    assert!(h.at(4_999).handle(Input::Tick).is_empty());
    let actions = h.at(5_000).handle(Input::Tick);
    let LeaseChange::Expire { resolution, report } = lease_change(&actions) else {
        panic!();
    };
    assert_eq!(resolution, Resolution::Retry { at: ts(6_000) });
    assert_eq!(report.verdict, Verdict::Retry);
    assert!(report.error.unwrap().starts_with(LEASE_EXPIRED_CODE));
    // Expired in memory already: every call is lost, recorded or not.
    let (call, late) = h.call(&lease.lease, LeaseCall::Complete { result: None });
    assert_eq!(reply_to(call, &late), lost());
    let (call, late) = h.call(&lease.lease, LeaseCall::Heartbeat { extend: None });
    assert_eq!(reply_to(call, &late), lost());
    assert!(finishes(&actions).is_empty());
    let done = h.persist(&actions, PersistResult::Done);
    assert_eq!(finishes(&done), [("a".to_string(), Finish::Done)]);
    let (call, late) = h
        .at(5_001)
        .call(&lease.lease, LeaseCall::Complete { result: None });
    assert_eq!(reply_to(call, &late), lost());
    assert_eq!((h.queue.leases_len(), h.queue.stats().expired), (0, 1));
}

#[test]
fn a_call_right_at_the_expiry_finds_the_lease_expired_without_a_tick() {
    let mut h = Harness::new();
    h.offer(vec![ready_in("t", "a", 0, "default", 2)]);
    let lease = h.grant("t", 1, 5_000).remove(0);
    let (call, actions) = h
        .at(5_000)
        .call(&lease.lease, LeaseCall::Complete { result: None });
    assert_eq!(reply_to(call, &actions), lost());
    let LeaseChange::Expire {
        resolution: Resolution::Dead { reason },
        ..
    } = lease_change(&actions)
    else {
        panic!("{actions:?}");
    };
    assert!(reason.contains("max_attempts reached") && reason.contains(LEASE_EXPIRED_CODE));
}

#[test]
fn an_expiry_the_store_could_not_record_is_tried_again() {
    let mut h = Harness::with(PullConfig {
        store_retry: Duration::from_millis(300),
        ..PullConfig::default()
    });
    h.offer(vec![ready("t", "a", 0)]);
    h.grant("t", 1, 1_000);
    let actions = h.at(1_000).handle(Input::Tick);
    let failed = h.persist(&actions, PersistResult::Unavailable);
    assert!(failed.is_empty());
    assert_eq!(h.queue.next_wake(), Some(ts(1_300)));
    let again = h.at(1_300).handle(Input::Tick);
    assert!(matches!(lease_change(&again), LeaseChange::Expire { .. }));
    let done = h.persist(&again, PersistResult::Done);
    assert_eq!(finishes(&done), [("a".to_string(), Finish::Done)]);
    assert_eq!(h.queue.stats().expired, 1);
}

#[test]
fn calls_during_a_write_wait_for_it_and_are_bounded() {
    let mut h = Harness::new();
    h.offer(vec![ready("t", "a", 0)]);
    let lease = h.grant("t", 1, 30_000).remove(0).lease;
    let (first, actions) = h.call(&lease, LeaseCall::Complete { result: None });
    let mut queued = Vec::new();
    for _ in 0..MAX_QUEUED_CALLS_PER_LEASE {
        let (call, none) = h.call(&lease, LeaseCall::Complete { result: None });
        assert!(none.is_empty());
        queued.push(call);
    }
    let (refused, answer) = h.call(&lease, LeaseCall::Heartbeat { extend: None });
    assert_eq!(
        reply_to(refused, &answer),
        Reply::Error(PullError::TooManyCalls)
    );
    let done = h.persist(&actions, PersistResult::Done);
    for call in [first].iter().chain(&queued) {
        assert_eq!(reply_to(*call, &done), Reply::Completed);
    }
    assert_eq!(
        done.iter()
            .filter(|a| matches!(a, Action::PersistLease { .. }))
            .count(),
        0,
        "the repeats were answered from the recorded outcome"
    );
}

#[test]
fn a_write_in_flight_holds_back_the_expiry() {
    let mut h = Harness::new();
    h.offer(vec![ready("t", "a", 0)]);
    let lease = h.grant("t", 1, 5_000).remove(0).lease;
    let (beat, actions) = h
        .at(4_900)
        .call(&lease, LeaseCall::Heartbeat { extend: None });
    let (complete, queued) = h
        .at(5_100)
        .call(&lease, LeaseCall::Complete { result: None });
    assert!(
        queued.is_empty(),
        "queued behind the heartbeat, not expired"
    );
    let done = h.persist(&actions, PersistResult::Done);
    assert_eq!(
        reply_to(beat, &done),
        Reply::Heartbeat {
            expires_at: ts(9_900),
            cancel_requested: false
        }
    );
    let completed = h.persist(&done, PersistResult::Done);
    assert_eq!(reply_to(complete, &completed), Reply::Completed);
    // Had the heartbeat not been recorded, the lease would have expired.
    h.offer(vec![ready("t", "b", 0)]);
    let lease = h.at(10_000).grant("t", 1, 1_000).remove(0).lease;
    let (beat, actions) = h
        .at(10_900)
        .call(&lease, LeaseCall::Heartbeat { extend: None });
    let (complete, _) = h
        .at(11_100)
        .call(&lease, LeaseCall::Complete { result: None });
    let after = h.persist(&actions, PersistResult::Unavailable);
    assert_eq!(reply_to(beat, &after), Reply::Error(PullError::Unavailable));
    assert_eq!(reply_to(complete, &after), lost());
    assert!(matches!(
        lease_change(&after),
        LeaseChange::Expire {
            resolution: Resolution::Retry { .. },
            ..
        }
    ));
}

#[test]
fn the_held_versions_of_a_key_are_listed_for_the_runtime() {
    let mut h = Harness::new();
    assert!(h.queue.holds_nothing());
    h.offer(vec![
        ready("t", "a", 0),
        ready("t", "b", 0),
        ready("u", "a", 0),
    ]);
    assert!(!h.queue.holds_nothing());
    assert_eq!(
        h.queue.held_versions(&key("t", "a")),
        [EventVersion::from_string("v-a".into())]
    );
    assert!(h.queue.held_versions(&key("t", "c")).is_empty());
    let leased = h.grant("t", 2, 30_000);
    assert_eq!(leased.len(), 2);
    assert_eq!(
        h.queue.held_versions(&key("t", "b")),
        [EventVersion::from_string("v-b".into())],
        "leased versions are held too"
    );
}

#[test]
fn a_cancel_of_a_ready_entry_finishes_it() {
    let mut h = Harness::new();
    h.offer(vec![ready("t", "a", 0), ready("t", "b", 0)]);
    let actions = h.handle(Input::VersionEnded {
        key: key("t", "a"),
        version: EventVersion::from_string("v-a".into()),
    });
    assert_eq!(finishes(&actions), [("a".to_string(), Finish::Done)]);
    // Another version, or an unknown key: nothing.
    assert!(
        h.handle(Input::VersionEnded {
            key: key("t", "b"),
            version: EventVersion::from_string("old".into())
        })
        .is_empty()
    );
    assert!(
        h.handle(Input::VersionEnded {
            key: key("t", "zz"),
            version: EventVersion::from_string("v-zz".into())
        })
        .is_empty()
    );
    assert_eq!(ids(&h.grant("t", 5, 30_000)), ["b"]);
}

#[test]
fn a_version_is_handed_out_once_leased_also_after_its_lease_was_cancelled() {
    let mut h = Harness::new();
    h.offer(vec![ready("t", "a", 0), ready("t", "b", 0)]);
    let version = |id: &str| EventVersion::from_string(format!("v-{id}"));
    let handed_out = |h: &Harness, id: &str| h.queue.is_handed_out(&key("t", id), &version(id));
    assert_eq!(handed_out(&h, "a"), Some(false), "ready");
    assert_eq!(handed_out(&h, "zz"), None, "unknown");
    assert_eq!(ids(&h.grant("t", 1, 30_000)), ["a"]);
    assert_eq!(handed_out(&h, "a"), Some(true), "leased");
    for id in ["a", "b"] {
        h.at(1_000).handle(Input::VersionEnded {
            key: key("t", id),
            version: version(id),
        });
    }
    assert_eq!(handed_out(&h, "a"), Some(true), "its lease cancelled");
    assert_eq!(
        handed_out(&h, "b"),
        None,
        "dropped before any worker had it"
    );
    // Forgotten with the lease, at its expiry.
    h.at(30_000).handle(Input::Tick);
    assert_eq!(handed_out(&h, "a"), None);
}

#[test]
fn a_cancel_of_a_leased_event_is_reported_by_the_next_heartbeat_and_fences_the_lease() {
    let mut h = Harness::new();
    h.offer(vec![ready("t", "a", 0)]);
    let lease = h.grant("t", 1, 30_000).remove(0).lease;
    let actions = h.at(1_000).handle(Input::VersionEnded {
        key: key("t", "a"),
        version: EventVersion::from_string("v-a".into()),
    });
    assert_eq!(finishes(&actions), [("a".to_string(), Finish::Done)]);
    let (call, actions) = h.call(&lease, LeaseCall::Heartbeat { extend: None });
    assert_eq!(
        reply_to(call, &actions),
        Reply::Heartbeat {
            expires_at: ts(30_000),
            cancel_requested: true
        }
    );
    for request in [
        LeaseCall::Complete { result: None },
        LeaseCall::Fail(fail_request(false, None)),
        LeaseCall::Release {
            delay: Duration::ZERO,
        },
    ] {
        let (call, actions) = h.call(&lease, request);
        assert_eq!(reply_to(call, &actions), lost());
    }
    // Forgotten at its expiry, without a write.
    assert!(h.at(30_000).handle(Input::Tick).is_empty());
    assert_eq!(h.queue.leases_len(), 0);
    let (call, actions) = h.call(&lease, LeaseCall::Heartbeat { extend: None });
    assert_eq!(reply_to(call, &actions), lost());
}

#[test]
fn a_cancel_during_a_write_lets_the_store_decide() {
    let mut h = Harness::new();
    h.offer(vec![
        ready("t", "a", 0),
        ready("t", "b", 0),
        ready("t", "c", 0),
    ]);
    let leases: Vec<LeaseId> = h
        .grant("t", 3, 30_000)
        .into_iter()
        .map(|l| l.lease)
        .collect();
    let cancel = |h: &mut Harness, id: &str| {
        h.handle(Input::VersionEnded {
            key: key("t", id),
            version: EventVersion::from_string(format!("v-{id}")),
        })
    };
    // The complete was recorded first: it stands.
    let (call, actions) = h.call(&leases[0], LeaseCall::Complete { result: None });
    assert!(cancel(&mut h, "a").is_empty());
    let done = h.persist(&actions, PersistResult::Done);
    assert_eq!(reply_to(call, &done), Reply::Completed);
    // The cancel was first: the complete is lost, heartbeats say cancel.
    let (call, actions) = h.call(&leases[1], LeaseCall::Complete { result: None });
    let answered = h.persist(&actions, PersistResult::Cancelled);
    assert_eq!(reply_to(call, &answered), lost());
    assert_eq!(finishes(&answered), [("b".to_string(), Finish::Done)]);
    let (call, actions) = h.call(&leases[1], LeaseCall::Heartbeat { extend: None });
    assert!(matches!(
        reply_to(call, &actions),
        Reply::Heartbeat {
            cancel_requested: true,
            ..
        }
    ));
    // A heartbeat recorded before the cancel reached the queue still
    // reports it.
    let (call, actions) = h.call(&leases[2], LeaseCall::Heartbeat { extend: None });
    assert!(cancel(&mut h, "c").is_empty());
    let done = h.persist(&actions, PersistResult::Done);
    assert!(matches!(
        reply_to(call, &done),
        Reply::Heartbeat {
            cancel_requested: true,
            ..
        }
    ));
    assert_eq!(finishes(&done), [("c".to_string(), Finish::Done)]);
}

#[test]
fn a_write_the_store_fences_loses_the_lease() {
    let mut h = Harness::new();
    h.offer(vec![ready("t", "a", 0), ready("t", "b", 0)]);
    let leases: Vec<LeaseId> = h
        .grant("t", 2, 30_000)
        .into_iter()
        .map(|l| l.lease)
        .collect();
    let (call, actions) = h.call(&leases[0], LeaseCall::Heartbeat { extend: None });
    let answered = h.persist(&actions, PersistResult::Lost);
    assert_eq!(reply_to(call, &answered), lost());
    assert_eq!(finishes(&answered), [("a".to_string(), Finish::Done)]);
    let (call, actions) = h.call(&leases[1], LeaseCall::Complete { result: None });
    let answered = h.persist(&actions, PersistResult::Unavailable);
    assert_eq!(
        reply_to(call, &answered),
        Reply::Error(PullError::Unavailable)
    );
    // Unavailable changed nothing: the worker may try again.
    let (reply, _) = h.call_done(&leases[1], LeaseCall::Complete { result: None });
    assert_eq!(reply, Reply::Completed);
    assert_eq!(h.queue.stats().lost, 1);
}

#[test]
fn unknown_or_forged_lease_ids_are_lease_lost() {
    let mut h = Harness::new();
    h.offer(vec![ready("t", "a", 0)]);
    let lease = h.grant("t", 1, 30_000).remove(0).lease;
    let forged = LeaseId::new(
        lease.key().clone(),
        lease.version().clone(),
        lease.attempt(),
        lease.epoch(),
        LeaseNonce([0; 16]),
    )
    .unwrap();
    let (call, actions) = h.call(&forged, LeaseCall::Complete { result: None });
    assert_eq!(reply_to(call, &actions), lost());
    assert_eq!(PullError::LeaseLost.code(), "lease_lost");
}

#[test]
fn a_partition_move_voids_its_leases_and_entries() {
    let mut h = Harness::new();
    let mut other = ready("t", "other", 0);
    other.partition = PartitionId(1);
    other.record.partition = PartitionId(1);
    h.offer(vec![
        ready("t", "a", 0),
        ready("t", "b", 0),
        other,
        ready("t", "c", 0),
    ]);
    let leases: Vec<LeaseId> = h
        .grant("t", 2, 30_000)
        .into_iter()
        .map(|l| l.lease)
        .collect();
    let (busy, _) = h.call(&leases[0], LeaseCall::Heartbeat { extend: None });
    let (queued, _) = h.call(&leases[0], LeaseCall::Complete { result: None });
    let (granting, grant) = h.claim("t", 1, 30_000, 0);
    assert!(matches!(&grant[..], [Action::PersistGrants { .. }]));
    let actions = h.handle(Input::PartitionLost {
        partition: PartitionId(0),
    });
    assert_eq!(reply_to(busy, &actions), lost());
    assert_eq!(reply_to(queued, &actions), lost());
    assert!(
        finishes(&actions).is_empty(),
        "the partition's core is gone"
    );
    assert_eq!(h.queue.leases_len(), 0);
    let (call, actions) = h.call(&leases[1], LeaseCall::Complete { result: None });
    assert_eq!(reply_to(call, &actions), lost());
    // The grant in flight is not handed out; the claim answers empty.
    let done = h.persist(&grant, PersistResult::Done);
    assert_eq!(reply_to(granting, &done), Reply::Leases(Vec::new()));
    assert!(finishes(&done).is_empty());
    // The other partition's entry is still there.
    assert_eq!(ids(&h.grant("t", 5, 30_000)), ["other"]);
    assert_eq!(h.queue.pending_of(&tenant("t")), 0);
}

#[test]
fn a_grant_lost_in_the_store_puts_the_claim_back_in_line() {
    let mut h = Harness::new();
    let (first, _) = h.claim("t", 2, 30_000, 10_000);
    let (second, _) = h.claim("t", 2, 30_000, 10_000);
    let actions = h.offer(vec![ready("t", "a", 0)]);
    let lost_grant = h.persist(&actions, PersistResult::Lost);
    assert_eq!(finishes(&lost_grant), [("a".to_string(), Finish::Done)]);
    assert!(no_reply(first, &lost_grant));
    assert_eq!(h.queue.waiting_of(&tenant("t")), 2);
    // Still first in line.
    let actions = h.offer(vec![ready("t", "b", 0)]);
    assert!(matches!(&actions[..], [Action::PersistGrants { call, .. }] if *call == first));
    let cancelled = h.persist(&actions, PersistResult::Cancelled);
    assert_eq!(finishes(&cancelled), [("b".to_string(), Finish::Done)]);
    // Its wait ends while it is being granted: answered empty after.
    let actions = h.offer(vec![ready("t", "c", 0)]);
    let done = h.at(10_000).persist(&actions, PersistResult::Lost);
    assert_eq!(reply_to(first, &done), Reply::Leases(Vec::new()));
    assert_eq!(reply_to(second, &done), Reply::Leases(Vec::new()));
}

#[test]
fn a_grant_the_store_could_not_record_is_ready_again() {
    let mut h = Harness::new();
    h.offer(vec![ready("t", "a", 0), ready("t", "b", 0)]);
    let (call, actions) = h.claim("t", 2, 30_000, 5_000);
    let failed = h.persist(&actions, PersistResult::Unavailable);
    assert_eq!(
        reply_to(call, &failed),
        Reply::Error(PullError::Unavailable)
    );
    assert!(finishes(&failed).is_empty());
    assert_eq!(h.queue.ready_len(), 2);
    // Partly recorded: the worker gets what was.
    let (call, actions) = h.claim("t", 2, 30_000, 0);
    let [Action::PersistGrants { op, .. }] = &actions[..] else {
        panic!();
    };
    let answered = h.handle(Input::Persisted {
        op: *op,
        results: vec![PersistResult::Unavailable, PersistResult::Done],
    });
    assert!(matches!(reply_to(call, &answered), Reply::Leases(l) if ids(&l) == ["b"]));
    assert_eq!(ids(&h.grant("t", 2, 30_000)), ["a"]);
}

#[test]
fn an_abandoned_claim_is_not_answered_and_its_grants_are_released() {
    let mut h = Harness::new();
    let (gone, _) = h.claim("t", 1, 30_000, 10_000);
    assert!(h.handle(Input::Abandon { call: gone }).is_empty());
    assert_eq!(h.queue.waiters_len(), 0);
    let (call, _) = h.claim("t", 1, 30_000, 10_000);
    let actions = h.offer(vec![ready("t", "a", 0)]);
    h.handle(Input::Abandon { call });
    let done = h.persist(&actions, PersistResult::Done);
    assert!(no_reply(call, &done));
    assert!(matches!(
        lease_change(&done),
        LeaseChange::Resolve { resolution: Resolution::Released { at }, report: None } if at == ts(0)
    ));
    let released = h.persist(&done, PersistResult::Done);
    assert_eq!(finishes(&released), [("a".to_string(), Finish::Done)]);
    assert_eq!((h.queue.leases_len(), h.queue.waiters_len()), (0, 0));
}

#[test]
fn claims_wait_while_the_lease_bound_is_reached() {
    let mut h = Harness::with(PullConfig {
        max_leases: 2,
        // The node's bound only: no tenant share below it.
        max_leases_per_tenant: Some(2),
        ..PullConfig::default()
    });
    h.offer(vec![
        ready("t", "a", 0),
        ready("t", "b", 0),
        ready("u", "c", 0),
    ]);
    let leases = h.grant("t", 5, 30_000);
    assert_eq!(ids(&leases), ["a", "b"]);
    let (call, actions) = h.claim("u", 1, 30_000, 10_000);
    assert!(actions.is_empty());
    assert_eq!(h.queue.lease_room(), 0);
    // A lease ends: the waiting claim is served.
    let (_, all) = h.call_done(&leases[0].lease, LeaseCall::Complete { result: None });
    assert!(
        matches!(&all[..], [.., Action::PersistGrants { call: c, .. }] if *c == call),
        "{all:#?}"
    );
}

#[test]
fn a_tenant_at_its_lease_share_is_refused_while_others_are_served() {
    let mut h = Harness::with(PullConfig {
        max_leases: 4,
        max_leases_per_tenant: Some(2),
        ..PullConfig::default()
    });
    h.offer(vec![
        ready("t", "a", 0),
        ready("t", "b", 0),
        ready("t", "c", 0),
        ready("u", "d", 0),
    ]);
    let leases = h.grant("t", 5, 30_000);
    assert_eq!(ids(&leases), ["a", "b"], "no more than its share");
    assert_eq!(h.queue.leases_of(&tenant("t")), 2);
    let (_, actions) = h.claim("t", 1, 30_000, 10_000);
    assert!(
        matches!(
            &actions[..],
            [Action::Reply {
                reply: Reply::Error(PullError::TooManyLeases),
                ..
            }]
        ),
        "{actions:#?}"
    );
    assert_eq!(PullError::TooManyLeases.code(), "too_many_leases");
    assert_eq!(ids(&h.grant("u", 5, 30_000)), ["d"], "u is still served");
    // One of t's leases ends: t may claim again, up to its share.
    h.call_done(&leases[0].lease, LeaseCall::Complete { result: None });
    assert_eq!(ids(&h.grant("t", 5, 30_000)), ["c"]);
    assert_eq!(h.queue.leases_of(&tenant("t")), 2);
}

#[test]
fn remembered_outcomes_are_bounded_in_time_and_number() {
    let mut h = Harness::with(PullConfig {
        max_remembered: 2,
        remember_for: Duration::from_secs(60),
        ..PullConfig::default()
    });
    h.offer(vec![
        ready("t", "a", 0),
        ready("t", "b", 0),
        ready("t", "c", 0),
    ]);
    let leases: Vec<LeaseId> = h
        .grant("t", 3, 30_000)
        .into_iter()
        .map(|l| l.lease)
        .collect();
    for lease in &leases {
        h.call_done(lease, LeaseCall::Complete { result: None });
    }
    assert_eq!(h.queue.remembered_len(), 2);
    assert_eq!(h.queue.stats().remembered_evicted, 1);
    let (call, actions) = h.call(&leases[0], LeaseCall::Complete { result: None });
    assert_eq!(reply_to(call, &actions), lost(), "evicted");
    let (call, actions) = h.call(&leases[2], LeaseCall::Complete { result: None });
    assert_eq!(reply_to(call, &actions), Reply::Completed);
    assert_eq!(h.queue.next_wake(), Some(ts(60_000)));
    h.at(60_000).handle(Input::Tick);
    assert_eq!((h.queue.remembered_len(), h.queue.held()), (0, 0));
}

#[test]
fn a_withdrawn_claim_answers_empty_at_once_unless_its_grant_is_being_recorded() {
    let mut h = Harness::new();
    let (waiting, _) = h.at(0).claim("t", 1, 30_000, 10_000);
    let actions = h.at(5).handle(Input::Withdraw { call: waiting });
    assert_eq!(reply_to(waiting, &actions), Reply::Leases(Vec::new()));
    assert_eq!(h.queue.waiters_len(), 0);
    assert_eq!(h.queue.unclaimed_tenants(), Vec::<TenantName>::new());

    // An entry nobody waits for is what a cluster node announces.
    h.at(10).offer(vec![ready("t", "e1", 10)]);
    assert_eq!(h.queue.unclaimed_tenants(), vec![tenant("t")]);
    let (granting, actions) = h.at(20).claim("t", 1, 30_000, 10_000);
    assert!(no_reply(granting, &actions), "its grant is being recorded");
    assert!(h.queue.unclaimed_tenants().is_empty());
    let withdrawn = h.at(21).handle(Input::Withdraw { call: granting });
    assert!(no_reply(granting, &withdrawn), "the grant answers it");
    let done = h.persist(&actions, PersistResult::Done);
    match reply_to(granting, &done) {
        Reply::Leases(leases) => assert_eq!(ids(&leases), ["e1"]),
        other => panic!("expected its lease, got {other:?}"),
    }
}

/// The lease an earlier owner of `entry`'s partition granted for its
/// current attempt and never saw end (that node restarted, or lost the
/// partition): worker `w-old`, under `epoch`, from `leased_at` to
/// `expires_at`.
fn orphan_of(entry: &ReadyEntry, epoch: u64, leased_at: i64, expires_at: i64) -> LeaseRecord {
    LeaseRecord {
        lease: LeaseId::new(
            entry.entry.key.clone(),
            entry.record.version.clone(),
            entry.record.attempts + 1,
            epoch,
            LeaseNonce([7; 16]),
        )
        .unwrap(),
        partition: entry.partition,
        worker: WorkerId::new("w-old").unwrap(),
        leased_at: ts(leased_at),
        expires_at: ts(expires_at),
        deadline_at: ts(expires_at + 3_600 * SECOND),
    }
}

#[test]
fn an_orphan_a_grant_finds_is_held_until_its_expiry_then_recorded_as_an_expired_attempt() {
    let mut h = Harness::new();
    let entry = ready("t", "a", 0);
    h.at(1_000).offer(vec![entry.clone()]);
    let (call, actions) = h.claim("t", 1, 30_000, 60_000);
    // Granted under epoch 0, which ended while the lease was live.
    let orphan = orphan_of(&entry, 0, 500, 8_000);
    let found = h.persist(&actions, PersistResult::Orphaned(Box::new(orphan.clone())));
    assert!(found.is_empty(), "the claim waits on: {found:?}");
    assert_eq!(h.queue.stats().orphans, 1);
    assert_eq!(h.queue.leases_len(), 1);
    assert_eq!(h.queue.waiters_len(), 1);
    assert!(h.queue.holds(&entry.entry.key, &entry.record.version));
    // Its worker's calls find it void, as after any partition move.
    for request in [
        LeaseCall::Heartbeat { extend: None },
        LeaseCall::Complete { result: None },
    ] {
        let (late, answer) = h.at(2_000).call(&orphan.lease, request);
        assert_eq!(reply_to(late, &answer), lost());
    }
    // Not before its expiry: its worker may still be running it.
    assert_eq!(h.queue.next_wake(), Some(ts(8_000)));
    assert!(h.at(7_999).handle(Input::Tick).is_empty());
    let expired = h.at(8_000).handle(Input::Tick);
    let [
        Action::PersistLease {
            lease,
            partition,
            epoch,
            change: LeaseChange::Expire { resolution, report },
            ..
        },
    ] = &expired[..]
    else {
        panic!("{expired:?}");
    };
    assert_eq!((lease, *partition), (&orphan.lease, PartitionId(0)));
    assert_eq!(*epoch, 1, "written under the epoch it was found in");
    assert_eq!(*resolution, Resolution::Retry { at: ts(9_000) });
    assert_eq!(report.started_at, ts(500));
    assert_eq!(report.duration_ms, 7_500);
    let error = report.error.clone().unwrap();
    assert!(error.starts_with(LEASE_EXPIRED_CODE), "{error}");
    assert!(error.contains("w-old"), "{error}");
    let done = h.persist(&expired, PersistResult::Done);
    assert!(
        done.iter().any(|a| matches!(
            a,
            Action::Finish {
                epoch: 1,
                finish: Finish::Done,
                ..
            }
        )),
        "finished in its core: {done:?}"
    );
    assert_eq!((h.queue.leases_len(), h.queue.stats().expired), (0, 1));

    // Fired again after its back-off: the next attempt number.
    let again = h
        .at(9_000)
        .offer(vec![ready_in("t", "a", 9_000, "default", 1)]);
    let [Action::PersistGrants { grants, .. }] = &again[..] else {
        panic!("{again:?}");
    };
    assert_eq!(grants[0].lease.attempt(), 2);
    let granted = h.persist(&again, PersistResult::Done);
    let Reply::Leases(leases) = reply_to(call, &granted) else {
        panic!("{granted:?}");
    };
    assert_eq!(leases[0].attempt, 2);
}

#[test]
fn an_orphan_already_expired_is_recorded_at_once_and_its_last_attempt_fails_the_event() {
    let mut h = Harness::new();
    let entry = ready_in("t", "a", 0, "default", 2);
    h.at(1_000).offer(vec![entry.clone()]);
    let (call, actions) = h.claim("t", 1, 30_000, 5_000);
    // Same epoch: the node restarted (a single node's epoch never moves).
    let orphan = orphan_of(&entry, 1, 100, 900);
    let expired = h.persist(&actions, PersistResult::Orphaned(Box::new(orphan.clone())));
    assert!(no_reply(call, &expired));
    let LeaseChange::Expire {
        resolution: Resolution::Dead { reason },
        report,
    } = lease_change(&expired)
    else {
        panic!("{expired:?}");
    };
    assert!(
        reason.contains("max_attempts reached") && reason.contains(LEASE_EXPIRED_CODE),
        "{reason}"
    );
    assert_eq!(report.verdict, Verdict::Retry);
    let done = h.persist(&expired, PersistResult::Done);
    assert_eq!(finishes(&done), [("a".to_string(), Finish::Done)]);
    assert_eq!(h.queue.leases_len(), 0);
}

#[test]
fn an_orphan_whose_version_ends_is_finished_without_an_expiry() {
    let mut h = Harness::new();
    let entry = ready("t", "a", 0);
    h.at(1_000).offer(vec![entry.clone()]);
    let (_, actions) = h.claim("t", 1, 30_000, 0);
    let orphan = orphan_of(&entry, 0, 500, 8_000);
    h.persist(&actions, PersistResult::Orphaned(Box::new(orphan)));
    let ended = h.at(2_000).handle(Input::VersionEnded {
        key: entry.entry.key.clone(),
        version: entry.record.version.clone(),
    });
    assert_eq!(finishes(&ended), [("a".to_string(), Finish::Done)]);
    assert!(h.at(8_000).handle(Input::Tick).is_empty());
    assert_eq!(h.queue.held(), 0);
}

#[test]
fn leases_given_back_are_released_at_their_expiry_without_an_attempt() {
    let mut h = Harness::new();
    h.offer(vec![
        ready("t", "a", 0),
        ready("t", "b", 0),
        ready("t", "c", 0),
    ]);
    let leases = h.grant("t", 3, 5_000);
    // One ends (not given back), one is being extended (given back).
    h.at(1_000)
        .call_done(&leases[0].lease, LeaseCall::Complete { result: None });
    let (_, extending) = h
        .at(2_000)
        .call(&leases[1].lease, LeaseCall::Heartbeat { extend: None });
    assert!(matches!(
        lease_change(&extending),
        LeaseChange::Extend { .. }
    ));
    // And an orphan a grant found (left out: its expiry is the next
    // owner's to record).
    let orphaned = ready("t", "d", 0);
    h.offer(vec![orphaned.clone()]);
    let (_, granting) = h.claim("t", 1, 5_000, 0);
    h.persist(
        &granting,
        PersistResult::Orphaned(Box::new(orphan_of(&orphaned, 0, 0, 9_000))),
    );
    assert_eq!(h.queue.leases_len(), 3);

    let given = h.queue.give_back(PartitionId(0), ts(3_000));
    let mut expected: Vec<(LeaseId, LeaseChange)> = leases[1..]
        .iter()
        .map(|lease| {
            (
                lease.lease.clone(),
                LeaseChange::Resolve {
                    resolution: Resolution::Released { at: ts(5_000) },
                    report: None,
                },
            )
        })
        .collect();
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(given, expected);
    // Never before now, and nothing of another partition.
    let late = h.queue.give_back(PartitionId(0), ts(6_000));
    assert!(late.iter().all(|(_, change)| matches!(
        change,
        LeaseChange::Resolve { resolution: Resolution::Released { at }, .. } if *at == ts(6_000)
    )));
    assert!(h.queue.give_back(PartitionId(1), ts(3_000)).is_empty());
}

#[test]
fn an_entry_whose_expiry_passed_while_ready_goes_back_to_be_ended_not_granted() {
    let mut h = Harness::new();
    let mut lapsing = ready("t", "lapsing", SECOND);
    lapsing.policy.expires_at = Some(ts(3 * SECOND));
    let mut fresh = ready("t", "fresh", SECOND);
    fresh.policy.expires_at = Some(ts(10 * SECOND));
    h.at(2 * SECOND).offer(vec![lapsing, fresh]);

    h.at(3 * SECOND);
    let (call, actions) = h.claim("t", 10, 30_000, 0);
    assert_eq!(
        finishes(&actions),
        vec![("lapsing".to_string(), Finish::RetryAt(ts(3 * SECOND)))],
        "handed back to its partition, due now, whose delivery path expires it"
    );
    let done = h.persist(&actions, PersistResult::Done);
    match reply_to(call, &[actions, done].concat()) {
        Reply::Leases(leases) => assert_eq!(ids(&leases), vec!["fresh"]),
        other => panic!("expected a lease, got {other:?}"),
    }
    assert_eq!(h.queue.stats().lapsed, 1);
    assert_eq!(
        h.queue.pending_of(&tenant("t")),
        0,
        "neither waits any more"
    );
}

#[test]
fn a_claim_finding_only_lapsed_entries_answers_empty() {
    let mut h = Harness::new();
    let mut lapsing = ready("t", "lapsing", SECOND);
    lapsing.policy.expires_at = Some(ts(2 * SECOND));
    h.at(SECOND).offer(vec![lapsing]);
    h.at(2 * SECOND);
    let (call, actions) = h.claim("t", 10, 30_000, 0);
    assert_eq!(finishes(&actions).len(), 1, "{actions:#?}");
    assert_eq!(reply_to(call, &actions), Reply::Leases(Vec::new()));
    assert_eq!(h.queue.pending_of(&tenant("t")), 0);
}

#[test]
fn an_unclaimed_entry_goes_back_at_its_expiry_without_a_claim() {
    let mut h = Harness::new();
    let mut lapsing = ready("t", "lapsing", SECOND);
    lapsing.policy.expires_at = Some(ts(3 * SECOND));
    h.at(SECOND)
        .offer(vec![lapsing, ready("t", "lasting", SECOND)]);
    assert_eq!(
        h.queue.next_wake(),
        Some(ts(3 * SECOND)),
        "woken at its expiry"
    );
    assert!(finishes(&h.at(3 * SECOND - 1).handle(Input::Tick)).is_empty());
    let actions = h.at(3 * SECOND).handle(Input::Tick);
    assert_eq!(
        finishes(&actions),
        vec![("lapsing".to_string(), Finish::RetryAt(ts(3 * SECOND)))]
    );
    assert_eq!(h.queue.next_wake(), None, "no timer left behind");
    assert_eq!(ids(&h.grant("t", 10, 30_000)), vec!["lasting"]);
}

#[test]
fn a_granted_or_cancelled_entry_leaves_no_expiry_timer() {
    let mut h = Harness::new();
    let mut granted = ready("t", "granted", SECOND);
    granted.policy.expires_at = Some(ts(50 * SECOND));
    let mut cancelled = ready("t", "cancelled", 2 * SECOND);
    cancelled.policy.expires_at = Some(ts(60 * SECOND));
    h.at(2 * SECOND).offer(vec![granted, cancelled]);
    assert_eq!(ids(&h.grant("t", 1, 30_000)), vec!["granted"]);
    h.handle(Input::VersionEnded {
        key: key("t", "cancelled"),
        version: EventVersion::from_string("v-cancelled".to_string()),
    });
    // Only the granted lease's own expiry is left.
    assert_eq!(h.queue.next_wake(), Some(ts(32 * SECOND)));
}
