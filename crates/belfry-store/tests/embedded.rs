//! The embedded store: the whole conformance suite (a fresh temporary
//! directory per case), plus what only an on-disk store can show.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::sync::Arc;

use belfry_core::event::{
    AttemptReport, CommandOutcome, DeliveryOption, EventCommand, EventStatus,
};
use belfry_core::tenant::HttpTarget;
use belfry_core::{
    EventId, EventKey, EventVersion, PartitionCount, PartitionId, RetryPolicy, SinkConfig,
    TenantConfig, TenantName, Timestamp, Verdict,
};
use belfry_store::conformance::embedded_factory;
use belfry_store::interpose::{Fault, Interposed, Interposer, StoreCall};
use belfry_store::{
    ApplyParams, DuePageParams, EmbeddedOptions, EmbeddedStore, KeyedCommand, SharedStore,
    StoreError,
};

belfry_store::store_conformance_tests!(embedded_factory);

fn open(dir: &std::path::Path, partitions: u16) -> SharedStore {
    Arc::new(
        EmbeddedStore::open(EmbeddedOptions {
            data_dir: dir.to_path_buf(),
            partitions: PartitionCount::new(partitions).unwrap(),
            writers: None,
            clock: std::sync::Arc::new(belfry_clock::SystemClock),
        })
        .unwrap(),
    )
}

fn key(id: &str) -> EventKey {
    EventKey::new(TenantName::new("t/x").unwrap(), EventId::new(id).unwrap())
}

fn upsert(id: &str, at: i64) -> KeyedCommand {
    KeyedCommand {
        key: key(id),
        command: EventCommand::Upsert {
            event_time: Timestamp::from_millis(at),
            payload: Some(format!("payload {id}")),
            delivery: DeliveryOption::PayloadOnly,
            new_version: EventVersion::from_string(format!("v-{id}")),
            settings: Default::default(),
        },
        fence: None,
    }
}

async fn apply(store: &SharedStore, commands: Vec<KeyedCommand>) {
    store
        .apply(ApplyParams {
            commands,
            now: Timestamp::from_millis(100),
            retry: RetryPolicy::default(),
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_survives_drop_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let tenant = TenantConfig {
        name: TenantName::new("t/x").unwrap(),
        sink: SinkConfig::Http(HttpTarget {
            url: "http://127.0.0.1:9/hook".into(),
            headers: Default::default(),
            timeout_ms: None,
            delivery: Default::default(),
        }),
        signing: None,
        notify: None,
    };
    let before = {
        let store = open(dir.path(), 4);
        store.put_tenant(tenant.clone()).await.unwrap();
        apply(
            &store,
            (0..500)
                .map(|i| upsert(&format!("e{i:03}"), 1_000 + i))
                .collect(),
        )
        .await;
        store
            .apply(ApplyParams {
                commands: vec![KeyedCommand {
                    key: key("e000"),
                    command: EventCommand::RecordAttempt {
                        version: EventVersion::from_string("v-e000".into()),
                        number: 1,
                        report: AttemptReport {
                            started_at: Timestamp::from_millis(1_000),
                            duration_ms: 3,
                            verdict: Verdict::Delivered,
                            http_status: Some(204),
                            error: None,
                            steer: None,
                        },
                        tenant: Default::default(),
                    },
                    fence: None,
                }],
                now: Timestamp::from_millis(1_001),
                retry: RetryPolicy::default(),
            })
            .await
            .unwrap();
        let mut due = Vec::new();
        for partition in store.partitions().all() {
            due.extend(due_of(&store, partition).await);
        }
        assert_eq!(due.len(), 499);
        (store.get_event(&key("e042")).await.unwrap().unwrap(), due)
    };

    // A different configured count is ignored: the store keeps its own.
    let store = open(dir.path(), 16);
    assert_eq!(store.partitions(), PartitionCount::new(4).unwrap());
    assert_eq!(store.get_tenant(&tenant.name).await.unwrap(), Some(tenant));
    assert_eq!(store.get_event(&key("e042")).await.unwrap(), Some(before.0));
    let delivered = store.get_event(&key("e000")).await.unwrap().unwrap();
    assert_eq!(delivered.status, EventStatus::Delivered);
    assert_eq!(store.attempts(&key("e000"), 10).await.unwrap().len(), 1);
    let mut due = Vec::new();
    for partition in store.partitions().all() {
        due.extend(due_of(&store, partition).await);
    }
    assert_eq!(due, before.1);

    // History keeps its order across restarts (sequence numbers persist).
    apply(&store, vec![upsert("late", 5_000)]).await;
    assert!(store.stats().await.unwrap().disk_bytes.unwrap() > 0);
}

async fn due_of(store: &SharedStore, partition: PartitionId) -> Vec<belfry_core::DueCursor> {
    store
        .due_page(DuePageParams {
            partition,
            after: None,
            through: Timestamp::from_millis(i64::MAX),
            limit: usize::MAX,
            tenant: None,
            skip_tenants: Vec::new(),
        })
        .await
        .unwrap()
}

#[test]
fn a_second_open_of_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = open(dir.path(), 2);
    let second = EmbeddedStore::open(EmbeddedOptions {
        data_dir: dir.path().to_path_buf(),
        partitions: PartitionCount::new(2).unwrap(),
        writers: None,
        clock: std::sync::Arc::new(belfry_clock::SystemClock),
    });
    // Refused naming the holder (this process), not fjall's bare `Locked`.
    match second {
        Err(belfry_store::StoreError::Unavailable(message)) => {
            assert!(message.contains("is in use by"), "{message}");
            assert!(
                message.contains(&format!("pid {}", std::process::id())),
                "{message}"
            );
        }
        other => panic!("a second open must be refused: {:?}", other.err()),
    }
}

fn open_with_writers(dir: &std::path::Path, writers: usize) -> SharedStore {
    Arc::new(
        EmbeddedStore::open(EmbeddedOptions {
            data_dir: dir.to_path_buf(),
            partitions: PartitionCount::new(8).unwrap(),
            writers: std::num::NonZeroUsize::new(writers),
            clock: std::sync::Arc::new(belfry_clock::SystemClock),
        })
        .unwrap(),
    )
}

/// Same `started_at` every time, so only the sequence number keeps the
/// entries apart: a reused number would overwrite an older entry.
async fn record_stale_attempt(store: &SharedStore, id: &str, number: u32) {
    store
        .apply(ApplyParams {
            commands: vec![KeyedCommand {
                key: key(id),
                command: EventCommand::RecordAttempt {
                    version: EventVersion::from_string("an-old-version".into()),
                    number,
                    report: AttemptReport {
                        started_at: Timestamp::from_millis(50),
                        duration_ms: 1,
                        verdict: Verdict::Retry,
                        http_status: Some(503),
                        error: None,
                        steer: None,
                    },
                    tenant: Default::default(),
                },
                fence: None,
            }],
            now: Timestamp::from_millis(60),
            retry: RetryPolicy::default(),
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_writer_count_keeps_every_key_and_history_entry() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<String> = (0..64).map(|i| format!("e{i:02}")).collect();
    {
        let store = open_with_writers(dir.path(), 1);
        apply(&store, ids.iter().map(|id| upsert(id, 1_000)).collect()).await;
        for number in 1..=2 {
            for id in &ids {
                record_stale_attempt(&store, id, number).await;
            }
        }
    }
    let store = open_with_writers(dir.path(), 3);
    for id in &ids {
        record_stale_attempt(&store, id, 3).await;
    }
    for id in &ids {
        assert_eq!(store.attempts(&key(id), 10).await.unwrap().len(), 3, "{id}");
        assert!(store.get_event(&key(id)).await.unwrap().is_some());
    }
    let mut due = Vec::new();
    for partition in store.partitions().all() {
        due.extend(due_of(&store, partition).await);
    }
    assert_eq!(due.len(), ids.len());
}

/// A batch spread over two writer shards, one of which fails its commit:
/// the other shard's commands are applied and durable, and the answer says
/// so per command (`Partial`), not one error for the whole batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_writer_shard_fails_answers_each_command() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        EmbeddedStore::open(EmbeddedOptions {
            data_dir: dir.path().to_path_buf(),
            partitions: PartitionCount::new(8).unwrap(),
            writers: std::num::NonZeroUsize::new(2),
            clock: std::sync::Arc::new(belfry_clock::SystemClock),
        })
        .unwrap(),
    );
    let shared: SharedStore = store.clone();
    let of_shard = |shard: usize, prefix: &str| {
        (0..)
            .map(|i| format!("{prefix}-{i}"))
            .find(|id| store.writer_shard(&key(id)) == shard)
            .unwrap()
    };
    let (kept_1, failed, kept_2) = (
        of_shard(0, "kept"),
        of_shard(1, "lost"),
        of_shard(0, "also"),
    );
    let params = |commands| ApplyParams {
        commands,
        now: Timestamp::from_millis(100),
        retry: RetryPolicy::default(),
    };

    store.fail_commits_of(&key(&failed), 1);
    let answer = shared
        .apply(params(vec![
            upsert(&kept_1, 5_000),
            upsert(&failed, 5_000),
            upsert(&kept_2, 6_000),
        ]))
        .await;
    let Err(StoreError::Partial(partial)) = answer else {
        panic!("expected a partial failure, got {answer:?}");
    };
    assert_eq!(partial.results.len(), 3);
    for index in [0, 2] {
        let applied = partial.results[index].as_ref().unwrap();
        assert_eq!(applied.outcome, CommandOutcome::Created);
        assert_eq!(
            applied.effects.len(),
            1,
            "its timer effect is there to route"
        );
    }
    assert!(matches!(partial.results[1], Err(StoreError::Internal(_))));
    assert_eq!(partial.applied().count(), 2);
    assert!(
        partial
            .to_string()
            .starts_with("2 of 3 commands applied, 1 failed"),
        "{partial}"
    );

    // What the answer says is what the store holds, indexes included.
    assert!(shared.get_event(&key(&kept_1)).await.unwrap().is_some());
    assert!(shared.get_event(&key(&kept_2)).await.unwrap().is_some());
    assert!(shared.get_event(&key(&failed)).await.unwrap().is_none());
    let mut due = Vec::new();
    for partition in shared.partitions().all() {
        due.extend(due_of(&shared, partition).await.into_iter().map(|c| c.key));
    }
    due.sort();
    let mut expected = vec![key(&kept_1), key(&kept_2)];
    expected.sort();
    assert_eq!(due, expected);

    // A call that touches only the failing shard fails as a whole: a plain
    // error, not `Partial`.
    store.fail_commits_of(&key(&failed), 1);
    let alone = shared.apply(params(vec![upsert(&failed, 5_000)])).await;
    assert!(matches!(alone, Err(StoreError::Internal(_))), "{alone:?}");
    // The failpoint is spent: the same command now lands.
    apply(&shared, vec![upsert(&failed, 5_000)]).await;
    assert!(shared.get_event(&key(&failed)).await.unwrap().is_some());
}

/// Answers every `apply` with one fault; other calls pass.
#[derive(Debug)]
struct FaultEveryApply(Fault);

impl Interposer for FaultEveryApply {
    fn before(&self, call: StoreCall<'_>) -> Fault {
        match call {
            StoreCall::Apply(_) => self.0.clone(),
            _ => Fault::Pass,
        }
    }
}

fn interposed(store: &SharedStore, fault: Fault) -> SharedStore {
    Arc::new(Interposed::new(
        store.clone(),
        Arc::new(FaultEveryApply(fault)),
    ))
}

fn unavailable() -> StoreError {
    StoreError::Unavailable("injected".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_call_writes_nothing_and_commit_then_fail_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 4);
    let params = |id: &str| ApplyParams {
        commands: vec![upsert(id, 1_000)],
        now: Timestamp::from_millis(100),
        retry: RetryPolicy::default(),
    };

    let failing = interposed(&store, Fault::Fail(unavailable()));
    let answer = failing.apply(params("failed")).await;
    assert!(
        matches!(answer, Err(StoreError::Unavailable(_))),
        "{answer:?}"
    );
    assert_eq!(store.get_event(&key("failed")).await.unwrap(), None);

    let committing = interposed(&store, Fault::CommitThenFail(unavailable()));
    let answer = committing.apply(params("committed")).await;
    assert!(
        matches!(answer, Err(StoreError::Unavailable(_))),
        "{answer:?}"
    );
    assert!(store.get_event(&key("committed")).await.unwrap().is_some());
}

/// A stalled call dropped before its stall ends never reaches the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_during_its_stall_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 4);
    let stalling = interposed(&store, Fault::Stall(std::time::Duration::from_secs(60)));
    let call = stalling.apply(ApplyParams {
        commands: vec![upsert("stalled", 1_000)],
        now: Timestamp::from_millis(100),
        retry: RetryPolicy::default(),
    });
    let answer = tokio::time::timeout(std::time::Duration::from_millis(200), call).await;
    assert!(answer.is_err(), "the stall outlasts the caller");
    assert_eq!(store.get_event(&key("stalled")).await.unwrap(), None);
}

/// A call that committed and whose answer is held back: the write is
/// visible while the caller still waits, and stays once it gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_stalls_is_visible_before_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 4);
    let stalling = interposed(
        &store,
        Fault::CommitThenStall(std::time::Duration::from_secs(3_600)),
    );
    let call = tokio::spawn(async move {
        stalling
            .apply(ApplyParams {
                commands: vec![upsert("held", 1_000)],
                now: Timestamp::from_millis(100),
                retry: RetryPolicy::default(),
            })
            .await
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while store.get_event(&key("held")).await.unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "never committed");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(!call.is_finished(), "the answer is held back");
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    assert!(store.get_event(&key("held")).await.unwrap().is_some());
}
