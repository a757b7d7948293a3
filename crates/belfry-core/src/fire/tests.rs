//! Unit tests of the partition core; the randomized simulation against an
//! oracle is in `tests/simulation.rs`.

use super::*;

fn ts(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms)
}

fn entry(due: i64, tenant: &str, id: &str) -> DueCursor {
    DueCursor {
        due: ts(due),
        key: EventKey::new(TenantName::new(tenant).unwrap(), EventId::new(id).unwrap()),
    }
}

fn config() -> CoreConfig {
    CoreConfig {
        read_ahead: Duration::ZERO,
        repair_interval: Duration::ZERO,
        ..CoreConfig::with_capacity(100)
    }
}

fn only_load(actions: &[Action]) -> LoadRequest {
    match actions {
        [Action::Load(request)] => request.clone(),
        other => panic!("expected one load, got {other:?}"),
    }
}

/// A core whose tenants may have `bound` entries outstanding per
/// partition, holding `page` as its first window page.
fn core_with_page(bound: usize, page: Vec<DueCursor>) -> PartitionCore {
    core_with_config_and_page(
        CoreConfig {
            max_outstanding_per_tenant: bound,
            ..config()
        },
        page,
    )
}

/// A core of `config` holding `page` as its first window page.
fn core_with_config_and_page(config: CoreConfig, page: Vec<DueCursor>) -> PartitionCore {
    let mut core = PartitionCore::new(config);
    let request = only_load(&core.handle(Input::Tick { may_fire: true }, ts(0)));
    core.handle(
        Input::Loaded {
            request,
            page: Some(page),
        },
        ts(0),
    );
    core
}

/// Answers a page read as a store holding `store` would.
fn answer_load(
    core: &mut PartitionCore,
    store: &BTreeSet<DueCursor>,
    request: LoadRequest,
    now: Timestamp,
) {
    let page = store
        .iter()
        .filter(|e| request.after.as_ref().is_none_or(|after| *e > after))
        .filter(|e| e.due <= request.through)
        .filter(|e| request.tenant().is_none_or(|t| e.key.tenant == *t))
        .filter(|e| !request.skip.contains(&e.key.tenant))
        .take(request.limit)
        .cloned()
        .collect();
    let page = Some(page);
    core.handle(Input::Loaded { request, page }, now);
}

fn delivered(actions: &[Action]) -> Vec<DueCursor> {
    actions
        .iter()
        .flat_map(|a| match a {
            Action::Deliver(fired) => fired.iter().map(|f| f.entry.clone()).collect(),
            _ => Vec::new(),
        })
        .collect()
}

#[test]
fn loads_then_fires_at_the_instant_never_before() {
    let mut core = PartitionCore::new(config());
    let request = only_load(&core.handle(Input::Tick { may_fire: true }, ts(0)));
    assert_eq!(request.kind, LoadKind::Window);
    core.handle(
        Input::Loaded {
            request,
            page: Some(vec![entry(10, "t", "a"), entry(20, "t", "b")]),
        },
        ts(1),
    );
    assert_eq!(core.next_wake(ts(1)), ts(10));
    assert!(delivered(&core.handle(Input::Tick { may_fire: true }, ts(9))).is_empty());
    assert_eq!(
        delivered(&core.handle(Input::Tick { may_fire: true }, ts(10))),
        [entry(10, "t", "a")]
    );
    assert!(
        delivered(&core.handle(Input::Tick { may_fire: false }, ts(30))).is_empty(),
        "no firing without the lease"
    );
}

#[test]
fn an_offer_during_a_page_read_is_not_lost() {
    let mut core = PartitionCore::new(config());
    let request = only_load(&core.handle(Input::Tick { may_fire: true }, ts(0)));
    // Committed after the read saw the index: the page misses it, the
    // wake-up arrives while the read is in flight.
    core.handle(Input::Offer(entry(5, "t", "late")), ts(1));
    core.handle(
        Input::Loaded {
            request,
            page: Some(vec![]),
        },
        ts(2),
    );
    assert_eq!(
        delivered(&core.handle(Input::Tick { may_fire: true }, ts(5))),
        [entry(5, "t", "late")]
    );
}

#[test]
fn a_second_copy_of_a_claimed_version_is_refused_a_new_version_is_not() {
    let mut core = PartitionCore::new(config());
    let request = only_load(&core.handle(Input::Tick { may_fire: true }, ts(0)));
    core.handle(
        Input::Loaded {
            request,
            page: Some(vec![entry(1, "t", "a")]),
        },
        ts(0),
    );
    let fired = delivered(&core.handle(Input::Tick { may_fire: true }, ts(1)));
    let v1 = EventVersion::from_string("v1".into());
    let claim = |core: &mut PartitionCore, e: &DueCursor, v: &EventVersion| {
        core.handle(
            Input::Claim {
                entry: e.clone(),
                version: v.clone(),
            },
            ts(1),
        )
    };
    assert!(matches!(
        claim(&mut core, &fired[0], &v1)[..],
        [Action::Claimed { granted: true, .. }]
    ));
    // The event moved during the delivery: its new entry fires and claims
    // its own version.
    core.handle(Input::Offer(entry(2, "t", "a")), ts(1));
    let moved = delivered(&core.handle(Input::Tick { may_fire: true }, ts(2)));
    assert_eq!(moved, [entry(2, "t", "a")]);
    let v2 = EventVersion::from_string("v2".into());
    assert!(matches!(
        claim(&mut core, &moved[0], &v2)[..],
        [Action::Claimed { granted: true, .. }]
    ));
    // A same-instant re-offer of the moved entry while it is delivered is
    // ignored: it is outstanding.
    core.handle(Input::Offer(entry(2, "t", "a")), ts(2));
    assert!(delivered(&core.handle(Input::Tick { may_fire: true }, ts(3))).is_empty());
    core.handle(
        Input::Finished {
            entry: moved[0].clone(),
            finish: Finish::Done,
        },
        ts(3),
    );
    core.handle(
        Input::Finished {
            entry: fired[0].clone(),
            finish: Finish::Done,
        },
        ts(3),
    );
    assert_eq!(core.outstanding(), 0);
}

#[test]
fn a_tenant_at_its_outstanding_limit_does_not_hold_back_another() {
    let mut core = PartitionCore::new(CoreConfig {
        max_outstanding_per_tenant: 2,
        ..config()
    });
    let request = only_load(&core.handle(Input::Tick { may_fire: true }, ts(0)));
    let mut page: Vec<_> = (0..20)
        .map(|i| entry(1, "hung", &format!("e{i:02}")))
        .collect();
    page.push(entry(5, "ok", "x"));
    page.sort();
    core.handle(
        Input::Loaded {
            request,
            page: Some(page),
        },
        ts(0),
    );
    let first = delivered(&core.handle(Input::Tick { may_fire: true }, ts(5)));
    assert_eq!(
        first.len(),
        3,
        "two of the hung tenant, then the other: {first:?}"
    );
    assert_eq!(first[2], entry(5, "ok", "x"));
}

#[test]
fn a_backlog_beyond_the_capacity_is_evicted_per_tenant_and_paged_back() {
    let mut core = PartitionCore::new(CoreConfig {
        capacity: 64,
        ..config()
    });
    let request = only_load(&core.handle(Input::Tick { may_fire: true }, ts(0)));
    assert_eq!(request.limit, 16);
    // The big tenant's backlog comes first in due order; the small
    // tenant's event is later.
    let page: Vec<_> = (0..16)
        .map(|i| entry(1, "big", &format!("e{i:03}")))
        .collect();
    core.handle(
        Input::Loaded {
            request,
            page: Some(page),
        },
        ts(0),
    );
    // Pages until the window is covered; the big tenant overflows.
    let mut now = 0;
    let mut served = 0;
    while let [Action::Load(request)] = &core.handle(Input::Tick { may_fire: false }, ts(now))[..] {
        let page: Vec<_> = match request.kind {
            LoadKind::Window if served < 10 => {
                served += 1;
                (0..16)
                    .map(|i| entry(1, "big", &format!("e{:03}", 16 * served + i)))
                    .collect()
            }
            LoadKind::Window => vec![entry(30, "small", "s")],
            _ => vec![],
        };
        core.handle(
            Input::Loaded {
                request: request.clone(),
                page: Some(page),
            },
            ts(now),
        );
        now += 1;
        assert!(core.held() <= 64);
        if now > 100 {
            break;
        }
    }
    assert!(
        core.window()
            .overflow_of(&TenantName::new("big").unwrap())
            .is_some()
    );
    assert_eq!(core.window().held_by(&TenantName::new("small").unwrap()), 1);
}

#[test]
fn a_blocked_tenant_keeps_a_few_entries_and_no_read_ahead() {
    let mut core = PartitionCore::new(CoreConfig {
        max_outstanding_per_tenant: 2,
        read_ahead: Duration::from_millis(500),
        ..config()
    });
    let cap = core.config.blocked_lane_cap();
    let hung = TenantName::new("hung").unwrap();
    let request = only_load(&core.handle(Input::Tick { may_fire: true }, ts(0)));
    let page: Vec<_> = (0..40)
        .map(|i| entry(1, "hung", &format!("e{i:02}")))
        .collect();
    core.handle(
        Input::Loaded {
            request,
            page: Some(page),
        },
        ts(0),
    );
    // Fires two and is blocked: nothing of its lane is read ahead (it
    // cannot fire); the trim keeps the lane cap.
    let read_ahead_keys = |actions: &[Action]| -> Vec<EventKey> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::ReadAhead(keys) => Some(keys.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    };
    let actions = core.handle(Input::Tick { may_fire: true }, ts(1));
    assert_eq!(delivered(&actions).len(), 2);
    assert!(core.window().is_blocked(&hung));
    let first_read = read_ahead_keys(&actions);
    assert!(first_read.is_empty(), "{first_read:?}");
    let load = actions.iter().find_map(|a| match a {
        Action::Load(request) => Some(request.clone()),
        _ => None,
    });
    let request = load.expect("the window is read further");
    core.handle(
        Input::Loaded {
            request,
            page: Some(vec![entry(100, "ok", "x")]),
        },
        ts(2),
    );
    // Blocked for less than `blocked_trim_after`: the lane is kept.
    assert_eq!(core.window().held_by(&hung), 38);
    // Nothing more of the blocked tenant: the other tenant's record only.
    let next_read = read_ahead_keys(&core.handle(Input::Tick { may_fire: true }, ts(3)));
    assert_eq!(next_read, [entry(100, "ok", "x").key]);
    let trim_at = 1 + core.config.blocked_trim_after.as_millis() as i64;
    let actions = core.handle(Input::Tick { may_fire: true }, ts(trim_at));
    assert_eq!(core.window().held_by(&hung), cap, "{actions:?}");
    assert!(core.window().overflow_of(&hung).is_some());
}

#[test]
fn a_tenant_blocked_only_for_a_moment_keeps_its_lane() {
    // A healthy tenant at 10,000 deliveries/s reaches its outstanding bound
    // in a stall of some tens of milliseconds. Its lane used to be trimmed
    // at once: thousands of entries per partition evicted and paged back,
    // and that work made the next stall.
    let page = (0..40).map(|i| entry(1 + i, "busy", &format!("e{i:02}")));
    let mut core = core_with_page(2, page.collect());
    let busy = TenantName::new("busy").unwrap();
    let fired = delivered(&core.handle(Input::Tick { may_fire: true }, ts(2)));
    assert_eq!(fired.len(), 2);
    assert!(core.window().is_blocked(&busy));
    // 50 ms later both deliveries finish: the tenant fires on, nothing
    // of its lane was evicted.
    for entry in fired {
        core.handle(
            Input::Finished {
                entry,
                finish: Finish::Done,
            },
            ts(50),
        );
    }
    assert!(!core.window().is_blocked(&busy));
    assert_eq!(core.window().held_by(&busy), 38);
    assert_eq!(core.stats().evicted, 0);
    let fired = delivered(&core.handle(Input::Tick { may_fire: true }, ts(51)));
    assert_eq!(fired.len(), 2, "fires on from its held entries");
    // Blocked again, and this time for longer than `blocked_trim_after`:
    // trimmed to the cap then, not before.
    let later = 51 + 1_000; // `blocked_trim_after` by default
    core.handle(Input::Tick { may_fire: true }, ts(later - 1));
    assert_eq!(core.window().held_by(&busy), 36);
    core.handle(Input::Tick { may_fire: true }, ts(later));
    assert_eq!(core.window().held_by(&busy), core.config.blocked_lane_cap());
}

#[test]
fn a_tenant_blocked_by_the_spent_budget_fires_again_once_its_own_finish() {
    // Found by the simulation soak (seed 501246): a hung tenant keeps the
    // budget spent; the other tenant, blocked while one of its own was
    // outstanding, stayed blocked after that one finished.
    let mut core = PartitionCore::new(CoreConfig {
        capacity: 8, // budget: 4 outstanding
        max_outstanding_per_tenant: 10,
        ..config()
    });
    let request = only_load(&core.handle(Input::Tick { may_fire: true }, ts(0)));
    let mut page: Vec<_> = (0..4).map(|i| entry(1, "hung", &format!("e{i}"))).collect();
    page.push(entry(2, "ok", "a"));
    page.push(entry(3, "ok", "b"));
    core.handle(
        Input::Loaded {
            request,
            page: Some(page),
        },
        ts(0),
    );
    let first = delivered(&core.handle(Input::Tick { may_fire: true }, ts(3)));
    assert_eq!(first.len(), 5, "{first:?}");
    assert!(!first.contains(&entry(3, "ok", "b")), "over the budget");
    core.handle(
        Input::Finished {
            entry: entry(2, "ok", "a"),
            finish: Finish::Done,
        },
        ts(4),
    );
    let next = delivered(&core.handle(Input::Tick { may_fire: true }, ts(4)));
    assert_eq!(next, [entry(3, "ok", "b")]);
}

#[test]
fn a_tenant_with_a_backlog_due_at_once_gets_only_its_outstanding_bound_read_ahead() {
    // A thousand of one tenant's events due at one instant: reading them
    // all ahead (in every partition) is thousands of reads for records
    // that cannot fire at once; the other tenant's record is read too.
    let mut core = PartitionCore::new(CoreConfig {
        max_outstanding_per_tenant: 2,
        read_ahead: Duration::from_millis(500),
        ..config()
    });
    let request = only_load(&core.handle(Input::Tick { may_fire: true }, ts(0)));
    let mut page: Vec<_> = (0..40)
        .map(|i| entry(400, "busy", &format!("e{i:02}")))
        .collect();
    page.push(entry(450, "other", "x"));
    core.handle(
        Input::Loaded {
            request,
            page: Some(page),
        },
        ts(0),
    );
    let actions = core.handle(Input::Tick { may_fire: true }, ts(200));
    let read: Vec<EventKey> = actions
        .iter()
        .filter_map(|a| match a {
            Action::ReadAhead(keys) => Some(keys.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(
        read,
        [
            entry(400, "busy", "e00").key,
            entry(400, "busy", "e01").key,
            entry(450, "other", "x").key
        ]
    );
}

#[test]
fn attempts_awaiting_their_record_do_not_count_against_the_tenant_bound() {
    // The bound is for deliveries waiting on the tenant. Outcomes waiting
    // for the node's own commit (queued behind an ingest batch and an
    // fsync) blocked a busy tenant at 10,000 deliveries/s.
    let page = (0..6).map(|i| entry(1, "busy", &format!("e{i}")));
    let mut core = core_with_page(2, page.collect());
    let busy = TenantName::new("busy").unwrap();
    let first = delivered(&core.handle(Input::Tick { may_fire: true }, ts(1)));
    assert_eq!(first.len(), 2);
    assert!(core.window().is_blocked(&busy));
    // Both attempts end; their outcomes are not stored yet.
    for entry in &first {
        core.handle(
            Input::Attempted {
                entry: entry.clone(),
            },
            ts(2),
        );
        // A repeated report changes nothing.
        core.handle(
            Input::Attempted {
                entry: entry.clone(),
            },
            ts(2),
        );
    }
    assert!(!core.window().is_blocked(&busy));
    assert_eq!(core.outstanding(), 2, "still outstanding until finished");
    let second = delivered(&core.handle(Input::Tick { may_fire: true }, ts(3)));
    assert_eq!(second.len(), 2, "fires on while the first two are recorded");
    assert!(core.window().is_blocked(&busy));
    // The first two finish: they were already released from the bound,
    // so the tenant stays blocked by the two now in flight.
    for entry in first {
        core.handle(
            Input::Finished {
                entry,
                finish: Finish::Done,
            },
            ts(4),
        );
    }
    assert!(core.window().is_blocked(&busy));
    assert_eq!(core.outstanding(), 2);
    // An entry finished without an attempt (its record said it was not
    // due any more) releases its count at the finish, once.
    core.handle(
        Input::Finished {
            entry: second[0].clone(),
            finish: Finish::Done,
        },
        ts(5),
    );
    assert!(!core.window().is_blocked(&busy));
    assert_eq!(
        delivered(&core.handle(Input::Tick { may_fire: true }, ts(6))).len(),
        1,
        "one more fits beside the one in flight"
    );
}

/// The record a store holds for `entry` right after creating it.
fn stored_record(entry: &DueCursor) -> EventRecord {
    let command = crate::event::EventCommand::Upsert {
        event_time: entry.due,
        payload: None,
        delivery: crate::event::DeliveryOption::FullEvent,
        new_version: EventVersion::from_string(format!("v-{}", entry.key.id)),
        settings: Default::default(),
    };
    let retry = crate::retry::RetryPolicy::default();
    let context = crate::event::TransitionContext {
        now: ts(0),
        partition: crate::partition::PartitionId(0),
        retry: &retry,
    };
    crate::event::transition(&entry.key, None, command, context)
        .next
        .expect("created")
}

/// Answers a read-ahead round as a store holding `entries`, each as just
/// created, would.
fn answer_read_ahead(
    core: &mut PartitionCore,
    entries: &[DueCursor],
    keys: Vec<EventKey>,
    now: Timestamp,
) {
    let records = keys
        .into_iter()
        .map(|key| {
            let entry = entries.iter().find(|e| e.key == key).expect("stored");
            (key, Some(stored_record(entry)))
        })
        .collect();
    let records = Some(records);
    core.handle(Input::ReadAhead { records }, now);
}

#[test]
fn a_steady_stream_is_read_ahead_in_rounds_not_one_read_per_fired_entry() {
    // 10,000 deliveries/s over 64 partitions is one entry every 6 ms in
    // each. Each fired entry frees its tenant one record of read-ahead
    // room; a round started for every such room was a store read, a task
    // and one more tick of the worker per delivery.
    let bound = 16;
    let config = CoreConfig {
        max_outstanding_per_tenant: bound,
        read_ahead: Duration::from_millis(500),
        ..CoreConfig::with_capacity(10_000)
    };
    let entries: Vec<DueCursor> = (0..500)
        .map(|i| entry(1_000 + 6 * i, "t", &format!("e{i:03}")))
        .collect();
    let mut core = core_with_config_and_page(config, entries.clone());
    let (mut rounds, mut fired, mut fired_with_record) = (0, 0, 0);
    for now in 0..=4_000 {
        let now = ts(now);
        for action in core.handle(Input::Tick { may_fire: true }, now) {
            match action {
                Action::ReadAhead(keys) => {
                    rounds += 1;
                    answer_read_ahead(&mut core, &entries, keys, now);
                }
                Action::Deliver(batch) => {
                    for one in batch {
                        assert!(one.entry.due <= now, "never early");
                        fired += 1;
                        fired_with_record += usize::from(one.record.is_some());
                        let finish = Finish::Done;
                        core.handle(
                            Input::Finished {
                                entry: one.entry,
                                finish,
                            },
                            now,
                        );
                    }
                }
                _ => {}
            }
        }
    }
    assert_eq!(fired, entries.len());
    assert_eq!(fired_with_record, entries.len(), "every record read ahead");
    let at_most = 2 * entries.len() / bound + 4;
    assert!(
        rounds <= at_most,
        "{rounds} read-ahead rounds for {fired} entries"
    );
}

#[test]
fn entries_evicted_while_their_tenant_page_is_read_stay_the_loaders() {
    // A blocked tenant's lane trimmed while a page of its overflow is
    // being read moves its mark back before where that page starts. The
    // page's answer set the mark from the page alone, so the entries the
    // trim evicted were neither held nor left to the loader: they never
    // fired (found by a soak of the simulation, seed 8032400).
    let mut page = vec![entry(5, "a", "a00")];
    page.extend((1..12).map(|i| entry(999 + i, "a", &format!("a{i:02}"))));
    let config = CoreConfig {
        max_outstanding_per_tenant: 1,
        blocked_trim_after: Duration::from_millis(10),
        ..config()
    };
    let mut core = core_with_config_and_page(config, page);
    let a = TenantName::new("a").unwrap();
    // a00 fires and blocks the tenant; its lane is trimmed to the cap.
    let first = delivered(&core.handle(Input::Tick { may_fire: true }, ts(5)));
    assert_eq!(first, [entry(5, "a", "a00")]);
    core.handle(Input::Tick { may_fire: true }, ts(6));
    core.handle(Input::Tick { may_fire: true }, ts(16));
    assert_eq!(core.window().held_by(&a), 4);
    assert_eq!(
        core.window().overflow_of(&a),
        Some(&entry(1003, "a", "a04"))
    );
    // Unblocked with a short lane: a page of its overflow is read.
    let mut actions = core.handle(
        Input::Finished {
            entry: entry(5, "a", "a00"),
            finish: Finish::Done,
        },
        ts(17),
    );
    actions.extend(core.handle(Input::Tick { may_fire: true }, ts(17)));
    let tenant_page = actions
        .iter()
        .find_map(|action| match action {
            Action::Load(request) if request.kind == LoadKind::Tenant(a.clone()) => {
                Some(request.clone())
            }
            _ => None,
        })
        .expect("a page of the tenant's overflow");
    assert_eq!(tenant_page.after, Some(entry(1003, "a", "a04")));
    // Meanwhile it blocks again and earlier entries arrive: the trim
    // evicts a02..a04, and the mark moves back to a01.
    core.handle(Input::Offer(entry(18, "a", "now")), ts(18));
    let blocking = delivered(&core.handle(Input::Tick { may_fire: true }, ts(18)));
    assert_eq!(blocking, [entry(18, "a", "now")]);
    for id in ["b1", "b2", "b3"] {
        core.handle(Input::Offer(entry(999, "a", id)), ts(19));
    }
    core.handle(Input::Tick { may_fire: true }, ts(20));
    core.handle(Input::Tick { may_fire: true }, ts(30));
    assert_eq!(
        core.window().overflow_of(&a),
        Some(&entry(1000, "a", "a01"))
    );
    // The page answers what follows a04.
    let rest = (5..12).map(|i| entry(999 + i, "a", &format!("a{i:02}")));
    core.handle(
        Input::Loaded {
            request: tenant_page,
            page: Some(rest.collect()),
        },
        ts(31),
    );
    core.handle(
        Input::Finished {
            entry: entry(18, "a", "now"),
            finish: Finish::Done,
        },
        ts(32),
    );
    // Every entry fires, a02..a04 included, reloaded by a later page.
    let mut store: BTreeSet<DueCursor> = (1..12)
        .map(|i| entry(999 + i, "a", &format!("a{i:02}")))
        .chain(["b1", "b2", "b3"].map(|id| entry(999, "a", id)))
        .collect();
    for now in 32..2_000 {
        for action in core.handle(Input::Tick { may_fire: true }, ts(now)) {
            match action {
                Action::Deliver(batch) => {
                    for one in batch {
                        store.remove(&one.entry);
                        let finish = Finish::Done;
                        let entry = one.entry;
                        core.handle(Input::Finished { entry, finish }, ts(now));
                    }
                }
                Action::Load(request) => answer_load(&mut core, &store, request, ts(now)),
                _ => {}
            }
        }
    }
    assert!(store.is_empty(), "never fired: {store:?}");
}

#[test]
fn a_repair_sweep_skips_a_hung_tenants_overflow() {
    // A hung tenant's backlog past its overflow mark cannot be armed by a
    // repair, yet the sweep read it page by page before it reached another
    // tenant's lost wake-up: with 4-entry pages every 100 ms, 200 entries
    // held the repair of the healthy event back for 5 s (found by a soak
    // of the simulation, seed 9101859).
    let mut core = PartitionCore::new(CoreConfig {
        max_outstanding_per_tenant: 1,
        blocked_trim_after: Duration::from_millis(10),
        repair_interval: Duration::from_millis(100),
        repair_page: 4,
        ..config()
    });
    let mut store: BTreeSet<DueCursor> = (0..200)
        .map(|i| entry(10 + i, "hung", &format!("h{i:03}")))
        .collect();
    let healthy = entry(500, "ok", "e");
    let mut fired_at = None;
    for now in 0..2_000 {
        if now == 50 {
            // Committed with the window already past it; its wake-up is lost.
            assert!(core.window().covers(&healthy));
            store.insert(healthy.clone());
        }
        for action in core.handle(Input::Tick { may_fire: true }, ts(now)) {
            match action {
                // The hung tenant never answers; the healthy one does.
                Action::Deliver(batch) => {
                    for one in batch.into_iter().filter(|f| f.entry == healthy) {
                        store.remove(&one.entry);
                        fired_at = Some(now);
                        let (entry, finish) = (one.entry, Finish::Done);
                        core.handle(Input::Finished { entry, finish }, ts(now));
                    }
                }
                Action::Load(request) => answer_load(&mut core, &store, request, ts(now)),
                _ => {}
            }
        }
    }
    assert_eq!(fired_at, Some(500), "repaired before its instant");
    assert_eq!(core.stats().repaired, 1);
}

#[test]
fn a_repair_sweep_reaches_the_covered_entries_of_a_tenant_in_overflow() {
    // Skipping every tenant in overflow, the sweep never reached a lost
    // wake-up among an overflowing tenant's covered entries, and a tenant
    // with more due than the window holds stays in overflow for as long
    // as its backlog lasts (found by a soak of the engine simulation,
    // seeds 1000018 and 1000048).
    let mut core = PartitionCore::new(CoreConfig {
        repair_interval: Duration::from_millis(100),
        repair_page: 64,
        ..config()
    });
    // Ten times what the window holds, one entry every 10 ms.
    let mut store: BTreeSet<DueCursor> = (0..1_000)
        .map(|i| entry(10 + 10 * i, "big", &format!("b{i:04}")))
        .collect();
    let lost = entry(505, "big", "moved");
    let mut fired_at = None;
    for now in 0..1_000 {
        if now == 50 {
            // Moved with the window already past its new instant; the
            // wake-up is lost.
            assert!(core.window().covers(&lost));
            assert!(core.window().overflow_of(&lost.key.tenant).is_some());
            store.insert(lost.clone());
        }
        for action in core.handle(Input::Tick { may_fire: true }, ts(now)) {
            match action {
                Action::Deliver(batch) => {
                    for one in batch {
                        store.remove(&one.entry);
                        if one.entry == lost {
                            fired_at = Some(now);
                        }
                        let (entry, finish) = (one.entry, Finish::Done);
                        core.handle(Input::Finished { entry, finish }, ts(now));
                    }
                }
                Action::Load(request) => answer_load(&mut core, &store, request, ts(now)),
                _ => {}
            }
        }
    }
    assert_eq!(fired_at, Some(505), "repaired before its instant");
    assert_eq!(core.stats().repaired, 1);
}

#[test]
fn records_are_read_early_enough_to_ride_out_a_store_stall_of_a_second() {
    // The embedded store blocks every read of a keyspace while a compaction
    // of it installs its result, and fjall's workers run at a lower
    // priority: on a busy node that took up to a second. A record read
    // only a few hundred milliseconds ahead then made its delivery wait
    // for the store; read early enough, the stall passes unseen.
    // A healthy tenant's sparse stream in this partition: one entry every
    // 300 ms.
    let entries: Vec<DueCursor> = (0..40)
        .map(|i| entry(1_000 + 300 * i, "t", &format!("e{i:02}")))
        .collect();
    let config = CoreConfig::with_capacity(10_000);
    let mut core = core_with_config_and_page(config, entries.clone());
    let stall = 5_000..6_000;
    let mut reads: Vec<(i64, Vec<EventKey>)> = Vec::new();
    let (mut fired, mut fired_without_record) = (0, Vec::new());
    for now in 0..=14_000 {
        // A read answers 1 ms after it starts, or when the stall ends.
        let answered: Vec<_> = reads.extract_if(.., |(at, _)| *at <= now).collect();
        for (_, keys) in answered {
            answer_read_ahead(&mut core, &entries, keys, ts(now));
        }
        for action in core.handle(Input::Tick { may_fire: true }, ts(now)) {
            match action {
                Action::ReadAhead(keys) => {
                    let answer_at = if stall.contains(&now) {
                        stall.end
                    } else {
                        now + 1
                    };
                    reads.push((answer_at, keys));
                }
                Action::Deliver(batch) => {
                    for one in batch {
                        assert_eq!(one.entry.due, ts(now), "fired at its instant");
                        fired += 1;
                        if one.record.is_none() {
                            fired_without_record.push(one.entry.key.id.to_string());
                        }
                        let finish = Finish::Done;
                        let entry = one.entry;
                        core.handle(Input::Finished { entry, finish }, ts(now));
                    }
                }
                _ => {}
            }
        }
    }
    assert_eq!(fired, entries.len());
    assert_eq!(
        fired_without_record,
        Vec::<String>::new(),
        "these waited for the stalled store"
    );
}

#[test]
fn an_entry_fired_before_a_write_of_unknown_outcome_reads_its_record_again() {
    let a = entry(1, "t", "a");
    let mut core = core_with_page(10, vec![a.clone()]);
    assert_eq!(
        delivered(&core.handle(Input::Tick { may_fire: true }, ts(1))),
        std::slice::from_ref(&a)
    );
    // A cancel of it failed in the store, perhaps after its commit.
    core.handle(Input::MayHaveChanged(a.key.clone()), ts(2));
    let version = EventVersion::from_string("v1".into());
    assert_eq!(
        core.handle(
            Input::Claim {
                entry: a.clone(),
                version: version.clone()
            },
            ts(2)
        ),
        [Action::Reread { entry: a.clone() }]
    );
    // Read again, it claims as usual.
    assert_eq!(
        core.handle(
            Input::Claim {
                entry: a.clone(),
                version
            },
            ts(3)
        ),
        [Action::Claimed {
            entry: a,
            granted: true
        }]
    );
}

#[test]
fn an_entry_a_repair_page_lists_while_it_is_delivered_fires_again() {
    // A repair page skipped an entry it listed while it was outstanding
    // and did not offer it again once finished, as window and tenant
    // pages do: an event re-created at the same instant while its old
    // version was delivered, its wake-ups late or lost, waited for the
    // next repair cycle (found by a soak of the simulation, seed
    // 20015545).
    let a = entry(1, "t", "a");
    let mut core = core_with_config_and_page(
        CoreConfig {
            repair_interval: Duration::from_millis(100),
            ..config()
        },
        vec![a.clone()],
    );
    let fired = delivered(&core.handle(Input::Tick { may_fire: true }, ts(1)));
    assert_eq!(fired, vec![a.clone()]);
    let claim = Input::Claim {
        entry: a.clone(),
        version: EventVersion::from_string("v1".into()),
    };
    core.handle(claim, ts(1));
    // Re-created at the same instant (v2); the repair page lists it while
    // v1 is delivered.
    let repair = core
        .handle(Input::Tick { may_fire: true }, ts(150))
        .into_iter()
        .find_map(|action| match action {
            Action::Load(request) if request.kind == LoadKind::Repair => Some(request),
            _ => None,
        })
        .expect("a repair page read");
    let store = BTreeSet::from([a.clone()]);
    answer_load(&mut core, &store, repair, ts(150));
    // v1's delivery ends without a record (it was read after the change).
    let (entry, finish) = (a.clone(), Finish::Done);
    core.handle(Input::Finished { entry, finish }, ts(151));
    let again = delivered(&core.handle(Input::Tick { may_fire: true }, ts(152)));
    assert_eq!(again, vec![a], "v2 waits for the next repair cycle");
}

fn finish(core: &mut PartitionCore, entries: &[DueCursor], finish: Finish, now: i64) {
    for entry in entries {
        core.handle(
            Input::Finished {
                entry: entry.clone(),
                finish: finish.clone(),
            },
            ts(now),
        );
    }
}

#[test]
fn a_held_tenant_fires_nothing_until_it_resumes_then_all_in_due_order() {
    let page = vec![
        entry(1, "paused", "a"),
        entry(2, "paused", "b"),
        entry(3, "other", "x"),
        entry(4, "paused", "c"),
    ];
    let mut core = core_with_page(8, page);
    let fired = delivered(&core.handle(Input::Tick { may_fire: true }, ts(2)));
    assert_eq!(fired, [entry(1, "paused", "a"), entry(2, "paused", "b")]);
    // The dispatcher found the tenant paused: both come back held.
    finish(&mut core, &fired, Finish::Held, 2);
    assert!(core.is_held(&TenantName::new("paused").unwrap()));
    assert_eq!(core.outstanding(), 0);
    // Another tenant is not held back; the paused one's entries stay.
    assert_eq!(
        delivered(&core.handle(Input::Tick { may_fire: true }, ts(4))),
        [entry(3, "other", "x")]
    );
    assert_eq!(
        core.window().held_by(&TenantName::new("paused").unwrap()),
        3
    );
    // Nothing spins: the core sleeps (its next wake-up is in the future).
    assert!(core.next_wake(ts(4)) > ts(4));
    assert!(delivered(&core.handle(Input::Tick { may_fire: true }, ts(50))).is_empty());
    core.handle(Input::Resumed(TenantName::new("paused").unwrap()), ts(100));
    assert_eq!(
        delivered(&core.handle(Input::Tick { may_fire: true }, ts(100))),
        [
            entry(1, "paused", "a"),
            entry(2, "paused", "b"),
            entry(4, "paused", "c")
        ]
    );
}

#[test]
fn a_pause_made_here_holds_the_lane_before_anything_fires() {
    let mut core = core_with_page(8, vec![entry(1, "t", "a"), entry(2, "t", "b")]);
    let tenant = TenantName::new("t").unwrap();
    core.handle(Input::Paused(tenant.clone()), ts(0));
    assert!(delivered(&core.handle(Input::Tick { may_fire: true }, ts(5))).is_empty());
    // A reload keeps the hold.
    core.handle(Input::Reload, ts(5));
    let request = only_load(&core.handle(Input::Tick { may_fire: true }, ts(5)));
    core.handle(
        Input::Loaded {
            request,
            page: Some(vec![entry(1, "t", "a"), entry(2, "t", "b")]),
        },
        ts(5),
    );
    assert!(delivered(&core.handle(Input::Tick { may_fire: true }, ts(6))).is_empty());
    core.handle(Input::Resumed(tenant), ts(7));
    assert_eq!(
        delivered(&core.handle(Input::Tick { may_fire: true }, ts(7))),
        [entry(1, "t", "a"), entry(2, "t", "b")]
    );
}

#[test]
fn a_hold_is_rechecked_with_one_entry_per_interval() {
    let recheck = Duration::from_millis(1_000);
    let page = (1..=5).map(|i| entry(i, "t", &format!("e{i}"))).collect();
    let mut core = core_with_config_and_page(
        CoreConfig {
            hold_recheck: recheck,
            ..config()
        },
        page,
    );
    let fired = delivered(&core.handle(Input::Tick { may_fire: true }, ts(10)));
    assert_eq!(fired.len(), 5);
    finish(&mut core, &fired, Finish::Held, 10);
    assert!(delivered(&core.handle(Input::Tick { may_fire: true }, ts(1_009))).is_empty());
    // The recheck fires one entry, the first in due order.
    let probe = delivered(&core.handle(Input::Tick { may_fire: true }, ts(1_010)));
    assert_eq!(probe, [entry(1, "t", "e1")]);
    assert!(delivered(&core.handle(Input::Tick { may_fire: true }, ts(1_011))).is_empty());
    // Still paused (no resume was heard here): held again, for another
    // interval.
    finish(&mut core, &probe, Finish::Held, 1_020);
    assert!(delivered(&core.handle(Input::Tick { may_fire: true }, ts(1_020))).is_empty());
    assert_eq!(core.next_wake(ts(1_020)), ts(2_020));
    assert!(delivered(&core.handle(Input::Tick { may_fire: true }, ts(2_019))).is_empty());
    let probe = delivered(&core.handle(Input::Tick { may_fire: true }, ts(2_020)));
    assert_eq!(probe, [entry(1, "t", "e1")]);
    // Resumed through another node: the probe is delivered, and the rest
    // follows.
    finish(&mut core, &probe, Finish::Done, 2_030);
    assert!(!core.is_held(&TenantName::new("t").unwrap()));
    assert_eq!(
        delivered(&core.handle(Input::Tick { may_fire: true }, ts(2_030))),
        (2..=5)
            .map(|i| entry(i, "t", &format!("e{i}")))
            .collect::<Vec<_>>()
    );
}

#[test]
fn an_open_circuit_holds_the_lane_until_its_probe_time_and_a_close_releases_it() {
    let recheck = Duration::from_millis(5_000);
    let page = (1..=4).map(|i| entry(i, "t", &format!("e{i}"))).collect();
    let mut core = core_with_config_and_page(
        CoreConfig {
            hold_recheck: recheck,
            ..config()
        },
        page,
    );
    let fired = delivered(&core.handle(Input::Tick { may_fire: true }, ts(10)));
    assert_eq!(fired.len(), 4);
    // Open until 2 s: rechecked then, sooner than the pause recheck.
    finish(&mut core, &fired, Finish::HeldUntil(ts(2_000)), 20);
    assert!(core.is_held(&TenantName::new("t").unwrap()));
    assert!(delivered(&core.handle(Input::Tick { may_fire: true }, ts(20))).is_empty());
    assert!(delivered(&core.handle(Input::Tick { may_fire: true }, ts(1_999))).is_empty());
    let probe = delivered(&core.handle(Input::Tick { may_fire: true }, ts(2_000)));
    assert_eq!(probe, [entry(1, "t", "e1")]);
    // A far cool-down is still rechecked after `hold_recheck`.
    finish(&mut core, &probe, Finish::HeldUntil(ts(60_000)), 2_010);
    assert!(delivered(&core.handle(Input::Tick { may_fire: true }, ts(2_010))).is_empty());
    assert!(delivered(&core.handle(Input::Tick { may_fire: true }, ts(7_009))).is_empty());
    let probe = delivered(&core.handle(Input::Tick { may_fire: true }, ts(7_010)));
    assert_eq!(probe, [entry(1, "t", "e1")]);
    finish(&mut core, &probe, Finish::HeldUntil(ts(60_000)), 7_020);
    // The circuit closed on this node: the lane fires in due order at once.
    core.handle(
        Input::CircuitClosed(TenantName::new("t").unwrap()),
        ts(8_000),
    );
    assert!(!core.is_held(&TenantName::new("t").unwrap()));
    assert_eq!(
        delivered(&core.handle(Input::Tick { may_fire: true }, ts(8_000))),
        (1..=4)
            .map(|i| entry(i, "t", &format!("e{i}")))
            .collect::<Vec<_>>()
    );
}

fn internal_entry(due: i64, tenant: &str, rest: &str) -> DueCursor {
    DueCursor {
        due: ts(due),
        key: EventKey::new(
            TenantName::new(tenant).unwrap(),
            EventId::internal(rest).unwrap(),
        ),
    }
}

#[test]
fn a_held_lane_still_fires_its_internal_entries_notices_and_schedules() {
    // A backlog held ahead of a notice and a schedule's control event.
    let page = vec![
        entry(1, "t", "a"),
        entry(2, "t", "b"),
        internal_entry(5, "t", "notice/3"),
        entry(6, "t", "c"),
        internal_entry(8, "t", "schedule/daily"),
    ];
    let mut core = core_with_page(8, page);
    let tenant = TenantName::new("t").unwrap();
    core.handle(Input::Paused(tenant.clone()), ts(0));
    assert!(delivered(&core.handle(Input::Tick { may_fire: true }, ts(4))).is_empty());
    assert_eq!(core.next_wake(ts(4)), ts(5), "woken for the notice");
    let fired = delivered(&core.handle(Input::Tick { may_fire: true }, ts(5)));
    assert_eq!(fired, [internal_entry(5, "t", "notice/3")]);
    finish(&mut core, &fired, Finish::Done, 5);
    assert!(core.is_held(&tenant), "the hold stays");
    let fired = delivered(&core.handle(Input::Tick { may_fire: true }, ts(9)));
    assert_eq!(fired, [internal_entry(8, "t", "schedule/daily")]);
    finish(&mut core, &fired, Finish::Done, 9);
    assert!(delivered(&core.handle(Input::Tick { may_fire: true }, ts(10))).is_empty());
    core.handle(Input::Resumed(tenant), ts(11));
    assert_eq!(
        delivered(&core.handle(Input::Tick { may_fire: true }, ts(11))),
        [entry(1, "t", "a"), entry(2, "t", "b"), entry(6, "t", "c")]
    );
}

#[test]
fn an_entry_judged_paused_before_a_resume_goes_out_again_not_held() {
    let recheck = Duration::from_millis(5_000);
    let mut core = core_with_config_and_page(
        CoreConfig {
            hold_recheck: recheck,
            ..config()
        },
        vec![entry(1, "t", "a"), entry(2, "t", "b")],
    );
    let tenant = TenantName::new("t").unwrap();
    let fired = delivered(&core.handle(Input::Tick { may_fire: true }, ts(2)));
    assert_eq!(fired, [entry(1, "t", "a"), entry(2, "t", "b")]);
    // The dispatcher judged both paused, but the resume came in before
    // their answer did.
    core.handle(Input::Resumed(tenant.clone()), ts(3));
    finish(&mut core, &fired, Finish::Held, 4);
    assert!(!core.is_held(&tenant), "no hold left until a recheck");
    assert_eq!(
        delivered(&core.handle(Input::Tick { may_fire: true }, ts(4))),
        [entry(1, "t", "a"), entry(2, "t", "b")],
        "out again at once, not after the 5 s recheck"
    );
}
