//! A GGUF v3 writer, used to produce test models: collects metadata and tensors in memory,
//! validates them as llama.cpp would, and writes the file in one pass.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use crate::error::GgufError;
use crate::ggml_type::GgmlType;
use crate::reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_NESTING};
use crate::value::{MetadataArray, MetadataValue};

/// The version this writer produces.
pub const GGUF_WRITE_VERSION: u32 = 3;
/// Tensor names must be shorter than this (ggml's `GGML_MAX_NAME`, counting the NUL).
pub const GGML_MAX_NAME: usize = 64;

/// One tensor waiting to be written.
#[derive(Debug, Clone)]
struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    data: Vec<u8>,
}

/// Builds a GGUF v3 file. Metadata and tensors are written in the order they were added;
/// tensor data is laid out contiguously, each tensor padded to the alignment.
#[derive(Debug, Clone, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetadataValue)>,
    keys: HashSet<String>,
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
}

impl GgufWriter {
    /// An empty file: no metadata, no tensors.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Adds a metadata entry. Keys must be non-empty and unique; `general.alignment` must be
    /// a power-of-two `u32` and sets the alignment of the tensor data.
    pub fn add_metadata(
        &mut self,
        key: impl Into<String>,
        value: impl Into<MetadataValue>,
    ) -> Result<&mut GgufWriter, GgufError> {
        let key = key.into();
        let value = value.into();
        if key.is_empty() {
            return Err(GgufError::EmptyKey {
                index: self.metadata.len() as u64,
            });
        }
        if self.keys.contains(&key) {
            return Err(GgufError::DuplicateKey { key });
        }
        if key == ALIGNMENT_KEY && !matches!(value, MetadataValue::U32(a) if a.is_power_of_two()) {
            return Err(GgufError::InvalidAlignment {
                found: format!("{value} ({})", value.value_type()),
            });
        }
        if let MetadataValue::Array(array) = &value {
            if nesting_depth(array) > MAX_ARRAY_NESTING {
                return Err(GgufError::NestingTooDeep {
                    key,
                    limit: MAX_ARRAY_NESTING,
                });
            }
        }
        self.keys.insert(key.clone());
        self.metadata.push((key, value));
        Ok(self)
    }

    /// Adds a tensor with its raw little-endian bytes; `dims` are `ne[0]` first. The data
    /// length must be what `dims` and `ggml_type` require.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ggml_type: GgmlType,
        data: Vec<u8>,
    ) -> Result<&mut GgufWriter, GgufError> {
        let name = name.into();
        if name.len() >= GGML_MAX_NAME {
            let count = name.len() as u64;
            return Err(GgufError::InvalidTensor {
                name,
                source: Box::new(GgufError::LimitExceeded {
                    what: "tensor name length",
                    count,
                    limit: (GGML_MAX_NAME - 1) as u64,
                }),
            });
        }
        if self.names.contains(&name) {
            return Err(GgufError::DuplicateTensor { name });
        }
        let expected = ggml_type
            .tensor_bytes(dims)
            .map_err(|source| GgufError::InvalidTensor {
                name: name.clone(),
                source: Box::new(source),
            })?;
        if data.len() as u64 != expected {
            return Err(GgufError::TensorDataSize {
                name,
                ggml_type,
                expected,
                actual: data.len() as u64,
            });
        }
        self.names.insert(name.clone());
        self.tensors.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            ggml_type,
            data,
        });
        Ok(self)
    }

    /// Adds an F32 tensor from its values.
    pub fn add_f32_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        values: &[f32],
    ) -> Result<&mut GgufWriter, GgufError> {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, dims, GgmlType::F32, data)
    }

    /// The metadata added so far, in order.
    pub fn metadata(&self) -> &[(String, MetadataValue)] {
        &self.metadata
    }

    /// Names of the tensors added so far, in order.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|t| t.name.as_str())
    }

    /// The bytes of tensor `name`, if it was added.
    pub fn tensor_data(&self, name: &str) -> Option<&[u8]> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.data.as_slice())
    }

    /// The alignment the data section will have.
    pub fn alignment(&self) -> u64 {
        match self.metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
            Some((_, MetadataValue::U32(a))) => (*a).into(),
            _ => DEFAULT_ALIGNMENT,
        }
    }

    /// Writes the file to `out`; returns the number of bytes written.
    pub fn write_to(&self, out: impl Write) -> io::Result<u64> {
        let mut out = Counting {
            inner: out,
            written: 0,
        };
        let alignment = self.alignment();

        out.write_all(&GGUF_MAGIC)?;
        out.write_all(&GGUF_WRITE_VERSION.to_le_bytes())?;
        out.write_all(&(self.tensors.len() as u64).to_le_bytes())?;
        out.write_all(&(self.metadata.len() as u64).to_le_bytes())?;
        for (key, value) in &self.metadata {
            write_string(&mut out, key)?;
            out.write_all(&value.value_type().id().to_le_bytes())?;
            write_value(&mut out, value)?;
        }

        let mut offset = 0u64;
        for tensor in &self.tensors {
            write_string(&mut out, &tensor.name)?;
            out.write_all(&(tensor.dims.len() as u32).to_le_bytes())?;
            for dim in &tensor.dims {
                out.write_all(&dim.to_le_bytes())?;
            }
            out.write_all(&tensor.ggml_type.id().to_le_bytes())?;
            out.write_all(&offset.to_le_bytes())?;
            offset = align_up(offset + tensor.data.len() as u64, alignment);
        }

        out.pad_to(alignment)?;
        for tensor in &self.tensors {
            out.write_all(&tensor.data)?;
            out.pad_to(alignment)?;
        }
        out.flush()?;
        Ok(out.written)
    }

    /// The file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        self.write_to(&mut bytes)
            .expect("writing to a Vec<u8> cannot fail");
        bytes
    }

    /// Writes the file at `path`, replacing any file there.
    pub fn write_file(&self, path: &Path) -> io::Result<()> {
        let mut out = BufWriter::new(File::create(path)?);
        self.write_to(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()
    }
}

fn align_up(n: u64, alignment: u64) -> u64 {
    n.div_ceil(alignment) * alignment
}

fn nesting_depth(array: &MetadataArray) -> usize {
    match array {
        MetadataArray::Array(inner) => 1 + inner.iter().map(nesting_depth).max().unwrap_or(0),
        _ => 1,
    }
}

/// A writer that counts bytes so that padding can be computed without seeking.
struct Counting<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Counting<W> {
    fn pad_to(&mut self, alignment: u64) -> io::Result<()> {
        let padding = align_up(self.written, alignment) - self.written;
        self.write_all(&vec![0u8; padding as usize])
    }
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn write_string(out: &mut impl Write, s: &str) -> io::Result<()> {
    out.write_all(&(s.len() as u64).to_le_bytes())?;
    out.write_all(s.as_bytes())
}

fn write_value(out: &mut impl Write, value: &MetadataValue) -> io::Result<()> {
    match value {
        MetadataValue::U8(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::I8(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::U16(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::I16(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::U32(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::I32(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::F32(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::Bool(v) => out.write_all(&[u8::from(*v)]),
        MetadataValue::String(v) => write_string(out, v),
        MetadataValue::Array(a) => write_array(out, a),
        MetadataValue::U64(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::I64(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::F64(v) => out.write_all(&v.to_le_bytes()),
    }
}

fn write_array(out: &mut impl Write, array: &MetadataArray) -> io::Result<()> {
    out.write_all(&array.element_type().id().to_le_bytes())?;
    out.write_all(&(array.len() as u64).to_le_bytes())?;
    fn each<T>(
        out: &mut impl Write,
        values: &[T],
        f: impl Fn(&mut dyn Write, &T) -> io::Result<()>,
    ) -> io::Result<()> {
        values.iter().try_for_each(|v| f(out, v))
    }
    match array {
        MetadataArray::U8(v) => out.write_all(v),
        MetadataArray::I8(v) => each(out, v, |o, x| o.write_all(&x.to_le_bytes())),
        MetadataArray::U16(v) => each(out, v, |o, x| o.write_all(&x.to_le_bytes())),
        MetadataArray::I16(v) => each(out, v, |o, x| o.write_all(&x.to_le_bytes())),
        MetadataArray::U32(v) => each(out, v, |o, x| o.write_all(&x.to_le_bytes())),
        MetadataArray::I32(v) => each(out, v, |o, x| o.write_all(&x.to_le_bytes())),
        MetadataArray::F32(v) => each(out, v, |o, x| o.write_all(&x.to_le_bytes())),
        MetadataArray::Bool(v) => each(out, v, |o, x| o.write_all(&[u8::from(*x)])),
        MetadataArray::String(v) => each(out, v, |mut o, x| write_string(&mut o, x)),
        MetadataArray::Array(v) => each(out, v, |mut o, x| write_array(&mut o, x)),
        MetadataArray::U64(v) => each(out, v, |o, x| o.write_all(&x.to_le_bytes())),
        MetadataArray::I64(v) => each(out, v, |o, x| o.write_all(&x.to_le_bytes())),
        MetadataArray::F64(v) => each(out, v, |o, x| o.write_all(&x.to_le_bytes())),
    }
}
