//! The conformance suite every [`Store`] backend runs.
//!
//! Each case is an `async fn` taking a factory that creates a fresh, empty
//! store with a given partition count. A backend's test file expands
//! [`store_conformance_tests!`](crate::store_conformance_tests) with its
//! factory to get one named `#[tokio::test]` per case:
//!
//! ```ignore
//! async fn factory(partitions: PartitionCount) -> StoreUnderTest { ... }
//! belfry_store::store_conformance_tests!(factory);
//! ```
//!
//! Changing a backend's behaviour means extending this suite, so that every
//! backend keeps the same contract.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use belfry_core::event::{
    Attempt, AttemptReport, CommandOutcome, Debounce, DeliveryOption, Effect, EventCommand,
    EventRecord, EventStatus, Precondition, PreviousDelivery, Replaced,
};
use belfry_core::tenant::{BuiltinTarget, HttpTarget, PullTarget};
use belfry_core::{
    DueCursor, EventId, EventKey, EventVersion, PartitionCount, PartitionId, RetryPolicy,
    SigningSecrets, SinkConfig, TenantConfig, TenantName, TenantPause, Timestamp, Verdict,
};

use belfry_core::WorkerId;
use belfry_core::pull::{LeaseChange, LeaseId, LeaseNonce, LeaseRecord, Resolution};

use crate::{
    Applied, ApplyParams, ChangeLeaseParams, ChangeLeasesParams, CountEventsParams, DuePageParams,
    EmbeddedOptions, EmbeddedStore, Fence, KeyedCommand, LeaseWriteOutcome, ListEventsParams,
    PurgeParams, RecordLeasesParams, SharedStore, StoredLeaseState,
};

/// A store made for one case, with whatever must live as long as it (a
/// temporary directory, a database).
pub struct StoreUnderTest {
    pub store: SharedStore,
    /// Moves a partition's fencing epoch forward (a hand-over), for
    /// backends with several owners; `None` on a single-owner backend,
    /// whose epoch never moves.
    pub move_epoch: Option<EpochMover>,
    /// Dropped after `store` (field order).
    _keep_alive: Box<dyn Any + Send>,
}

/// See [`StoreUnderTest::move_epoch`]: answers the partition's new epoch.
pub type EpochMover =
    Box<dyn Fn(PartitionId) -> Pin<Box<dyn Future<Output = u64> + Send>> + Send + Sync>;

impl StoreUnderTest {
    pub fn new(store: SharedStore, keep_alive: impl Any + Send) -> Self {
        StoreUnderTest {
            store,
            move_epoch: None,
            _keep_alive: Box::new(keep_alive),
        }
    }

    pub fn with_epoch_mover(mut self, mover: EpochMover) -> Self {
        self.move_epoch = Some(mover);
        self
    }
}

/// The embedded backend in a fresh temporary directory.
pub async fn embedded_factory(partitions: PartitionCount) -> StoreUnderTest {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let store = EmbeddedStore::open(EmbeddedOptions {
        data_dir: dir.path().to_path_buf(),
        partitions,
        // Three shards over (mostly) four partitions: one shard owns two,
        // so both the spread and the sharing of a shard are exercised.
        writers: std::num::NonZeroUsize::new(3),
        clock: std::sync::Arc::new(belfry_clock::SystemClock),
    })
    .expect("open the embedded store");
    StoreUnderTest::new(Arc::new(store), dir)
}

/// Expands to one `#[tokio::test]` per conformance case, each calling the
/// case with `$factory` (a path to an
/// `async fn(PartitionCount) -> StoreUnderTest`).
#[macro_export]
macro_rules! store_conformance_tests {
    ($factory:path) => {
        $crate::store_conformance_tests!(@cases $factory;
            partitions_are_reported,
            tenants_put_get_list_replace_delete,
            tenant_pause_is_kept_apart_from_the_config,
            create_then_get,
            pull_settings_are_kept_and_replaced,
            delivery_policy_settings_and_expiry_are_kept,
            get_events_in_input_order,
            same_instant_update_keeps_version,
            move_starts_a_new_version,
            cancel_and_cancel_unknown,
            if_match_changes_nothing_unless_it_holds,
            if_absent_creates_once_however_many_race,
            a_debounced_series_keeps_its_start,
            attempt_delivered_finishes,
            attempt_retry_reschedules,
            attempt_permanent_fails,
            stale_attempt_changes_nothing_but_history,
            a_repeated_attempt_is_recorded_once,
            expire_only_pending,
            results_in_input_order,
            several_commands_for_one_key_in_one_apply,
            due_index_holds_exactly_pending_in_order,
            due_page_cursor_through_and_limit,
            due_page_leaves_out_skipped_tenants,
            due_page_partition_isolation,
            due_index_follows_changes,
            list_events_filters_and_pagination,
            count_events_by_status_up_to_a_bound,
            filtered_pages_are_full_until_the_last,
            time_cursor_survives_its_event,
            filtered_listing_reads_only_its_page,
            attempts_history_in_order,
            purge_removes_only_old_finished,
            delete_finished_takes_only_finished_events,
            names_with_slashes_and_non_ascii,
            concurrent_applies_all_land,
            concurrent_changes_of_one_event_all_count,
            api_keys_put_find_list_touch_delete,
            audit_log_append_page_purge,
            audit_log_same_millisecond_in_recorded_order,
            bulk_actions_create_get_and_list,
            bulk_action_updates_compare_and_set,
            bulk_action_claims_exclude_each_other,
            bulk_actions_purge_only_old_finished,
            lease_granted_once_per_version,
            lease_extend_complete_and_repeats,
            lease_retry_dead_and_release_move_the_event,
            lease_fenced_by_epoch_and_lease_id,
            lease_of_cancelled_or_moved_event_is_void,
            lease_orphan_is_expired_at_its_time_as_an_attempt,
            lease_orphan_of_an_earlier_epoch_is_expired_by_the_new_owner,
            concurrent_grants_of_one_version_one_wins,
            lease_batch_answers_each_change_truthfully,
            lease_batch_fenced_change_is_lost_alone,
        );
    };
    (@cases $factory:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::conformance::$case($factory).await;
            }
        )*
    };
}

// ---------------------------------------------------------------- helpers

fn tenant(name: &str) -> TenantName {
    TenantName::new(name).expect("valid tenant name")
}

fn key(tenant_name: &str, id: &str) -> EventKey {
    EventKey::new(tenant(tenant_name), EventId::new(id).expect("valid id"))
}

fn ts(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms)
}

fn upsert(at: i64, version: &str) -> EventCommand {
    EventCommand::Upsert {
        event_time: ts(at),
        payload: Some(format!("payload-{version}")),
        delivery: DeliveryOption::FullEvent,
        new_version: EventVersion::from_string(version.into()),
        settings: Default::default(),
    }
}

fn attempt(version: &str, number: u32, verdict: Verdict, started_at: i64) -> EventCommand {
    EventCommand::RecordAttempt {
        version: EventVersion::from_string(version.into()),
        number,
        report: AttemptReport {
            started_at: ts(started_at),
            duration_ms: 7,
            verdict,
            http_status: Some(match verdict {
                Verdict::Delivered => 200,
                Verdict::Retry => 503,
                Verdict::Permanent => 400,
            }),
            error: (verdict != Verdict::Delivered).then(|| format!("{verdict:?} at {started_at}")),
            steer: None,
        },
        tenant: Default::default(),
    }
}

fn command(key: &EventKey, command: EventCommand) -> KeyedCommand {
    KeyedCommand {
        key: key.clone(),
        command,
        fence: None,
    }
}

async fn apply(store: &SharedStore, now: i64, commands: Vec<KeyedCommand>) -> Vec<Applied> {
    let count = commands.len();
    let applied = store
        .apply(ApplyParams {
            commands,
            now: ts(now),
            retry: RetryPolicy::default(),
        })
        .await
        .expect("apply");
    assert_eq!(applied.len(), count, "one result per command");
    applied
}

async fn apply_one(store: &SharedStore, now: i64, key: &EventKey, cmd: EventCommand) -> Applied {
    apply(store, now, vec![command(key, cmd)])
        .await
        .pop()
        .expect("one result")
}

async fn get(store: &SharedStore, key: &EventKey) -> Option<EventRecord> {
    store.get_event(key).await.expect("get_event")
}

/// Every due entry of every partition, partition by partition.
async fn all_due(store: &SharedStore) -> Vec<(PartitionId, DueCursor)> {
    let mut out = Vec::new();
    for partition in store.partitions().all() {
        for cursor in due(store, partition, None, i64::MAX, usize::MAX).await {
            out.push((partition, cursor));
        }
    }
    out
}

async fn due(
    store: &SharedStore,
    partition: PartitionId,
    after: Option<DueCursor>,
    through: i64,
    limit: usize,
) -> Vec<DueCursor> {
    store
        .due_page(DuePageParams {
            partition,
            after,
            through: ts(through),
            limit,
            tenant: None,
            skip_tenants: Vec::new(),
        })
        .await
        .expect("due_page")
}

fn cursor(at: i64, key: &EventKey) -> DueCursor {
    DueCursor {
        due: ts(at),
        key: key.clone(),
    }
}

fn http_tenant(name: &str, url: &str) -> TenantConfig {
    TenantConfig {
        name: tenant(name),
        sink: SinkConfig::Http(HttpTarget {
            url: url.into(),
            headers: [("x-token".to_string(), "secret".to_string())].into(),
            timeout_ms: Some(1_500),
            delivery: Default::default(),
        }),
        signing: None,
        notify: None,
    }
}

fn partitions(count: u16) -> PartitionCount {
    PartitionCount::new(count).expect("non-zero")
}

// ------------------------------------------------------------------ cases

/// Counts per status follow creates, cancels and attempts; stop at the
/// bound; leave out other tenants (also one whose name extends this one's)
/// and engine-internal events.
pub async fn count_events_by_status_up_to_a_bound<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let count = |name: &str, status, at_most| {
        store.count_events(CountEventsParams {
            tenant: tenant(name),
            status,
            at_most,
        })
    };
    assert_eq!(count("t", EventStatus::Scheduled, 100).await.unwrap(), 0);

    let mut commands: Vec<KeyedCommand> = (0..10)
        .map(|i| command(&key("t", &format!("e{i}")), upsert(1_000 + i, "v")))
        .collect();
    commands.push(command(&key("tt", "e0"), upsert(1_000, "v")));
    commands.push(command(&key("t/x", "e0"), upsert(1_000, "v")));
    commands.push(command(
        &EventKey::new(tenant("t"), EventId::internal("control").unwrap()),
        upsert(1_000, "v"),
    ));
    apply(store, 0, commands).await;
    assert_eq!(count("t", EventStatus::Scheduled, 100).await.unwrap(), 10);
    assert_eq!(
        count("t", EventStatus::Scheduled, 4).await.unwrap(),
        4,
        "bounded"
    );
    assert_eq!(count("t", EventStatus::Scheduled, 0).await.unwrap(), 0);
    assert_eq!(count("tt", EventStatus::Scheduled, 100).await.unwrap(), 1);
    assert_eq!(
        count("nobody", EventStatus::Scheduled, 100).await.unwrap(),
        0
    );

    apply_one(store, 10, &key("t", "e0"), EventCommand::Cancel).await;
    apply_one(
        store,
        2_000,
        &key("t", "e1"),
        attempt("v", 1, Verdict::Delivered, 2_000),
    )
    .await;
    apply_one(
        store,
        2_000,
        &key("t", "e2"),
        attempt("v", 1, Verdict::Retry, 2_000),
    )
    .await;
    assert_eq!(count("t", EventStatus::Scheduled, 100).await.unwrap(), 7);
    assert_eq!(count("t", EventStatus::Retrying, 100).await.unwrap(), 1);
    assert_eq!(count("t", EventStatus::Cancelled, 100).await.unwrap(), 1);
    assert_eq!(count("t", EventStatus::Delivered, 100).await.unwrap(), 1);
    // A cancelled event created again counts as scheduled again.
    apply_one(store, 20, &key("t", "e0"), upsert(5_000, "w")).await;
    assert_eq!(count("t", EventStatus::Scheduled, 100).await.unwrap(), 8);
    assert_eq!(count("t", EventStatus::Cancelled, 100).await.unwrap(), 0);
}

pub async fn partitions_are_reported<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(7)).await;
    assert_eq!(under_test.store.partitions(), partitions(7));
}

pub async fn tenant_pause_is_kept_apart_from_the_config<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let paused = TenantPause {
        paused: true,
        reason: Some("receiver answered 410 Gone".into()),
        since: ts(1_000),
    };
    // No such tenant: nothing is written.
    assert!(
        !store
            .put_tenant_pause(&tenant("a/x"), paused.clone())
            .await
            .unwrap()
    );
    assert_eq!(store.get_tenant_pause(&tenant("a/x")).await.unwrap(), None);

    store
        .put_tenant(http_tenant("a/x", "http://127.0.0.1:1/hook"))
        .await
        .unwrap();
    store
        .put_tenant(http_tenant("b", "http://127.0.0.1:1/hook"))
        .await
        .unwrap();
    assert_eq!(store.get_tenant_pause(&tenant("a/x")).await.unwrap(), None);
    assert!(store.list_tenant_pauses().await.unwrap().is_empty());
    assert!(
        store
            .put_tenant_pause(&tenant("a/x"), paused.clone())
            .await
            .unwrap()
    );
    assert!(
        store
            .put_tenant_pause(&tenant("b"), paused.clone())
            .await
            .unwrap()
    );
    assert_eq!(
        store.get_tenant_pause(&tenant("a/x")).await.unwrap(),
        Some(paused.clone())
    );
    assert_eq!(
        store.list_tenant_pauses().await.unwrap(),
        vec![
            (tenant("a/x"), paused.clone()),
            (tenant("b"), paused.clone())
        ],
        "ordered by name"
    );

    // Replacing the config keeps the pause.
    store
        .put_tenant(http_tenant("a/x", "http://127.0.0.1:2/other"))
        .await
        .unwrap();
    assert_eq!(
        store.get_tenant_pause(&tenant("a/x")).await.unwrap(),
        Some(paused.clone())
    );

    // Resumed: kept, with when.
    let resumed = TenantPause {
        paused: false,
        reason: None,
        since: ts(2_000),
    };
    assert!(
        store
            .put_tenant_pause(&tenant("b"), resumed.clone())
            .await
            .unwrap()
    );
    assert_eq!(
        store.get_tenant_pause(&tenant("b")).await.unwrap(),
        Some(resumed.clone())
    );
    assert_eq!(
        store.list_tenant_pauses().await.unwrap(),
        vec![
            (tenant("a/x"), paused.clone()),
            (tenant("b"), resumed.clone())
        ]
    );

    // Removed with the tenant: one registered again under the name starts
    // unpaused.
    assert!(store.delete_tenant(&tenant("a/x")).await.unwrap());
    assert_eq!(store.get_tenant_pause(&tenant("a/x")).await.unwrap(), None);
    store
        .put_tenant(http_tenant("a/x", "http://127.0.0.1:1/hook"))
        .await
        .unwrap();
    assert_eq!(store.get_tenant_pause(&tenant("a/x")).await.unwrap(), None);
    assert_eq!(
        store.list_tenant_pauses().await.unwrap(),
        vec![(tenant("b"), resumed)]
    );
}

pub async fn tenants_put_get_list_replace_delete<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    assert!(store.list_tenants().await.unwrap().is_empty());
    assert_eq!(store.get_tenant(&tenant("b")).await.unwrap(), None);

    let b = http_tenant("b", "http://127.0.0.1:1/hook");
    let a = TenantConfig {
        name: tenant("a/x"),
        sink: SinkConfig::Builtin(BuiltinTarget {
            processor: "log".into(),
        }),
        signing: None,
        notify: None,
    };
    store.put_tenant(b.clone()).await.unwrap();
    store.put_tenant(a.clone()).await.unwrap();
    assert_eq!(
        store.get_tenant(&tenant("b")).await.unwrap(),
        Some(b.clone())
    );
    assert_eq!(
        store.list_tenants().await.unwrap(),
        vec![a.clone(), b.clone()],
        "ordered by name"
    );

    let replaced = http_tenant("b", "http://127.0.0.1:2/other");
    store.put_tenant(replaced.clone()).await.unwrap();
    assert_eq!(
        store.get_tenant(&tenant("b")).await.unwrap(),
        Some(replaced.clone())
    );
    assert_eq!(store.list_tenants().await.unwrap().len(), 2);

    // Signing secrets (current and a rotated-out one) round-trip, and a
    // replacement without them clears them.
    let mut signed = http_tenant("b", "http://127.0.0.1:3/signed");
    signed.signing =
        Some(SigningSecrets::new("whsec_b2xk".into()).rotated("whsec_bmV3".into(), ts(1_000)));
    store.put_tenant(signed.clone()).await.unwrap();
    assert_eq!(
        store.get_tenant(&tenant("b")).await.unwrap(),
        Some(signed.clone())
    );
    assert_eq!(store.list_tenants().await.unwrap()[1], signed);
    store.put_tenant(replaced.clone()).await.unwrap();
    assert_eq!(
        store.get_tenant(&tenant("b")).await.unwrap(),
        Some(replaced.clone())
    );

    // A notice target (either kind) round-trips, and a replacement
    // without one clears it.
    for target in [
        belfry_core::NotifyTarget::Url {
            url: "https://ops.example/notices".into(),
        },
        belfry_core::NotifyTarget::KafkaTopic {
            kafka_topic: "notices".into(),
        },
    ] {
        let mut notified = http_tenant("b", "http://127.0.0.1:4/notified");
        notified.notify = Some(target);
        store.put_tenant(notified.clone()).await.unwrap();
        assert_eq!(
            store.get_tenant(&tenant("b")).await.unwrap(),
            Some(notified.clone())
        );
        assert_eq!(store.list_tenants().await.unwrap()[1], notified);
    }
    store.put_tenant(replaced.clone()).await.unwrap();
    assert_eq!(
        store.get_tenant(&tenant("b")).await.unwrap(),
        Some(replaced.clone())
    );

    // A pull tenant's defaults and declared queues round-trip (the
    // multiplier a float, the queues in their order), and a replacement
    // without them clears them.
    let pull = |target: PullTarget| TenantConfig {
        name: tenant("c"),
        sink: SinkConfig::Pull(target),
        signing: None,
        notify: None,
    };
    let full = pull(PullTarget {
        delivery: belfry_core::DeliveryDefaults {
            max_attempts: Some(7),
            backoff: Some(belfry_core::Backoff::new(250, 1.5, 90_000).unwrap()),
            max_age_ms: Some(60_000),
        },
        queues: Some(vec![
            belfry_core::QueueName::new("sms").unwrap(),
            belfry_core::QueueName::new("emails").unwrap(),
        ]),
    });
    store.put_tenant(full.clone()).await.unwrap();
    assert_eq!(store.get_tenant(&tenant("c")).await.unwrap(), Some(full));
    let plain = pull(PullTarget::default());
    store.put_tenant(plain.clone()).await.unwrap();
    assert_eq!(store.get_tenant(&tenant("c")).await.unwrap(), Some(plain));
    assert!(store.delete_tenant(&tenant("c")).await.unwrap());

    assert!(store.delete_tenant(&tenant("b")).await.unwrap());
    assert!(
        !store.delete_tenant(&tenant("b")).await.unwrap(),
        "already gone"
    );
    assert_eq!(store.get_tenant(&tenant("b")).await.unwrap(), None);
    assert_eq!(store.list_tenants().await.unwrap(), vec![a]);
}

pub async fn create_then_get<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(8)).await;
    let store = &under_test.store;
    let k = key("t", "e1");
    assert_eq!(get(store, &k).await, None);
    let applied = apply_one(store, 1_000, &k, upsert(5_000, "v1")).await;
    let partition = store.partitions().partition_of(&k);
    assert_eq!(applied.key, k);
    assert_eq!(applied.partition, partition);
    assert_eq!(applied.outcome, CommandOutcome::Created);
    assert_eq!(applied.effects, vec![Effect::Arm { at: ts(5_000) }]);
    let record = applied.record.expect("record after create");
    assert_eq!(record.status, EventStatus::Scheduled);
    assert_eq!(record.version.as_str(), "v1");
    assert_eq!(record.next_fire_at, Some(ts(5_000)));
    assert_eq!(record.created_at, ts(1_000));
    assert_eq!(record.partition, partition);
    assert_eq!(get(store, &k).await, Some(record));
    assert_eq!(all_due(store).await, vec![(partition, cursor(5_000, &k))]);
}

/// An event's pull settings (queue, attempt cap, back-off) are stored
/// with it, kept through attempts, and replaced by an upsert like its
/// payload; an event without them reads the defaults.
pub async fn pull_settings_are_kept_and_replaced<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(8)).await;
    let store = &under_test.store;
    let settings = belfry_core::EventSettings {
        queue: Some(belfry_core::QueueName::new("emails.high-1").expect("valid queue")),
        max_attempts: Some(7),
        backoff: Some(belfry_core::Backoff::new(250, 1.5, 60_000).expect("valid back-off")),
        ..belfry_core::EventSettings::default()
    };
    let with = |at, version: &str, pull: &belfry_core::EventSettings| match upsert(at, version) {
        EventCommand::Upsert {
            event_time,
            payload,
            delivery,
            new_version,
            ..
        } => EventCommand::Upsert {
            event_time,
            payload,
            delivery,
            new_version,
            settings: pull.clone(),
        },
        other => other,
    };
    let k = key("t", "pulled");
    let plain = key("t", "plain");
    apply_one(store, 1_000, &k, with(5_000, "v1", &settings)).await;
    apply_one(store, 1_000, &plain, upsert(5_000, "p1")).await;
    assert_eq!(get(store, &k).await.expect("stored").settings, settings);
    assert_eq!(
        get(store, &plain).await.expect("stored").settings,
        belfry_core::EventSettings::default()
    );
    apply_one(store, 5_000, &k, attempt("v1", 1, Verdict::Retry, 5_000)).await;
    let retried = get(store, &k).await.expect("stored");
    assert_eq!(retried.attempts, 1);
    assert_eq!(retried.settings, settings, "kept through attempts");
    let listed = store
        .get_events(std::slice::from_ref(&k))
        .await
        .expect("read");
    assert_eq!(listed[0].as_ref().map(|r| &r.settings), Some(&settings));
    apply_one(store, 6_000, &k, with(9_000, "v2", &Default::default())).await;
    assert_eq!(
        get(store, &k).await.expect("stored").settings,
        belfry_core::EventSettings::default(),
        "replaced by the next upsert"
    );
}

/// An event's delivery policy (attempt cap, back-off, attempt timeout,
/// expiry) is stored with it and kept through attempts; the transition
/// reads it (and the tenant's defaults carried by the attempt) for the next
/// attempt. An event ended `expired` is finished and listed under its
/// status.
pub async fn delivery_policy_settings_and_expiry_are_kept<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(8)).await;
    let store = &under_test.store;
    let settings = belfry_core::EventSettings {
        max_attempts: Some(2),
        backoff: Some(belfry_core::Backoff::new(100, 2.0, 1_000).expect("valid back-off")),
        attempt_timeout_ms: Some(750),
        expire_at: Some(ts(60_000)),
        max_age_ms: Some(30_000),
        ..belfry_core::EventSettings::default()
    };
    let k = key("t", "policed");
    let with_settings = match upsert(5_000, "v1") {
        EventCommand::Upsert {
            event_time,
            payload,
            delivery,
            new_version,
            ..
        } => EventCommand::Upsert {
            event_time,
            payload,
            delivery,
            new_version,
            settings: settings.clone(),
        },
        other => other,
    };
    apply_one(store, 1_000, &k, with_settings).await;
    assert_eq!(get(store, &k).await.expect("stored").settings, settings);
    apply_one(store, 5_010, &k, attempt("v1", 1, Verdict::Retry, 5_000)).await;
    let retrying = get(store, &k).await.expect("stored");
    assert_eq!(retrying.settings, settings, "kept through attempts");
    assert_eq!(
        retrying.next_fire_at,
        Some(ts(5_110)),
        "the event's back-off"
    );
    let last = apply_one(store, 5_120, &k, attempt("v1", 2, Verdict::Retry, 5_110)).await;
    assert_eq!(
        last.outcome,
        CommandOutcome::AttemptRecorded(EventStatus::Failed),
        "the event's attempt cap"
    );

    // Expired at its expiry: finished, out of the due index, listed.
    let e = key("t", "expiring");
    apply_one(store, 1_000, &e, upsert(5_000, "x1")).await;
    let expired = apply_one(
        store,
        9_000,
        &e,
        EventCommand::EndExpired {
            version: EventVersion::from_string("x1".into()),
            reason: "expired: not delivered by its expiry".into(),
        },
    )
    .await;
    assert_eq!(expired.outcome, CommandOutcome::Expired);
    let record = get(store, &e).await.expect("stored");
    assert_eq!(record.status, EventStatus::Expired);
    assert_eq!(record.finished_at, Some(ts(9_000)));
    assert!(
        !all_due(store).await.iter().any(|(_, c)| c.key == e),
        "no longer due"
    );
    let listed = store
        .list_events(ListEventsParams {
            tenant: tenant("t"),
            status: Some(EventStatus::Expired),
            from: None,
            to: None,
            after: None,
            limit: 10,
        })
        .await
        .expect("listed");
    assert_eq!(listed, vec![record]);
    let counted = store
        .count_events(CountEventsParams {
            tenant: tenant("t"),
            status: EventStatus::Expired,
            at_most: 10,
        })
        .await
        .expect("counted");
    assert_eq!(counted, 1);
}

pub async fn get_events_in_input_order<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(8)).await;
    let store = &under_test.store;
    let (a, b, missing) = (key("t", "a"), key("u", "b"), key("t", "zz"));
    apply_one(store, 1_000, &a, upsert(5_000, "va")).await;
    apply_one(store, 1_000, &b, upsert(6_000, "vb")).await;
    let records = store
        .get_events(&[b.clone(), missing.clone(), a.clone()])
        .await
        .expect("get_events");
    let versions: Vec<Option<String>> = records
        .iter()
        .map(|r| r.as_ref().map(|r| r.version.as_str().to_string()))
        .collect();
    assert_eq!(
        versions,
        vec![Some("vb".to_string()), None, Some("va".to_string())]
    );
    assert_eq!(records[2], get(store, &a).await);
    assert!(store.get_events(&[]).await.expect("empty").is_empty());
}

pub async fn same_instant_update_keeps_version<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("t", "e1");
    apply_one(store, 1_000, &k, upsert(5_000, "v1")).await;
    let applied = apply_one(store, 2_000, &k, upsert(5_000, "v2")).await;
    assert_eq!(applied.outcome, CommandOutcome::Updated { moved: false });
    // Re-armed in place: the owner drops what it read ahead for the event.
    assert_eq!(applied.effects, vec![Effect::Arm { at: ts(5_000) }]);
    let record = get(store, &k).await.unwrap();
    assert_eq!(record.version.as_str(), "v1");
    assert_eq!(record.payload.as_deref(), Some("payload-v2"));
    assert_eq!(record.updated_at, ts(2_000));
    assert_eq!(record.created_at, ts(1_000));
    assert_eq!(all_due(store).await.len(), 1);
}

pub async fn move_starts_a_new_version<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("t", "e1");
    apply_one(store, 1_000, &k, upsert(5_000, "v1")).await;
    let applied = apply_one(store, 2_000, &k, upsert(9_000, "v2")).await;
    assert_eq!(applied.outcome, CommandOutcome::Updated { moved: true });
    assert_eq!(
        applied.effects,
        vec![
            Effect::Disarm { at: ts(5_000) },
            Effect::Arm { at: ts(9_000) }
        ]
    );
    let record = get(store, &k).await.unwrap();
    assert_eq!(record.version.as_str(), "v2");
    assert_eq!(record.next_fire_at, Some(ts(9_000)));
    let partition = store.partitions().partition_of(&k);
    assert_eq!(all_due(store).await, vec![(partition, cursor(9_000, &k))]);
}

pub async fn cancel_and_cancel_unknown<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("t", "e1");
    let unknown = apply_one(store, 1_000, &key("t", "nope"), EventCommand::Cancel).await;
    assert_eq!(unknown.outcome, CommandOutcome::NotFound);
    assert_eq!(unknown.record, None);
    assert_eq!(
        get(store, &key("t", "nope")).await,
        None,
        "cancel creates nothing"
    );

    apply_one(store, 1_000, &k, upsert(5_000, "v1")).await;
    let cancelled = apply_one(store, 2_000, &k, EventCommand::Cancel).await;
    assert_eq!(cancelled.outcome, CommandOutcome::Cancelled);
    assert_eq!(cancelled.effects, vec![Effect::Disarm { at: ts(5_000) }]);
    let record = get(store, &k).await.unwrap();
    assert_eq!(record.status, EventStatus::Cancelled);
    assert_eq!(record.finished_at, Some(ts(2_000)));
    assert!(all_due(store).await.is_empty());

    let again = apply_one(store, 3_000, &k, EventCommand::Cancel).await;
    assert_eq!(again.outcome, CommandOutcome::NotFound);

    let revived = apply_one(store, 4_000, &k, upsert(6_000, "v3")).await;
    assert_eq!(revived.outcome, CommandOutcome::Created);
    assert_eq!(all_due(store).await.len(), 1);
}

pub async fn if_match_changes_nothing_unless_it_holds<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("t", "e1");
    let if_match = |precondition, command| EventCommand::IfMatch {
        precondition,
        command: Box::new(command),
    };
    let version = |v: &str| Precondition::Versions(vec![EventVersion::from_string(v.into())]);

    // Unknown: even `*` fails, and nothing is created.
    let unknown = apply_one(
        store,
        1_000,
        &k,
        if_match(Precondition::Exists, upsert(5_000, "v1")),
    )
    .await;
    assert_eq!(
        unknown.outcome,
        CommandOutcome::PreconditionFailed { current: None }
    );
    assert_eq!((unknown.record, unknown.effects), (None, vec![]));
    assert_eq!(get(store, &k).await, None);

    let created = apply_one(store, 1_000, &k, upsert(5_000, "v1")).await;
    assert_eq!(created.replaced, None, "nothing replaced");
    let before = get(store, &k).await.unwrap();

    // A stale version: neither a move nor a cancel changes anything.
    for command in [upsert(9_000, "v2"), EventCommand::Cancel] {
        let stale = apply_one(store, 2_000, &k, if_match(version("v0"), command)).await;
        assert_eq!(
            stale.outcome,
            CommandOutcome::PreconditionFailed {
                current: Some(EventVersion::from_string("v1".into()))
            }
        );
        assert!(stale.effects.is_empty());
        assert_eq!(stale.replaced, None);
        assert_eq!(get(store, &k).await.as_ref(), Some(&before));
    }
    let partition = store.partitions().partition_of(&k);
    assert_eq!(all_due(store).await, vec![(partition, cursor(5_000, &k))]);

    // The current version: the move applies and tells the replaced
    // version's delivery had not started.
    let moved = apply_one(
        store,
        3_000,
        &k,
        if_match(version("v1"), upsert(9_000, "v2")),
    )
    .await;
    assert_eq!(moved.outcome, CommandOutcome::Updated { moved: true });
    assert_eq!(
        moved.replaced,
        Some(Replaced {
            version: EventVersion::from_string("v1".into()),
            delivery: PreviousDelivery::NotStarted
        })
    );
    assert_eq!(get(store, &k).await.unwrap().version.as_str(), "v2");

    // An attempt recorded: a cancel reports it started.
    apply_one(store, 9_010, &k, attempt("v2", 1, Verdict::Retry, 9_000)).await;
    let cancelled = apply_one(
        store,
        9_020,
        &k,
        if_match(Precondition::Exists, EventCommand::Cancel),
    )
    .await;
    assert_eq!(cancelled.outcome, CommandOutcome::Cancelled);
    assert_eq!(
        cancelled
            .replaced
            .map(|r| (r.version.as_str().to_owned(), r.delivery)),
        Some(("v2".to_owned(), PreviousDelivery::Started))
    );
    assert!(all_due(store).await.is_empty());

    // Several commands on one key in one apply see each other's writes.
    let both = apply(
        store,
        10_000,
        vec![
            command(&k, upsert(20_000, "v3")),
            command(&k, if_match(version("v2"), upsert(30_000, "v4"))),
            command(&k, if_match(version("v3"), upsert(30_000, "v4"))),
        ],
    )
    .await;
    assert_eq!(both[0].outcome, CommandOutcome::Created);
    assert!(matches!(
        both[1].outcome,
        CommandOutcome::PreconditionFailed { .. }
    ));
    assert_eq!(both[2].outcome, CommandOutcome::Updated { moved: true });
    assert_eq!(get(store, &k).await.unwrap().version.as_str(), "v4");

    // Moving a delivered version reports it finished.
    apply_one(
        store,
        30_010,
        &k,
        attempt("v4", 1, Verdict::Delivered, 30_000),
    )
    .await;
    let again = apply_one(
        store,
        31_000,
        &k,
        if_match(version("v4"), upsert(40_000, "v5")),
    )
    .await;
    assert_eq!(
        again.replaced.map(|r| r.delivery),
        Some(PreviousDelivery::Finished)
    );
}

/// `IfMatch` with [`Precondition::Absent`]: a create that never
/// overwrites. Of callers that all read the key absent and create it at
/// once, exactly one creates it; the others change nothing (a store that
/// checked the precondition outside its write would let several "create").
pub async fn if_absent_creates_once_however_many_race<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    const CALLERS: usize = 16;
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let if_absent = |command| EventCommand::IfMatch {
        precondition: Precondition::Absent,
        command: Box::new(command),
    };

    let k = key("t", "slot");
    let created = apply_one(store, 1_000, &k, if_absent(upsert(5_000, "v1"))).await;
    assert_eq!(created.outcome, CommandOutcome::Created);
    let before = get(store, &k).await.unwrap();
    let again = apply_one(store, 2_000, &k, if_absent(upsert(9_000, "v2"))).await;
    assert_eq!(
        again.outcome,
        CommandOutcome::PreconditionFailed {
            current: Some(EventVersion::from_string("v1".into()))
        }
    );
    assert!(again.effects.is_empty());
    assert_eq!(
        again.record.as_ref(),
        Some(&before),
        "the stored event, unchanged"
    );
    assert_eq!(get(store, &k).await.as_ref(), Some(&before));
    // A cancelled event is still stored: not absent.
    apply_one(store, 3_000, &k, EventCommand::Cancel).await;
    let cancelled = apply_one(store, 4_000, &k, if_absent(upsert(9_000, "v3"))).await;
    assert!(
        matches!(cancelled.outcome, CommandOutcome::PreconditionFailed { .. }),
        "{:?}",
        cancelled.outcome
    );
    assert_eq!(get(store, &k).await.unwrap().status, EventStatus::Cancelled);

    let raced = key("t", "raced");
    let mut tasks = Vec::new();
    for caller in 0..CALLERS {
        let store = store.clone();
        let raced = raced.clone();
        let command = if_absent(upsert(5_000, &format!("c{caller}")));
        tasks.push(tokio::spawn(async move {
            apply_one(&store, 1_000, &raced, command).await
        }));
    }
    let mut winners = Vec::new();
    for (caller, task) in tasks.into_iter().enumerate() {
        match task.await.expect("caller task").outcome {
            CommandOutcome::Created => winners.push(format!("c{caller}")),
            CommandOutcome::PreconditionFailed { current: Some(_) } => {}
            other => panic!("caller {caller}: {other:?}"),
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one caller created it: {winners:?}"
    );
    let stored = get(store, &raced).await.unwrap();
    assert_eq!(
        stored.version.as_str(),
        winners[0],
        "the winner's write stays"
    );
    let partition = store.partitions().partition_of(&raced);
    assert!(
        all_due(store)
            .await
            .contains(&(partition, cursor(5_000, &raced)))
    );
}

pub async fn a_debounced_series_keeps_its_start<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("t", "e1");
    let debounced = |version: &str| EventCommand::DebouncedUpsert {
        debounce: Debounce {
            delay_ms: 500,
            max_wait_ms: 3_000,
        },
        payload: Some(version.into()),
        delivery: DeliveryOption::FullEvent,
        settings: Default::default(),
        new_version: EventVersion::from_string(version.into()),
    };
    let created = apply_one(store, 1_000, &k, debounced("v1")).await;
    assert_eq!(created.outcome, CommandOutcome::Created);
    let record = get(store, &k).await.unwrap();
    assert_eq!(
        (record.event_time, record.debounce_since),
        (ts(1_500), Some(ts(1_000)))
    );
    // The start is read back from the store: it caps the later writes.
    for now in [1_400, 1_800, 2_200, 2_600, 3_000, 3_400] {
        apply_one(store, now, &k, debounced("v2")).await;
    }
    let capped = apply_one(store, 3_800, &k, debounced("v3")).await;
    assert_eq!(capped.outcome, CommandOutcome::Updated { moved: true });
    let record = get(store, &k).await.unwrap();
    assert_eq!(
        (record.event_time, record.debounce_since),
        (ts(4_000), Some(ts(1_000)))
    );
    assert_eq!(record.payload.as_deref(), Some("v3"));
    let partition = store.partitions().partition_of(&k);
    assert_eq!(all_due(store).await, vec![(partition, cursor(4_000, &k))]);

    // Delivered: the next write starts a new series.
    apply_one(
        store,
        4_010,
        &k,
        attempt("v3", 1, Verdict::Delivered, 4_000),
    )
    .await;
    apply_one(store, 5_000, &k, debounced("v4")).await;
    let record = get(store, &k).await.unwrap();
    assert_eq!(
        (record.event_time, record.debounce_since),
        (ts(5_500), Some(ts(5_000)))
    );
    // A plain write ends the series, stored as such.
    apply_one(store, 5_100, &k, upsert(9_000, "v5")).await;
    assert_eq!(get(store, &k).await.unwrap().debounce_since, None);
}

pub async fn attempt_delivered_finishes<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("t", "e1");
    apply_one(store, 1_000, &k, upsert(5_000, "v1")).await;
    let applied = apply_one(
        store,
        5_010,
        &k,
        attempt("v1", 1, Verdict::Delivered, 5_001),
    )
    .await;
    assert_eq!(
        applied.outcome,
        CommandOutcome::AttemptRecorded(EventStatus::Delivered)
    );
    assert_eq!(applied.effects, vec![Effect::Disarm { at: ts(5_000) }]);
    let record = get(store, &k).await.unwrap();
    assert_eq!(record.status, EventStatus::Delivered);
    assert_eq!(record.attempts, 1);
    assert_eq!(record.triggered_at, Some(ts(5_001)));
    assert_eq!(record.finished_at, Some(ts(5_010)));
    assert_eq!(record.next_fire_at, None);
    assert!(all_due(store).await.is_empty());
    let history = store.attempts(&k, 10).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].verdict, Verdict::Delivered);
    assert_eq!(history[0].number, 1);
}

pub async fn attempt_retry_reschedules<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("t", "e1");
    apply_one(store, 1_000, &k, upsert(5_000, "v1")).await;
    let applied = apply_one(store, 5_010, &k, attempt("v1", 1, Verdict::Retry, 5_001)).await;
    assert_eq!(
        applied.outcome,
        CommandOutcome::AttemptRecorded(EventStatus::Retrying)
    );
    // Default policy: the first retry comes 1 s after "now".
    assert_eq!(
        applied.effects,
        vec![
            Effect::Disarm { at: ts(5_000) },
            Effect::Arm { at: ts(6_010) }
        ]
    );
    let record = get(store, &k).await.unwrap();
    assert_eq!(record.status, EventStatus::Retrying);
    assert_eq!(record.next_fire_at, Some(ts(6_010)));
    assert_eq!(record.attempts, 1);
    assert_eq!(record.last_error.as_deref(), Some("Retry at 5001"));
    assert_eq!(record.finished_at, None);
    let partition = store.partitions().partition_of(&k);
    assert_eq!(all_due(store).await, vec![(partition, cursor(6_010, &k))]);
}

pub async fn attempt_permanent_fails<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("t", "e1");
    apply_one(store, 1_000, &k, upsert(5_000, "v1")).await;
    let applied = apply_one(
        store,
        5_010,
        &k,
        attempt("v1", 1, Verdict::Permanent, 5_001),
    )
    .await;
    assert_eq!(
        applied.outcome,
        CommandOutcome::AttemptRecorded(EventStatus::Failed)
    );
    let record = get(store, &k).await.unwrap();
    assert_eq!(record.status, EventStatus::Failed);
    assert_eq!(record.last_error.as_deref(), Some("Permanent at 5001"));
    assert_eq!(record.finished_at, Some(ts(5_010)));
    assert!(all_due(store).await.is_empty());
}

pub async fn stale_attempt_changes_nothing_but_history<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("t", "e1");
    apply_one(store, 1_000, &k, upsert(5_000, "v1")).await;
    apply_one(store, 2_000, &k, upsert(9_000, "v2")).await;
    let before = get(store, &k).await.unwrap();
    let applied = apply_one(
        store,
        5_010,
        &k,
        attempt("v1", 1, Verdict::Delivered, 5_001),
    )
    .await;
    assert_eq!(applied.outcome, CommandOutcome::StaleAttempt);
    // The current version (moved meanwhile) is re-armed, nothing else.
    assert_eq!(
        applied.effects,
        vec![Effect::Arm {
            at: Timestamp::from_millis(9_000)
        }]
    );
    assert_eq!(applied.record.as_ref(), Some(&before));
    assert_eq!(get(store, &k).await, Some(before.clone()));
    let history = store.attempts(&k, 10).await.unwrap();
    assert_eq!(history.len(), 1, "a stale attempt is still history");
    assert_eq!(history[0].version.as_str(), "v1");
    assert_eq!(history[0].number, 1, "numbered as it was delivered");

    // Recorded again (a retried write), alone and twice in one batch: the
    // history keeps one entry per (version, number).
    let again = apply_one(
        store,
        5_020,
        &k,
        attempt("v1", 1, Verdict::Delivered, 5_001),
    )
    .await;
    assert_eq!(again.outcome, CommandOutcome::StaleAttempt);
    apply(
        store,
        5_030,
        vec![
            command(&k, attempt("v1", 2, Verdict::Retry, 5_002)),
            command(&k, attempt("v1", 2, Verdict::Retry, 5_002)),
        ],
    )
    .await;
    assert_eq!(get(store, &k).await, Some(before.clone()));
    let history = store.attempts(&k, 10).await.unwrap();
    let numbers: Vec<(&str, u32)> = history
        .iter()
        .map(|a| (a.version.as_str(), a.number))
        .collect();
    assert_eq!(numbers, [("v1", 1), ("v1", 2)]);

    let unknown = apply_one(
        store,
        5_010,
        &key("t", "ghost"),
        attempt("v1", 1, Verdict::Delivered, 1),
    )
    .await;
    assert_eq!(unknown.outcome, CommandOutcome::StaleAttempt);
    assert_eq!(get(store, &key("t", "ghost")).await, None);
}

/// The same attempt recorded twice (a write that committed but answered
/// an error, then retried) counts once: one history entry, the state and
/// the retry instant of the first recording.
pub async fn a_repeated_attempt_is_recorded_once<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("t", "e1");
    apply_one(store, 1_000, &k, upsert(5_000, "v1")).await;
    let first = apply_one(store, 5_010, &k, attempt("v1", 1, Verdict::Retry, 5_001)).await;
    assert_eq!(
        first.outcome,
        CommandOutcome::AttemptRecorded(EventStatus::Retrying)
    );
    let recorded = get(store, &k).await.unwrap();
    assert_eq!(recorded.attempts, 1);
    assert_eq!(recorded.next_fire_at, Some(ts(6_010)));

    // Later, as a retry after the error would be: the instant of the next
    // attempt is not pushed back, only armed again.
    let repeat = apply_one(store, 5_500, &k, attempt("v1", 1, Verdict::Retry, 5_001)).await;
    assert_eq!(
        repeat.outcome,
        CommandOutcome::AttemptAlreadyRecorded(EventStatus::Retrying)
    );
    assert_eq!(repeat.effects, vec![Effect::Arm { at: ts(6_010) }]);
    assert_eq!(repeat.record.as_ref(), Some(&recorded));
    assert_eq!(get(store, &k).await, Some(recorded.clone()));
    // And twice within one batch.
    let batch = apply(
        store,
        5_600,
        vec![
            command(&k, attempt("v1", 1, Verdict::Retry, 5_001)),
            command(&k, attempt("v1", 1, Verdict::Retry, 5_001)),
        ],
    )
    .await;
    assert!(
        batch
            .iter()
            .all(|a| a.outcome == CommandOutcome::AttemptAlreadyRecorded(EventStatus::Retrying))
    );
    assert_eq!(get(store, &k).await, Some(recorded));
    let history = store.attempts(&k, 10).await.unwrap();
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(history[0].number, 1);
    let partition = store.partitions().partition_of(&k);
    assert_eq!(all_due(store).await, vec![(partition, cursor(6_010, &k))]);

    // The next attempt counts; its repeat after the event finished does
    // not reopen or re-count it.
    let delivered = apply_one(
        store,
        6_020,
        &k,
        attempt("v1", 2, Verdict::Delivered, 6_011),
    )
    .await;
    assert_eq!(
        delivered.outcome,
        CommandOutcome::AttemptRecorded(EventStatus::Delivered)
    );
    let finished = get(store, &k).await.unwrap();
    let repeat = apply_one(
        store,
        6_500,
        &k,
        attempt("v1", 2, Verdict::Delivered, 6_011),
    )
    .await;
    assert_eq!(
        repeat.outcome,
        CommandOutcome::AttemptAlreadyRecorded(EventStatus::Delivered)
    );
    assert!(repeat.effects.is_empty());
    assert_eq!(get(store, &k).await, Some(finished));
    assert_eq!(store.attempts(&k, 10).await.unwrap().len(), 2);
    assert!(all_due(store).await.is_empty());
}

pub async fn expire_only_pending<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("t", "e1");
    apply_one(store, 1_000, &k, upsert(5_000, "v1")).await;
    let expire = || EventCommand::Expire {
        reason: "down too long".into(),
    };
    let applied = apply_one(store, 99_000, &k, expire()).await;
    assert_eq!(applied.outcome, CommandOutcome::Expired);
    assert_eq!(applied.effects, vec![Effect::Disarm { at: ts(5_000) }]);
    let record = get(store, &k).await.unwrap();
    assert_eq!(record.status, EventStatus::Missed);
    assert_eq!(record.last_error.as_deref(), Some("down too long"));
    assert!(all_due(store).await.is_empty());
    let again = apply_one(store, 99_001, &k, expire()).await;
    assert_eq!(again.outcome, CommandOutcome::NotPending);
    let unknown = apply_one(store, 99_001, &key("t", "ghost"), expire()).await;
    assert_eq!(unknown.outcome, CommandOutcome::NotPending);
}

pub async fn results_in_input_order<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(8)).await;
    let store = &under_test.store;
    apply_one(store, 1_000, &key("t", "existing"), upsert(5_000, "v0")).await;
    let keys: Vec<EventKey> = ["z", "existing", "a", "m", "missing"]
        .iter()
        .map(|id| key("t", id))
        .collect();
    let commands = vec![
        command(&keys[0], upsert(7_000, "v1")),
        command(&keys[1], EventCommand::Cancel),
        command(&keys[2], upsert(6_000, "v2")),
        command(&keys[3], upsert(8_000, "v3")),
        command(&keys[4], EventCommand::Cancel),
    ];
    let applied = apply(store, 2_000, commands).await;
    let got: Vec<(EventKey, CommandOutcome)> =
        applied.into_iter().map(|a| (a.key, a.outcome)).collect();
    assert_eq!(
        got,
        vec![
            (keys[0].clone(), CommandOutcome::Created),
            (keys[1].clone(), CommandOutcome::Cancelled),
            (keys[2].clone(), CommandOutcome::Created),
            (keys[3].clone(), CommandOutcome::Created),
            (keys[4].clone(), CommandOutcome::NotFound),
        ]
    );
}

pub async fn several_commands_for_one_key_in_one_apply<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("t", "e1");
    let other = key("t", "e2");
    let applied = apply(
        store,
        1_000,
        vec![
            command(&k, upsert(5_000, "v1")),
            command(&other, upsert(5_500, "w1")),
            command(&k, upsert(5_000, "ignored")),
            command(&k, upsert(9_000, "v2")),
            command(&k, attempt("v2", 1, Verdict::Retry, 9_000)),
            command(&k, EventCommand::Cancel),
            command(&k, EventCommand::Cancel),
            command(&k, upsert(7_000, "v3")),
        ],
    )
    .await;
    let outcomes: Vec<CommandOutcome> = applied.iter().map(|a| a.outcome.clone()).collect();
    assert_eq!(
        outcomes,
        vec![
            CommandOutcome::Created,
            CommandOutcome::Created,
            CommandOutcome::Updated { moved: false },
            CommandOutcome::Updated { moved: true },
            CommandOutcome::AttemptRecorded(EventStatus::Retrying),
            CommandOutcome::Cancelled,
            CommandOutcome::NotFound,
            CommandOutcome::Created,
        ]
    );
    assert_eq!(applied[2].record.as_ref().unwrap().version.as_str(), "v1");
    assert_eq!(applied[3].record.as_ref().unwrap().version.as_str(), "v2");
    let record = get(store, &k).await.unwrap();
    assert_eq!(record.version.as_str(), "v3");
    assert_eq!(record.status, EventStatus::Scheduled);
    assert_eq!(Some(&record), applied[7].record.as_ref());
    let mut due: Vec<DueCursor> = all_due(store).await.into_iter().map(|(_, c)| c).collect();
    due.sort();
    assert_eq!(due, vec![cursor(5_500, &other), cursor(7_000, &k)]);
    assert_eq!(store.attempts(&k, 10).await.unwrap().len(), 1);

    // A create and its delivery in one apply leave nothing in the due index.
    let quick = key("t", "quick");
    apply(
        store,
        2_000,
        vec![
            command(&quick, upsert(2_000, "q1")),
            command(&quick, attempt("q1", 1, Verdict::Delivered, 2_000)),
        ],
    )
    .await;
    assert_eq!(
        get(store, &quick).await.unwrap().status,
        EventStatus::Delivered
    );
    assert_eq!(all_due(store).await.len(), 2);
}

pub async fn due_index_holds_exactly_pending_in_order<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    // One partition, so the whole index is one ordered page.
    let under_test = factory(partitions(1)).await;
    let store = &under_test.store;
    let ids = ["b", "a", "c", "d", "e", "f", "aa", "a/b"];
    let instants = [3_000, 3_000, 1_000, 2_000, 9_000, 4_000, 3_000, 3_000];
    let commands = ids
        .iter()
        .zip(instants)
        .map(|(id, at)| command(&key("t", id), upsert(at, id)))
        .collect();
    apply(store, 500, commands).await;
    // d delivered, e cancelled, f failed: only the others stay pending.
    apply(
        store,
        600,
        vec![
            command(&key("t", "d"), attempt("d", 1, Verdict::Delivered, 600)),
            command(&key("t", "e"), EventCommand::Cancel),
            command(&key("t", "f"), attempt("f", 1, Verdict::Permanent, 600)),
        ],
    )
    .await;
    let page = due(store, PartitionId(0), None, i64::MAX, 100).await;
    assert_eq!(
        page,
        vec![
            cursor(1_000, &key("t", "c")),
            cursor(3_000, &key("t", "a")),
            cursor(3_000, &key("t", "a/b")),
            cursor(3_000, &key("t", "aa")),
            cursor(3_000, &key("t", "b")),
        ]
    );
    let mut sorted = page.clone();
    sorted.sort();
    assert_eq!(page, sorted, "store order is DueCursor order");
}

pub async fn due_page_cursor_through_and_limit<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(1)).await;
    let store = &under_test.store;
    let p = PartitionId(0);
    let commands = (0..10)
        .map(|i| {
            command(
                &key("t", &format!("e{i}")),
                upsert(1_000 + 100 * (i / 2), "v"),
            )
        })
        .collect();
    apply(store, 0, commands).await;
    let everything = due(store, p, None, i64::MAX, 100).await;
    assert_eq!(everything.len(), 10);

    // Limit, then continue after the last entry: no gaps, no repeats.
    let first = due(store, p, None, i64::MAX, 3).await;
    assert_eq!(first, everything[..3]);
    let second = due(store, p, first.last().cloned(), i64::MAX, 3).await;
    assert_eq!(second, everything[3..6]);

    // The cursor is exclusive even between two events of the same instant.
    let tie = due(store, p, Some(everything[4].clone()), i64::MAX, 1).await;
    assert_eq!(tie, vec![everything[5].clone()]);
    assert_eq!(everything[4].due, everything[5].due);

    // `through` is inclusive.
    let through = due(store, p, None, 1_200, 100).await;
    assert_eq!(through, everything[..6]);
    assert!(due(store, p, None, 999, 100).await.is_empty());
    let after_through = due(store, p, Some(everything[5].clone()), 1_200, 100).await;
    assert!(after_through.is_empty());
    assert!(due(store, p, None, i64::MAX, 0).await.is_empty());
    // A cursor past `through` yields nothing rather than an error.
    assert!(
        due(store, p, Some(everything[9].clone()), 1_000, 10)
            .await
            .is_empty()
    );
}

/// `skip_tenants` may leave a tenant's entries out (both backends do);
/// every other entry comes in order, with the limit counting only them.
pub async fn due_page_leaves_out_skipped_tenants<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(1)).await;
    let store = &under_test.store;
    let p = PartitionId(0);
    // "b" (skipped) has a run at one instant between "a" and "c", and one
    // entry at a later instant.
    let mut commands: Vec<_> = (0..50)
        .map(|i| command(&key("b", &format!("e{i:02}")), upsert(1_000, "v")))
        .collect();
    commands.push(command(&key("a", "x"), upsert(1_000, "v")));
    commands.push(command(&key("c", "x"), upsert(1_000, "v")));
    commands.push(command(&key("b", "late"), upsert(2_000, "v")));
    commands.push(command(&key("a", "y"), upsert(2_000, "v")));
    commands.push(command(&key("c", "y"), upsert(3_000, "v")));
    apply(store, 0, commands).await;
    let page = |after: Option<DueCursor>, limit: usize| {
        store.due_page(DuePageParams {
            partition: p,
            after,
            through: ts(i64::MAX),
            limit,
            tenant: None,
            skip_tenants: vec![tenant("b")],
        })
    };
    let expected = vec![
        cursor(1_000, &key("a", "x")),
        cursor(1_000, &key("c", "x")),
        cursor(2_000, &key("a", "y")),
        cursor(3_000, &key("c", "y")),
    ];
    assert_eq!(page(None, 100).await.expect("due_page"), expected);
    let first = page(None, 2).await.expect("due_page");
    assert_eq!(first, expected[..2]);
    let rest = page(first.last().cloned(), 10).await.expect("due_page");
    assert_eq!(rest, expected[2..]);
    // Nothing is skipped without the list.
    assert_eq!(due(store, p, None, i64::MAX, 100).await.len(), 55);
}

pub async fn due_page_partition_isolation<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let count = store.partitions();
    let keys: Vec<EventKey> = (0..40).map(|i| key("t", &format!("e{i}"))).collect();
    let commands = keys
        .iter()
        .enumerate()
        .map(|(i, k)| command(k, upsert(1_000 + i as i64, "v")))
        .collect();
    apply(store, 0, commands).await;
    let mut seen = 0;
    for partition in count.all() {
        let page = due(store, partition, None, i64::MAX, 100).await;
        for entry in &page {
            assert_eq!(count.partition_of(&entry.key), partition);
        }
        let expected = keys
            .iter()
            .filter(|k| count.partition_of(k) == partition)
            .count();
        assert_eq!(page.len(), expected);
        seen += page.len();
    }
    assert_eq!(seen, keys.len());
}

pub async fn due_index_follows_changes<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(1)).await;
    let store = &under_test.store;
    let p = PartitionId(0);
    let [moved, cancelled, delivered, retried] =
        ["moved", "cancelled", "delivered", "retried"].map(|id| key("t", id));
    apply(
        store,
        0,
        vec![
            command(&moved, upsert(1_000, "m1")),
            command(&cancelled, upsert(1_000, "c1")),
            command(&delivered, upsert(1_000, "d1")),
            command(&retried, upsert(1_000, "r1")),
        ],
    )
    .await;
    assert_eq!(due(store, p, None, i64::MAX, 10).await.len(), 4);
    apply_one(store, 100, &moved, upsert(8_000, "m2")).await;
    apply_one(store, 100, &cancelled, EventCommand::Cancel).await;
    apply_one(
        store,
        1_000,
        &delivered,
        attempt("d1", 1, Verdict::Delivered, 1_000),
    )
    .await;
    apply_one(
        store,
        1_000,
        &retried,
        attempt("r1", 1, Verdict::Retry, 1_000),
    )
    .await;
    assert_eq!(
        due(store, p, None, i64::MAX, 10).await,
        vec![cursor(2_000, &retried), cursor(8_000, &moved)]
    );
    // A second retry moves it again (the quick phase: another 1 s); its
    // old entry goes.
    apply_one(
        store,
        2_000,
        &retried,
        attempt("r1", 2, Verdict::Retry, 2_000),
    )
    .await;
    assert_eq!(
        due(store, p, None, i64::MAX, 10).await,
        vec![cursor(3_000, &retried), cursor(8_000, &moved)]
    );
}

pub async fn list_events_filters_and_pagination<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    // Ids in an order that differs from their instants; a neighbour tenant
    // whose name extends this one's must never leak in.
    let commands = (0..12)
        .map(|i| {
            command(
                &key("t", &format!("e{:02}", 11 - i)),
                upsert(1_000 * i, "v"),
            )
        })
        .chain([
            command(&key("tt", "e00"), upsert(0, "v")),
            command(&key("t/x", "e00"), upsert(0, "v")),
        ])
        .collect();
    apply(store, 0, commands).await;
    apply_one(store, 10, &key("t", "e03"), EventCommand::Cancel).await;
    apply_one(store, 10, &key("t", "e05"), EventCommand::Cancel).await;

    let list = |status, from: Option<i64>, to: Option<i64>, after: Option<&str>, limit| {
        store.list_events(ListEventsParams {
            tenant: tenant("t"),
            status,
            from: from.map(ts),
            to: to.map(ts),
            after: after.map(|a| EventId::new(a).unwrap()),
            limit,
        })
    };
    let ids = |records: Vec<EventRecord>| -> Vec<String> {
        records
            .into_iter()
            .map(|r| r.key.id.as_str().to_string())
            .collect()
    };

    let all = ids(list(None, None, None, None, 100).await.unwrap());
    let expected: Vec<String> = (0..12).map(|i| format!("e{i:02}")).collect();
    assert_eq!(all, expected, "stable id order, only this tenant");

    // Cursor pagination walks the same list without gaps or repeats.
    let mut paged = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = ids(list(None, None, None, after.as_deref(), 5).await.unwrap());
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 5);
        after = page.last().cloned();
        paged.extend(page);
    }
    assert_eq!(paged, expected);

    let cancelled = ids(list(Some(EventStatus::Cancelled), None, None, None, 100)
        .await
        .unwrap());
    // e11 fires at 0 s ... e00 at 11 s: any filter orders by (event_time,
    // id); from inclusive, to exclusive.
    assert_eq!(cancelled, vec!["e05", "e03"]);
    let window = ids(list(None, Some(3_000), Some(6_000), None, 100)
        .await
        .unwrap());
    assert_eq!(window, vec!["e08", "e07", "e06"]);
    let only_to = ids(list(None, None, Some(2_000), None, 100).await.unwrap());
    assert_eq!(only_to, vec!["e11", "e10"]);
    let only_from = ids(list(None, Some(10_000), None, None, 100).await.unwrap());
    assert_eq!(only_from, vec!["e01", "e00"]);
    let scheduled_window = ids(list(
        Some(EventStatus::Scheduled),
        Some(3_000),
        Some(9_000),
        None,
        2,
    )
    .await
    .unwrap());
    assert_eq!(scheduled_window, vec!["e08", "e07"]);
    // The previous page's last id alone continues after it...
    let after_cursor = ids(list(
        Some(EventStatus::Scheduled),
        Some(3_000),
        Some(9_000),
        Some("e07"),
        10,
    )
    .await
    .unwrap());
    assert_eq!(after_cursor, vec!["e06", "e04"]);
    // ... and so does it with its instant as `from`.
    let after_cursor = ids(list(
        Some(EventStatus::Scheduled),
        Some(4_000),
        Some(9_000),
        Some("e07"),
        10,
    )
    .await
    .unwrap());
    assert_eq!(after_cursor, vec!["e06", "e04"]);
    assert!(
        list(None, Some(6_000), Some(6_000), None, 10)
            .await
            .unwrap()
            .is_empty(),
        "an empty window"
    );
    assert!(
        list(None, Some(7_000), Some(3_000), None, 10)
            .await
            .unwrap()
            .is_empty(),
        "an inverted window"
    );
    assert!(list(None, None, None, None, 0).await.unwrap().is_empty());
    let nobody = store
        .list_events(ListEventsParams {
            tenant: tenant("nobody"),
            status: None,
            from: None,
            to: None,
            after: None,
            limit: 10,
        })
        .await
        .unwrap();
    assert!(nobody.is_empty());
}

/// Ids of a listing page.
fn page_ids(records: &[EventRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| r.key.id.as_str().to_string())
        .collect()
}

fn list_params(
    tenant_name: &str,
    status: Option<EventStatus>,
    from: Option<i64>,
    to: Option<i64>,
    after: Option<&EventId>,
    limit: usize,
) -> ListEventsParams {
    ListEventsParams {
        tenant: tenant(tenant_name),
        status,
        from: from.map(ts),
        to: to.map(ts),
        after: after.cloned(),
        limit,
    }
}

/// Pages through a filtered listing as the API does (the next `from` is
/// the last event's instant) and checks every page: full
/// until the last, which is the only short (or empty) one, and a short page
/// really is the end. Returns every id in listing order.
async fn page_through(
    store: &SharedStore,
    tenant_name: &str,
    status: Option<EventStatus>,
    window: (Option<i64>, Option<i64>),
    limit: usize,
) -> Vec<String> {
    let (mut from, to) = window;
    let mut after: Option<EventId> = None;
    let mut seen = Vec::new();
    for _ in 0..1_000 {
        let page = store
            .list_events(list_params(
                tenant_name,
                status,
                from,
                to,
                after.as_ref(),
                limit,
            ))
            .await
            .expect("list_events");
        assert!(page.len() <= limit, "a page holds at most `limit` events");
        for record in &page {
            assert!(
                status.is_none_or(|s| s == record.status),
                "{record:?} does not have status {status:?}"
            );
            assert!(
                window.0.is_none_or(|f| record.event_time >= ts(f))
                    && window.1.is_none_or(|t| record.event_time < ts(t)),
                "{record:?} is outside the window"
            );
        }
        seen.extend(page_ids(&page));
        let Some(last) = page.last() else {
            return seen;
        };
        after = Some(last.key.id.clone());
        from = Some(last.event_time.as_millis());
        if page.len() < limit {
            // A short page is the last: nothing follows it.
            let rest = store
                .list_events(list_params(
                    tenant_name,
                    status,
                    from,
                    to,
                    after.as_ref(),
                    limit,
                ))
                .await
                .expect("list_events");
            assert_eq!(
                page_ids(&rest),
                Vec::<String>::new(),
                "a short page is the end"
            );
            return seen;
        }
    }
    panic!("the listing never ended");
}

/// A filtered page is complete: it holds `limit` matching events whenever
/// that many are left, whatever lies between them in the tenant (events of
/// other statuses and instants, engine-internal events); so a page is
/// never empty while more exist, and a short page is the last.
pub async fn filtered_pages_are_full_until_the_last<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    // 60 client events: i at instant (i * 37) % 60 s (ids and instants in
    // different orders), every third one delivered, every fifth failed.
    let id = |i: i64| format!("c{i:02}");
    let at = |i: i64| (i * 37) % 60 * 1_000;
    let mut commands: Vec<KeyedCommand> = (0..60)
        .map(|i| command(&key("t", &id(i)), upsert(at(i), &format!("v{i}"))))
        .collect();
    // Engine-internal events (a schedule's control event is one) sort
    // before every client id and are pending: filtered listings skip them.
    for n in 0..7 {
        let internal = EventId::internal(&format!("schedule/s{n}")).expect("internal id");
        commands.push(command(
            &EventKey::new(tenant("t"), internal),
            upsert(1_000 * n, "control"),
        ));
    }
    commands.push(command(&key("t2", "c00"), upsert(0, "other")));
    apply(store, 0, commands).await;
    let outcomes = (0..60)
        .filter_map(|i| {
            let verdict = if i % 5 == 0 {
                Verdict::Permanent
            } else if i % 3 == 0 {
                Verdict::Delivered
            } else {
                return None;
            };
            Some(command(
                &key("t", &id(i)),
                attempt(&format!("v{i}"), 1, verdict, at(i)),
            ))
        })
        .collect();
    apply(store, 100_000, outcomes).await;

    let status_of = |i: i64| {
        if i % 5 == 0 {
            EventStatus::Failed
        } else if i % 3 == 0 {
            EventStatus::Delivered
        } else {
            EventStatus::Scheduled
        }
    };
    // The expected listing, by (instant, id).
    let expected = |status: Option<EventStatus>, window: Option<(i64, i64)>| {
        let mut matching: Vec<i64> = (0..60)
            .filter(|i| status.is_none_or(|s| s == status_of(*i)))
            .filter(|i| window.is_none_or(|(from, to)| at(*i) >= from && at(*i) < to))
            .collect();
        matching.sort_by_key(|i| (at(*i), id(*i)));
        matching.into_iter().map(id).collect::<Vec<String>>()
    };

    for limit in [1, 2, 3, 7, 100] {
        for status in [
            Some(EventStatus::Scheduled),
            Some(EventStatus::Failed),
            Some(EventStatus::Delivered),
            Some(EventStatus::Cancelled),
            None,
        ] {
            for window in [None, Some((5_000, 41_000)), Some((0, 60_000))] {
                if status.is_none() && window.is_none() {
                    // Unfiltered: by id, internal events included.
                    continue;
                }
                let got = page_through(
                    store,
                    "t",
                    status,
                    window.map_or((None, None), |(f, t)| (Some(f), Some(t))),
                    limit,
                )
                .await;
                assert_eq!(
                    got,
                    expected(status, window),
                    "status {status:?}, window {window:?}, limit {limit}"
                );
            }
        }
        // Only one bound.
        let got = page_through(store, "t", None, (Some(30_000), None), limit).await;
        assert_eq!(got, expected(None, Some((30_000, i64::MAX))));
        let got = page_through(
            store,
            "t",
            Some(EventStatus::Scheduled),
            (None, Some(30_000)),
            limit,
        )
        .await;
        assert_eq!(
            got,
            expected(Some(EventStatus::Scheduled), Some((i64::MIN, 30_000)))
        );
    }

    // A status change moves the event between the status listings.
    apply_one(store, 200_000, &key("t", "c01"), EventCommand::Cancel).await;
    let cancelled = page_through(store, "t", Some(EventStatus::Cancelled), (None, None), 10).await;
    assert_eq!(cancelled, vec!["c01"]);
    let scheduled = page_through(store, "t", Some(EventStatus::Scheduled), (None, None), 10).await;
    assert!(!scheduled.contains(&"c01".to_string()));
    assert_eq!(
        scheduled.len(),
        expected(Some(EventStatus::Scheduled), None).len() - 1
    );
    // A move in time moves it in the time listings (and revives it).
    apply_one(store, 200_000, &key("t", "c01"), upsert(59_500, "v1b")).await;
    let late = page_through(store, "t", None, (Some(59_000), None), 10).await;
    assert_eq!(
        late,
        vec![id(47), "c01".to_string()],
        "at 59 s, then 59.5 s"
    );
    let late = page_through(
        store,
        "t",
        Some(EventStatus::Scheduled),
        (Some(59_000), None),
        10,
    )
    .await;
    assert_eq!(late, vec![id(47), "c01".to_string()]);
    assert!(
        page_through(store, "t", Some(EventStatus::Cancelled), (None, None), 10)
            .await
            .is_empty()
    );
}

/// A time-ordered listing keeps its place when the event its cursor names
/// is purged, as long as the caller passes that event's instant as `from`
/// (the API's cursor carries it).
pub async fn time_cursor_survives_its_event<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let keys: Vec<EventKey> = (0..6).map(|i| key("t", &format!("e{i}"))).collect();
    apply(
        store,
        0,
        keys.iter()
            .enumerate()
            .map(|(i, k)| command(k, upsert(1_000 * i as i64, "v")))
            .collect(),
    )
    .await;
    let first = store
        .list_events(list_params("t", None, Some(0), Some(10_000), None, 3))
        .await
        .unwrap();
    assert_eq!(page_ids(&first), vec!["e0", "e1", "e2"]);
    // The page's last event finishes and is purged.
    apply_one(store, 10, &keys[2], EventCommand::Cancel).await;
    let purged = store
        .purge_finished(PurgeParams {
            finished_before: ts(1_000),
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(purged, 1);
    let last = first.last().expect("a full page");
    let next = store
        .list_events(list_params(
            "t",
            None,
            Some(last.event_time.as_millis()),
            Some(10_000),
            Some(&last.key.id),
            3,
        ))
        .await
        .unwrap();
    assert_eq!(page_ids(&next), vec!["e3", "e4", "e5"]);
}

/// A filtered listing reads O(`limit`) stored entries, however large the
/// tenant: `status=failed&limit=1` among 50,000 delivered events, a narrow
/// time window, both, and the pages after a cursor.
pub async fn filtered_listing_reads_only_its_page<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    const EVENTS: i64 = 50_000;
    const FAILED: [i64; 3] = [7_001, 29_999, 49_998];
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let id = |i: i64| format!("e{i:05}");
    // Instants in another order than the ids.
    let at = |i: i64| (i * 7_919) % EVENTS * 10;
    for chunk in (0..EVENTS).collect::<Vec<_>>().chunks(5_000) {
        apply(
            store,
            0,
            chunk
                .iter()
                .map(|i| command(&key("big", &id(*i)), upsert(at(*i), "v")))
                .collect(),
        )
        .await;
        apply(
            store,
            1,
            chunk
                .iter()
                .map(|i| {
                    let verdict = if FAILED.contains(i) {
                        Verdict::Permanent
                    } else {
                        Verdict::Delivered
                    };
                    command(&key("big", &id(*i)), attempt("v", 1, verdict, at(*i)))
                })
                .collect(),
        )
        .await;
    }
    let cursor = EventId::new(id(25_000)).expect("valid id");
    let cases = [
        ("status=failed", Some(EventStatus::Failed), None, None, None),
        (
            "status=scheduled (none)",
            Some(EventStatus::Scheduled),
            None,
            None,
            None,
        ),
        (
            "status=delivered after a cursor",
            Some(EventStatus::Delivered),
            None,
            None,
            Some(&cursor),
        ),
        (
            "a narrow window",
            None,
            Some(at(12_345)),
            Some(at(12_345) + 1),
            None,
        ),
        (
            "a window after a cursor",
            None,
            Some(at(25_000)),
            None,
            Some(&cursor),
        ),
        (
            "status=failed in a wide window",
            Some(EventStatus::Failed),
            Some(0),
            Some(EVENTS * 10),
            None,
        ),
        (
            "status=delivered from an instant",
            Some(EventStatus::Delivered),
            Some(250_000),
            None,
            None,
        ),
        ("no filter after a cursor", None, None, None, Some(&cursor)),
    ];
    for limit in [2, 20] {
        for (name, status, from, to, after) in cases {
            let params = list_params("big", status, from, to, after, limit);
            let page = store.list_events(params.clone()).await.unwrap();
            if status == Some(EventStatus::Failed) {
                assert_eq!(page.len(), limit.min(FAILED.len()), "{name}");
            }
            let reads = store
                .list_events_reads(params)
                .await
                .unwrap()
                .expect("every backend counts what a listing reads");
            // The page, one record per entry, a head per status merged and
            // the cursor's record: a small multiple of the page, never the
            // tenant's 50,000 events.
            let bound = 3 * limit as u64 + 12;
            assert!(
                reads <= bound,
                "{name}, limit {limit}: read {reads} entries for a page of {} (bound {bound})",
                page.len()
            );
        }
    }
}

pub async fn attempts_history_in_order<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("t", "e1");
    let neighbour = key("t", "e10");
    apply_one(store, 0, &k, upsert(1_000, "v1")).await;
    apply_one(store, 0, &neighbour, upsert(1_000, "n1")).await;
    apply_one(
        store,
        1_000,
        &neighbour,
        attempt("n1", 1, Verdict::Retry, 1_000),
    )
    .await;
    apply_one(store, 1_005, &k, attempt("v1", 1, Verdict::Retry, 1_000)).await;
    apply_one(store, 2_010, &k, attempt("v1", 2, Verdict::Retry, 2_005)).await;
    apply_one(
        store,
        4_020,
        &k,
        attempt("v1", 3, Verdict::Delivered, 4_010),
    )
    .await;

    let history = store.attempts(&k, 100).await.unwrap();
    let expected = vec![
        Attempt {
            version: EventVersion::from_string("v1".into()),
            number: 1,
            started_at: ts(1_000),
            duration_ms: 7,
            verdict: Verdict::Retry,
            http_status: Some(503),
            error: Some("Retry at 1000".into()),
        },
        Attempt {
            version: EventVersion::from_string("v1".into()),
            number: 2,
            started_at: ts(2_005),
            duration_ms: 7,
            verdict: Verdict::Retry,
            http_status: Some(503),
            error: Some("Retry at 2005".into()),
        },
        Attempt {
            version: EventVersion::from_string("v1".into()),
            number: 3,
            started_at: ts(4_010),
            duration_ms: 7,
            verdict: Verdict::Delivered,
            http_status: Some(200),
            error: None,
        },
    ];
    assert_eq!(history, expected, "oldest first, only this event");
    assert_eq!(store.attempts(&k, 2).await.unwrap(), expected[..2]);
    assert_eq!(store.attempts(&neighbour, 100).await.unwrap().len(), 1);
    assert!(
        store
            .attempts(&key("t", "ghost"), 100)
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn purge_removes_only_old_finished<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let [old_done, old_cancelled, new_done, pending, revived] = [
        "old_done",
        "old_cancelled",
        "new_done",
        "pending",
        "revived",
    ]
    .map(|id| key("t", id));
    apply(
        store,
        0,
        vec![
            command(&old_done, upsert(1_000, "a")),
            command(&old_cancelled, upsert(1_000, "b")),
            command(&new_done, upsert(1_000, "c")),
            command(&pending, upsert(1_000_000, "d")),
            command(&revived, upsert(1_000, "e")),
        ],
    )
    .await;
    apply_one(
        store,
        1_000,
        &old_done,
        attempt("a", 1, Verdict::Delivered, 1_000),
    )
    .await;
    apply_one(store, 1_000, &old_cancelled, EventCommand::Cancel).await;
    apply_one(store, 1_000, &revived, EventCommand::Cancel).await;
    // Finished before the cut-off, then given a new life: must stay.
    apply_one(store, 1_500, &revived, upsert(900_000, "e2")).await;
    apply_one(
        store,
        9_000,
        &new_done,
        attempt("c", 1, Verdict::Delivered, 9_000),
    )
    .await;

    let purged = store
        .purge_finished(PurgeParams {
            finished_before: ts(5_000),
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(purged, 2);
    assert_eq!(get(store, &old_done).await, None);
    assert_eq!(get(store, &old_cancelled).await, None);
    assert!(store.attempts(&old_done, 10).await.unwrap().is_empty());
    assert!(get(store, &new_done).await.is_some());
    assert_eq!(store.attempts(&new_done, 10).await.unwrap().len(), 1);
    assert!(get(store, &pending).await.is_some());
    assert_eq!(
        get(store, &revived).await.unwrap().status,
        EventStatus::Scheduled
    );
    assert_eq!(all_due(store).await.len(), 2);

    let again = store
        .purge_finished(PurgeParams {
            finished_before: ts(5_000),
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(again, 0, "nothing old is left");

    // The limit bounds one call; later calls take the rest.
    let many: Vec<EventKey> = (0..5).map(|i| key("bulk", &format!("e{i}"))).collect();
    apply(
        store,
        0,
        many.iter().map(|k| command(k, upsert(100, "x"))).collect(),
    )
    .await;
    apply(
        store,
        200,
        many.iter()
            .map(|k| command(k, EventCommand::Cancel))
            .collect(),
    )
    .await;
    let params = PurgeParams {
        finished_before: ts(5_000),
        limit: 3,
    };
    assert_eq!(store.purge_finished(params.clone()).await.unwrap(), 3);
    assert_eq!(store.purge_finished(params.clone()).await.unwrap(), 2);
    assert_eq!(store.purge_finished(params).await.unwrap(), 0);
    assert!(get(store, &new_done).await.is_some());
}

/// `delete_finished` takes a finished event with its history, lease,
/// listing and count entries; a pending or unknown one stays and answers
/// `false`, as does a second delete; the id can then be scheduled again
/// as a new event.
pub async fn delete_finished_takes_only_finished_events<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let [failed, cancelled, pulled, pending, other_tenant] =
        ["failed", "cancelled", "pulled", "pending", "other"].map(|id| key("t", id));
    let other_tenant = EventKey::new(tenant("u"), other_tenant.id);
    apply(
        store,
        0,
        [&failed, &cancelled, &pulled, &pending, &other_tenant]
            .into_iter()
            .map(|k| command(k, upsert(1_000, "v1")))
            .collect(),
    )
    .await;
    apply_one(
        store,
        1_000,
        &failed,
        attempt("v1", 1, Verdict::Permanent, 1_000),
    )
    .await;
    apply_one(store, 1_000, &cancelled, EventCommand::Cancel).await;
    apply_one(store, 1_000, &other_tenant, EventCommand::Cancel).await;
    let lease = grant_of(store, &pulled, 1, 0, 1, 1_000).await;
    assert_eq!(record_lease(store, &lease).await, LeaseWriteOutcome::Done);
    let complete = resolve(
        Resolution::Delivered { result: None },
        Some(Verdict::Delivered),
        1_000,
    );
    assert_eq!(
        change(store, &lease, complete, 1_500).await,
        LeaseWriteOutcome::Done
    );
    assert!(store.get_lease(&pulled).await.unwrap().is_some());
    assert_eq!(store.attempts(&failed, 10).await.unwrap().len(), 1);

    let ghost = key("t", "ghost");
    let deleted = store
        .delete_finished(&[
            failed.clone(),
            pending.clone(),
            ghost,
            cancelled.clone(),
            pulled.clone(),
            failed.clone(),
        ])
        .await
        .unwrap();
    assert_eq!(
        deleted,
        [true, false, false, true, true, false],
        "finished ones go once; pending and unknown ones stay"
    );
    for gone in [&failed, &cancelled, &pulled] {
        assert_eq!(get(store, gone).await, None);
        assert!(store.attempts(gone, 10).await.unwrap().is_empty());
        assert_eq!(store.get_lease(gone).await.unwrap(), None);
    }
    assert_eq!(
        get(store, &pending).await.unwrap().status,
        EventStatus::Scheduled
    );
    assert_eq!(
        all_due(store).await.len(),
        1,
        "the pending one is still due"
    );
    assert!(get(store, &other_tenant).await.is_some());
    let listed = store
        .list_events(list_params("t", None, None, None, None, 100))
        .await
        .unwrap();
    assert_eq!(page_ids(&listed), ["pending"]);
    for status in [
        EventStatus::Failed,
        EventStatus::Cancelled,
        EventStatus::Delivered,
    ] {
        let filtered = store
            .list_events(list_params("t", Some(status), None, None, None, 100))
            .await
            .unwrap();
        assert!(filtered.is_empty(), "no {status:?} event is listed");
        assert_eq!(count(store, "t", status).await, 0);
    }

    assert_eq!(
        store
            .delete_finished(std::slice::from_ref(&failed))
            .await
            .unwrap(),
        [false],
        "deleting twice"
    );
    assert!(store.delete_finished(&[]).await.unwrap().is_empty());
    // The id is free: scheduling it again creates a new event, and the
    // retention sweep finds nothing left of the old one.
    let again = apply_one(store, 2_000, &failed, upsert(5_000, "v2")).await;
    assert_eq!(again.outcome, CommandOutcome::Created);
    assert_eq!(get(store, &failed).await.unwrap().attempts, 0);
    let purged = store
        .purge_finished(PurgeParams {
            finished_before: ts(i64::MAX),
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(purged, 1, "only the other tenant's cancelled event");
    assert_eq!(
        get(store, &failed).await.unwrap().status,
        EventStatus::Scheduled
    );
}

pub async fn names_with_slashes_and_non_ascii<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let tenant_name = "TenantB/ProgramB/EnvC";
    let keys = [
        key(tenant_name, "order/42"),
        key(tenant_name, "commande-é-ü-日本"),
        key("TenantB/ProgramB", "EnvC/order/42"),
        key("ünïcødé/🎉", "🎉/1"),
    ];
    let commands = keys
        .iter()
        .map(|k| command(k, upsert(5_000, "v")))
        .collect();
    let applied = apply(store, 0, commands).await;
    assert!(applied.iter().all(|a| a.outcome == CommandOutcome::Created));
    for k in &keys {
        let record = get(store, k).await.expect("stored");
        assert_eq!(&record.key, k);
    }
    let listed = store
        .list_events(ListEventsParams {
            tenant: tenant(tenant_name),
            status: None,
            from: None,
            to: None,
            after: None,
            limit: 10,
        })
        .await
        .unwrap();
    let listed: Vec<&EventKey> = listed.iter().map(|r| &r.key).collect();
    assert_eq!(listed, vec![&keys[1], &keys[0]], "only this tenant, by id");
    let mut due_keys: Vec<EventKey> = all_due(store)
        .await
        .into_iter()
        .map(|(_, c)| c.key)
        .collect();
    due_keys.sort();
    let mut expected = keys.to_vec();
    expected.sort();
    assert_eq!(due_keys, expected);

    store
        .put_tenant(http_tenant("ünïcødé/🎉", "http://127.0.0.1:1/"))
        .await
        .unwrap();
    assert!(
        store
            .get_tenant(&tenant("ünïcødé/🎉"))
            .await
            .unwrap()
            .is_some()
    );
    apply_one(store, 10, &keys[3], attempt("v", 1, Verdict::Retry, 5)).await;
    assert_eq!(store.attempts(&keys[3], 10).await.unwrap().len(), 1);
}

pub async fn concurrent_applies_all_land<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(8)).await;
    let store = &under_test.store;
    let mut tasks = Vec::new();
    for caller in 0..100 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let commands = (0..10)
                .map(|i| {
                    command(
                        &key("t", &format!("c{caller:03}-{i}")),
                        upsert(10_000 + i, "v"),
                    )
                })
                .collect();
            let applied = apply(&store, 0, commands).await;
            assert!(applied.iter().all(|a| a.outcome == CommandOutcome::Created));
            // Every caller also touches one shared key: all 100 updates land.
            apply_one(&store, 1 + caller, &key("t", "shared"), upsert(50_000, "s")).await
        }));
    }
    let mut created = 0;
    for task in tasks {
        if task.await.expect("caller task").outcome == CommandOutcome::Created {
            created += 1;
        }
    }
    assert_eq!(created, 1, "exactly one caller created the shared key");
    for caller in 0..100 {
        for i in 0..10 {
            assert!(
                get(store, &key("t", &format!("c{caller:03}-{i}")))
                    .await
                    .is_some()
            );
        }
    }
    assert_eq!(all_due(store).await.len(), 1_001);
    let shared = get(store, &key("t", "shared")).await.unwrap();
    assert_eq!(shared.status, EventStatus::Scheduled);
}

/// Calls that change one event at once each build on the previous one's
/// result: none is lost (a store that read the row, then wrote it without
/// holding it in between, would count fewer).
pub async fn concurrent_changes_of_one_event_all_count<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    const CALLERS: u32 = 24;
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("t", "contended");
    apply_one(store, 1_000, &k, upsert(5_000, "v1")).await;
    let mut tasks = Vec::new();
    for caller in 0..CALLERS {
        let store = store.clone();
        let k = k.clone();
        // Each caller records the next attempt as it reads it; a caller
        // that lost the race to another (its number is recorded already)
        // reads again and records the one after.
        tasks.push(tokio::spawn(async move {
            let started = 5_001 + i64::from(caller);
            loop {
                let number = get(&store, &k).await.expect("stored").attempts + 1;
                let applied = apply_one(
                    &store,
                    5_100,
                    &k,
                    attempt("v1", number, Verdict::Retry, started),
                )
                .await;
                if applied.outcome != CommandOutcome::AttemptAlreadyRecorded(EventStatus::Retrying)
                {
                    return applied;
                }
            }
        }));
    }
    for task in tasks {
        let applied = task.await.expect("caller task");
        assert_eq!(
            applied.outcome,
            CommandOutcome::AttemptRecorded(EventStatus::Retrying)
        );
    }
    let record = get(store, &k).await.unwrap();
    assert_eq!(record.attempts, CALLERS, "every retry counted once");
    let history = store.attempts(&k, 100).await.unwrap();
    assert_eq!(history.len(), CALLERS as usize);
}

pub async fn api_keys_put_find_list_touch_delete<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    use belfry_core::auth::{ApiKey, KeyId, KeySecret, Role};

    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    assert!(store.list_api_keys().await.unwrap().is_empty());

    let admin_secret = KeySecret::generate().unwrap();
    let admin = ApiKey::new(&admin_secret, None, Role::Admin, ts(1_000), None).unwrap();
    let acme_secret = KeySecret::generate().unwrap();
    let acme = ApiKey::new(
        &acme_secret,
        Some(tenant("acme/x")),
        Role::Write,
        ts(2_000),
        Some(ts(9_000)),
    )
    .unwrap();
    assert!(store.put_api_key(admin.clone()).await.unwrap());
    assert!(store.put_api_key(acme.clone()).await.unwrap());
    // The same secret again (a bootstrap key seeded twice) stores nothing.
    let again = ApiKey::new(&admin_secret, None, Role::Admin, ts(3_000), None).unwrap();
    assert!(!store.put_api_key(again).await.unwrap());

    assert_eq!(
        store.api_key_by_hash(&admin_secret.hash()).await.unwrap(),
        Some(admin.clone())
    );
    assert_eq!(
        store.api_key_by_hash(&acme_secret.hash()).await.unwrap(),
        Some(acme.clone())
    );
    let unknown = KeySecret::generate().unwrap();
    assert_eq!(store.api_key_by_hash(&unknown.hash()).await.unwrap(), None);

    let mut expected = vec![admin.clone(), acme.clone()];
    expected.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(store.list_api_keys().await.unwrap(), expected);

    // Touch only moves forward; an unknown id is no error.
    store.touch_api_key(&acme.id, ts(5_000)).await.unwrap();
    store.touch_api_key(&acme.id, ts(4_000)).await.unwrap();
    store
        .touch_api_key(&KeyId::parse("key_unknown").unwrap(), ts(5_000))
        .await
        .unwrap();
    let touched = store
        .api_key_by_hash(&acme_secret.hash())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(touched.last_used_at, Some(ts(5_000)));

    // Revocation removes the key and answers what it was.
    let removed = store.delete_api_key(&acme.id).await.unwrap().unwrap();
    assert_eq!(removed.id, acme.id);
    assert_eq!(removed.tenant, Some(tenant("acme/x")));
    assert_eq!(store.delete_api_key(&acme.id).await.unwrap(), None);
    assert_eq!(
        store.api_key_by_hash(&acme_secret.hash()).await.unwrap(),
        None
    );
    assert_eq!(store.list_api_keys().await.unwrap(), vec![admin]);
    // A revoked secret is never stored again (a bootstrap key revoked,
    // then seeded at the next start).
    let revived = ApiKey::new(
        &acme_secret,
        Some(tenant("acme/x")),
        Role::Write,
        ts(6_000),
        None,
    )
    .unwrap();
    assert!(!store.put_api_key(revived).await.unwrap());
    assert_eq!(
        store.api_key_by_hash(&acme_secret.hash()).await.unwrap(),
        None
    );
    assert_eq!(store.list_api_keys().await.unwrap().len(), 1);
}

pub async fn audit_log_append_page_purge<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    use belfry_core::auth::{AuditAction, AuditEntry};

    use crate::AuditPageParams;

    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let page = |after: Option<(Timestamp, String)>, limit: usize| AuditPageParams { after, limit };
    assert!(store.list_audit(page(None, 10)).await.unwrap().is_empty());

    // Appended out of time order; two entries share a millisecond.
    let mut entries = Vec::new();
    for (at, action) in [
        (3_000, AuditAction::TenantDeleted),
        (1_000, AuditAction::KeyCreated),
        (2_000, AuditAction::TenantRegistered),
        (2_000, AuditAction::TenantChanged),
        (4_000, AuditAction::KeyRevoked),
    ] {
        let entry = AuditEntry::new(
            ts(at),
            "key_abc",
            action,
            Some(tenant("acme/x")),
            Some("key_def".into()),
        )
        .unwrap();
        store.append_audit(entry.clone()).await.unwrap();
        entries.push(entry);
    }
    entries.sort_by(|a, b| (a.at, &a.id).cmp(&(b.at, &b.id)));
    assert_eq!(store.list_audit(page(None, 10)).await.unwrap(), entries);

    // Pages of two, each continuing after the previous page's last entry.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let got = store.list_audit(page(after.clone(), 2)).await.unwrap();
        assert!(got.len() <= 2);
        let Some(last) = got.last() else { break };
        after = Some((last.at, last.id.clone()));
        seen.extend(got);
    }
    assert_eq!(seen, entries);

    // Purge: older than 3 000, at most 2 at a time, oldest first.
    assert_eq!(store.purge_audit(ts(3_000), 2).await.unwrap(), 2);
    assert_eq!(store.purge_audit(ts(3_000), 2).await.unwrap(), 1);
    assert_eq!(store.purge_audit(ts(3_000), 2).await.unwrap(), 0);
    assert_eq!(
        store.list_audit(page(None, 10)).await.unwrap(),
        entries[3..]
    );
}

/// Entries of one millisecond are listed in the order they were made (the
/// contract of `AuditEntry::new` within one process), on every page.
pub async fn audit_log_same_millisecond_in_recorded_order<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    use belfry_core::auth::{AuditAction, AuditEntry};

    use crate::AuditPageParams;

    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    // Twelve entries in one millisecond: random ids would list them in
    // their made order once in 12! runs.
    let mut made = Vec::new();
    for n in 0..12 {
        let entry = AuditEntry::new(
            ts(5_000),
            "key_abc",
            AuditAction::TenantChanged,
            Some(tenant("acme/x")),
            Some(format!("change-{n}")),
        )
        .unwrap();
        store.append_audit(entry.clone()).await.unwrap();
        made.push(entry);
    }
    let targets = |entries: &[AuditEntry]| -> Vec<Option<String>> {
        entries.iter().map(|e| e.target.clone()).collect()
    };
    let all = store
        .list_audit(AuditPageParams {
            after: None,
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(targets(&all), targets(&made));
    assert_eq!(all, made);

    // Pages of five continue in the same order.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let got = store
            .list_audit(AuditPageParams {
                after: after.clone(),
                limit: 5,
            })
            .await
            .unwrap();
        let Some(last) = got.last() else { break };
        after = Some((last.at, last.id.clone()));
        seen.extend(got);
    }
    assert_eq!(seen, made);
}

// ---------------------------------------------------------------- bulk actions

fn bulk_action(tenant_name: &str, created_ms: i64) -> belfry_core::bulk::BulkAction {
    use belfry_core::bulk::{BulkAction, BulkActionId, BulkFilter, BulkKind, StatusFilter};
    BulkAction::new(
        BulkActionId::generate(ts(created_ms)).expect("random source"),
        BulkKind::Redrive,
        BulkFilter {
            tenant: tenant(tenant_name),
            status: Some(StatusFilter::Event(EventStatus::Failed)),
            from: Some(ts(1)),
            to: None,
        },
        Some("key_abc".into()),
        ts(created_ms),
    )
}

fn bulk_ids(actions: &[belfry_core::bulk::BulkAction]) -> Vec<String> {
    actions.iter().map(|a| a.id.to_string()).collect()
}

/// Actions are stored whole, read back by id, listed newest first (all,
/// or one tenant's, in pages), and the running ones oldest first.
pub async fn bulk_actions_create_get_and_list<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    use crate::{ListBulkActionsParams, RunningBulkActionsParams};

    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    // Created in time order, across two tenants (one name extends the other).
    let actions: Vec<_> = [
        ("acme", 1_000),
        ("acme/x", 2_000),
        ("acme", 3_000),
        ("acme", 4_000),
    ]
    .into_iter()
    .map(|(t, at)| bulk_action(t, at))
    .collect();
    for action in &actions {
        assert!(store.create_bulk_action(action.clone()).await.unwrap());
    }
    assert!(
        !store.create_bulk_action(actions[0].clone()).await.unwrap(),
        "an id is stored once"
    );
    assert_eq!(
        store
            .get_bulk_action(&actions[1].id)
            .await
            .unwrap()
            .as_ref(),
        Some(&actions[1])
    );
    let unknown = bulk_action("acme", 9_000);
    assert_eq!(store.get_bulk_action(&unknown.id).await.unwrap(), None);

    let list =
        |tenant_name: Option<&str>, before: Option<&belfry_core::bulk::BulkAction>, limit| {
            ListBulkActionsParams {
                tenant: tenant_name.map(tenant),
                before: before.map(|a| a.id.clone()),
                limit,
            }
        };
    let newest_first: Vec<_> = actions.iter().rev().cloned().collect();
    assert_eq!(
        store.list_bulk_actions(list(None, None, 10)).await.unwrap(),
        newest_first
    );
    let acme: Vec<_> = newest_first
        .iter()
        .filter(|a| a.tenant().as_str() == "acme")
        .cloned()
        .collect();
    assert_eq!(
        store
            .list_bulk_actions(list(Some("acme"), None, 10))
            .await
            .unwrap(),
        acme
    );
    assert_eq!(
        bulk_ids(
            &store
                .list_bulk_actions(list(Some("acme/x"), None, 10))
                .await
                .unwrap()
        ),
        bulk_ids(&actions[1..2])
    );
    assert!(
        store
            .list_bulk_actions(list(Some("other"), None, 10))
            .await
            .unwrap()
            .is_empty()
    );
    // Pages of two, each before the previous page's last.
    let first = store
        .list_bulk_actions(list(Some("acme"), None, 2))
        .await
        .unwrap();
    assert_eq!(bulk_ids(&first), bulk_ids(&acme[..2]));
    let second = store
        .list_bulk_actions(list(Some("acme"), first.last(), 2))
        .await
        .unwrap();
    assert_eq!(bulk_ids(&second), bulk_ids(&acme[2..]));
    let all_after = store
        .list_bulk_actions(list(None, Some(&actions[2]), 10))
        .await
        .unwrap();
    assert_eq!(
        bulk_ids(&all_after),
        bulk_ids(&[actions[1].clone(), actions[0].clone()])
    );

    // Running: every one so far, oldest first, paged after an id.
    let running = |after: Option<&belfry_core::bulk::BulkAction>, limit| RunningBulkActionsParams {
        after: after.map(|a| a.id.clone()),
        limit,
    };
    assert_eq!(
        store.running_bulk_actions(running(None, 10)).await.unwrap(),
        actions
    );
    assert_eq!(
        bulk_ids(
            &store
                .running_bulk_actions(running(Some(&actions[1]), 1))
                .await
                .unwrap()
        ),
        bulk_ids(&actions[2..3])
    );
}

/// An update lands only from the stored revision, which it increments;
/// a finished action leaves the running ones; the filter never changes.
pub async fn bulk_action_updates_compare_and_set<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    use belfry_core::bulk::{BulkCursor, BulkProgress, BulkState, PageReport};

    use crate::RunningBulkActionsParams;

    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let created = bulk_action("acme", 1_000);
    assert!(store.create_bulk_action(created.clone()).await.unwrap());

    let mut progressed = created.clone();
    progressed.record_page(
        &PageReport {
            tally: BulkProgress {
                matched: 3,
                succeeded: 2,
                skipped: 1,
                failed: 0,
            },
            cursor: Some(BulkCursor {
                at: Some(ts(50)),
                id: "e3".into(),
            }),
            last: false,
        },
        ts(2_000),
    );
    let stored = store
        .update_bulk_action(progressed.clone())
        .await
        .unwrap()
        .expect("the first update from revision 0 lands");
    assert_eq!(stored.revision, 1);
    assert_eq!(stored.progress.matched, 3);
    assert_eq!(
        store.get_bulk_action(&created.id).await.unwrap().as_ref(),
        Some(&stored)
    );

    // A second writer still at revision 0 changes nothing.
    let mut stale = created.clone();
    stale.cancel(ts(2_500)).unwrap();
    assert_eq!(store.update_bulk_action(stale).await.unwrap(), None);
    assert_eq!(
        store.get_bulk_action(&created.id).await.unwrap().as_ref(),
        Some(&stored)
    );

    // The filter and the creation instant are not the update's to change.
    let mut renamed = stored.clone();
    renamed.filter.tenant = tenant("other");
    renamed.created_at = ts(5);
    let kept = store.update_bulk_action(renamed).await.unwrap().unwrap();
    assert_eq!(kept.filter, created.filter);
    assert_eq!(kept.created_at, created.created_at);
    assert_eq!(kept.revision, 2);

    // Finishing takes it out of the running ones.
    let mut done = kept.clone();
    done.cancel(ts(3_000)).unwrap();
    let done = store.update_bulk_action(done).await.unwrap().unwrap();
    assert_eq!(done.state, BulkState::Cancelled);
    assert!(
        store
            .running_bulk_actions(RunningBulkActionsParams {
                after: None,
                limit: 10
            })
            .await
            .unwrap()
            .is_empty()
    );
    // Unknown: nothing to update.
    assert_eq!(
        store
            .update_bulk_action(bulk_action("acme", 9_000))
            .await
            .unwrap(),
        None
    );
}

/// Two runners claiming one action from the same revision, at once: on
/// every backend exactly one claim lands, and the loser's later progress
/// save from its stale revision is refused too.
pub async fn bulk_action_claims_exclude_each_other<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    use std::time::Duration;

    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let lease = Duration::from_secs(10);
    for round in 0..20 {
        let created = bulk_action("acme", 1_000 + round);
        assert!(store.create_bulk_action(created.clone()).await.unwrap());
        let claims: Vec<_> = ["node-a", "node-b", "node-c"]
            .into_iter()
            .map(|runner| {
                let store = store.clone();
                let claimed = created.claimed(runner, ts(1_000), lease).unwrap();
                tokio::spawn(async move { store.update_bulk_action(claimed).await })
            })
            .collect();
        let mut winners = Vec::new();
        for claim in claims {
            if let Some(stored) = claim.await.unwrap().unwrap() {
                winners.push(stored);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        let winner = &winners[0];
        let stored = store.get_bulk_action(&created.id).await.unwrap().unwrap();
        assert_eq!(&stored, winner);
        let holder = &stored.claim.as_ref().unwrap().runner;
        // Another runner sees the claim and may not take it before it lapses.
        let other = if holder == "node-a" {
            "node-b"
        } else {
            "node-a"
        };
        assert!(!stored.claimable_by(other, ts(5_000)));
        assert!(stored.claimable_by(other, ts(11_000)));
        // A loser that saves from the old revision changes nothing.
        let stale = created.claimed(other, ts(1_000), lease).unwrap();
        assert_eq!(store.update_bulk_action(stale).await.unwrap(), None);
    }
}

/// Retention: actions finished before the cut-off go (oldest first, up to
/// the limit); running ones and those finished later stay.
pub async fn bulk_actions_purge_only_old_finished<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    use crate::{ListBulkActionsParams, PurgeBulkActionsParams};

    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let mut ids = Vec::new();
    for (created, finished) in [
        (1_000, Some(5_000)),
        (2_000, Some(3_000)),
        (3_000, None),
        (4_000, Some(9_000)),
    ] {
        let action = bulk_action("acme", created);
        assert!(store.create_bulk_action(action.clone()).await.unwrap());
        if let Some(at) = finished {
            let mut done = action.clone();
            done.cancel(ts(at)).unwrap();
            store.update_bulk_action(done).await.unwrap().unwrap();
        }
        ids.push(action.id);
    }
    let purge = |limit| PurgeBulkActionsParams {
        finished_before: ts(6_000),
        limit,
    };
    assert_eq!(store.purge_bulk_actions(purge(1)).await.unwrap(), 1);
    assert_eq!(
        store.get_bulk_action(&ids[1]).await.unwrap(),
        None,
        "oldest finished first"
    );
    assert_eq!(store.purge_bulk_actions(purge(10)).await.unwrap(), 1);
    assert_eq!(store.purge_bulk_actions(purge(10)).await.unwrap(), 0);
    let left = store
        .list_bulk_actions(ListBulkActionsParams {
            tenant: Some(tenant("acme")),
            before: None,
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(
        left.iter().map(|a| a.id.clone()).collect::<Vec<_>>(),
        vec![ids[3].clone(), ids[2].clone()]
    );
    assert_eq!(
        store
            .list_bulk_actions(ListBulkActionsParams {
                tenant: None,
                before: None,
                limit: 10
            })
            .await
            .unwrap()
            .len(),
        2
    );
}

// ------------------------------------------------------------ pull leases

/// The lease of attempt `attempt` on `key`'s current version, under
/// `epoch`, told apart by `nonce`; granted at `leased_at` for 1 s.
async fn grant_of(
    store: &SharedStore,
    key: &EventKey,
    attempt: u32,
    epoch: u64,
    nonce: u8,
    leased_at: i64,
) -> LeaseRecord {
    let record = get(store, key).await.expect("the event exists");
    LeaseRecord {
        lease: LeaseId::new(
            key.clone(),
            record.version,
            attempt,
            epoch,
            LeaseNonce([nonce; 16]),
        )
        .expect("a short version"),
        partition: record.partition,
        worker: WorkerId::new("w-1").expect("valid worker id"),
        leased_at: ts(leased_at),
        expires_at: ts(leased_at + 1_000),
        deadline_at: ts(leased_at + 60_000),
    }
}

async fn record_lease(store: &SharedStore, grant: &LeaseRecord) -> LeaseWriteOutcome {
    let mut outcomes = store
        .record_leases(RecordLeasesParams {
            fence: Fence {
                partition: grant.partition,
                epoch: grant.lease.epoch(),
            },
            grants: vec![grant.clone()],
        })
        .await
        .expect("record_leases");
    assert_eq!(outcomes.len(), 1, "one outcome per grant");
    outcomes.pop().expect("one outcome")
}

/// A change of `grant`'s lease, fenced by its own partition and epoch.
fn change_of(grant: &LeaseRecord, change: LeaseChange, at: i64) -> ChangeLeaseParams {
    ChangeLeaseParams {
        fence: Fence {
            partition: grant.partition,
            epoch: grant.lease.epoch(),
        },
        lease: grant.lease.clone(),
        change,
        at: ts(at),
    }
}

async fn change(
    store: &SharedStore,
    grant: &LeaseRecord,
    change: LeaseChange,
    at: i64,
) -> LeaseWriteOutcome {
    store
        .change_lease(change_of(grant, change, at))
        .await
        .expect("change_lease")
}

async fn change_all(store: &SharedStore, changes: &[ChangeLeaseParams]) -> Vec<LeaseWriteOutcome> {
    let outcomes = store
        .change_leases(ChangeLeasesParams {
            changes: changes.to_vec(),
        })
        .await
        .expect("change_leases");
    assert_eq!(outcomes.len(), changes.len(), "one outcome per change");
    outcomes
}

fn resolve(resolution: Resolution, verdict: Option<Verdict>, started_at: i64) -> LeaseChange {
    LeaseChange::Resolve {
        resolution,
        report: verdict.map(|verdict| AttemptReport {
            started_at: ts(started_at),
            duration_ms: 5,
            verdict,
            http_status: None,
            error: (verdict != Verdict::Delivered).then(|| "boom".to_string()),
            steer: None,
        }),
    }
}

async fn lease_state(store: &SharedStore, key: &EventKey) -> Option<StoredLeaseState> {
    store
        .get_lease(key)
        .await
        .expect("get_lease")
        .map(|lease| lease.state)
}

/// One lease per attempt: a repeat of the same lease is `Done`; any other
/// grant of the attempt answers the lease it already has (`Orphaned`),
/// live or expired, until it ends; then only the next attempt number
/// (attempts + 1) may be granted.
pub async fn lease_granted_once_per_version<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("pull", "job-1");
    apply_one(store, 0, &k, upsert(1_000, "v1")).await;
    assert_eq!(store.get_lease(&k).await.unwrap(), None);

    let first = grant_of(store, &k, 1, 0, 1, 1_000).await;
    assert_eq!(record_lease(store, &first).await, LeaseWriteOutcome::Done);
    let stored = store.get_lease(&k).await.unwrap().expect("recorded");
    assert_eq!(stored.record, first);
    assert_eq!(stored.state, StoredLeaseState::Live);
    assert_eq!(
        record_lease(store, &first).await,
        LeaseWriteOutcome::Done,
        "a repeat of the same grant"
    );

    let orphaned = LeaseWriteOutcome::Orphaned(Box::new(first.clone()));
    let rival = grant_of(store, &k, 1, 0, 2, 1_500).await;
    assert_eq!(record_lease(store, &rival).await, orphaned);
    // Expired (2 000) but never ended: still the attempt's lease.
    let skipping = grant_of(store, &k, 2, 0, 3, 2_500).await;
    assert_eq!(record_lease(store, &skipping).await, orphaned);
    let after_expiry = grant_of(store, &k, 1, 0, 4, 2_500).await;
    assert_eq!(record_lease(store, &after_expiry).await, orphaned);
    // Ended (released: no attempt): not the attempt after next, only
    // attempts + 1.
    let release = resolve(Resolution::Released { at: ts(2_500) }, None, 0);
    assert_eq!(
        change(store, &first, release, 2_400).await,
        LeaseWriteOutcome::Done
    );
    assert_eq!(
        record_lease(store, &skipping).await,
        LeaseWriteOutcome::Lost
    );
    assert_eq!(
        record_lease(store, &after_expiry).await,
        LeaseWriteOutcome::Done
    );
    assert_eq!(
        store.get_lease(&k).await.unwrap().expect("recorded").record,
        after_expiry
    );
    // The superseded lease is lost for every call.
    assert_eq!(
        change(
            store,
            &first,
            LeaseChange::Extend {
                expires_at: ts(9_000)
            },
            2_600
        )
        .await,
        LeaseWriteOutcome::Lost
    );
    // A version the event does not have.
    let mut stale = after_expiry.clone();
    stale.lease = LeaseId::new(
        k.clone(),
        EventVersion::from_string("v0".into()),
        1,
        0,
        LeaseNonce([5; 16]),
    )
    .unwrap();
    assert_eq!(
        record_lease(store, &stale).await,
        LeaseWriteOutcome::Cancelled
    );
    // Grants of a batch are answered one by one, in order.
    let other = key("pull", "job-2");
    apply_one(store, 0, &other, upsert(1_000, "w1")).await;
    let other_grant = grant_of(store, &other, 1, 0, 6, 3_000).await;
    if other_grant.partition == after_expiry.partition {
        let outcomes = store
            .record_leases(RecordLeasesParams {
                fence: Fence {
                    partition: other_grant.partition,
                    epoch: 0,
                },
                grants: vec![other_grant.clone(), stale, after_expiry],
            })
            .await
            .unwrap();
        assert_eq!(
            outcomes,
            vec![
                LeaseWriteOutcome::Done,
                LeaseWriteOutcome::Cancelled,
                LeaseWriteOutcome::Done
            ]
        );
    } else {
        assert_eq!(
            record_lease(store, &other_grant).await,
            LeaseWriteOutcome::Done
        );
    }
    // No attempt was counted.
    let record = get(store, &k).await.unwrap();
    assert_eq!(record.status, EventStatus::Scheduled);
    assert_eq!(record.attempts, 0);
    assert!(store.attempts(&k, 10).await.unwrap().is_empty());
}

/// A heartbeat moves the expiry; a complete delivers the event with its
/// attempt in the history; the same complete again is `Done`, anything
/// else on the ended lease `Lost`.
pub async fn lease_extend_complete_and_repeats<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("pull", "job-1");
    apply_one(store, 0, &k, upsert(1_000, "v1")).await;
    let lease = grant_of(store, &k, 1, 0, 1, 1_000).await;
    assert_eq!(record_lease(store, &lease).await, LeaseWriteOutcome::Done);

    let extend = LeaseChange::Extend {
        expires_at: ts(30_000),
    };
    assert_eq!(
        change(store, &lease, extend.clone(), 1_500).await,
        LeaseWriteOutcome::Done
    );
    let stored = store.get_lease(&k).await.unwrap().unwrap();
    assert_eq!(stored.record.expires_at, ts(30_000));
    assert_eq!(stored.state, StoredLeaseState::Live);
    // A rival grant answers the lease as extended.
    let rival = grant_of(store, &k, 1, 0, 2, 5_000).await;
    assert_eq!(
        record_lease(store, &rival).await,
        LeaseWriteOutcome::Orphaned(Box::new(stored.record.clone()))
    );

    let complete = resolve(
        Resolution::Delivered {
            result: Some("{\"ok\":true}".into()),
        },
        Some(Verdict::Delivered),
        1_000,
    );
    assert_eq!(
        change(store, &lease, complete.clone(), 2_000).await,
        LeaseWriteOutcome::Done
    );
    let record = get(store, &k).await.unwrap();
    assert_eq!(record.status, EventStatus::Delivered);
    assert_eq!(record.next_fire_at, None);
    assert_eq!(record.finished_at, Some(ts(2_000)));
    assert!(all_due(store).await.is_empty());
    let history = store.attempts(&k, 10).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].number, 1);
    assert_eq!(history[0].verdict, Verdict::Delivered);
    assert!(matches!(
        lease_state(store, &k).await,
        Some(StoredLeaseState::Resolved(Resolution::Delivered { .. }))
    ));

    assert_eq!(
        change(store, &lease, complete, 2_100).await,
        LeaseWriteOutcome::Done,
        "the same complete again"
    );
    assert_eq!(store.attempts(&k, 10).await.unwrap().len(), 1);
    let fail = resolve(
        Resolution::Dead {
            reason: "nope".into(),
        },
        Some(Verdict::Permanent),
        1_000,
    );
    assert_eq!(
        change(store, &lease, fail, 2_200).await,
        LeaseWriteOutcome::Lost
    );
    assert_eq!(
        change(store, &lease, extend, 2_300).await,
        LeaseWriteOutcome::Lost
    );
    assert_eq!(get(store, &k).await.unwrap().status, EventStatus::Delivered);
}

/// A release gives the event back due at its instant with no attempt; a
/// retry counts one and makes it due at the instant given (the due index
/// follows); a dead end fails it with its reason.
pub async fn lease_retry_dead_and_release_move_the_event<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("pull", "job-1");
    apply_one(store, 0, &k, upsert(1_000, "v1")).await;
    let partition = get(store, &k).await.unwrap().partition;

    let first = grant_of(store, &k, 1, 0, 1, 1_000).await;
    assert_eq!(record_lease(store, &first).await, LeaseWriteOutcome::Done);
    let release = resolve(Resolution::Released { at: ts(4_000) }, None, 0);
    assert_eq!(
        change(store, &first, release, 1_200).await,
        LeaseWriteOutcome::Done
    );
    let record = get(store, &k).await.unwrap();
    assert_eq!(record.status, EventStatus::Scheduled);
    assert_eq!(record.attempts, 0);
    assert_eq!(record.next_fire_at, Some(ts(4_000)));
    assert_eq!(
        due(store, partition, None, i64::MAX, 10).await,
        vec![cursor(4_000, &k)]
    );
    assert!(store.attempts(&k, 10).await.unwrap().is_empty());

    // Released: the same attempt number again, under another nonce.
    let second = grant_of(store, &k, 1, 0, 2, 4_000).await;
    assert_eq!(record_lease(store, &second).await, LeaseWriteOutcome::Done);
    let retry = resolve(
        Resolution::Retry { at: ts(9_000) },
        Some(Verdict::Retry),
        4_000,
    );
    assert_eq!(
        change(store, &second, retry, 4_500).await,
        LeaseWriteOutcome::Done
    );
    let record = get(store, &k).await.unwrap();
    assert_eq!(record.status, EventStatus::Retrying);
    assert_eq!(record.attempts, 1);
    assert_eq!(record.next_fire_at, Some(ts(9_000)));
    assert_eq!(record.last_error.as_deref(), Some("boom"));
    assert_eq!(
        due(store, partition, None, i64::MAX, 10).await,
        vec![cursor(9_000, &k)]
    );

    // The next lease must carry the next attempt number.
    let same_number = grant_of(store, &k, 1, 0, 3, 9_000).await;
    assert_eq!(
        record_lease(store, &same_number).await,
        LeaseWriteOutcome::Lost
    );
    let third = grant_of(store, &k, 2, 0, 4, 9_000).await;
    assert_eq!(record_lease(store, &third).await, LeaseWriteOutcome::Done);
    let dead = resolve(
        Resolution::Dead {
            reason: "gave up after 2 attempts: lease_expired".into(),
        },
        Some(Verdict::Retry),
        9_000,
    );
    assert_eq!(
        change(store, &third, dead, 10_000).await,
        LeaseWriteOutcome::Done
    );
    let record = get(store, &k).await.unwrap();
    assert_eq!(record.status, EventStatus::Failed);
    assert_eq!(record.attempts, 2);
    assert_eq!(
        record.last_error.as_deref(),
        Some("gave up after 2 attempts: lease_expired")
    );
    assert_eq!(record.next_fire_at, None);
    assert!(due(store, partition, None, i64::MAX, 10).await.is_empty());
    let history = store.attempts(&k, 10).await.unwrap();
    let numbers: Vec<(u32, Verdict)> = history.iter().map(|a| (a.number, a.verdict)).collect();
    assert_eq!(numbers, vec![(1, Verdict::Retry), (2, Verdict::Retry)]);
    assert_eq!(
        count(store, "pull", EventStatus::Failed).await,
        1,
        "listed with the dead letters"
    );
}

async fn count(store: &SharedStore, tenant_name: &str, status: EventStatus) -> u64 {
    store
        .count_events(CountEventsParams {
            tenant: tenant(tenant_name),
            status,
            at_most: 100,
        })
        .await
        .unwrap()
}

/// Every write names the epoch and the exact lease: another nonce, an
/// epoch other than the lease's, or (where epochs move) a partition
/// handed over since the grant is `Lost`; the new epoch's grant answers
/// the old lease, an orphan until its expiry is recorded.
pub async fn lease_fenced_by_epoch_and_lease_id<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("pull", "job-1");
    apply_one(store, 0, &k, upsert(1_000, "v1")).await;
    let lease = grant_of(store, &k, 1, 0, 1, 1_000).await;
    assert_eq!(record_lease(store, &lease).await, LeaseWriteOutcome::Done);
    let extend = LeaseChange::Extend {
        expires_at: ts(5_000),
    };

    let mut forged = lease.clone();
    forged.lease = LeaseId::new(
        k.clone(),
        lease.lease.version().clone(),
        1,
        0,
        LeaseNonce([9; 16]),
    )
    .unwrap();
    assert_eq!(
        change(store, &forged, extend.clone(), 1_100).await,
        LeaseWriteOutcome::Lost
    );
    let mismatched = store
        .change_lease(ChangeLeaseParams {
            fence: Fence {
                partition: lease.partition,
                epoch: 7,
            },
            lease: lease.lease.clone(),
            change: extend.clone(),
            at: ts(1_100),
        })
        .await
        .unwrap();
    assert_eq!(mismatched, LeaseWriteOutcome::Lost);
    let wrong_partition = PartitionId((lease.partition.0 + 1) % 4);
    let outcomes = store
        .record_leases(RecordLeasesParams {
            fence: Fence {
                partition: wrong_partition,
                epoch: 0,
            },
            grants: vec![grant_of(store, &k, 1, 0, 2, 1_100).await],
        })
        .await
        .unwrap();
    assert_eq!(outcomes, vec![LeaseWriteOutcome::Lost]);
    assert_eq!(
        store.get_lease(&k).await.unwrap().unwrap().record,
        lease,
        "nothing refused was written"
    );

    let Some(move_epoch) = &under_test.move_epoch else {
        return;
    };
    let epoch = move_epoch(lease.partition).await;
    assert!(epoch > 0);
    assert_eq!(
        change(store, &lease, extend, 1_200).await,
        LeaseWriteOutcome::Lost,
        "the partition moved"
    );
    assert_eq!(lease_state(store, &k).await, Some(StoredLeaseState::Voided));
    let old_epoch = grant_of(store, &k, 1, 0, 3, 1_200).await;
    assert_eq!(
        record_lease(store, &old_epoch).await,
        LeaseWriteOutcome::Lost
    );
    // Its epoch is over, but it was never ended: the new epoch's grant
    // answers it.
    let new_epoch = grant_of(store, &k, 1, epoch, 4, 1_200).await;
    assert_eq!(
        record_lease(store, &new_epoch).await,
        LeaseWriteOutcome::Orphaned(Box::new(lease.clone()))
    );
    let complete = resolve(
        Resolution::Delivered { result: None },
        Some(Verdict::Delivered),
        1_200,
    );
    assert_eq!(
        change(store, &lease, complete, 1_300).await,
        LeaseWriteOutcome::Lost
    );
    assert_eq!(get(store, &k).await.unwrap().status, EventStatus::Scheduled);
}

/// A cancel or a move through `apply` voids the lease: every later change
/// on it is `Cancelled`, and the moved event's new version can be leased.
pub async fn lease_of_cancelled_or_moved_event_is_void<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let cancelled = key("pull", "cancelled");
    let moved = key("pull", "moved");
    apply_one(store, 0, &cancelled, upsert(1_000, "c1")).await;
    apply_one(store, 0, &moved, upsert(1_000, "m1")).await;
    let cancelled_lease = grant_of(store, &cancelled, 1, 0, 1, 1_000).await;
    let moved_lease = grant_of(store, &moved, 1, 0, 2, 1_000).await;
    assert_eq!(
        record_lease(store, &cancelled_lease).await,
        LeaseWriteOutcome::Done
    );
    assert_eq!(
        record_lease(store, &moved_lease).await,
        LeaseWriteOutcome::Done
    );

    apply_one(store, 1_100, &cancelled, EventCommand::Cancel).await;
    apply_one(store, 1_100, &moved, upsert(8_000, "m2")).await;
    let complete = resolve(
        Resolution::Delivered { result: None },
        Some(Verdict::Delivered),
        1_000,
    );
    for lease in [&cancelled_lease, &moved_lease] {
        assert_eq!(
            change(
                store,
                lease,
                LeaseChange::Extend {
                    expires_at: ts(9_000)
                },
                1_200
            )
            .await,
            LeaseWriteOutcome::Cancelled
        );
        assert_eq!(
            change(store, lease, complete.clone(), 1_200).await,
            LeaseWriteOutcome::Cancelled
        );
        assert_eq!(
            lease_state(store, lease.lease.key()).await,
            Some(StoredLeaseState::Voided)
        );
    }
    assert_eq!(
        get(store, &cancelled).await.unwrap().status,
        EventStatus::Cancelled
    );
    let record = get(store, &moved).await.unwrap();
    assert_eq!(record.status, EventStatus::Scheduled);
    assert_eq!(record.next_fire_at, Some(ts(8_000)));
    assert!(store.attempts(&moved, 10).await.unwrap().is_empty());

    // The new version is free at once, though the old lease lives on paper.
    let again = grant_of(store, &moved, 1, 0, 3, 1_300).await;
    assert_eq!(record_lease(store, &again).await, LeaseWriteOutcome::Done);
    assert_eq!(
        record_lease(store, &cancelled_lease).await,
        LeaseWriteOutcome::Cancelled
    );
}

/// An expiry of `grant`'s lease by whoever holds the partition now
/// (`fence_epoch`), at `at`: a failed attempt `lease_expired`, then
/// `resolution`.
fn expire_of(
    grant: &LeaseRecord,
    fence_epoch: u64,
    resolution: Resolution,
    at: i64,
) -> ChangeLeaseParams {
    ChangeLeaseParams {
        fence: Fence {
            partition: grant.partition,
            epoch: fence_epoch,
        },
        lease: grant.lease.clone(),
        change: LeaseChange::Expire {
            resolution,
            report: AttemptReport {
                started_at: grant.leased_at,
                duration_ms: grant.leased_at.until(ts(at)).as_millis() as u64,
                verdict: Verdict::Retry,
                http_status: None,
                error: Some("lease_expired: its node restarted".into()),
                steer: None,
            },
        },
        at: ts(at),
    }
}

async fn expire(store: &SharedStore, params: ChangeLeaseParams) -> LeaseWriteOutcome {
    store.change_lease(params).await.expect("change_lease")
}

/// A lease whose owner went away before it ended (a restart: the same
/// epoch) is an orphan: grants of its attempt answer it, live or expired;
/// its expiry is recorded only once its time has come, as a failed
/// attempt like any other, and is told apart from a worker's failure.
pub async fn lease_orphan_is_expired_at_its_time_as_an_attempt<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("pull", "job-1");
    apply_one(store, 0, &k, upsert(1_000, "v1")).await;
    let partition = get(store, &k).await.unwrap().partition;
    let orphan = grant_of(store, &k, 1, 0, 1, 1_000).await;
    assert_eq!(record_lease(store, &orphan).await, LeaseWriteOutcome::Done);

    // After the restart, past its expiry (2 000): the same attempt number
    // would run the event again uncounted.
    let orphaned = LeaseWriteOutcome::Orphaned(Box::new(orphan.clone()));
    for (attempt, nonce) in [(1, 2), (2, 3)] {
        let grant = grant_of(store, &k, attempt, 0, nonce, 5_000).await;
        assert_eq!(record_lease(store, &grant).await, orphaned, "#{attempt}");
    }
    // Never before its expiry: its worker may still be running it.
    let retry = Resolution::Retry { at: ts(6_000) };
    assert_eq!(
        expire(store, expire_of(&orphan, 0, retry.clone(), 1_999)).await,
        LeaseWriteOutcome::Lost
    );
    assert_eq!(lease_state(store, &k).await, Some(StoredLeaseState::Live));
    assert_eq!(get(store, &k).await.unwrap().attempts, 0);

    assert_eq!(
        expire(store, expire_of(&orphan, 0, retry.clone(), 5_000)).await,
        LeaseWriteOutcome::Done
    );
    let record = get(store, &k).await.unwrap();
    assert_eq!(record.status, EventStatus::Retrying);
    assert_eq!(record.attempts, 1);
    assert_eq!(record.next_fire_at, Some(ts(6_000)));
    assert_eq!(
        due(store, partition, None, i64::MAX, 10).await,
        vec![cursor(6_000, &k)]
    );
    let history = store.attempts(&k, 10).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!((history[0].number, history[0].verdict), (1, Verdict::Retry));
    assert!(
        history[0]
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("lease_expired")),
        "{history:?}"
    );
    assert_eq!(
        lease_state(store, &k).await,
        Some(StoredLeaseState::Expired(retry.clone()))
    );

    // The same expiry again is a repeat; a worker's call is not.
    assert_eq!(
        expire(store, expire_of(&orphan, 0, retry.clone(), 5_100)).await,
        LeaseWriteOutcome::Done
    );
    assert_eq!(store.attempts(&k, 10).await.unwrap().len(), 1);
    let fail = resolve(retry, Some(Verdict::Retry), 1_000);
    assert_eq!(
        change(store, &orphan, fail, 5_200).await,
        LeaseWriteOutcome::Lost,
        "a late failure of its worker"
    );
    // Freed: the next attempt number only, after the back-off.
    let next = grant_of(store, &k, 2, 0, 4, 6_000).await;
    assert_eq!(record_lease(store, &next).await, LeaseWriteOutcome::Done);

    // A worker's failure reads as its own, not as an expiry.
    let failed = resolve(
        Resolution::Dead {
            reason: "bad input".into(),
        },
        Some(Verdict::Permanent),
        6_000,
    );
    assert_eq!(
        change(store, &next, failed, 6_500).await,
        LeaseWriteOutcome::Done
    );
    assert_eq!(
        lease_state(store, &k).await,
        Some(StoredLeaseState::Resolved(Resolution::Dead {
            reason: "bad input".into()
        }))
    );
    assert_eq!(get(store, &k).await.unwrap().status, EventStatus::Failed);
}

/// Where epochs move: the new owner finds the old owner's lease (an
/// orphan) and records its expiry under its own epoch — an expiry is the
/// one change that may name a lease of an earlier epoch — and, its
/// attempts spent, the event fails with the expiry's reason.
pub async fn lease_orphan_of_an_earlier_epoch_is_expired_by_the_new_owner<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let Some(move_epoch) = &under_test.move_epoch else {
        return;
    };
    let k = key("pull", "job-1");
    apply_one(store, 0, &k, upsert(1_000, "v1")).await;
    let orphan = grant_of(store, &k, 1, 0, 1, 1_000).await;
    assert_eq!(record_lease(store, &orphan).await, LeaseWriteOutcome::Done);
    let epoch = move_epoch(orphan.partition).await;

    let taken_over = grant_of(store, &k, 1, epoch, 2, 1_200).await;
    assert_eq!(
        record_lease(store, &taken_over).await,
        LeaseWriteOutcome::Orphaned(Box::new(orphan.clone()))
    );
    let dead = Resolution::Dead {
        reason: "gave up after 1 attempts (max_attempts reached): lease_expired".into(),
    };
    for (fence_epoch, at, why) in [
        (0, 2_500, "the old owner is fenced"),
        (epoch + 1, 2_500, "not the current epoch"),
        (epoch, 1_999, "before its expiry"),
    ] {
        assert_eq!(
            expire(store, expire_of(&orphan, fence_epoch, dead.clone(), at)).await,
            LeaseWriteOutcome::Lost,
            "{why}"
        );
    }
    let mut complete = change_of(
        &orphan,
        resolve(
            Resolution::Delivered { result: None },
            Some(Verdict::Delivered),
            1_000,
        ),
        2_500,
    );
    complete.fence.epoch = epoch;
    assert_eq!(
        store.change_lease(complete).await.unwrap(),
        LeaseWriteOutcome::Lost,
        "only an expiry may end a lease of an earlier epoch"
    );
    assert_eq!(get(store, &k).await.unwrap().status, EventStatus::Scheduled);

    assert_eq!(
        expire(store, expire_of(&orphan, epoch, dead.clone(), 2_500)).await,
        LeaseWriteOutcome::Done
    );
    let record = get(store, &k).await.unwrap();
    assert_eq!(record.status, EventStatus::Failed);
    assert_eq!(record.attempts, 1);
    assert_eq!(
        record.last_error.as_deref(),
        Some("gave up after 1 attempts (max_attempts reached): lease_expired")
    );
    let history = store.attempts(&k, 10).await.unwrap();
    assert_eq!(history.len(), 1);
    assert!(
        history[0]
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("lease_expired")),
        "{history:?}"
    );
    let stored = store.get_lease(&k).await.unwrap().unwrap();
    assert_eq!(stored.record, orphan, "the orphan itself, as granted");
    assert_eq!(stored.state, StoredLeaseState::Expired(dead.clone()));
    // A repeat under the same epoch is `Done`; once the epoch moved on,
    // `Lost`.
    assert_eq!(
        expire(store, expire_of(&orphan, epoch, dead.clone(), 2_600)).await,
        LeaseWriteOutcome::Done
    );
    let later = move_epoch(orphan.partition).await;
    assert!(later > epoch);
    assert_eq!(
        expire(store, expire_of(&orphan, epoch, dead, 2_700)).await,
        LeaseWriteOutcome::Lost
    );
    assert_eq!(store.attempts(&k, 10).await.unwrap().len(), 1);
}

/// Racing grants of one version under different nonces: exactly one is
/// recorded.
pub async fn concurrent_grants_of_one_version_one_wins<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let k = key("pull", "contended");
    apply_one(store, 0, &k, upsert(1_000, "v1")).await;
    let mut tasks = Vec::new();
    for nonce in 0..16u8 {
        let grant = grant_of(store, &k, 1, 0, nonce, 1_000).await;
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            (record_lease(&store, &grant).await, grant)
        }));
    }
    let mut winners = Vec::new();
    let mut refused = Vec::new();
    for task in tasks {
        let (outcome, grant) = task.await.expect("task");
        if outcome == LeaseWriteOutcome::Done {
            winners.push(grant);
        } else {
            refused.push(outcome);
        }
    }
    assert_eq!(winners.len(), 1, "exactly one grant wins");
    assert_eq!(
        store.get_lease(&k).await.unwrap().unwrap().record,
        winners[0]
    );
    // Every other one was shown the winner.
    let winner = LeaseWriteOutcome::Orphaned(Box::new(winners[0].clone()));
    assert!(
        refused.iter().all(|outcome| *outcome == winner),
        "{refused:?}"
    );
}

/// A batch of changes answers each one as `change_lease` would, in order
/// (a later change of one lease sees the earlier), and writes only the
/// `Done` ones; the same batch again is answered as repeats are.
pub async fn lease_batch_answers_each_change_truthfully<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let names = ["done", "forged", "stale", "cancelled", "extended", "twice"];
    let mut leases = Vec::new();
    for (nonce, name) in names.iter().enumerate() {
        let k = key("pull", name);
        apply_one(store, 0, &k, upsert(1_000, name)).await;
        let lease = grant_of(store, &k, 1, 0, nonce as u8, 1_000).await;
        assert_eq!(record_lease(store, &lease).await, LeaseWriteOutcome::Done);
        leases.push(lease);
    }
    let [done, forged, stale, cancelled, extended, twice] = &leases[..] else {
        unreachable!("six leases");
    };
    apply_one(store, 1_100, cancelled.lease.key(), EventCommand::Cancel).await;

    let complete = resolve(
        Resolution::Delivered { result: None },
        Some(Verdict::Delivered),
        1_000,
    );
    let mut wrong_nonce = forged.clone();
    wrong_nonce.lease = LeaseId::new(
        forged.lease.key().clone(),
        forged.lease.version().clone(),
        1,
        0,
        LeaseNonce([99; 16]),
    )
    .unwrap();
    let mut stale_epoch = change_of(stale, complete.clone(), 1_200);
    stale_epoch.fence.epoch = 7;
    let extend = LeaseChange::Extend {
        expires_at: ts(30_000),
    };
    let batch = vec![
        change_of(done, complete.clone(), 1_200),
        change_of(&wrong_nonce, complete.clone(), 1_200),
        stale_epoch,
        change_of(cancelled, complete.clone(), 1_200),
        change_of(extended, extend.clone(), 1_200),
        change_of(twice, extend, 1_200),
        change_of(twice, complete.clone(), 1_300),
    ];
    use LeaseWriteOutcome::{Cancelled, Done, Lost};
    let expected = vec![Done, Lost, Lost, Cancelled, Done, Done, Done];
    assert_eq!(change_all(store, &batch).await, expected);

    for finished in [done, twice] {
        let k = finished.lease.key();
        assert_eq!(get(store, k).await.unwrap().status, EventStatus::Delivered);
        assert_eq!(store.attempts(k, 10).await.unwrap().len(), 1);
        assert!(matches!(
            lease_state(store, k).await,
            Some(StoredLeaseState::Resolved(Resolution::Delivered { .. }))
        ));
    }
    for untouched in [forged, stale] {
        let k = untouched.lease.key();
        let record = get(store, k).await.unwrap();
        assert_eq!(record.status, EventStatus::Scheduled, "{k:?}");
        assert_eq!(record.attempts, 0);
        assert!(store.attempts(k, 10).await.unwrap().is_empty());
        let stored = store.get_lease(k).await.unwrap().unwrap();
        assert_eq!(stored.record, *untouched, "nothing refused was written");
        assert_eq!(stored.state, StoredLeaseState::Live);
    }
    let k = cancelled.lease.key();
    assert_eq!(get(store, k).await.unwrap().status, EventStatus::Cancelled);
    assert!(store.attempts(k, 10).await.unwrap().is_empty());
    let stored = store
        .get_lease(extended.lease.key())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.record.expires_at, ts(30_000));
    assert_eq!(stored.state, StoredLeaseState::Live);

    // The same batch again: the completes are repeats (`Done`, no second
    // attempt); the extend of the ended lease `twice` is now `Lost`.
    let expected = vec![Done, Lost, Lost, Cancelled, Done, Lost, Done];
    assert_eq!(change_all(store, &batch).await, expected);
    for finished in [done, twice] {
        assert_eq!(
            store
                .attempts(finished.lease.key(), 10)
                .await
                .unwrap()
                .len(),
            1
        );
    }
    assert_eq!(
        get(store, forged.lease.key()).await.unwrap().status,
        EventStatus::Scheduled
    );
    assert!(change_all(store, &[]).await.is_empty());
}

/// Where epochs move: a change under a partition handed over since its
/// grant is `Lost` and changes nothing, while the rest of its batch (in
/// other partitions) is written.
pub async fn lease_batch_fenced_change_is_lost_alone<F, Fut>(factory: F)
where
    F: Fn(PartitionCount) -> Fut,
    Fut: Future<Output = StoreUnderTest>,
{
    let under_test = factory(partitions(4)).await;
    let store = &under_test.store;
    let Some(move_epoch) = &under_test.move_epoch else {
        return;
    };
    let moved = key("pull", "moved");
    apply_one(store, 0, &moved, upsert(1_000, "m1")).await;
    let moved_lease = grant_of(store, &moved, 1, 0, 1, 1_000).await;
    // A key of another partition than `moved`'s.
    let mut kept = None;
    for n in 0..64 {
        let k = key("pull", &format!("kept-{n}"));
        apply_one(store, 0, &k, upsert(1_000, "k1")).await;
        if get(store, &k).await.unwrap().partition != moved_lease.partition {
            kept = Some(k);
            break;
        }
    }
    let kept = kept.expect("a key in another partition");
    let kept_lease = grant_of(store, &kept, 1, 0, 2, 1_000).await;
    for lease in [&moved_lease, &kept_lease] {
        assert_eq!(record_lease(store, lease).await, LeaseWriteOutcome::Done);
    }
    move_epoch(moved_lease.partition).await;

    let complete = resolve(
        Resolution::Delivered { result: None },
        Some(Verdict::Delivered),
        1_000,
    );
    let batch = vec![
        change_of(&moved_lease, complete.clone(), 1_200),
        change_of(&kept_lease, complete, 1_200),
    ];
    assert_eq!(
        change_all(store, &batch).await,
        vec![LeaseWriteOutcome::Lost, LeaseWriteOutcome::Done]
    );
    assert_eq!(
        get(store, &moved).await.unwrap().status,
        EventStatus::Scheduled
    );
    assert!(store.attempts(&moved, 10).await.unwrap().is_empty());
    assert_eq!(
        lease_state(store, &moved).await,
        Some(StoredLeaseState::Voided)
    );
    assert_eq!(
        get(store, &kept).await.unwrap().status,
        EventStatus::Delivered
    );
}
