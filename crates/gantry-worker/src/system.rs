//! Host facts: CPU count and load, memory, free disk in the data directory.

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
    fn reads_this_hosts_facts() {
        let info = system_info(Path::new("/"));
        assert!(info.cpu_count >= 1);
        assert!(info.memory_total > 0);
        assert!(info.memory_available <= info.memory_total);
        assert!(info.disk_free > 0);
        assert!(!info.hostname.is_empty());
    }
}
