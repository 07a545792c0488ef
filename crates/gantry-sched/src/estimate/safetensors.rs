//! The safetensors header: which tensors a file holds, their types and shapes.
//!
//! A safetensors file starts with an 8-byte little-endian header length `N`, then `N` bytes
//! of JSON mapping each tensor name to `{"dtype", "shape", "data_offsets"}`, plus an optional
//! `__metadata__` string map. The caller reads the first 8 bytes, asks
//! [`header_length`] how many more to read, and hands the whole prefix to
//! [`SafetensorsHeader::parse`]; the tensor data itself is never needed.

use std::collections::BTreeMap;

use serde::Deserialize;
use thiserror::Error;

/// Largest header accepted, as in the reference implementation: a header is a table of
/// contents, and anything bigger is corrupt or hostile.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Why a safetensors header was rejected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SafetensorsError {
    /// Fewer than 8 bytes, or fewer bytes than the header length announces.
    #[error("safetensors header truncated: need {needed} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        needed: u64,
        /// Bytes given.
        have: u64,
    },
    /// The announced header length exceeds [`MAX_HEADER_BYTES`].
    #[error("safetensors header of {length} bytes exceeds the {MAX_HEADER_BYTES}-byte limit")]
    TooLarge {
        /// The announced length.
        length: u64,
    },
    /// The header is not the expected JSON.
    #[error("safetensors header is not valid JSON: {0}")]
    Json(String),
    /// A tensor entry is inconsistent.
    #[error("safetensors tensor {name}: {reason}")]
    InvalidTensor {
        /// Tensor name.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

/// Element types of safetensors, with their size in bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SafetensorsDtype {
    /// Boolean, one byte.
    Bool,
    /// 4-bit float (`F4`, e2m1), two per byte.
    F4,
    /// 8-bit floats (`F8_E4M3`, `F8_E5M2`, `F8_E8M0`).
    F8,
    /// 8-bit integers.
    I8,
    /// Unsigned 8-bit integers.
    U8,
    /// 16-bit floats.
    F16,
    /// bfloat16.
    Bf16,
    /// 16-bit integers.
    I16,
    /// Unsigned 16-bit integers.
    U16,
    /// 32-bit floats.
    F32,
    /// 32-bit integers.
    I32,
    /// Unsigned 32-bit integers.
    U32,
    /// 64-bit floats.
    F64,
    /// 64-bit integers.
    I64,
    /// Unsigned 64-bit integers.
    U64,
}

impl SafetensorsDtype {
    /// Parses the `dtype` string of a header entry; `None` for types this crate does not know.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "BOOL" => SafetensorsDtype::Bool,
            "F4" => SafetensorsDtype::F4,
            "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => SafetensorsDtype::F8,
            "I8" => SafetensorsDtype::I8,
            "U8" => SafetensorsDtype::U8,
            "F16" => SafetensorsDtype::F16,
            "BF16" => SafetensorsDtype::Bf16,
            "I16" => SafetensorsDtype::I16,
            "U16" => SafetensorsDtype::U16,
            "F32" => SafetensorsDtype::F32,
            "I32" => SafetensorsDtype::I32,
            "U32" => SafetensorsDtype::U32,
            "F64" => SafetensorsDtype::F64,
            "I64" => SafetensorsDtype::I64,
            "U64" => SafetensorsDtype::U64,
            _ => return None,
        })
    }

    /// Size of one element in bits.
    pub fn bits(self) -> u64 {
        match self {
            SafetensorsDtype::F4 => 4,
            SafetensorsDtype::Bool
            | SafetensorsDtype::F8
            | SafetensorsDtype::I8
            | SafetensorsDtype::U8 => 8,
            SafetensorsDtype::F16
            | SafetensorsDtype::Bf16
            | SafetensorsDtype::I16
            | SafetensorsDtype::U16 => 16,
            SafetensorsDtype::F32 | SafetensorsDtype::I32 | SafetensorsDtype::U32 => 32,
            SafetensorsDtype::F64 | SafetensorsDtype::I64 | SafetensorsDtype::U64 => 64,
        }
    }
}

/// One tensor of the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// Tensor name, e.g. `model.layers.0.mlp.up_proj.weight`.
    pub name: String,
    /// The `dtype` string as written in the file.
    pub dtype: String,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// Bytes of data: `data_offsets[1] - data_offsets[0]`, which the parser checks against
    /// `dtype × shape` when it knows the dtype.
    pub bytes: u64,
}

/// The parsed header of one safetensors file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SafetensorsHeader {
    /// Tensors, sorted by name.
    pub tensors: Vec<TensorEntry>,
}

#[derive(Deserialize)]
struct RawEntry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// Reads the header length from the first 8 bytes of a file and checks it against
/// [`MAX_HEADER_BYTES`]. The caller then needs `8 + length` bytes in all.
pub fn header_length(prefix: &[u8]) -> Result<u64, SafetensorsError> {
    let first: [u8; 8] = prefix
        .get(..8)
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or(SafetensorsError::Truncated {
            needed: 8,
            have: prefix.len() as u64,
        })?;
    let length = u64::from_le_bytes(first);
    if length > MAX_HEADER_BYTES {
        return Err(SafetensorsError::TooLarge { length });
    }
    Ok(length)
}

impl SafetensorsHeader {
    /// Parses the header from the start of a file: at least `8 + header_length` bytes; any
    /// bytes after the header are ignored.
    pub fn parse(bytes: &[u8]) -> Result<Self, SafetensorsError> {
        let length = header_length(bytes)?;
        // `length` ≤ MAX_HEADER_BYTES, so it fits in usize on every supported platform.
        let end = 8 + usize::try_from(length).map_err(|_| SafetensorsError::TooLarge { length })?;
        let json = bytes.get(8..end).ok_or(SafetensorsError::Truncated {
            needed: end as u64,
            have: bytes.len() as u64,
        })?;
        let raw: BTreeMap<String, serde_json::Value> =
            serde_json::from_slice(json).map_err(|e| SafetensorsError::Json(e.to_string()))?;
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, value) in raw {
            if name == "__metadata__" {
                continue;
            }
            let entry: RawEntry =
                serde_json::from_value(value).map_err(|e| SafetensorsError::InvalidTensor {
                    name: name.clone(),
                    reason: e.to_string(),
                })?;
            let [begin, finish] = entry.data_offsets;
            let Some(bytes) = finish.checked_sub(begin) else {
                return Err(SafetensorsError::InvalidTensor {
                    name,
                    reason: format!("data_offsets [{begin}, {finish}] run backwards"),
                });
            };
            if let Some(dtype) = SafetensorsDtype::parse(&entry.dtype) {
                let elements = entry
                    .shape
                    .iter()
                    .try_fold(1u64, |product, dim| product.checked_mul(*dim));
                let expected = elements
                    .and_then(|n| n.checked_mul(dtype.bits()))
                    .map(|bits| bits.div_ceil(8));
                if expected != Some(bytes) {
                    return Err(SafetensorsError::InvalidTensor {
                        name,
                        reason: format!(
                            "{} × {:?} does not fill data_offsets [{begin}, {finish}]",
                            entry.dtype, entry.shape
                        ),
                    });
                }
            }
            tensors.push(TensorEntry {
                name,
                dtype: entry.dtype,
                shape: entry.shape,
                bytes,
            });
        }
        Ok(SafetensorsHeader { tensors })
    }

    /// Bytes of all tensors of this file.
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes).sum()
    }
}

/// Weight bytes of a model sharded over several safetensors files.
pub fn total_weight_bytes(headers: &[SafetensorsHeader]) -> u64 {
    headers.iter().map(SafetensorsHeader::total_bytes).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(json: &str) -> Vec<u8> {
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json.as_bytes());
        bytes
    }

    #[test]
    fn parses_tensors_and_skips_metadata() {
        let json = r#"{
            "__metadata__": {"format": "pt"},
            "embed.weight": {"dtype": "BF16", "shape": [1000, 64], "data_offsets": [0, 128000]},
            "norm.weight": {"dtype": "F32", "shape": [64], "data_offsets": [128000, 128256]},
            "packed": {"dtype": "F4", "shape": [3, 5], "data_offsets": [128256, 128264]}
        }"#;
        let mut bytes = file(json);
        bytes.extend_from_slice(&[0u8; 16]); // tensor data after the header is ignored
        let header = SafetensorsHeader::parse(&bytes).expect("valid header");
        let names: Vec<&str> = header.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["embed.weight", "norm.weight", "packed"]);
        // 1000 × 64 × 2 B = 128_000; 64 × 4 B = 256; 15 × 4 bit = 60 bit → 8 B.
        assert_eq!(header.total_bytes(), 128_000 + 256 + 8);
        assert_eq!(total_weight_bytes(&[header.clone(), header]), 2 * 128_264);
    }

    #[test]
    fn rejects_lengths_over_the_limit_and_truncation() {
        let bytes = (MAX_HEADER_BYTES + 1).to_le_bytes();
        assert_eq!(
            SafetensorsHeader::parse(&bytes),
            Err(SafetensorsError::TooLarge {
                length: MAX_HEADER_BYTES + 1
            })
        );
        assert!(matches!(
            SafetensorsHeader::parse(&[1, 2, 3]),
            Err(SafetensorsError::Truncated { needed: 8, have: 3 })
        ));
        let mut short = file(r#"{"a": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}}"#);
        short.truncate(20);
        assert!(matches!(
            SafetensorsHeader::parse(&short),
            Err(SafetensorsError::Truncated { .. })
        ));
        assert_eq!(header_length(&file("{}")), Ok(2));
    }

    #[test]
    fn rejects_offsets_that_disagree_with_shape() {
        let bytes = file(r#"{"w": {"dtype": "F16", "shape": [4, 4], "data_offsets": [0, 16]}}"#);
        let e = SafetensorsHeader::parse(&bytes).expect_err("16 elements of F16 are 32 bytes");
        assert!(matches!(e, SafetensorsError::InvalidTensor { ref name, .. } if name == "w"));
        let bytes = file(r#"{"w": {"dtype": "F16", "shape": [1], "data_offsets": [4, 2]}}"#);
        assert!(SafetensorsHeader::parse(&bytes).is_err());
        assert!(matches!(
            SafetensorsHeader::parse(&file("[1, 2]")),
            Err(SafetensorsError::Json(_))
        ));
    }

    #[test]
    fn unknown_dtypes_are_sized_by_their_offsets() {
        let bytes = file(r#"{"q": {"dtype": "Q9_Z", "shape": [7], "data_offsets": [0, 5]}}"#);
        let header = SafetensorsHeader::parse(&bytes).expect("offsets suffice");
        assert_eq!(header.total_bytes(), 5);
    }
}
