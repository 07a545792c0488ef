//! GPU detection: NVML (loaded at run time, so the binary runs on machines without the
//! NVIDIA driver), or devices declared with `--simulate-gpus` for tests and demos.
//! Simulated devices are marked `simulated: true` everywhere they appear.

use std::ffi::OsStr;

use gantry_types::GpuDevice;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::Nvml;

/// Devices declared on the command line: `count` GPUs of `memory` bytes each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimulatedGpus {
    pub count: u32,
    pub memory: u64,
}

impl SimulatedGpus {
    /// Parses `4x80GiB`, `2x24GB`, `1x512MiB`, `8x80G`: a count, then a size in any form
    /// [`gantry_types::units::parse_size`] reads.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (count, memory) = text
            .split_once(['x', 'X'])
            .ok_or_else(|| format!("{text:?} is not COUNTxMEMORY, for example 4x80GiB"))?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| format!("{count:?} is not a GPU count"))?;
        if count == 0 || count > 64 {
            return Err("the GPU count must be between 1 and 64".into());
        }
        let memory = gantry_types::units::parse_size(memory).map_err(|e| e.to_string())?;
        if memory == 0 {
            return Err("the memory size must be positive".into());
        }
        Ok(Self { count, memory })
    }

    /// The declared devices, named after the worker so their UUIDs are unique.
    pub fn devices(&self, worker_name: &str) -> Vec<GpuDevice> {
        (0..self.count)
            .map(|index| GpuDevice {
                index,
                name: "Simulated GPU".to_string(),
                uuid: format!("SIM-{worker_name}-{index}"),
                memory_total: self.memory,
                memory_used: 0,
                utilization: None,
                temperature: None,
                simulated: true,
            })
            .collect()
    }
}

/// A handle on NVML, if the driver library could be loaded.
pub struct GpuProbe {
    nvml: Option<Nvml>,
}

impl std::fmt::Debug for GpuProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuProbe")
            .field("nvml", &self.nvml.is_some())
            .finish()
    }
}

impl GpuProbe {
    /// Loads NVML. Without it the worker is CPU-only; that is said once, here.
    pub fn load() -> Self {
        let nvml = Nvml::init().or_else(|_| {
            Nvml::builder()
                .lib_path(OsStr::new("libnvidia-ml.so.1"))
                .init()
        });
        match nvml {
            Ok(nvml) => {
                let count = nvml.device_count().unwrap_or(0);
                let driver = nvml.sys_driver_version().unwrap_or_default();
                tracing::info!(gpus = count, driver = %driver, "NVML loaded");
                Self { nvml: Some(nvml) }
            }
            Err(e) => {
                tracing::info!(reason = %e, "NVML not available: this worker has no GPUs it can use (CPU only)");
                Self { nvml: None }
            }
        }
    }

    /// A probe that never looks for real GPUs (tests, and workers with simulated ones).
    pub fn disabled() -> Self {
        Self { nvml: None }
    }

    pub fn has_nvml(&self) -> bool {
        self.nvml.is_some()
    }

    /// The GPUs as they are now. Devices that fail to answer are skipped with a
    /// warning rather than failing the whole report.
    pub fn devices(&self) -> Vec<GpuDevice> {
        let Some(nvml) = &self.nvml else {
            return Vec::new();
        };
        let count = match nvml.device_count() {
            Ok(count) => count,
            Err(e) => {
                tracing::warn!(error = %e, "NVML could not count devices");
                return Vec::new();
            }
        };
        let mut devices = Vec::new();
        for index in 0..count {
            let device = match nvml.device_by_index(index) {
                Ok(device) => device,
                Err(e) => {
                    tracing::warn!(index, error = %e, "NVML could not open device");
                    continue;
                }
            };
            let memory = device.memory_info().ok();
            devices.push(GpuDevice {
                index,
                name: device.name().unwrap_or_else(|_| "unknown GPU".into()),
                uuid: device.uuid().unwrap_or_default(),
                memory_total: memory.as_ref().map_or(0, |m| m.total),
                memory_used: memory.as_ref().map_or(0, |m| m.used),
                utilization: device.utilization_rates().ok().map(|u| u.gpu),
                temperature: device.temperature(TemperatureSensor::Gpu).ok(),
                simulated: false,
            });
        }
        devices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_gpus_parse() {
        assert_eq!(
            SimulatedGpus::parse("4x80GiB").unwrap(),
            SimulatedGpus {
                count: 4,
                memory: 80 << 30
            }
        );
        assert_eq!(
            SimulatedGpus::parse("2X24GB").unwrap().memory,
            24_000_000_000
        );
        assert!(SimulatedGpus::parse("0x80GiB").is_err());
        assert!(SimulatedGpus::parse("4x").is_err());
        assert!(SimulatedGpus::parse("four").is_err());
        assert!(SimulatedGpus::parse("4x80PB").is_err());
        assert!(SimulatedGpus::parse("4x0GiB").is_err());
    }

    #[test]
    fn simulated_memory_reads_sizes_like_every_other_size() {
        assert_eq!(SimulatedGpus::parse("2x20G").unwrap().memory, 20 << 30);
        assert_eq!(SimulatedGpus::parse("1x1.5GiB").unwrap().memory, 3 << 29);
        assert_eq!(SimulatedGpus::parse("1x512mb").unwrap().memory, 512_000_000);
    }

    #[test]
    fn simulated_devices_say_so() {
        let devices = SimulatedGpus::parse("2x1GiB").unwrap().devices("w1");
        assert_eq!(devices.len(), 2);
        assert!(devices.iter().all(|d| d.simulated));
        assert_eq!(devices[1].uuid, "SIM-w1-1");
    }
}
