//! What the control-plane benchmark measures with: latency samples and their
//! percentiles, and a sampler of a process's CPU time and resident memory read from
//! `/proc/<pid>/stat` and `/proc/<pid>/status` (the `gantry server` under test, and the
//! load process itself, which shares the machine with it).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Latencies, sorted on demand.
#[derive(Debug, Default, Clone)]
pub struct Latencies {
    samples: Vec<Duration>,
}

impl Latencies {
    pub fn push(&mut self, latency: Duration) {
        self.samples.push(latency);
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The nearest-rank percentile `p` (0–100); `None` without samples.
    pub fn percentile(&self, p: f64) -> Option<Duration> {
        let mut sorted = self.samples.clone();
        sorted.sort_unstable();
        percentile_of_sorted(&sorted, p)
    }

    /// `n=… p50 … ms p99 … ms max … ms`, the line every latency figure is printed as.
    pub fn summary(&self) -> String {
        let mut sorted = self.samples.clone();
        sorted.sort_unstable();
        match (
            percentile_of_sorted(&sorted, 50.0),
            percentile_of_sorted(&sorted, 99.0),
            sorted.last(),
        ) {
            (Some(p50), Some(p99), Some(max)) => format!(
                "n={} p50 {} p99 {} max {}",
                sorted.len(),
                ms(p50),
                ms(p99),
                ms(*max)
            ),
            _ => "n=0 (no samples)".to_owned(),
        }
    }
}

/// The nearest-rank percentile of sorted samples.
pub fn percentile_of_sorted(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// A duration as milliseconds with three decimals and the unit.
pub fn ms(duration: Duration) -> String {
    format!("{:.3} ms", duration.as_secs_f64() * 1000.0)
}

/// Bytes as MiB with one decimal and the unit.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// One reading of a process.
#[derive(Debug, Clone, Copy)]
pub struct ProcSample {
    pub at: Instant,
    /// User plus system CPU time, in clock ticks (`utime + stime` of `/proc/<pid>/stat`).
    pub cpu_ticks: u64,
    /// `VmRSS` of `/proc/<pid>/status`.
    pub rss_bytes: u64,
}

/// Reads a process's CPU time and resident memory now.
pub fn read_process(pid: u32) -> std::io::Result<ProcSample> {
    let at = Instant::now();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let cpu_ticks = parse_cpu_ticks(&stat).ok_or_else(|| invalid("stat", pid))?;
    let rss_bytes = parse_rss_bytes(&status).ok_or_else(|| invalid("status", pid))?;
    Ok(ProcSample {
        at,
        cpu_ticks,
        rss_bytes,
    })
}

fn invalid(file: &str, pid: u32) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("/proc/{pid}/{file} does not read as expected"),
    )
}

/// `utime + stime` of a `/proc/<pid>/stat` line. The command name (field 2) is in
/// parentheses and may hold spaces and parentheses, so the fields are counted from the
/// last `)`: state is the first after it, utime the 12th and stime the 13th.
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// `VmRSS` of `/proc/<pid>/status`, in bytes (the file says kB, meaning KiB).
pub fn parse_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Samples of one process taken every period by a task, kept for the whole run, so that
/// each phase can read its own stretch.
#[derive(Debug, Clone)]
pub struct ProcessSampler {
    pid: u32,
    clock_ticks_per_second: u64,
    samples: Arc<Mutex<Vec<ProcSample>>>,
}

/// CPU and memory of a process over a stretch of time.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    /// CPU time over wall time, in percent of one core.
    pub cpu_percent: f64,
    pub rss_max: u64,
    pub rss_last: u64,
}

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CPU {:.1} % of a core, RSS max {} (last {})",
            self.cpu_percent,
            mib(self.rss_max),
            mib(self.rss_last)
        )
    }
}

impl ProcessSampler {
    /// Starts sampling `pid` every `period` until `shutdown`; the first sample is taken
    /// before this returns, so a missing process fails here.
    pub fn start(
        pid: u32,
        clock_ticks_per_second: u64,
        period: Duration,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> std::io::Result<Self> {
        let first = read_process(pid)?;
        let sampler = ProcessSampler {
            pid,
            clock_ticks_per_second,
            samples: Arc::new(Mutex::new(vec![first])),
        };
        let task_sampler = sampler.clone();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                // A process that exited leaves its last samples; the phases report them.
                if task_sampler.sample_now().is_err() {
                    return;
                }
            }
        });
        Ok(sampler)
    }

    /// Takes a sample now (phase boundaries take one so their stretch is exact).
    pub fn sample_now(&self) -> std::io::Result<ProcSample> {
        let sample = read_process(self.pid)?;
        self.samples
            .lock()
            .expect("the sample lock is never poisoned: no code panics holding it")
            .push(sample);
        Ok(sample)
    }

    /// The latest resident memory.
    pub fn rss_now(&self) -> u64 {
        self.sample_now().map(|s| s.rss_bytes).unwrap_or(0)
    }

    /// The median resident memory of the samples between `from` and `to`.
    pub fn rss_median(&self, from: Instant, to: Instant) -> Option<u64> {
        let samples = self
            .samples
            .lock()
            .expect("the sample lock is never poisoned: no code panics holding it");
        let mut inside: Vec<u64> = samples
            .iter()
            .filter(|s| s.at >= from && s.at <= to)
            .map(|s| s.rss_bytes)
            .collect();
        inside.sort_unstable();
        inside.get(inside.len() / 2).copied()
    }

    /// CPU and memory between `from` and `to` (samples inside the stretch, and the
    /// nearest outside it at either end for the CPU delta).
    pub fn usage(&self, from: Instant, to: Instant) -> Option<Usage> {
        let samples = self
            .samples
            .lock()
            .expect("the sample lock is never poisoned: no code panics holding it");
        let start = samples
            .iter()
            .rev()
            .find(|s| s.at <= from)
            .or(samples.first())?;
        let end = samples.iter().rev().find(|s| s.at <= to)?;
        let inside: Vec<&ProcSample> = samples
            .iter()
            .filter(|s| s.at >= start.at && s.at <= end.at)
            .collect();
        let wall = end.at.saturating_duration_since(start.at).as_secs_f64();
        if wall <= 0.0 {
            return None;
        }
        let cpu_seconds = end.cpu_ticks.saturating_sub(start.cpu_ticks) as f64
            / self.clock_ticks_per_second as f64;
        Some(Usage {
            cpu_percent: 100.0 * cpu_seconds / wall,
            rss_max: inside
                .iter()
                .map(|s| s.rss_bytes)
                .max()
                .unwrap_or(end.rss_bytes),
            rss_last: end.rss_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_counted_from_the_last_parenthesis() {
        let stat = "1234 (gantry (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 \
                    250 50 0 0 20 0 9 0 12345 1000000 2500 ...";
        assert_eq!(parse_cpu_ticks(stat), Some(300));
    }

    #[test]
    fn rss_is_read_in_bytes() {
        let status = "Name:\tgantry\nVmPeak:\t  9000 kB\nVmRSS:\t  2048 kB\nThreads:\t9\n";
        assert_eq!(parse_rss_bytes(status), Some(2048 * 1024));
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let mut latencies = Latencies::default();
        for ms in 1..=100 {
            latencies.push(Duration::from_millis(ms));
        }
        assert_eq!(latencies.percentile(50.0), Some(Duration::from_millis(50)));
        assert_eq!(latencies.percentile(99.0), Some(Duration::from_millis(99)));
        assert_eq!(
            latencies.percentile(100.0),
            Some(Duration::from_millis(100))
        );
        assert_eq!(Latencies::default().percentile(50.0), None);
    }

    #[test]
    fn this_process_can_be_read() {
        let sample = read_process(std::process::id()).expect("/proc/self is readable");
        assert!(sample.rss_bytes > 0);
    }
}
