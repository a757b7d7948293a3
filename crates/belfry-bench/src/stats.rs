//! Percentiles, and the node's resource use read from `/proc`.

use std::path::Path;

use serde::Serialize;

/// Nearest-rank percentiles of a sample, in the sample's unit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Percentiles {
    /// `None` for an empty sample. Sorts `values` in place.
    pub fn of(values: &mut [i64]) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        values.sort_unstable();
        let rank = |q: f64| {
            // Nearest rank: the smallest value with at least q of the sample
            // at or below it.
            let index = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
            values[index] as f64
        };
        Some(Percentiles {
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            p999: rank(0.999),
            max: values[values.len() - 1] as f64,
        })
    }

    /// Every field divided by `divisor` (e.g. µs → ms).
    pub fn scaled(self, divisor: f64) -> Self {
        Percentiles {
            p50: self.p50 / divisor,
            p90: self.p90 / divisor,
            p99: self.p99 / divisor,
            p999: self.p999 / divisor,
            max: self.max / divisor,
        }
    }
}

/// The highest RSS a process reaches while a phase runs: sampled every
/// `every` from `start` (the RSS when the phase began) until [`Self::stop`].
pub struct RssPeak {
    peak: std::sync::Arc<std::sync::atomic::AtomicU64>,
    sampler: Option<tokio::task::JoinHandle<()>>,
}

impl RssPeak {
    pub fn start(pid: Option<u32>, start: u64, every: std::time::Duration) -> RssPeak {
        let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(start));
        let sampler = pid.map(|pid| {
            let peak = std::sync::Arc::clone(&peak);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    if let Some(sample) = ProcessSample::read(pid) {
                        peak.fetch_max(sample.rss_bytes, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            })
        });
        RssPeak { peak, sampler }
    }

    /// Stops sampling; answers the highest RSS seen.
    pub fn stop(self) -> u64 {
        if let Some(sampler) = self.sampler {
            sampler.abort();
        }
        self.peak.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops sampling; the highest RSS seen, `last` included (`None`
    /// without `last`).
    pub fn stop_with(self, last: Option<ProcessSample>) -> Option<u64> {
        let peak = self.stop();
        last.map(|s| peak.max(s.rss_bytes))
    }
}

/// A process's resource use at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ProcessSample {
    /// `VmHWM`: the peak resident set size so far.
    pub peak_rss_bytes: u64,
    /// `VmRSS`: the resident set size now.
    pub rss_bytes: u64,
    /// User CPU seconds so far (`utime`).
    pub cpu_user_s: f64,
    /// System CPU seconds so far (`stime`).
    pub cpu_system_s: f64,
    /// Seconds its live threads spent runnable but waiting for a CPU so far
    /// (`/proc/<pid>/task/*/schedstat`, second field; threads that exited
    /// are not counted). Waiting much longer than running means the
    /// machine's other work held the CPUs, not that the process was slow.
    pub run_queue_wait_s: f64,
}

impl ProcessSample {
    /// Reads `/proc/<pid>/status` and `/proc/<pid>/stat`; `None` when the
    /// process is gone or /proc is unavailable.
    pub fn read(pid: u32) -> Option<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (utime, stime) = parse_stat_times(&stat)?;
        let ticks = clock_ticks_per_second();
        Some(ProcessSample {
            peak_rss_bytes: status_kib(&status, "VmHWM:")? * 1024,
            rss_bytes: status_kib(&status, "VmRSS:")? * 1024,
            cpu_user_s: utime as f64 / ticks,
            cpu_system_s: stime as f64 / ticks,
            run_queue_wait_s: run_queue_wait_ns(pid) as f64 / 1e9,
        })
    }

    /// CPU seconds spent between `earlier` and `self`.
    pub fn cpu_since(&self, earlier: &ProcessSample) -> CpuSplit {
        CpuSplit {
            user_s: self.cpu_user_s - earlier.cpu_user_s,
            system_s: self.cpu_system_s - earlier.cpu_system_s,
        }
    }
}

/// Nanoseconds the threads of `pid` waited on a run queue (0 when
/// schedstats are not available).
fn run_queue_wait_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|task| {
            let text = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            text.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .sum()
}

/// CPU seconds over an interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuSplit {
    pub user_s: f64,
    pub system_s: f64,
}

impl std::ops::Add for CpuSplit {
    type Output = CpuSplit;
    fn add(self, other: CpuSplit) -> CpuSplit {
        CpuSplit {
            user_s: self.user_s + other.user_s,
            system_s: self.system_s + other.system_s,
        }
    }
}

impl CpuSplit {
    pub fn total_s(self) -> f64 {
        self.user_s + self.system_s
    }
}

/// The 1, 5 and 15 minute load averages (`/proc/loadavg`).
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut fields = text.split_whitespace().map(|f| f.parse::<f64>().ok());
    Some([fields.next()??, fields.next()??, fields.next()??])
}

/// Busy and total CPU time of the whole machine so far (`/proc/stat`, all
/// CPUs), in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MachineSample {
    pub busy_s: f64,
    pub total_s: f64,
}

impl MachineSample {
    pub fn read() -> Option<Self> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        parse_machine_line(text.lines().next()?)
    }

    /// The share of the machine's CPU time that was busy since `earlier`,
    /// in percent (100 = every core busy the whole time).
    pub fn busy_percent_since(&self, earlier: &MachineSample) -> f64 {
        let total = self.total_s - earlier.total_s;
        if total <= 0.0 {
            return 0.0;
        }
        100.0 * (self.busy_s - earlier.busy_s) / total
    }
}

/// `cpu  user nice system idle iowait irq softirq steal ...` (ticks):
/// idle and iowait are not busy.
fn parse_machine_line(line: &str) -> Option<MachineSample> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let ticks: Vec<u64> = fields
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let total: u64 = ticks.iter().sum();
    let idle = ticks.get(3)? + ticks.get(4)?;
    let per_second = clock_ticks_per_second();
    Some(MachineSample {
        busy_s: (total - idle) as f64 / per_second,
        total_s: total as f64 / per_second,
    })
}

/// The value of a `Name:   1234 kB` line of `/proc/<pid>/status`.
fn status_kib(status: &str, name: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with(name))?;
    line[name.len()..].split_whitespace().next()?.parse().ok()
}

/// `(utime, stime)` in clock ticks from `/proc/<pid>/stat`. The command name
/// (field 2) may contain spaces and parentheses, so fields are counted from
/// the last `)`: utime and stime are fields 14 and 15 overall.
fn parse_stat_times(stat: &str) -> Option<(u64, u64)> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let utime = fields.next()?.parse().ok()?;
    let stime = fields.next()?.parse().ok()?;
    Some((utime, stime))
}

#[allow(unsafe_code)]
fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the C library; no memory of ours
    // is touched.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    // USER_HZ is 100 on every Linux architecture when sysconf fails.
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// Bytes of the files under `dir`: `(apparent size, allocated on disk)`.
pub fn dir_size(dir: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut apparent = 0;
    let mut allocated = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in std::fs::read_dir(&current)? {
            let entry = entry?;
            let metadata = entry.metadata()?;
            if metadata.is_dir() {
                pending.push(entry.path());
            } else {
                apparent += metadata.len();
                // st_blocks counts 512-byte units regardless of block size.
                allocated += metadata.blocks() * 512;
            }
        }
    }
    Ok((apparent, allocated))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut values: Vec<i64> = (1..=1000).rev().collect();
        let p = Percentiles::of(&mut values).unwrap();
        assert_eq!(
            (p.p50, p.p90, p.p99, p.p999, p.max),
            (500.0, 900.0, 990.0, 999.0, 1000.0)
        );
        assert_eq!(Percentiles::of(&mut [7]).unwrap().p50, 7.0);
        assert!(Percentiles::of(&mut []).is_none());
    }

    #[test]
    fn stat_times_skip_a_command_name_with_spaces() {
        let stat = "42 (my (odd) cmd) S 1 42 42 0 -1 4194304 100 0 0 0 250 75 0 0 20 0 1 0";
        assert_eq!(parse_stat_times(stat), Some((250, 75)));
    }

    #[test]
    fn machine_line_counts_idle_and_iowait_as_not_busy() {
        let sample = parse_machine_line("cpu  100 0 50 800 50 0 0 0 0 0").unwrap();
        let ticks = clock_ticks_per_second();
        assert_eq!(sample.busy_s, 150.0 / ticks);
        assert_eq!(sample.total_s, 1000.0 / ticks);
        assert!(parse_machine_line("cpu0 1 2 3 4 5 6 7 8").is_none());
        assert!(load_average().is_some());
    }

    #[test]
    fn reads_its_own_process() {
        let me = ProcessSample::read(std::process::id()).unwrap();
        assert!(me.peak_rss_bytes >= me.rss_bytes && me.rss_bytes > 0);
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/f"), [0u8; 1000]).unwrap();
        assert_eq!(dir_size(dir.path()).unwrap().0, 1000);
    }
}
