//! Host facts: CPU count and load, memory, free disk in the data directory; how busy the
//! CPUs were between two samples ([`CpuMeter`]).

use std::path::Path;

use gantry_types::SystemInfo;

/// Reads the host's facts; a fact that cannot be read is reported as zero.
pub fn system_info(data_dir: &Path) -> SystemInfo {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| -> u64 {
        meminfo
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map_or(0, |kib| kib * 1024)
    };
    let load_average = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0);
    let disk_free = nix::sys::statvfs::statvfs(data_dir)
        .map(|s| s.blocks_available() * s.fragment_size())
        .unwrap_or(0);
    SystemInfo {
        cpu_count: std::thread::available_parallelism()
            .map(|n| u32::try_from(n.get()).unwrap_or(u32::MAX))
            .unwrap_or(1),
        load_average,
        memory_total: field("MemTotal:"),
        memory_available: field("MemAvailable:"),
        disk_free,
        os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        hostname: hostname(),
    }
}

/// How busy all CPUs were since the previous reading, from `/proc/stat`'s first line.
#[derive(Debug, Default)]
pub struct CpuMeter {
    /// Idle and total jiffies at the previous reading.
    previous: Option<(u64, u64)>,
}

impl CpuMeter {
    /// Percent busy since the previous call; `None` on the first call or where
    /// `/proc/stat` cannot be read.
    pub fn percent(&mut self) -> Option<f32> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let now = cpu_jiffies(&stat)?;
        let before = self.previous.replace(now)?;
        busy_percent(before, now)
    }
}

/// (idle, total) jiffies of the `cpu` line: idle counts `idle` and `iowait`; the total
/// counts user to steal (guest time is already in user).
fn cpu_jiffies(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|line| line.starts_with("cpu "))?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    let idle = values.get(3)? + values.get(4).copied().unwrap_or(0);
    Some((idle, values.iter().sum()))
}

fn busy_percent((idle_before, total_before): (u64, u64), (idle, total): (u64, u64)) -> Option<f32> {
    let total = total.checked_sub(total_before).filter(|t| *t > 0)?;
    let idle = idle.saturating_sub(idle_before).min(total);
    Some(((total - idle) as f64 * 100.0 / total as f64) as f32)
}

/// The machine's hostname.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_busy_time_is_the_share_of_non_idle_jiffies() {
        let before = cpu_jiffies("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n").unwrap();
        assert_eq!(before, (850, 1000));
        let after = cpu_jiffies("cpu  150 0 50 850 50 0 0 0 0 0\n").unwrap();
        assert_eq!(busy_percent(before, after), Some(50.0));
        assert_eq!(busy_percent(after, after), None);
        assert_eq!(cpu_jiffies("intr 1 2"), None);
        let mut meter = CpuMeter::default();
        assert_eq!(meter.percent(), None);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let busy = meter.percent().unwrap();
        assert!((0.0..=100.0).contains(&busy), "{busy}");
    }

    #[test]
    fn reads_this_hosts_facts() {
        let info = system_info(Path::new("/"));
        assert!(info.cpu_count >= 1);
        assert!(info.memory_total > 0);
        assert!(info.memory_available <= info.memory_total);
        assert!(info.disk_free > 0);
        assert!(!info.hostname.is_empty());
    }
}
