//! What a kill -9 of a node (the Master or another) did to the deliveries:
//! the longest silence (overall and in the partitions that had to move), the
//! worst lateness, how many events were more than 1 s late, duplicates.
//!
//! The partitions the killed node owned are known from `/v1/cluster` just
//! before the kill; each event's partition is computed with the same hash
//! the nodes use (`belfry_core::PartitionCount::partition_of`).

use belfry_testkit::RecordedRequest;

use crate::report::FailoverReport;
use crate::stats::Percentiles;
use crate::workload::Workload;

/// Facts about the kill the analysis needs.
pub struct Kill {
    pub address: String,
    /// The killed node was the Master.
    pub leader: bool,
    /// Wall-clock ms of the kill.
    pub at_ms: i64,
    /// `moved[n]`: event `e<n>` belongs to a partition the killed node owned.
    pub moved: Vec<bool>,
    pub partitions_moved: usize,
    pub new_master_after_ms: Option<f64>,
    pub partitions_owned_after_ms: Option<f64>,
}

/// One delivery of a workload event.
struct Arrival {
    index: usize,
    arrived_ms: i64,
    first: bool,
}

pub fn analyze(records: &[RecordedRequest], workload: &Workload, kill: Kill) -> FailoverReport {
    let mut seen = vec![false; workload.len()];
    let mut arrivals: Vec<Arrival> = records
        .iter()
        .filter_map(|record| {
            let index = workload.index_of(record.header("x-belfry-event-id")?)?;
            Some(Arrival {
                index,
                arrived_ms: record.arrived_at_ms,
                first: !std::mem::replace(&mut seen[index], true),
            })
        })
        .collect();
    arrivals.sort_by_key(|a| a.arrived_ms);
    let first_due = workload.due_ms.iter().copied().min().unwrap_or(0);
    let last_due = workload.due_ms.iter().copied().max().unwrap_or(0);
    let is_moved = |a: &&Arrival| kill.moved.get(a.index).copied().unwrap_or(false);

    let lateness = |a: &Arrival| a.arrived_ms - workload.due_ms[a.index];
    let mut moved_after_kill: Vec<i64> = arrivals
        .iter()
        .filter(is_moved)
        .filter(|a| a.first && workload.due_ms[a.index] >= kill.at_ms)
        .map(lateness)
        .collect();
    FailoverReport {
        killed_address: kill.address.clone(),
        killed_leader: kill.leader,
        killed_after_first_due_ms: kill.at_ms - first_due,
        partitions_moved: kill.partitions_moved,
        new_master_after_ms: kill.new_master_after_ms,
        partitions_owned_after_ms: kill.partitions_owned_after_ms,
        longest_gap_ms: longest_gap(arrivals.iter(), first_due, last_due),
        longest_gap_moved_ms: longest_gap(arrivals.iter().filter(is_moved), first_due, last_due),
        first_moved_delivery_after_kill_ms: arrivals
            .iter()
            .filter(is_moved)
            .find(|a| a.arrived_ms >= kill.at_ms)
            .map(|a| a.arrived_ms - kill.at_ms),
        worst_lateness_ms: arrivals.iter().filter(|a| a.first).map(lateness).max(),
        late_over_1s: arrivals
            .iter()
            .filter(|a| a.first && lateness(a) > 1_000)
            .count(),
        worst_lateness_moved_ms: arrivals
            .iter()
            .filter(is_moved)
            .filter(|a| a.first)
            .map(lateness)
            .max(),
        lateness_moved_after_kill_ms: Percentiles::of(&mut moved_after_kill),
        duplicates: arrivals.iter().filter(|a| !a.first).count(),
        duplicates_moved: arrivals
            .iter()
            .filter(is_moved)
            .filter(|a| !a.first)
            .count(),
    }
}

/// The longest stretch without an arrival between `from_ms` and `to_ms`
/// (the due window): from its start to the first arrival, between
/// consecutive arrivals, and up to the end when arrivals stop early.
fn longest_gap<'a>(sorted: impl Iterator<Item = &'a Arrival>, from_ms: i64, to_ms: i64) -> i64 {
    let mut previous = from_ms;
    let mut longest = 0;
    for arrival in sorted {
        if arrival.arrived_ms < from_ms {
            continue;
        }
        longest = longest.max(arrival.arrived_ms - previous);
        previous = arrival.arrived_ms;
        if previous >= to_ms {
            return longest;
        }
    }
    longest.max(to_ms - previous)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, arrived_ms: i64) -> RecordedRequest {
        RecordedRequest {
            arrived_at_ms: arrived_ms,
            arrived_at: std::time::Instant::now(),
            method: reqwest::Method::POST,
            path: String::new(),
            headers: vec![("x-belfry-event-id".into(), id.into())],
            body: bytes::Bytes::new(),
        }
    }

    #[test]
    fn gaps_lateness_and_duplicates_of_the_moved_partitions() {
        // e0..e9 due 1000, 1100, ..., 1900; odd events were on the killed node.
        let workload = Workload::uniform("t", 10, 1_000, 1_000, 0);
        let moved = (0..10).map(|n| n % 2 == 1).collect();
        let kill = Kill {
            address: "127.0.0.1:1".into(),
            leader: true,
            at_ms: 1_250,
            moved,
            partitions_moved: 1,
            new_master_after_ms: Some(900.0),
            partitions_owned_after_ms: Some(1_000.0),
        };
        let mut records: Vec<_> = (0..10)
            .filter(|n| n % 2 == 0 || *n < 3)
            .map(|n| record(&format!("e{n}"), 1_000 + n * 100))
            .collect();
        // The moved ones due after the kill arrive together at 2_500, e3 twice.
        for n in [3, 5, 7, 9, 3] {
            records.push(record(&format!("e{n}"), 2_500));
        }
        let report = analyze(&records, &workload, kill);
        assert_eq!(report.killed_after_first_due_ms, 250);
        // Moved arrivals: e1 at 1100, then silence until 2500.
        assert_eq!(report.longest_gap_moved_ms, 1_400);
        // All arrivals: ... e8 at 1800, then 2500.
        assert_eq!(report.longest_gap_ms, 700);
        assert_eq!(report.first_moved_delivery_after_kill_ms, Some(1_250));
        assert_eq!(report.worst_lateness_moved_ms, Some(2_500 - 1_300));
        assert_eq!(report.worst_lateness_ms, Some(1_200));
        // Of those arriving at 2500 only e3 (due 1300) is over 1 s late;
        // its second delivery does not count again.
        assert_eq!(report.late_over_1s, 1);
        assert_eq!(report.duplicates, 1);
        assert_eq!(report.duplicates_moved, 1);
        let after = report.lateness_moved_after_kill_ms.unwrap();
        assert_eq!((after.p50, after.max), (800.0, 1_200.0));
    }

    #[test]
    fn a_silent_end_counts_as_a_gap() {
        let workload = Workload::uniform("t", 2, 0, 1_000, 0);
        let arrivals = [Arrival {
            index: 0,
            arrived_ms: 100,
            first: true,
        }];
        assert_eq!(longest_gap(arrivals.iter(), 0, 1_000), 900);
        assert_eq!(workload.len(), 2);
    }
}
