//! The GGUF reader: header, metadata and tensor table of a v2 or v3 file, read from any
//! `Read` (a file, a socket, or a byte prefix) without touching the tensor data.
//!
//! Files can be a hundred gigabytes, so the reader consumes only what comes before the data
//! section; a prefix that ends too early gives [`GgufError::Truncated`], which tells a caller
//! to fetch more bytes. Counts and lengths read from the file are capped, and buffers grow
//! only as bytes actually arrive, so a forged length cannot make the reader allocate more
//! than the input it was given (plus a constant).

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use crate::error::GgufError;
use crate::ggml_type::{GgmlType, GGML_MAX_DIMS};
use crate::value::{MetadataArray, MetadataValue, ValueType};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// The longest string accepted (keys, values, tensor names). Chat templates and embedded
/// tokenizer JSON are the longest strings in practice, at a few megabytes.
pub const MAX_STRING_LENGTH: u64 = 256 << 20;
/// The most elements accepted in one metadata array (llama.cpp's own limit). Vocabularies
/// have a few hundred thousand entries.
pub const MAX_ARRAY_LENGTH: u64 = 1 << 30;
/// The most tensors accepted. The largest mixture-of-experts models have a few thousand.
pub const MAX_TENSOR_COUNT: u64 = 1 << 20;
/// The most metadata entries accepted.
pub const MAX_METADATA_COUNT: u64 = 1 << 20;
/// The deepest array nesting accepted (llama.cpp itself writes none).
pub const MAX_ARRAY_NESTING: usize = 8;

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions, `ne[0]` (the contiguous one) first; at most [`GGML_MAX_DIMS`].
    pub dims: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Offset of the tensor's bytes from the start of the data section; a multiple of the
    /// file's alignment.
    pub offset: u64,
    /// Bytes of the tensor, computed by the reader from `dims` and `ggml_type`.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (product of the dimensions; 1 for a scalar).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The block (layer) number for tensors named `blk.N.*`, `None` for the others.
    pub fn block_index(&self) -> Option<u64> {
        let rest = self.name.strip_prefix("blk.")?;
        let (number, _) = rest.split_once('.')?;
        if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        number.parse().ok()
    }
}

/// What a GGUF file says about itself before its tensor data: header, metadata and tensor
/// table, plus where the data section starts.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufFile {
    /// Format version: 2 or 3.
    pub version: u32,
    /// Metadata entries in file order; keys are unique and non-empty.
    pub metadata: Vec<(String, MetadataValue)>,
    /// The tensor table in file order; names are unique.
    pub tensors: Vec<TensorInfo>,
    /// Alignment of the data section and of every tensor in it (`general.alignment`, default
    /// [`DEFAULT_ALIGNMENT`]); a power of two.
    pub alignment: u64,
    /// Bytes from the start of the file to the end of the tensor table.
    pub header_len: u64,
    /// Absolute offset of the tensor data section: `header_len` rounded up to `alignment`.
    pub data_offset: u64,
}

impl GgufFile {
    /// Reads the header, metadata and tensor table from `reader`, which must be positioned at
    /// the start of the file. Stops right after the tensor table: the weights are never read.
    /// Wrap unbuffered sources (files, sockets) in a `BufReader`.
    pub fn read_header(reader: impl Read) -> Result<GgufFile, GgufError> {
        Parser {
            source: Source {
                inner: reader,
                position: 0,
            },
        }
        .parse()
    }

    /// Parses a byte slice holding the file or a prefix of it; [`GgufError::Truncated`] when
    /// the prefix ends before the tensor table does.
    pub fn parse(bytes: &[u8]) -> Result<GgufFile, GgufError> {
        GgufFile::read_header(bytes)
    }

    /// Opens `path` and reads its header, metadata and tensor table (not its weights).
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let file = File::open(path).map_err(|source| GgufError::Open {
            path: path.to_owned(),
            source,
        })?;
        GgufFile::read_header(BufReader::new(file))
    }

    /// The value of metadata key `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata
            .iter()
            .find_map(|(k, v)| (k == key).then_some(v))
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Size the whole file must have: the data section's start plus the end of the tensor
    /// that ends last (the data section is not padded at its end).
    pub fn expected_file_len(&self) -> u64 {
        self.tensors
            .iter()
            .map(|t| t.offset.saturating_add(t.n_bytes))
            .max()
            .map_or(self.header_len, |end| self.data_offset.saturating_add(end))
    }
}

/// A `Read` that knows its absolute position, for error messages and alignment.
struct Source<R> {
    inner: R,
    position: u64,
}

impl<R: Read> Source<R> {
    fn io_error(&self, what: &'static str, offset: u64, source: io::Error) -> GgufError {
        if source.kind() == io::ErrorKind::UnexpectedEof {
            GgufError::Truncated { offset, what }
        } else {
            GgufError::Io { offset, source }
        }
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let mut buf = [0u8; N];
        let start = self.position;
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| self.io_error(what, start, e))?;
        self.position += N as u64;
        Ok(buf)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Reads exactly `len` bytes. The buffer grows as data arrives (`read_to_end` doubles
    /// it), so a huge forged `len` costs at most about twice the bytes really present.
    fn bytes(&mut self, len: u64, what: &'static str) -> Result<Vec<u8>, GgufError> {
        let mut buf = Vec::with_capacity(len.min(64 * 1024) as usize);
        let start = self.position;
        let got = (&mut self.inner)
            .take(len)
            .read_to_end(&mut buf)
            .map_err(|e| self.io_error(what, start, e))?;
        self.position += got as u64;
        if (got as u64) < len {
            return Err(GgufError::Truncated {
                offset: self.position,
                what,
            });
        }
        Ok(buf)
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        if len > MAX_STRING_LENGTH {
            return Err(GgufError::LimitExceeded {
                what: "string length",
                count: len,
                limit: MAX_STRING_LENGTH,
            });
        }
        let bytes = self.bytes(len, what)?;
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }
}

fn check_count(what: &'static str, count: u64, limit: u64) -> Result<(), GgufError> {
    if count > limit {
        return Err(GgufError::LimitExceeded { what, count, limit });
    }
    Ok(())
}

struct Parser<R> {
    source: Source<R>,
}

impl<R: Read> Parser<R> {
    fn parse(mut self) -> Result<GgufFile, GgufError> {
        let magic: [u8; 4] = self.source.array("magic")?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = self.source.u32("version")?;
        if version != 2 && version != 3 {
            let hint = if version == 1 {
                ": GGUF v1 files are no longer supported; convert the model again"
            } else if matches!(version.swap_bytes(), 2 | 3) {
                ": the file looks big-endian, only little-endian files are supported"
            } else {
                ""
            };
            return Err(GgufError::UnsupportedVersion { version, hint });
        }
        let tensor_count = self.source.u64("tensor count")?;
        check_count("tensor count", tensor_count, MAX_TENSOR_COUNT)?;
        let metadata_count = self.source.u64("metadata count")?;
        check_count("metadata entry count", metadata_count, MAX_METADATA_COUNT)?;

        let metadata = self.metadata(metadata_count)?;
        let alignment = alignment_of(&metadata)?;
        let tensors = self.tensors(tensor_count, alignment)?;

        let header_len = self.source.position;
        let data_offset = header_len
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| GgufError::InvalidAlignment {
                found: alignment.to_string(),
            })?;
        Ok(GgufFile {
            version,
            metadata,
            tensors,
            alignment,
            header_len,
            data_offset,
        })
    }

    fn metadata(&mut self, count: u64) -> Result<Vec<(String, MetadataValue)>, GgufError> {
        // Capacity from the count is bounded by MAX_METADATA_COUNT but can still be large
        // for a forged count, so start small and let the vector grow with real entries.
        let mut entries = Vec::with_capacity(count.min(256) as usize);
        let mut seen = HashSet::new();
        for index in 0..count {
            let key = self.source.string("metadata key")?;
            if key.is_empty() {
                return Err(GgufError::EmptyKey { index });
            }
            if !seen.insert(key.clone()) {
                return Err(GgufError::DuplicateKey { key });
            }
            let type_id = self.source.u32("metadata value type")?;
            let value_type =
                ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
                    key: key.clone(),
                    id: type_id,
                })?;
            let value = self.value(value_type, &key)?;
            entries.push((key, value));
        }
        Ok(entries)
    }

    fn value(&mut self, value_type: ValueType, key: &str) -> Result<MetadataValue, GgufError> {
        const WHAT: &str = "metadata value";
        let s = &mut self.source;
        Ok(match value_type {
            ValueType::U8 => MetadataValue::U8(u8::from_le_bytes(s.array(WHAT)?)),
            ValueType::I8 => MetadataValue::I8(i8::from_le_bytes(s.array(WHAT)?)),
            ValueType::U16 => MetadataValue::U16(u16::from_le_bytes(s.array(WHAT)?)),
            ValueType::I16 => MetadataValue::I16(i16::from_le_bytes(s.array(WHAT)?)),
            ValueType::U32 => MetadataValue::U32(u32::from_le_bytes(s.array(WHAT)?)),
            ValueType::I32 => MetadataValue::I32(i32::from_le_bytes(s.array(WHAT)?)),
            ValueType::F32 => MetadataValue::F32(f32::from_le_bytes(s.array(WHAT)?)),
            ValueType::Bool => MetadataValue::Bool(s.array::<1>(WHAT)?[0] != 0),
            ValueType::String => MetadataValue::String(s.string(WHAT)?),
            ValueType::U64 => MetadataValue::U64(u64::from_le_bytes(s.array(WHAT)?)),
            ValueType::I64 => MetadataValue::I64(i64::from_le_bytes(s.array(WHAT)?)),
            ValueType::F64 => MetadataValue::F64(f64::from_le_bytes(s.array(WHAT)?)),
            ValueType::Array => MetadataValue::Array(self.array(key, 1)?),
        })
    }

    /// Reads an array (element type, count, elements); `depth` is 1 for a top-level array.
    fn array(&mut self, key: &str, depth: usize) -> Result<MetadataArray, GgufError> {
        if depth > MAX_ARRAY_NESTING {
            return Err(GgufError::NestingTooDeep {
                key: key.to_owned(),
                limit: MAX_ARRAY_NESTING,
            });
        }
        const WHAT: &str = "array elements";
        let type_id = self.source.u32("array element type")?;
        let element_type =
            ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
                key: key.to_owned(),
                id: type_id,
            })?;
        let count = self.source.u64("array length")?;
        check_count("array length", count, MAX_ARRAY_LENGTH)?;

        if let Some(size) = element_type.fixed_size() {
            // count <= 2^30 and size <= 8, so this cannot overflow.
            let bytes = self.source.bytes(count * size as u64, WHAT)?;
            return Ok(decode_fixed_array(element_type, &bytes));
        }
        let capacity = count.min(1024) as usize;
        Ok(match element_type {
            ValueType::String => {
                let mut strings = Vec::with_capacity(capacity);
                for _ in 0..count {
                    strings.push(self.source.string(WHAT)?);
                }
                MetadataArray::String(strings)
            }
            _ => {
                let mut arrays = Vec::with_capacity(capacity);
                for _ in 0..count {
                    arrays.push(self.array(key, depth + 1)?);
                }
                MetadataArray::Array(arrays)
            }
        })
    }

    fn tensors(&mut self, count: u64, alignment: u64) -> Result<Vec<TensorInfo>, GgufError> {
        let mut tensors = Vec::with_capacity(count.min(1024) as usize);
        let mut seen = HashSet::new();
        for _ in 0..count {
            let name = self.source.string("tensor name")?;
            let invalid = |source: GgufError| GgufError::InvalidTensor {
                name: name.clone(),
                source: Box::new(source),
            };
            let n_dims = self.source.u32("tensor dimension count")?;
            if n_dims as usize > GGML_MAX_DIMS {
                return Err(invalid(GgufError::TooManyDimensions {
                    n_dims: n_dims.into(),
                    max: GGML_MAX_DIMS,
                }));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(self.source.u64("tensor dimension")?);
            }
            let type_id = self.source.u32("tensor type")?;
            let ggml_type = GgmlType::from_id(type_id).map_err(invalid)?;
            let offset = self.source.u64("tensor offset")?;
            if offset % alignment != 0 {
                return Err(invalid(GgufError::MisalignedOffset { offset, alignment }));
            }
            let n_bytes = ggml_type.tensor_bytes(&dims).map_err(invalid)?;
            if !seen.insert(name.clone()) {
                return Err(GgufError::DuplicateTensor { name });
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                n_bytes,
            });
        }
        Ok(tensors)
    }
}

/// Decodes little-endian fixed-size elements; `bytes.len()` is a multiple of the size.
fn decode_fixed_array(element_type: ValueType, bytes: &[u8]) -> MetadataArray {
    fn le<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
        bytes
            .chunks_exact(N)
            .map(|chunk| {
                let mut a = [0u8; N];
                a.copy_from_slice(chunk);
                f(a)
            })
            .collect()
    }
    match element_type {
        ValueType::U8 => MetadataArray::U8(bytes.to_vec()),
        ValueType::I8 => MetadataArray::I8(le(bytes, i8::from_le_bytes)),
        ValueType::Bool => MetadataArray::Bool(bytes.iter().map(|&b| b != 0).collect()),
        ValueType::U16 => MetadataArray::U16(le(bytes, u16::from_le_bytes)),
        ValueType::I16 => MetadataArray::I16(le(bytes, i16::from_le_bytes)),
        ValueType::U32 => MetadataArray::U32(le(bytes, u32::from_le_bytes)),
        ValueType::I32 => MetadataArray::I32(le(bytes, i32::from_le_bytes)),
        ValueType::F32 => MetadataArray::F32(le(bytes, f32::from_le_bytes)),
        ValueType::U64 => MetadataArray::U64(le(bytes, u64::from_le_bytes)),
        ValueType::I64 => MetadataArray::I64(le(bytes, i64::from_le_bytes)),
        ValueType::F64 => MetadataArray::F64(le(bytes, f64::from_le_bytes)),
        ValueType::String | ValueType::Array => {
            unreachable!("the only caller passes types with a fixed size")
        }
    }
}

/// `general.alignment` when present (it must be a power-of-two u32), else the default.
fn alignment_of(metadata: &[(String, MetadataValue)]) -> Result<u64, GgufError> {
    match metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some((_, MetadataValue::U32(a))) if a.is_power_of_two() => Ok((*a).into()),
        Some((_, other)) => Err(GgufError::InvalidAlignment {
            found: format!("{other} ({})", other.value_type()),
        }),
    }
}
