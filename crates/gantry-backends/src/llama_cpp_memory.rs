//! What `llama-server` reports allocating, read from its log.
//!
//! While it loads a model, llama.cpp prints one line per buffer it allocates, naming the
//! buffer type (`CPU`, `CPU_Mapped`, `CUDA0`, `CUDA_Host`, …) and the size in MiB with two
//! decimals:
//!
//! ```text
//! load_tensors:   CPU_Mapped model buffer size =    70.31 MiB
//! llama_kv_cache:        CPU KV buffer size =    32.00 MiB
//! llama_context:        CPU  output buffer size =     0.49 MiB
//! sched_reserve:        CPU compute buffer size =   300.75 MiB
//! ```
//!
//! [`LlamaCppMemoryReport`] adds them up per part, over every buffer type: a model with
//! sliding-window layers prints two KV lines (the full and the sliding cache), a model split
//! between devices prints one model line per device. Sizes are read back into bytes, so
//! each one is exact to within the ±0.005 MiB of the printed rounding.

use std::collections::BTreeMap;

/// Bytes in a MiB, the unit of llama.cpp's buffer lines.
const MIB: f64 = 1024.0 * 1024.0;

/// The parts of llama.cpp's memory, as its log names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LlamaCppPart {
    /// `model buffer size`: the weights.
    Model,
    /// `KV buffer size`: the KV cache.
    KvCache,
    /// `compute buffer size`: the graph's intermediate tensors.
    Compute,
    /// `output buffer size`: logits (and embeddings) handed back to the caller.
    Output,
}

impl LlamaCppPart {
    /// Every part, in report order.
    pub const ALL: [LlamaCppPart; 4] = [
        LlamaCppPart::Model,
        LlamaCppPart::KvCache,
        LlamaCppPart::Compute,
        LlamaCppPart::Output,
    ];

    /// The words llama.cpp prints before `buffer size =`.
    fn marker(self) -> &'static str {
        match self {
            LlamaCppPart::Model => " model buffer size =",
            LlamaCppPart::KvCache => " KV buffer size =",
            LlamaCppPart::Compute => " compute buffer size =",
            LlamaCppPart::Output => " output buffer size =",
        }
    }

    /// A short name for tables and messages.
    pub fn name(self) -> &'static str {
        match self {
            LlamaCppPart::Model => "weights",
            LlamaCppPart::KvCache => "kv",
            LlamaCppPart::Compute => "compute",
            LlamaCppPart::Output => "output",
        }
    }
}

/// One buffer line: which part, which buffer type, how many bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferLine {
    /// The part.
    pub part: LlamaCppPart,
    /// The buffer type as printed (`CPU`, `CPU_Mapped`, `CUDA0`, …).
    pub buffer_type: String,
    /// The size.
    pub bytes: u64,
}

impl BufferLine {
    /// Reads one log line; `None` when it is not a buffer line.
    pub fn parse(line: &str) -> Option<BufferLine> {
        LlamaCppPart::ALL.into_iter().find_map(|part| {
            let (before, after) = line.split_once(part.marker())?;
            let buffer_type = before.split_whitespace().last()?.to_owned();
            let mib: f64 = after.trim().strip_suffix("MiB")?.trim().parse().ok()?;
            (mib.is_finite() && mib >= 0.0).then(|| BufferLine {
                part,
                buffer_type,
                bytes: (mib * MIB).round() as u64,
            })
        })
    }
}

/// The buffers one `llama-server` start reported, summed per part and per buffer type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LlamaCppMemoryReport {
    lines: Vec<BufferLine>,
}

impl LlamaCppMemoryReport {
    /// Takes in one log line; lines that are not buffer lines are ignored.
    pub fn observe(&mut self, line: &str) {
        if let Some(buffer) = BufferLine::parse(line) {
            self.lines.push(buffer);
        }
    }

    /// Reads a whole log.
    pub fn from_log(log: &str) -> LlamaCppMemoryReport {
        let mut report = LlamaCppMemoryReport::default();
        log.lines().for_each(|line| report.observe(line));
        report
    }

    /// Whether a line of `part` was seen.
    pub fn has(&self, part: LlamaCppPart) -> bool {
        self.lines.iter().any(|line| line.part == part)
    }

    /// Bytes of `part` over every buffer type.
    ///
    /// llama.cpp prints the compute buffers once per graph reservation; when it reserves
    /// again (it does after resolving automatic options) the later lines replace the
    /// earlier ones, so for the compute part only the last line of each buffer type counts.
    pub fn bytes(&self, part: LlamaCppPart) -> u64 {
        self.by_buffer_type(part).values().sum()
    }

    /// Bytes of `part` per buffer type.
    pub fn by_buffer_type(&self, part: LlamaCppPart) -> BTreeMap<&str, u64> {
        let mut sizes = BTreeMap::new();
        for line in self.lines.iter().filter(|line| line.part == part) {
            let size = sizes.entry(line.buffer_type.as_str()).or_insert(0);
            if part == LlamaCppPart::Compute {
                *size = line.bytes;
            } else {
                *size += line.bytes;
            }
        }
        sizes
    }

    /// Bytes of all parts.
    pub fn total_bytes(&self) -> u64 {
        LlamaCppPart::ALL
            .into_iter()
            .map(|part| self.bytes(part))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
load_tensors: loading model tensors, this can take a while... (mmap = true)
load_tensors:   CPU_Mapped model buffer size =    70.31 MiB
load_tensors:   CPU_REPACK model buffer size =    12.00 MiB
llama_context:        CPU  output buffer size =     0.49 MiB
llama_kv_cache_iswa: creating non-SWA KV cache, size = 4096 cells
llama_kv_cache:        CPU KV buffer size =    16.00 MiB
llama_kv_cache_iswa: creating     SWA KV cache, size = 768 cells
llama_kv_cache:        CPU KV buffer size =    15.00 MiB
sched_reserve:        CPU compute buffer size =   100.00 MiB
sched_reserve:        CPU compute buffer size =   300.75 MiB
sched_reserve: graph nodes  = 1386
";

    #[test]
    fn a_log_is_summed_per_part() {
        let report = LlamaCppMemoryReport::from_log(LOG);
        let mib = |x: f64| (x * MIB).round() as u64;
        assert_eq!(report.bytes(LlamaCppPart::Model), mib(70.31) + mib(12.0));
        assert_eq!(report.bytes(LlamaCppPart::KvCache), mib(31.0));
        assert_eq!(report.bytes(LlamaCppPart::Output), mib(0.49));
        assert_eq!(
            report.bytes(LlamaCppPart::Compute),
            mib(300.75),
            "a later reservation replaces an earlier one"
        );
        assert_eq!(
            report
                .by_buffer_type(LlamaCppPart::Model)
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            ["CPU_Mapped", "CPU_REPACK"]
        );
        assert!(report.has(LlamaCppPart::KvCache));
    }

    #[test]
    fn other_lines_and_malformed_sizes_are_ignored() {
        let report = LlamaCppMemoryReport::from_log(
            "llama_kv_cache: size = 32.00 MiB (4096 cells)\n\
             load_tensors: CPU model buffer size = lots MiB\n\
             load_tensors: CPU model buffer size = 1.00 GiB\n",
        );
        assert_eq!(report, LlamaCppMemoryReport::default());
        assert!(!report.has(LlamaCppPart::Model));
        assert_eq!(report.total_bytes(), 0);
    }

    #[test]
    fn device_buffers_are_named() {
        let line = BufferLine::parse("llama_kv_cache:      CUDA0 KV buffer size =  1024.00 MiB")
            .expect("a KV line");
        assert_eq!(line.buffer_type, "CUDA0");
        assert_eq!(line.bytes, 1 << 30);
    }
}
