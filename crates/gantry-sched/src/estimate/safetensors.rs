//! The safetensors header: which tensors a file holds, their types and shapes, and so how
//! many bytes of weights the file carries.
//!
//! A safetensors file starts with an 8-byte little-endian header length `N`, then `N` bytes
//! of JSON mapping each tensor name to `{"dtype", "shape", "data_offsets"}`, plus an optional
//! `__metadata__` string map. The reference writer pads the JSON with spaces to a multiple
//! of 8 bytes (the padding is part of `N`). The tensor data follows at byte `8 + N`;
//! `data_offsets` are relative to that point, and the tensors tile the data section: sorted
//! by offset, each begins where the previous one ends, the first at 0, the last at the end
//! of the file.
//!
//! The caller reads the first 8 bytes, asks [`header_length`] how many more to read, and
//! hands the whole prefix to [`SafetensorsHeader::parse`]; the tensor data itself is never
//! needed. The parser checks what the header alone can show, as the reference
//! implementation does: every known dtype × shape fills its `data_offsets` exactly (in whole
//! bytes), and the offsets tile `[0, data end)` with no overlap and no gap. That makes
//! [`SafetensorsHeader::total_bytes`] the exact size of the data section, which is what the
//! engines load. A caller that also knows the file's length checks that the data section
//! ends with the file through [`SafetensorsHeader::check_file_length`].
//!
//! A dtype this crate does not know is sized by its offsets rather than refused: the tiling
//! check still bounds it, and a dtype added to the format later (as `F8_E8M0` and the `F6`
//! types were) then does not stop a model from being scheduled.

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
    /// A tensor entry is inconsistent: with itself (dtype × shape against its offsets), with
    /// the other tensors (overlap, gap) or with the file (data past its end).
    #[error("safetensors tensor {name}: {reason}")]
    InvalidTensor {
        /// Tensor name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The file holds bytes after the last tensor's data that no tensor describes (the
    /// reference implementation's `MetadataIncompleteBuffer`).
    #[error(
        "safetensors file has {file_length} bytes, but its header and tensors describe only \
         the first {described}: the header does not match the data"
    )]
    UndescribedBytes {
        /// `8 + header length + data section size`.
        described: u64,
        /// The file's length.
        file_length: u64,
    },
}

/// Element types of safetensors, with their size in bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SafetensorsDtype {
    /// Boolean, one byte.
    Bool,
    /// 4-bit float (`F4`, e2m1), two per byte.
    F4,
    /// 6-bit floats (`F6_E2M3`, `F6_E3M2`), four per three bytes.
    F6,
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
    /// Complex numbers of two 32-bit floats (`C64`).
    C64,
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
            "F6_E2M3" | "F6_E3M2" => SafetensorsDtype::F6,
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
            "C64" => SafetensorsDtype::C64,
            "I64" => SafetensorsDtype::I64,
            "U64" => SafetensorsDtype::U64,
            _ => return None,
        })
    }

    /// Size of one element in bits.
    pub fn bits(self) -> u64 {
        match self {
            SafetensorsDtype::F4 => 4,
            SafetensorsDtype::F6 => 6,
            SafetensorsDtype::Bool
            | SafetensorsDtype::F8
            | SafetensorsDtype::I8
            | SafetensorsDtype::U8 => 8,
            SafetensorsDtype::F16
            | SafetensorsDtype::Bf16
            | SafetensorsDtype::I16
            | SafetensorsDtype::U16 => 16,
            SafetensorsDtype::F32 | SafetensorsDtype::I32 | SafetensorsDtype::U32 => 32,
            SafetensorsDtype::F64
            | SafetensorsDtype::C64
            | SafetensorsDtype::I64
            | SafetensorsDtype::U64 => 64,
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
    /// `[begin, end)` of its data, relative to the start of the data section (byte
    /// `8 + header_length` of the file).
    pub data_offsets: [u64; 2],
    /// Bytes of data: `data_offsets[1] - data_offsets[0]`, which the parser checks against
    /// `dtype × shape` when it knows the dtype.
    pub bytes: u64,
}

/// The parsed header of one safetensors file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SafetensorsHeader {
    /// Tensors, sorted by name. Their `data_offsets` tile `[0, total_bytes())` without
    /// overlap or gap (checked by [`SafetensorsHeader::parse`]).
    pub tensors: Vec<TensorEntry>,
    /// `N`, the header length from the first 8 bytes: the JSON and its padding. The data
    /// section starts at byte `8 + header_length`.
    pub header_length: u64,
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
    ///
    /// Rejects, naming the tensor: an entry that is not `{dtype, shape, data_offsets}`;
    /// offsets that run backwards; a known dtype × shape that is not a whole number of bytes
    /// or does not fill its offsets; offsets that overlap another tensor's or leave a gap
    /// (the data section must be tiled from byte 0).
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
            let bytes = checked_size(&entry).map_err(|reason| SafetensorsError::InvalidTensor {
                name: name.clone(),
                reason,
            })?;
            tensors.push(TensorEntry {
                name,
                dtype: entry.dtype,
                shape: entry.shape,
                data_offsets: entry.data_offsets,
                bytes,
            });
        }
        check_tiling(&tensors)?;
        Ok(SafetensorsHeader {
            tensors,
            header_length: length,
        })
    }

    /// Bytes of all tensors of this file: the size of its data section, since the tensors
    /// tile it.
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes).sum()
    }

    /// The length the file must have: the 8-byte prefix, the header, the data section.
    pub fn expected_file_length(&self) -> u64 {
        8u64.saturating_add(self.header_length)
            .saturating_add(self.total_bytes())
    }

    /// Checks the header against the length of the file it came from: the data section must
    /// end exactly where the file ends, as the reference implementation requires. A tensor
    /// whose data runs past the end is named; bytes after the last tensor are
    /// [`SafetensorsError::UndescribedBytes`].
    pub fn check_file_length(&self, file_length: u64) -> Result<(), SafetensorsError> {
        let data_start = 8u64.saturating_add(self.header_length);
        let expected = self.expected_file_length();
        if file_length == expected {
            return Ok(());
        }
        if file_length > expected {
            return Err(SafetensorsError::UndescribedBytes {
                described: expected,
                file_length,
            });
        }
        if file_length < data_start {
            return Err(SafetensorsError::Truncated {
                needed: data_start,
                have: file_length,
            });
        }
        // The first tensor, in file order, whose data does not fit in the file. A parsed
        // header always has one (its tensors tile the data section); one built by hand
        // might not, and then the file is just short.
        let past_end = self
            .tensors
            .iter()
            .filter(|t| data_start.saturating_add(t.data_offsets[1]) > file_length)
            .min_by_key(|t| t.data_offsets);
        let Some(past_end) = past_end else {
            return Err(SafetensorsError::Truncated {
                needed: expected,
                have: file_length,
            });
        };
        let [begin, end] = past_end.data_offsets;
        Err(SafetensorsError::InvalidTensor {
            name: past_end.name.clone(),
            reason: format!(
                "data_offsets [{begin}, {end}] end at byte {} of the file, past its end at \
                 byte {file_length} (file truncated, or offsets wrong)",
                data_start.saturating_add(end)
            ),
        })
    }
}

/// The byte size of one entry: its offsets' span, checked against `dtype × shape` when the
/// dtype is known. The error is the reason, for [`SafetensorsError::InvalidTensor`].
fn checked_size(entry: &RawEntry) -> Result<u64, String> {
    let [begin, finish] = entry.data_offsets;
    let Some(bytes) = finish.checked_sub(begin) else {
        return Err(format!("data_offsets [{begin}, {finish}] run backwards"));
    };
    let Some(dtype) = SafetensorsDtype::parse(&entry.dtype) else {
        return Ok(bytes);
    };
    let bits = entry
        .shape
        .iter()
        .try_fold(1u64, |product, dim| product.checked_mul(*dim))
        .and_then(|elements| elements.checked_mul(dtype.bits()))
        .ok_or_else(|| format!("{} × {:?} overflows 64 bits", entry.dtype, entry.shape))?;
    if bits % 8 != 0 {
        return Err(format!(
            "{} × {:?} is {bits} bits, not a whole number of bytes",
            entry.dtype, entry.shape
        ));
    }
    if bits / 8 != bytes {
        return Err(format!(
            "{} × {:?} is {} bytes, but data_offsets [{begin}, {finish}] hold {bytes}",
            entry.dtype,
            entry.shape,
            bits / 8
        ));
    }
    Ok(bytes)
}

/// Checks that the tensors' offsets tile `[0, end)`: in offset order, each begins where the
/// previous one ends. Zero-size tensors take no room and may share an offset.
fn check_tiling(tensors: &[TensorEntry]) -> Result<(), SafetensorsError> {
    let mut in_file_order: Vec<&TensorEntry> = tensors.iter().collect();
    in_file_order.sort_by(|a, b| {
        a.data_offsets
            .cmp(&b.data_offsets)
            .then_with(|| a.name.cmp(&b.name))
    });
    let mut cursor = 0u64;
    let mut previous: Option<&TensorEntry> = None;
    for tensor in in_file_order {
        let [begin, end] = tensor.data_offsets;
        let reason = match previous {
            _ if begin == cursor => None,
            Some(before) if begin < cursor => Some(format!(
                "data_offsets [{begin}, {end}] overlap those of {} {:?}",
                before.name, before.data_offsets
            )),
            Some(before) => Some(format!(
                "data_offsets [{begin}, {end}] leave a gap of {} bytes after {} {:?}; the \
                 tensors must tile the data section",
                begin - cursor,
                before.name,
                before.data_offsets
            )),
            None => Some(format!(
                "data_offsets [{begin}, {end}] leave a gap of {begin} bytes at the start of \
                 the data section; the first tensor must begin at 0"
            )),
        };
        if let Some(reason) = reason {
            return Err(SafetensorsError::InvalidTensor {
                name: tensor.name.clone(),
                reason,
            });
        }
        cursor = end;
        previous = Some(tensor);
    }
    Ok(())
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
            "packed": {"dtype": "F4", "shape": [3, 6], "data_offsets": [128256, 128265]}
        }"#;
        let mut bytes = file(json);
        bytes.extend_from_slice(&[0u8; 16]); // tensor data after the header is ignored
        let header = SafetensorsHeader::parse(&bytes).expect("valid header");
        let names: Vec<&str> = header.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["embed.weight", "norm.weight", "packed"]);
        // 1000 × 64 × 2 B = 128_000; 64 × 4 B = 256; 18 × 4 bit = 72 bit = 9 B.
        assert_eq!(header.total_bytes(), 128_000 + 256 + 9);
        assert_eq!(header.header_length, json.len() as u64);
        assert_eq!(
            header.expected_file_length(),
            8 + json.len() as u64 + 128_265
        );
        assert_eq!(total_weight_bytes(&[header.clone(), header]), 2 * 128_265);
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
        // 15 F4 elements are 60 bits: the reference implementation refuses a partial byte.
        let bytes = file(r#"{"p": {"dtype": "F4", "shape": [3, 5], "data_offsets": [0, 8]}}"#);
        let e = SafetensorsHeader::parse(&bytes).expect_err("60 bits");
        assert!(e.to_string().contains("not a whole number of bytes"), "{e}");
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
