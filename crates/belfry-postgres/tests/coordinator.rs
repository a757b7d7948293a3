//! The cluster coordinator on PostgreSQL: leader lease and terms,
//! membership, partition epochs with takeover delays, and fencing of
//! `apply`.

mod support;

use std::time::Duration;

use belfry_core::event::{AttemptReport, EventCommand, EventStatus};
use belfry_core::{EventVersion, PartitionId, Timestamp, Verdict};
use belfry_postgres::PostgresStore;
use belfry_store::cluster::{Coordinator, LeaderLease, NodeId, NodeInfo, PartitionAssignment};
use belfry_store::{KeyedCommand, Store, StoreError};
use belfry_testkit::PgServer;
use support::{eventually, fenced, fresh_store, key, key_in, options, params, upsert};

fn node(name: &str) -> NodeId {
    NodeId(name.into())
}

fn lease(holder: &str, term: u64) -> LeaderLease {
    LeaderLease {
        holder: node(holder),
        term,
    }
}

const LONG: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_lease_acquire_renew_expire_and_release() {
    let store = fresh_store(4).await;
    assert_eq!(
        store.leader().await.unwrap(),
        None,
        "nobody leads a new cluster"
    );

    let short = Duration::from_millis(400);
    assert_eq!(
        store.claim_leadership(&node("a"), short).await.unwrap(),
        lease("a", 1)
    );
    assert_eq!(
        store.claim_leadership(&node("b"), short).await.unwrap(),
        lease("a", 1),
        "a live lease is not taken over"
    );
    assert_eq!(
        store.claim_leadership(&node("a"), short).await.unwrap(),
        lease("a", 1),
        "the holder renews within its term"
    );
    assert_eq!(store.leader().await.unwrap(), Some(lease("a", 1)));

    // a stops renewing: once its lease has expired, b gets a new term.
    eventually("a's lease to expire", || async {
        store.leader().await.unwrap().is_none().then_some(())
    })
    .await;
    assert_eq!(
        store.claim_leadership(&node("b"), LONG).await.unwrap(),
        lease("b", 2)
    );
    assert_eq!(
        store.claim_leadership(&node("a"), LONG).await.unwrap(),
        lease("b", 2)
    );

    // A clean hand-over: released at once, the next claimant's term is new.
    store.release_leadership(&node("a")).await.unwrap();
    assert_eq!(
        store.leader().await.unwrap(),
        Some(lease("b", 2)),
        "a held nothing"
    );
    store.release_leadership(&node("b")).await.unwrap();
    assert_eq!(store.leader().await.unwrap(), None);
    assert_eq!(
        store.claim_leadership(&node("a"), LONG).await.unwrap(),
        lease("a", 3)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_elect_exactly_one_leader() {
    let store = std::sync::Arc::new(fresh_store(4).await);
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            store
                .claim_leadership(&node(&format!("n{i}")), LONG)
                .await
                .unwrap()
        }));
    }
    let mut leases = Vec::new();
    for task in tasks {
        leases.push(task.await.unwrap());
    }
    let first = leases[0].clone();
    assert!(
        leases.iter().all(|l| *l == first),
        "every claimant sees one lease: {leases:?}"
    );
    assert_eq!(first.term, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assign_with_a_stale_term_is_rejected() {
    let store = fresh_store(4).await;
    let short = Duration::from_millis(300);
    let a = store.claim_leadership(&node("a"), short).await.unwrap();
    store
        .assign(&node("a"), a.term, vec![(PartitionId(0), node("a"))])
        .await
        .unwrap();
    eventually("a's lease to expire", || async {
        store.leader().await.unwrap().is_none().then_some(())
    })
    .await;
    // Expired, not yet taken: a must not act on its old term either.
    let expired = store
        .assign(&node("a"), a.term, vec![(PartitionId(1), node("a"))])
        .await;
    assert!(
        matches!(expired, Err(StoreError::Unavailable(_))),
        "{expired:?}"
    );

    let b = store.claim_leadership(&node("b"), LONG).await.unwrap();
    assert_eq!(b.term, a.term + 1);
    let stale = store
        .assign(
            &node("a"),
            a.term,
            vec![(PartitionId(0), node("a")), (PartitionId(1), node("a"))],
        )
        .await;
    assert!(
        matches!(stale, Err(StoreError::Unavailable(_))),
        "{stale:?}"
    );
    let wrong_holder = store
        .assign(&node("a"), b.term, vec![(PartitionId(1), node("a"))])
        .await;
    assert!(
        matches!(wrong_holder, Err(StoreError::Unavailable(_))),
        "{wrong_holder:?}"
    );

    let map = store.assignments().await.unwrap();
    assert_eq!(
        map,
        vec![
            PartitionAssignment {
                partition: PartitionId(0),
                owner: Some(node("a")),
                epoch: 1
            },
            PartitionAssignment {
                partition: PartitionId(1),
                owner: None,
                epoch: 0
            },
            PartitionAssignment {
                partition: PartitionId(2),
                owner: None,
                epoch: 0
            },
            PartitionAssignment {
                partition: PartitionId(3),
                owner: None,
                epoch: 0
            },
        ],
        "rejected assignments changed nothing"
    );
    store
        .assign(&node("b"), b.term, vec![(PartitionId(1), node("b"))])
        .await
        .unwrap();
    assert_eq!(store.assignments().await.unwrap()[1].owner, Some(node("b")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_changes_bump_epochs_and_wait_for_the_old_lease() {
    let store = fresh_store(4).await;
    let leader = store.claim_leadership(&node("a"), LONG).await.unwrap();
    let leader_id = node("a");
    let assign = |owners: Vec<(u16, &str)>| {
        let owners = owners
            .into_iter()
            .map(|(p, n)| (PartitionId(p), node(n)))
            .collect();
        store.assign(&leader_id, leader.term, owners)
    };
    assign(vec![(0, "a"), (1, "a"), (2, "b")]).await.unwrap();

    let lease_ttl = Duration::from_secs(20);
    let owned = store.renew_ownership(&node("a"), lease_ttl).await.unwrap();
    let summary: Vec<(PartitionId, u64, Duration)> = owned
        .iter()
        .map(|o| (o.partition, o.epoch, o.takeover_after))
        .collect();
    assert_eq!(
        summary,
        vec![
            (PartitionId(0), 1, Duration::ZERO),
            (PartitionId(1), 1, Duration::ZERO)
        ],
        "a first owner has nobody to wait for"
    );

    // Re-assigning the same owner changes nothing.
    assign(vec![(0, "a")]).await.unwrap();
    assert_eq!(store.assignments().await.unwrap()[0].epoch, 1);

    // p0 moves to c while a's lease runs: c waits for its end.
    assign(vec![(0, "c")]).await.unwrap();
    let owned_by_c = store.renew_ownership(&node("c"), lease_ttl).await.unwrap();
    assert_eq!(owned_by_c.len(), 1);
    assert_eq!(owned_by_c[0].partition, PartitionId(0));
    assert_eq!(owned_by_c[0].epoch, 2);
    let wait = owned_by_c[0].takeover_after;
    assert!(
        wait > Duration::from_secs(15) && wait <= lease_ttl,
        "c must wait out a's lease, waits {wait:?}"
    );
    let owned_by_a = store.renew_ownership(&node("a"), lease_ttl).await.unwrap();
    assert_eq!(
        owned_by_a.iter().map(|o| o.partition).collect::<Vec<_>>(),
        vec![PartitionId(1)]
    );

    // Moved again before its lease ran out: the wait still covers a's.
    assign(vec![(0, "d")]).await.unwrap();
    let owned_by_d = store.renew_ownership(&node("d"), lease_ttl).await.unwrap();
    assert_eq!(owned_by_d[0].epoch, 3);
    assert!(owned_by_d[0].takeover_after > Duration::from_secs(15));

    // p2's owner b never renewed: its successor need not wait.
    assign(vec![(2, "a")]).await.unwrap();
    let owned_by_a = store.renew_ownership(&node("a"), lease_ttl).await.unwrap();
    let p2 = owned_by_a
        .iter()
        .find(|o| o.partition == PartitionId(2))
        .unwrap();
    assert_eq!((p2.epoch, p2.takeover_after), (2, Duration::ZERO));

    // A short lease that ran out: the next owner starts at once.
    store
        .renew_ownership(&node("d"), Duration::from_millis(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assign(vec![(0, "e")]).await.unwrap();
    let owned_by_e = store.renew_ownership(&node("e"), lease_ttl).await.unwrap();
    assert_eq!(
        (owned_by_e[0].epoch, owned_by_e[0].takeover_after),
        (4, Duration::ZERO)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_list_live_nodes_with_ages() {
    let store = fresh_store(4).await;
    let info = |id: &str, port: u16| NodeInfo {
        id: node(id),
        address: format!("127.0.0.1:{port}"),
    };
    store.heartbeat(&info("b", 8082), LONG).await.unwrap();
    let live = store.heartbeat(&info("a", 8081), LONG).await.unwrap();
    let ids: Vec<(&str, &str)> = live
        .iter()
        .map(|n| (n.info.id.0.as_str(), n.info.address.as_str()))
        .collect();
    assert_eq!(
        ids,
        vec![("a", "127.0.0.1:8081"), ("b", "127.0.0.1:8082")],
        "ordered by id"
    );
    assert!(
        live.iter()
            .all(|n| n.heartbeat_age < Duration::from_secs(10))
    );

    // A new address replaces the old one.
    store.heartbeat(&info("b", 9092), LONG).await.unwrap();
    // b goes silent: with a short ttl only a fresh heartbeat counts.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let live = store
        .heartbeat(&info("a", 8081), Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].info.id, node("a"));
    let live = store.heartbeat(&info("a", 8081), LONG).await.unwrap();
    assert_eq!(live.len(), 2);
    assert_eq!(live[1].info.address, "127.0.0.1:9092");
    assert!(
        live[1].heartbeat_age >= Duration::from_millis(250),
        "{:?}",
        live[1]
    );

    store.leave(&node("b")).await.unwrap();
    let live = store.heartbeat(&info("a", 8081), LONG).await.unwrap();
    assert_eq!(live.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_epoch_fails_the_whole_apply_and_changes_nothing() {
    let partitions = 4;
    let store = fresh_store(partitions).await;
    let leader = store.claim_leadership(&node("a"), LONG).await.unwrap();
    store
        .assign(&node("a"), leader.term, vec![(PartitionId(0), node("a"))])
        .await
        .unwrap();
    let owned = key_in(partitions, 0, "owned");
    store
        .apply(params(0, vec![upsert(&owned, 1_000, "v1")]))
        .await
        .unwrap();

    // The owner's write under its epoch is accepted.
    let delivered = KeyedCommand {
        key: owned.clone(),
        command: EventCommand::RecordAttempt {
            version: EventVersion::from_string("v1".into()),
            report: AttemptReport {
                started_at: Timestamp::from_millis(1_000),
                duration_ms: 2,
                verdict: Verdict::Retry,
                http_status: Some(503),
                error: Some("busy".into()),
            },
        },
        fence: None,
    };
    store
        .apply(params(1_001, vec![fenced(delivered.clone(), 0, 1)]))
        .await
        .unwrap();
    let before = store.get_event(&owned).await.unwrap().unwrap();
    assert_eq!(before.status, EventStatus::Retrying);

    // p0 moves to b: a's epoch 1 is stale now.
    store
        .assign(&node("a"), leader.term, vec![(PartitionId(0), node("b"))])
        .await
        .unwrap();
    let bystander = key("bystander");
    let stale = store
        .apply(params(
            2_000,
            vec![
                upsert(&bystander, 9_000, "x"),
                fenced(delivered.clone(), 0, 1),
            ],
        ))
        .await;
    assert!(
        matches!(
            stale,
            Err(StoreError::Fenced {
                partition: PartitionId(0),
                epoch: 1
            })
        ),
        "{stale:?}"
    );
    assert_eq!(store.get_event(&owned).await.unwrap(), Some(before.clone()));
    assert_eq!(
        store.get_event(&bystander).await.unwrap(),
        None,
        "nothing of the batch landed"
    );
    assert_eq!(store.attempts(&owned, 10).await.unwrap().len(), 1);

    // The new owner's epoch is accepted; an unknown partition never is.
    store
        .apply(params(2_000, vec![fenced(delivered.clone(), 0, 2)]))
        .await
        .unwrap();
    assert_eq!(store.attempts(&owned, 10).await.unwrap().len(), 2);
    let nowhere = store
        .apply(params(2_000, vec![fenced(delivered, 9, 0)]))
        .await;
    assert!(
        matches!(nowhere, Err(StoreError::Fenced { .. })),
        "{nowhere:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_connects_migrate_once_and_keep_the_partition_count() {
    let url = PgServer::shared().fresh_database().await;
    let mut tasks = Vec::new();
    for i in 0..6u16 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            PostgresStore::connect(options(url, 4 + i)).await.unwrap()
        }));
    }
    let mut counts = Vec::new();
    for task in tasks {
        counts.push(task.await.unwrap().partitions());
    }
    assert!(
        counts.iter().all(|c| *c == counts[0]),
        "one creator decides: {counts:?}"
    );
    // Later nodes keep the stored count, whatever they ask for.
    let later = PostgresStore::connect(options(url.clone(), 64))
        .await
        .unwrap();
    assert_eq!(later.partitions(), counts[0]);
    assert_eq!(
        later.assignments().await.unwrap().len(),
        usize::from(counts[0].get())
    );

    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let migrations: i64 = client
        .query_one("SELECT count(*) FROM belfry_schema_migrations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(migrations, 1);
}
