//! The cluster coordinator on PostgreSQL: leader lease and terms,
//! membership, partition epochs, revoke-then-grant hand-overs, releases,
//! presence sessions and evictions, change notifications, and fencing of
//! `apply`.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod support;

use std::time::Duration;

use belfry_core::event::{AttemptReport, EventCommand, EventStatus};
use belfry_core::{EventVersion, PartitionId, Timestamp, Verdict};
use belfry_postgres::{PostgresStore, Wakeup};
use belfry_store::cluster::{
    Coordinator, Eviction, LeaderLease, NodeId, NodeInfo, OwnedPartition, PartitionAssignment,
};
use belfry_store::{KeyedCommand, Store, StoreError};
use belfry_testkit::PgServer;
use support::{DEADLINE, eventually, fenced, fresh_store, key, key_in, options, params, upsert};

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
                epoch: 1,
                pending_owner: None,
            },
            PartitionAssignment {
                partition: PartitionId(1),
                owner: None,
                epoch: 0,
                pending_owner: None,
            },
            PartitionAssignment {
                partition: PartitionId(2),
                owner: None,
                epoch: 0,
                pending_owner: None,
            },
            PartitionAssignment {
                partition: PartitionId(3),
                owner: None,
                epoch: 0,
                pending_owner: None,
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

/// `(partition, epoch, revoked)` of a renewal, with no takeover wait.
fn summary(owned: &[OwnedPartition]) -> Vec<(u16, u64, bool)> {
    assert!(
        owned.iter().all(|o| o.takeover_after == Duration::ZERO),
        "grants never wait for a live lease: {owned:?}"
    );
    owned
        .iter()
        .map(|o| (o.partition.0, o.epoch, o.revoked))
        .collect()
}

/// `(owner, epoch, pending owner)` of one partition.
async fn row(store: &PostgresStore, partition: usize) -> (Option<String>, u64, Option<String>) {
    let a = store.assignments().await.unwrap().remove(partition);
    (a.owner.map(|n| n.0), a.epoch, a.pending_owner.map(|n| n.0))
}

fn some(name: &str) -> Option<String> {
    Some(name.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_grants_bump_epochs_and_need_no_wait() {
    let store = fresh_store(4).await;
    let leader = store.claim_leadership(&node("a"), LONG).await.unwrap();
    let owners = vec![
        (PartitionId(0), node("a")),
        (PartitionId(1), node("a")),
        (PartitionId(2), node("b")),
    ];
    store
        .assign(&node("a"), leader.term, owners.clone())
        .await
        .unwrap();
    let owned = store.renew_ownership(&node("a"), LONG).await.unwrap();
    assert_eq!(summary(&owned), vec![(0, 1, false), (1, 1, false)]);

    // Re-assigning the same owners changes nothing.
    store.assign(&node("a"), leader.term, owners).await.unwrap();
    assert_eq!(row(&store, 0).await, (some("a"), 1, None));

    // p2's owner b never renewed (no lease): it moves at once.
    store
        .assign(&node("a"), leader.term, vec![(PartitionId(2), node("a"))])
        .await
        .unwrap();
    assert_eq!(row(&store, 2).await, (some("a"), 2, None));
    let owned = store.renew_ownership(&node("a"), LONG).await.unwrap();
    assert_eq!(
        summary(&owned),
        vec![(0, 1, false), (1, 1, false), (2, 2, false)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_a_live_owners_partition_revokes_it_and_its_release_grants_it() {
    let partitions = 4;
    let store = fresh_store(partitions).await;
    let leader = store.claim_leadership(&node("a"), LONG).await.unwrap();
    let leader_id = node("a");
    let assign = |owners: Vec<(u16, &str)>| {
        let owners = owners
            .into_iter()
            .map(|(p, n)| (PartitionId(p), node(n)))
            .collect();
        store.assign(&leader_id, leader.term, owners)
    };
    assign(vec![(0, "a"), (1, "a")]).await.unwrap();
    store.renew_ownership(&node("a"), LONG).await.unwrap();

    // a holds a live lease on p0: moving it to c only revokes it.
    assign(vec![(0, "c")]).await.unwrap();
    assert_eq!(row(&store, 0).await, (some("a"), 1, some("c")));
    assert!(
        store
            .renew_ownership(&node("c"), LONG)
            .await
            .unwrap()
            .is_empty(),
        "c gets nothing before a released it"
    );
    let owned = store.renew_ownership(&node("a"), LONG).await.unwrap();
    assert_eq!(summary(&owned), vec![(0, 1, true), (1, 1, false)]);
    // The leader repeats its move every round: nothing changes.
    assign(vec![(0, "c")]).await.unwrap();
    assert_eq!(row(&store, 0).await, (some("a"), 1, some("c")));

    // Until a released it, a's epoch is current: its outcomes still land.
    let owned_key = key_in(partitions, 0, "owned");
    store
        .apply(params(0, vec![upsert(&owned_key, 1_000, "v1")]))
        .await
        .unwrap();
    let expire = |epoch| {
        fenced(
            KeyedCommand {
                key: owned_key.clone(),
                command: EventCommand::Expire {
                    reason: "test".into(),
                },
                fence: None,
            },
            0,
            epoch,
        )
    };

    // Releases are fenced by owner and epoch.
    assert!(
        store
            .release_partitions(&node("a"), &[(PartitionId(0), 0)])
            .await
            .unwrap()
            .is_empty(),
        "a stale epoch releases nothing"
    );
    assert!(
        store
            .release_partitions(&node("c"), &[(PartitionId(0), 1)])
            .await
            .unwrap()
            .is_empty(),
        "only the owner releases"
    );
    assert_eq!(row(&store, 0).await, (some("a"), 1, some("c")));

    // a confirms: c owns p0 under a new epoch, with nothing to wait for.
    assert_eq!(
        store
            .release_partitions(&node("a"), &[(PartitionId(0), 1)])
            .await
            .unwrap(),
        vec![PartitionId(0)]
    );
    assert_eq!(row(&store, 0).await, (some("c"), 2, None));
    let owned = store.renew_ownership(&node("c"), LONG).await.unwrap();
    assert_eq!(summary(&owned), vec![(0, 2, false)]);
    let owned = store.renew_ownership(&node("a"), LONG).await.unwrap();
    assert_eq!(summary(&owned), vec![(1, 1, false)]);
    let stale = store.apply(params(2_000, vec![expire(1)])).await;
    assert!(
        matches!(stale, Err(StoreError::Fenced { epoch: 1, .. })),
        "a's writes are fenced once it released: {stale:?}"
    );
    store.apply(params(2_000, vec![expire(2)])).await.unwrap();
    assert!(
        store
            .release_partitions(&node("a"), &[(PartitionId(0), 1)])
            .await
            .unwrap()
            .is_empty(),
        "a second release changes nothing"
    );

    // A pending move the leader no longer wants is cancelled by naming
    // the owner: no epoch change, the lease is renewed again.
    assign(vec![(1, "d")]).await.unwrap();
    assert_eq!(row(&store, 1).await, (some("a"), 1, some("d")));
    assign(vec![(1, "a")]).await.unwrap();
    assert_eq!(row(&store, 1).await, (some("a"), 1, None));
    let owned = store.renew_ownership(&node("a"), LONG).await.unwrap();
    assert_eq!(summary(&owned), vec![(1, 1, false)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_owner_that_never_releases_loses_the_partition_when_its_lease_expires() {
    let store = fresh_store(4).await;
    let leader = store.claim_leadership(&node("a"), LONG).await.unwrap();
    let leader_id = node("a");
    let move_to = |n: &str| store.assign(&leader_id, leader.term, vec![(PartitionId(0), node(n))]);
    move_to("b").await.unwrap();
    let short = Duration::from_secs(2);
    store.renew_ownership(&node("b"), short).await.unwrap();
    move_to("c").await.unwrap();
    assert_eq!(row(&store, 0).await, (some("b"), 1, some("c")));

    // b keeps renewing (a stuck hand-over) but a revoked lease is not
    // extended: it runs out, and the leader's repeated move grants it.
    let renewed = store.renew_ownership(&node("b"), LONG).await.unwrap();
    assert_eq!(summary(&renewed), vec![(0, 1, true)]);
    move_to("c").await.unwrap();
    assert_eq!(
        row(&store, 0).await,
        (some("b"), 1, some("c")),
        "not before the lease ran out"
    );
    eventually("b's lease to run out and c to get p0", || async {
        move_to("c").await.unwrap();
        (row(&store, 0).await == (some("c"), 2, None)).then_some(())
    })
    .await;
    let owned = store.renew_ownership(&node("c"), LONG).await.unwrap();
    assert_eq!(summary(&owned), vec![(0, 2, false)]);
    assert!(
        store
            .release_partitions(&node("b"), &[(PartitionId(0), 1)])
            .await
            .unwrap()
            .is_empty(),
        "b's late release is fenced"
    );
    assert_eq!(row(&store, 0).await, (some("c"), 2, None));

    // A stale leader term can neither revoke nor grant.
    let stale = store
        .assign(
            &node("a"),
            leader.term + 1,
            vec![(PartitionId(0), node("d"))],
        )
        .await;
    assert!(
        matches!(stale, Err(StoreError::Unavailable(_))),
        "{stale:?}"
    );
    assert_eq!(row(&store, 0).await, (some("c"), 2, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_partition_is_unowned_without_a_lease_and_granted_at_once() {
    let store = fresh_store(4).await;
    let leader = store.claim_leadership(&node("a"), LONG).await.unwrap();
    store
        .assign(
            &node("a"),
            leader.term,
            vec![(PartitionId(0), node("b")), (PartitionId(1), node("b"))],
        )
        .await
        .unwrap();
    store.renew_ownership(&node("b"), LONG).await.unwrap();

    // b shuts down: it releases both (one at a stale epoch: kept).
    let released = store
        .release_partitions(&node("b"), &[(PartitionId(0), 1), (PartitionId(1), 7)])
        .await
        .unwrap();
    assert_eq!(released, vec![PartitionId(0)]);
    assert_eq!(
        row(&store, 0).await,
        (None, 1, None),
        "unowned; the epoch changes with the next grant"
    );
    assert_eq!(row(&store, 1).await, (some("b"), 1, None));
    assert!(
        summary(&store.renew_ownership(&node("b"), LONG).await.unwrap())
            .iter()
            .all(|(p, _, _)| *p == 1)
    );

    // Its lease went with it: the next owner starts at once.
    store
        .assign(&node("a"), leader.term, vec![(PartitionId(0), node("c"))])
        .await
        .unwrap();
    assert_eq!(row(&store, 0).await, (some("c"), 2, None));
    let owned = store.renew_ownership(&node("c"), LONG).await.unwrap();
    assert_eq!(summary(&owned), vec![(0, 2, false)]);

    // A revoked partition released while shutting down goes to the pending
    // owner directly.
    store
        .assign(&node("a"), leader.term, vec![(PartitionId(1), node("d"))])
        .await
        .unwrap();
    store
        .release_partitions(&node("b"), &[(PartitionId(1), 1)])
        .await
        .unwrap();
    assert_eq!(row(&store, 1).await, (some("d"), 2, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_changes_are_announced_to_every_subscriber() {
    let store = fresh_store(4).await;
    let mut wakeups = store.subscribe_wakeups();
    let mut next = async || {
        tokio::time::timeout(DEADLINE, wakeups.recv())
            .await
            .expect("a wake-up in time")
            .expect("the subscription is open")
    };
    assert_eq!(next().await, Wakeup::Resync);
    let info = NodeInfo {
        id: node("a"),
        address: "127.0.0.1:1".into(),
    };
    // A node joining, a move, a release, the leader leaving, a node leaving.
    store.heartbeat(&info, LONG).await.unwrap();
    assert_eq!(next().await, Wakeup::Cluster, "join");
    let leader = store.claim_leadership(&node("a"), LONG).await.unwrap();
    store
        .assign(&node("a"), leader.term, vec![(PartitionId(0), node("a"))])
        .await
        .unwrap();
    assert_eq!(next().await, Wakeup::Cluster, "grant");
    store.renew_ownership(&node("a"), LONG).await.unwrap();
    store
        .assign(&node("a"), leader.term, vec![(PartitionId(0), node("b"))])
        .await
        .unwrap();
    assert_eq!(next().await, Wakeup::Cluster, "revoke");
    store
        .release_partitions(&node("a"), &[(PartitionId(0), 1)])
        .await
        .unwrap();
    assert_eq!(next().await, Wakeup::Cluster, "release");
    store.release_leadership(&node("a")).await.unwrap();
    assert_eq!(next().await, Wakeup::Cluster, "leader released");
    store.leave(&node("a")).await.unwrap();
    assert_eq!(next().await, Wakeup::Cluster, "leave");

    // Rounds that change nothing are silent: a renewed heartbeat, a
    // repeated move. The next wake-up is the event below.
    store.heartbeat(&info, LONG).await.unwrap();
    assert_eq!(next().await, Wakeup::Cluster, "a rejoin is a join");
    store.heartbeat(&info, LONG).await.unwrap();
    let leader = store.claim_leadership(&node("a"), LONG).await.unwrap();
    store
        .assign(&node("a"), leader.term, vec![(PartitionId(0), node("b"))])
        .await
        .unwrap();
    let soon = key("soon");
    store
        .apply(params(0, vec![upsert(&soon, 1_000, "v1")]))
        .await
        .unwrap();
    assert!(
        matches!(next().await, Wakeup::Timer { key, .. } if key == soon),
        "nothing announced for rounds that changed nothing"
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

/// Silent nodes are declared dead once, with their address and how long
/// they have been silent; live nodes and nodes that left are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_nodes_are_removed_as_dead_exactly_once() {
    let store = fresh_store(4).await;
    let info = |id: &str, port: u16| NodeInfo {
        id: node(id),
        address: format!("127.0.0.1:{port}"),
    };
    store.heartbeat(&info("silent", 8082), LONG).await.unwrap();
    store.heartbeat(&info("leaving", 8083), LONG).await.unwrap();
    store.leave(&node("leaving")).await.unwrap();
    let ttl = Duration::from_millis(300);
    tokio::time::sleep(Duration::from_millis(400)).await;
    store.heartbeat(&info("alive", 8081), LONG).await.unwrap();

    let dead = store.remove_dead_nodes(ttl).await.unwrap();
    let named: Vec<(&str, &str)> = dead
        .iter()
        .map(|n| (n.info.id.0.as_str(), n.info.address.as_str()))
        .collect();
    assert_eq!(named, vec![("silent", "127.0.0.1:8082")]);
    assert!(dead[0].heartbeat_age >= ttl, "{:?}", dead[0]);
    assert!(
        store.remove_dead_nodes(ttl).await.unwrap().is_empty(),
        "declared once"
    );
    let live = store.heartbeat(&info("alive", 8081), LONG).await.unwrap();
    assert_eq!(live.len(), 1, "{live:?}");

    // A node declared dead that heartbeats again is back.
    let live = store.heartbeat(&info("silent", 8082), LONG).await.unwrap();
    assert_eq!(live.len(), 2, "{live:?}");
}

/// Each store stands for one node process: its presence session lives as
/// long as the store.
async fn node_store(url: &str, id: &str, port: u16) -> PostgresStore {
    let store = PostgresStore::connect(options(url.to_string(), 4))
        .await
        .unwrap();
    let info = NodeInfo {
        id: node(id),
        address: format!("127.0.0.1:{port}"),
    };
    store.heartbeat(&info, LONG).await.unwrap();
    store.presence(&info.id).await.unwrap();
    store
}

/// `(id, present)` of every registered node, as `by` sees them.
async fn presence_of(store: &PostgresStore, by: &str) -> Vec<(String, bool)> {
    store
        .presence(&node(by))
        .await
        .unwrap()
        .into_iter()
        .map(|n| (n.info.id.0, n.present))
        .collect()
}

fn present(nodes: &[(&str, bool)]) -> Vec<(String, bool)> {
    nodes.iter().map(|(n, p)| (n.to_string(), *p)).collect()
}

/// A node whose process dies (here: its store, and so its sessions, is
/// dropped) shows without its presence lock at once; evicting it makes
/// its partitions unowned under a new epoch (its writes fenced) although
/// its leases had a minute left, and they are granted without a wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_presence_session_ended_is_evicted_and_fenced_before_its_leases_expire() {
    let url = PgServer::shared().fresh_database().await;
    let a = node_store(&url, "a", 8081).await;
    let b = node_store(&url, "b", 8082).await;
    let leader = a.claim_leadership(&node("a"), LONG).await.unwrap();
    a.assign(
        &node("a"),
        leader.term,
        vec![
            (PartitionId(0), node("b")),
            (PartitionId(1), node("b")),
            (PartitionId(2), node("a")),
        ],
    )
    .await
    .unwrap();
    b.renew_ownership(&node("b"), LONG).await.unwrap();
    // A move to b still pending: cancelled by the eviction.
    a.renew_ownership(&node("a"), LONG).await.unwrap();
    a.assign(&node("a"), leader.term, vec![(PartitionId(2), node("b"))])
        .await
        .unwrap();
    assert_eq!(row(&a, 2).await, (some("a"), 1, some("b")));
    assert_eq!(
        presence_of(&a, "a").await,
        present(&[("a", true), ("b", true)])
    );
    assert_eq!(
        a.evict(&node("b")).await.unwrap(),
        None,
        "a node holding its lock is never evicted"
    );
    assert_eq!(row(&a, 0).await, (some("b"), 1, None));

    drop(b);
    eventually("b's lock to vanish", || async {
        (presence_of(&a, "a").await == present(&[("a", true), ("b", false)])).then_some(())
    })
    .await;
    assert_eq!(
        a.evict(&node("b")).await.unwrap(),
        Some(Eviction {
            registered: true,
            partitions: vec![PartitionId(0), PartitionId(1)],
            was_leader: false,
        })
    );
    assert_eq!(row(&a, 0).await, (None, 2, None), "a new epoch at once");
    assert_eq!(row(&a, 1).await, (None, 2, None));
    assert_eq!(
        row(&a, 2).await,
        (some("a"), 1, None),
        "the move to b is off"
    );
    assert_eq!(presence_of(&a, "a").await, present(&[("a", true)]));
    // Whatever b might still write under epoch 1 is fenced.
    let late = key_in(4, 0, "late");
    a.apply(params(0, vec![upsert(&late, 1_000, "v1")]))
        .await
        .unwrap();
    let stale = a
        .apply(params(
            1_000,
            vec![fenced(upsert(&late, 2_000, "v2"), 0, 1)],
        ))
        .await;
    assert!(matches!(stale, Err(StoreError::Fenced { .. })), "{stale:?}");
    // Granted at once (its minute-long lease is gone), epoch bumped again.
    a.assign(&node("a"), leader.term, vec![(PartitionId(0), node("a"))])
        .await
        .unwrap();
    assert_eq!(row(&a, 0).await, (some("a"), 3, None));
    let owned = a.renew_ownership(&node("a"), LONG).await.unwrap();
    assert_eq!(summary(&owned), vec![(0, 3, false), (2, 1, false)]);
    assert_eq!(
        a.evict(&node("b")).await.unwrap(),
        Some(Eviction::default()),
        "a second eviction finds nothing left to end"
    );
}

/// A dead leader's lease is freed by its eviction: the next claimant gets
/// a new term at once instead of after the lease TTL, and the old term
/// can no longer assign.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicting_a_dead_leader_frees_its_lease_for_a_new_term() {
    let url = PgServer::shared().fresh_database().await;
    let a = node_store(&url, "a", 8081).await;
    let b = node_store(&url, "b", 8082).await;
    let term = b.claim_leadership(&node("b"), LONG).await.unwrap().term;
    b.assign(&node("b"), term, vec![(PartitionId(3), node("b"))])
        .await
        .unwrap();
    drop(b);
    eventually("b's lock to vanish", || async {
        (presence_of(&a, "a").await == present(&[("a", true), ("b", false)])).then_some(())
    })
    .await;
    let eviction = a.evict(&node("b")).await.unwrap().unwrap();
    assert!(eviction.was_leader, "{eviction:?}");
    assert_eq!(eviction.partitions, vec![PartitionId(3)]);
    assert_eq!(
        a.claim_leadership(&node("a"), LONG).await.unwrap(),
        lease("a", term + 1)
    );
    let stale = a
        .assign(&node("b"), term, vec![(PartitionId(0), node("b"))])
        .await;
    assert!(
        matches!(stale, Err(StoreError::Unavailable(_))),
        "{stale:?}"
    );
}

/// A live node whose presence session is cut (a proxy reset, an
/// administrator's `pg_terminate_backend`) takes its lock again with its
/// next look.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_node_whose_presence_session_broke_takes_its_lock_again() {
    let url = PgServer::shared().fresh_database().await;
    let a = node_store(&url, "a", 8081).await;
    let b = node_store(&url, "b", 8082).await;
    let admin = belfry_postgres::tls::connect(&url).await.unwrap();
    let cut = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks
             WHERE locktype = 'advisory' AND objid = hashtext('b')::oid AND objsubid = 2
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(cut, 1, "b's presence session");
    eventually("a to see b's lock gone", || async {
        (presence_of(&a, "a").await == present(&[("a", true), ("b", false)])).then_some(())
    })
    .await;
    // b's next look (it may fail, having found its session broken) takes
    // the lock again; the one after it succeeds.
    let _ = b.presence(&node("b")).await;
    assert_eq!(
        presence_of(&b, "b").await,
        present(&[("a", true), ("b", true)])
    );
    assert_eq!(
        presence_of(&a, "a").await,
        present(&[("a", true), ("b", true)])
    );
    assert_eq!(a.evict(&node("b")).await.unwrap(), None);
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
    let attempt = |number: u32| KeyedCommand {
        key: owned.clone(),
        command: EventCommand::RecordAttempt {
            version: EventVersion::from_string("v1".into()),
            number,
            report: AttemptReport {
                started_at: Timestamp::from_millis(1_000),
                duration_ms: 2,
                verdict: Verdict::Retry,
                http_status: Some(503),
                error: Some("busy".into()),
                steer: None,
            },
            tenant: Default::default(),
        },
        fence: None,
    };
    let delivered = attempt(1);
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

    // The new owner's epoch is accepted (its attempt is the next one); an
    // unknown partition never is.
    store
        .apply(params(2_000, vec![fenced(attempt(2), 0, 2)]))
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

    let client = belfry_postgres::tls::connect(&url).await.unwrap();
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT version) FROM belfry_schema_migrations",
            &[],
        )
        .await
        .unwrap();
    let (migrations, versions): (i64, i64) = (row.get(0), row.get(1));
    assert!(migrations >= 2, "{migrations}");
    assert_eq!(migrations, versions, "each migration applied once");
}

/// Nodes joining at once each bring a candidate secret; one is stored and
/// every node, later ones too, gets that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_joins_share_one_cluster_secret() {
    let url = PgServer::shared().fresh_database().await;
    let mut tasks = Vec::new();
    for i in 0..4_u8 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let store = PostgresStore::connect(options(url, 4)).await.unwrap();
            store.cluster_secret(&[i; 32]).await.unwrap()
        }));
    }
    let mut secrets = Vec::new();
    for task in tasks {
        secrets.push(task.await.unwrap());
    }
    assert!(
        (0..4_u8).any(|i| secrets[0] == [i; 32]),
        "one candidate: {secrets:?}"
    );
    assert!(secrets.iter().all(|s| *s == secrets[0]), "{secrets:?}");
    let later = PostgresStore::connect(options(url, 4)).await.unwrap();
    assert_eq!(later.cluster_secret(&[9; 32]).await.unwrap(), secrets[0]);
}

/// A node's membership round must never queue behind its own data path: a
/// round that cannot renew within the lease stops the node firing. With
/// the only data connection stuck behind a lock, a whole round (heartbeat,
/// leadership, assignment, renewal) still answers at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_answers_while_every_data_connection_is_busy() {
    let url = PgServer::shared().fresh_database().await;
    let mut store_options = options(url.clone(), 4);
    store_options.pool_size = 1;
    let store = std::sync::Arc::new(PostgresStore::connect(store_options).await.unwrap());

    let locker = belfry_postgres::tls::connect(&url).await.unwrap();
    locker
        .batch_execute("BEGIN; LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let stuck = tokio::spawn({
        let store = store.clone();
        async move { store.get_event(&key("held")).await }
    });
    eventually("the data connection to wait for the lock", || async {
        let waiting: i64 = locker
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        (waiting == 1).then_some(())
    })
    .await;

    let started = std::time::Instant::now();
    let info = NodeInfo {
        id: node("a"),
        address: "127.0.0.1:8081".into(),
    };
    store.heartbeat(&info, LONG).await.unwrap();
    let leader = store.claim_leadership(&node("a"), LONG).await.unwrap();
    let everything = (0..4).map(|p| (PartitionId(p), node("a"))).collect();
    store
        .assign(&node("a"), leader.term, everything)
        .await
        .unwrap();
    assert_eq!(
        store.renew_ownership(&node("a"), LONG).await.unwrap().len(),
        4
    );
    assert_eq!(store.assignments().await.unwrap().len(), 4);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a round took {:?}",
        started.elapsed()
    );
    assert!(!stuck.is_finished(), "the data connection is still held");

    locker.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(stuck.await.unwrap().unwrap(), None);
}

/// A tenant's config, pause or deletion is announced by its own write, so
/// other nodes drop their cached copy and apply a pause at once; a write
/// that finds no tenant announces nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_changes_are_announced_by_their_write() {
    use belfry_core::tenant::HttpTarget;
    use belfry_core::{SinkConfig, TenantConfig, TenantName, TenantPause};

    let store = fresh_store(4).await;
    let mut wakeups = store.subscribe_wakeups();
    let mut next = async || {
        tokio::time::timeout(DEADLINE, wakeups.recv())
            .await
            .expect("a wake-up in time")
            .expect("the subscription is open")
    };
    assert_eq!(next().await, Wakeup::Resync);
    let name = TenantName::new("acme/orders").unwrap();
    let changed = Wakeup::TenantChanged(name.clone());
    let config = TenantConfig {
        name: name.clone(),
        sink: SinkConfig::Http(HttpTarget {
            url: "http://127.0.0.1:1/hook".into(),
            headers: Default::default(),
            timeout_ms: None,
            delivery: Default::default(),
        }),
        signing: None,
        notify: None,
    };
    store.put_tenant(config).await.unwrap();
    assert_eq!(next().await, changed, "put");
    let paused = TenantPause::paused(None, None, Timestamp::from_millis(1_000));
    assert!(store.put_tenant_pause(&name, paused).await.unwrap());
    assert_eq!(next().await, changed, "pause");
    assert!(store.delete_tenant(&name).await.unwrap());
    assert_eq!(next().await, changed, "delete");
    // Nothing left to change: silent. The next wake-up is the join below.
    let ghost = TenantPause::paused(None, None, Timestamp::from_millis(2_000));
    assert!(!store.put_tenant_pause(&name, ghost).await.unwrap());
    assert!(!store.delete_tenant(&name).await.unwrap());
    let info = NodeInfo {
        id: node("a"),
        address: "127.0.0.1:1".into(),
    };
    store.heartbeat(&info, LONG).await.unwrap();
    assert_eq!(next().await, Wakeup::Cluster);
}
