//! Element types llama.cpp accepts for its KV cache (`--cache-type-k`, `--cache-type-v`) and
//! their storage size.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A ggml type usable for the KV cache.
///
/// Quantised types store elements in blocks of 32 with a per-block scale, so their size is
/// given per block: `block_bytes` for every `block_elements` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum KvCacheType {
    /// 32-bit float.
    F32,
    /// 16-bit float, llama.cpp's default.
    #[default]
    F16,
    /// bfloat16.
    Bf16,
    /// 8-bit blocks: 32 int8 plus an f16 scale = 34 bytes.
    Q8_0,
    /// 4-bit blocks: 16 bytes of nibbles plus an f16 scale = 18 bytes.
    Q4_0,
    /// 4-bit blocks with scale and minimum = 20 bytes.
    Q4_1,
    /// Non-linear 4-bit blocks = 18 bytes.
    Iq4Nl,
    /// 5-bit blocks: 16 bytes of nibbles, 4 bytes of high bits, an f16 scale = 22 bytes.
    Q5_0,
    /// 5-bit blocks with scale and minimum = 24 bytes.
    Q5_1,
}

impl KvCacheType {
    /// `(elements per block, bytes per block)`.
    pub fn block_layout(self) -> (u64, u64) {
        match self {
            KvCacheType::F32 => (1, 4),
            KvCacheType::F16 | KvCacheType::Bf16 => (1, 2),
            KvCacheType::Q8_0 => (32, 34),
            KvCacheType::Q4_0 | KvCacheType::Iq4Nl => (32, 18),
            KvCacheType::Q4_1 => (32, 20),
            KvCacheType::Q5_0 => (32, 22),
            KvCacheType::Q5_1 => (32, 24),
        }
    }

    /// Whether the type stores elements in quantised blocks (llama.cpp then needs flash
    /// attention for a V cache of it).
    pub fn is_quantized(self) -> bool {
        self.block_layout().0 > 1
    }

    /// Bytes of one row of `elements` elements. A partial final block is stored whole.
    pub fn row_bytes(self, elements: u64) -> u64 {
        let (block_elements, block_bytes) = self.block_layout();
        elements
            .div_ceil(block_elements)
            .saturating_mul(block_bytes)
    }

    /// The name llama.cpp uses on its command line.
    pub fn name(self) -> &'static str {
        match self {
            KvCacheType::F32 => "f32",
            KvCacheType::F16 => "f16",
            KvCacheType::Bf16 => "bf16",
            KvCacheType::Q8_0 => "q8_0",
            KvCacheType::Q4_0 => "q4_0",
            KvCacheType::Q4_1 => "q4_1",
            KvCacheType::Iq4Nl => "iq4_nl",
            KvCacheType::Q5_0 => "q5_0",
            KvCacheType::Q5_1 => "q5_1",
        }
    }
}

impl fmt::Display for KvCacheType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvCacheType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let all = [
            KvCacheType::F32,
            KvCacheType::F16,
            KvCacheType::Bf16,
            KvCacheType::Q8_0,
            KvCacheType::Q4_0,
            KvCacheType::Q4_1,
            KvCacheType::Iq4Nl,
            KvCacheType::Q5_0,
            KvCacheType::Q5_1,
        ];
        let wanted = s.trim().to_ascii_lowercase();
        all.into_iter().find(|t| t.name() == wanted).ok_or_else(|| {
            let names: Vec<&str> = all.iter().map(|t| t.name()).collect();
            format!(
                "unknown KV cache type, expected one of {}",
                names.join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_bytes_of_plain_and_block_types() {
        // 1024 f16 elements = 2048 bytes.
        assert_eq!(KvCacheType::F16.row_bytes(1024), 2048);
        // 1024 q8_0 elements = 32 blocks × 34 bytes = 1088 bytes.
        assert_eq!(KvCacheType::Q8_0.row_bytes(1024), 1088);
        // 1024 q4_0 elements = 32 blocks × 18 bytes = 576 bytes.
        assert_eq!(KvCacheType::Q4_0.row_bytes(1024), 576);
        // 33 q4_0 elements need two blocks.
        assert_eq!(KvCacheType::Q4_0.row_bytes(33), 36);
    }

    #[test]
    fn parses_llama_cpp_names() {
        assert_eq!("q8_0".parse::<KvCacheType>(), Ok(KvCacheType::Q8_0));
        assert_eq!("F16".parse::<KvCacheType>(), Ok(KvCacheType::F16));
        assert_eq!("iq4_nl".parse::<KvCacheType>(), Ok(KvCacheType::Iq4Nl));
        assert!("q3_k".parse::<KvCacheType>().is_err());
    }
}
