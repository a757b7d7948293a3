//! Notices written by two engines on one store, as two nodes of a cluster
//! on one database write them: a notice slot both found free at once
//! keeps one of the two notices, and the other goes to the next slot;
//! neither is lost.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use belfry_clock::SystemClock;
use belfry_core::event::{DeliveryOption, EventCommand};
use belfry_core::notice::{self, MAX_PENDING_NOTICES, NoticeMessage};
use belfry_core::tenant::{HttpTarget, NotifyTarget};
use belfry_core::{
    EventId, EventKey, EventVersion, PartitionCount, SinkConfig, TenantConfig, TenantName,
    Timestamp,
};
use belfry_engine::{Engine, EngineHandle, EngineOptions};
use belfry_sinks::Sinks;
use belfry_store::interpose::{Fault, Interposed, Interposer, StoreCall};
use belfry_store::{EmbeddedOptions, EmbeddedStore, KeyedCommand, SharedStore};

const DEADLINE: Duration = Duration::from_secs(30);

/// How long the first engine's first notice write is held after its slot
/// was read: the other engine writes its notice meanwhile.
const HOLD: Duration = Duration::from_secs(3);

fn tenant() -> TenantName {
    TenantName::new("acme").unwrap()
}

/// Holds the first write of a notice slot for [`HOLD`], and tells when it
/// started holding it.
#[derive(Debug, Default)]
struct HoldFirstNoticeWrite {
    held_at: Mutex<Option<Instant>>,
}

impl Interposer for HoldFirstNoticeWrite {
    fn before(&self, call: StoreCall<'_>) -> Fault {
        let StoreCall::Apply(params) = call else {
            return Fault::Pass;
        };
        if !params.commands.iter().any(|c| notice::is_notice(&c.key.id)) {
            return Fault::Pass;
        }
        let mut held_at = self.held_at.lock().unwrap();
        if held_at.is_some() {
            return Fault::Pass;
        }
        *held_at = Some(Instant::now());
        Fault::Stall(HOLD)
    }
}

fn engine(store: SharedStore) -> Engine {
    let sinks = Sinks::new(Default::default()).unwrap();
    // Unowned: nothing fires, so the notices stay pending in their slots.
    Engine::start_unowned(
        EngineOptions::default(),
        store,
        sinks,
        Arc::new(SystemClock),
    )
}

/// The notice identity of event `id` (version `v-{id}`) ending missed.
fn identity(id: &str) -> String {
    format!("event_missed/{id}/v-{id}")
}

fn first_slot(id: &str) -> usize {
    notice::probe(&identity(id), MAX_PENDING_NOTICES)
        .next()
        .unwrap()
}

/// Stores event `id` far ahead, then ends it missed: its notice is raised
/// by the engine that wrote the ending.
async fn end_missed(handle: &EngineHandle, id: &str) {
    let key = EventKey::new(tenant(), EventId::new(id).unwrap());
    let write = |command| KeyedCommand {
        key: key.clone(),
        command,
        fence: None,
    };
    handle
        .apply(vec![write(EventCommand::Upsert {
            event_time: Timestamp::from_millis(i64::from(i32::MAX) * 1_000),
            payload: Some(id.to_string()),
            delivery: DeliveryOption::PayloadOnly,
            new_version: EventVersion::from_string(format!("v-{id}")),
            settings: Default::default(),
        })])
        .await
        .unwrap();
    handle
        .apply(vec![write(EventCommand::Expire {
            reason: "missed: test".to_string(),
        })])
        .await
        .unwrap();
}

/// The identity of the pending notice in each slot that holds one.
async fn slots(store: &SharedStore) -> Vec<(usize, String)> {
    let mut held = Vec::new();
    for slot in 0..MAX_PENDING_NOTICES {
        let key = EventKey::new(tenant(), notice::slot_id(slot));
        let Some(record) = store.get_event(&key).await.unwrap() else {
            continue;
        };
        let message: NoticeMessage = serde_json::from_str(record.payload.as_deref().unwrap())
            .expect("a slot holds a notice message");
        held.push((slot, message.id));
    }
    held
}

async fn wait_for(store: &SharedStore, identity: &str) -> Vec<(usize, String)> {
    let started = Instant::now();
    loop {
        let held = slots(store).await;
        if held.iter().any(|(_, id)| id == identity) {
            return held;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{identity} never written; slots: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_raising_notices_into_one_slot_lose_neither() {
    belfry_testkit::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let store: SharedStore = Arc::new(
        EmbeddedStore::open(EmbeddedOptions {
            data_dir: dir.path().to_path_buf(),
            partitions: PartitionCount::new(8).unwrap(),
            writers: None,
            clock: Arc::new(SystemClock),
        })
        .unwrap(),
    );
    store
        .put_tenant(TenantConfig {
            name: tenant(),
            sink: SinkConfig::Http(HttpTarget {
                url: "http://127.0.0.1:9/hook".into(),
                headers: Default::default(),
                timeout_ms: None,
                delivery: Default::default(),
            }),
            signing: None,
            notify: Some(NotifyTarget::Url {
                url: "http://127.0.0.1:9/notices".into(),
            }),
        })
        .await
        .unwrap();
    // Two events whose notices look first in the same slot.
    let first = "a";
    let slot = first_slot(first);
    let second = (0..)
        .map(|i| format!("b{i}"))
        .find(|id| first_slot(id) == slot)
        .unwrap();

    let hold = Arc::new(HoldFirstNoticeWrite::default());
    let held = Arc::new(Interposed::new(store.clone(), hold.clone()));
    let node_a = engine(held);
    let node_b = engine(store.clone());

    // A reads the slot free, and its write is held...
    end_missed(&node_a.handle(), first).await;
    let started = Instant::now();
    let held_at = loop {
        if let Some(at) = *hold.held_at.lock().unwrap() {
            break at;
        }
        assert!(started.elapsed() < DEADLINE, "A never wrote its notice");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // ...while B finds the same slot free and writes its notice there.
    end_missed(&node_b.handle(), &second).await;
    let after_b = wait_for(&store, &identity(&second)).await;
    assert!(
        held_at.elapsed() < HOLD,
        "B's notice took longer than A's write was held: nothing raced"
    );
    assert_eq!(after_b, vec![(slot, identity(&second))]);

    // A's write, once let go, must not replace B's notice.
    let after_a = wait_for(&store, &identity(first)).await;
    assert!(
        after_a.contains(&(slot, identity(&second))),
        "B's notice was overwritten: {after_a:?}"
    );
    assert_eq!(after_a.len(), 2, "{after_a:?}");
    assert_eq!(
        after_a
            .iter()
            .find(|(_, id)| *id == identity(first))
            .map(|(taken, _)| *taken),
        notice::probe(&identity(first), MAX_PENDING_NOTICES).nth(1),
        "A's notice took the next slot of its probe"
    );

    node_a.shutdown().await;
    node_b.shutdown().await;
}
