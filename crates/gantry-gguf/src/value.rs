//! GGUF metadata values: the thirteen value types of the specification, typed arrays
//! (arrays of arrays included), and conversions a caller needs to read numbers out of them.

use std::fmt;

/// The type tag GGUF stores before every metadata value (and every array's elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// `GGUF_TYPE_UINT8`.
    U8 = 0,
    /// `GGUF_TYPE_INT8`.
    I8 = 1,
    /// `GGUF_TYPE_UINT16`.
    U16 = 2,
    /// `GGUF_TYPE_INT16`.
    I16 = 3,
    /// `GGUF_TYPE_UINT32`.
    U32 = 4,
    /// `GGUF_TYPE_INT32`.
    I32 = 5,
    /// `GGUF_TYPE_FLOAT32`.
    F32 = 6,
    /// `GGUF_TYPE_BOOL`: one byte, 0 or 1.
    Bool = 7,
    /// `GGUF_TYPE_STRING`: u64 length then UTF-8 bytes, no terminator.
    String = 8,
    /// `GGUF_TYPE_ARRAY`: u32 element type, u64 count, then the elements.
    Array = 9,
    /// `GGUF_TYPE_UINT64`.
    U64 = 10,
    /// `GGUF_TYPE_INT64`.
    I64 = 11,
    /// `GGUF_TYPE_FLOAT64`.
    F64 = 12,
}

impl ValueType {
    /// The type with GGUF id `id`, if the specification has one.
    pub fn from_id(id: u32) -> Option<ValueType> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The numeric id GGUF stores.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Bytes of one value for fixed-size types; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => Some(1),
            ValueType::U16 | ValueType::I16 => Some(2),
            ValueType::U32 | ValueType::I32 | ValueType::F32 => Some(4),
            ValueType::U64 | ValueType::I64 | ValueType::F64 => Some(8),
            ValueType::String | ValueType::Array => None,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        })
    }
}

/// One metadata value.
///
/// Strings are decoded as UTF-8; invalid sequences (which the specification forbids but
/// some converters have written) are replaced by U+FFFD rather than failing the whole file.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    /// u8.
    U8(u8),
    /// i8.
    I8(i8),
    /// u16.
    U16(u16),
    /// i16.
    I16(i16),
    /// u32.
    U32(u32),
    /// i32.
    I32(i32),
    /// f32.
    F32(f32),
    /// bool.
    Bool(bool),
    /// string.
    String(String),
    /// array of one element type.
    Array(MetadataArray),
    /// u64.
    U64(u64),
    /// i64.
    I64(i64),
    /// f64.
    F64(f64),
}

/// A GGUF array: every element has the same type, which is known even when it is empty.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataArray {
    /// u8 elements.
    U8(Vec<u8>),
    /// i8 elements.
    I8(Vec<i8>),
    /// u16 elements.
    U16(Vec<u16>),
    /// i16 elements.
    I16(Vec<i16>),
    /// u32 elements.
    U32(Vec<u32>),
    /// i32 elements.
    I32(Vec<i32>),
    /// f32 elements.
    F32(Vec<f32>),
    /// bool elements.
    Bool(Vec<bool>),
    /// string elements.
    String(Vec<String>),
    /// Nested arrays; each inner array has its own element type.
    Array(Vec<MetadataArray>),
    /// u64 elements.
    U64(Vec<u64>),
    /// i64 elements.
    I64(Vec<i64>),
    /// f64 elements.
    F64(Vec<f64>),
}

impl MetadataValue {
    /// The value's type tag.
    pub fn value_type(&self) -> ValueType {
        match self {
            MetadataValue::U8(_) => ValueType::U8,
            MetadataValue::I8(_) => ValueType::I8,
            MetadataValue::U16(_) => ValueType::U16,
            MetadataValue::I16(_) => ValueType::I16,
            MetadataValue::U32(_) => ValueType::U32,
            MetadataValue::I32(_) => ValueType::I32,
            MetadataValue::F32(_) => ValueType::F32,
            MetadataValue::Bool(_) => ValueType::Bool,
            MetadataValue::String(_) => ValueType::String,
            MetadataValue::Array(_) => ValueType::Array,
            MetadataValue::U64(_) => ValueType::U64,
            MetadataValue::I64(_) => ValueType::I64,
            MetadataValue::F64(_) => ValueType::F64,
        }
    }

    /// The value as an unsigned integer, for any integer type holding a non-negative value;
    /// `None` for negative integers and non-integers.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetadataValue::U8(v) => Some(v.into()),
            MetadataValue::U16(v) => Some(v.into()),
            MetadataValue::U32(v) => Some(v.into()),
            MetadataValue::U64(v) => Some(v),
            MetadataValue::I8(v) => u64::try_from(v).ok(),
            MetadataValue::I16(v) => u64::try_from(v).ok(),
            MetadataValue::I32(v) => u64::try_from(v).ok(),
            MetadataValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, for any integer type that fits in an i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetadataValue::U8(v) => Some(v.into()),
            MetadataValue::U16(v) => Some(v.into()),
            MetadataValue::U32(v) => Some(v.into()),
            MetadataValue::U64(v) => i64::try_from(v).ok(),
            MetadataValue::I8(v) => Some(v.into()),
            MetadataValue::I16(v) => Some(v.into()),
            MetadataValue::I32(v) => Some(v.into()),
            MetadataValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a float, for float types.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetadataValue::F32(v) => Some(v.into()),
            MetadataValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string slice, for strings.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetadataValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a bool, for bools.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetadataValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The array, for arrays.
    pub fn as_array(&self) -> Option<&MetadataArray> {
        match self {
            MetadataValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl MetadataArray {
    /// The type of the elements.
    pub fn element_type(&self) -> ValueType {
        match self {
            MetadataArray::U8(_) => ValueType::U8,
            MetadataArray::I8(_) => ValueType::I8,
            MetadataArray::U16(_) => ValueType::U16,
            MetadataArray::I16(_) => ValueType::I16,
            MetadataArray::U32(_) => ValueType::U32,
            MetadataArray::I32(_) => ValueType::I32,
            MetadataArray::F32(_) => ValueType::F32,
            MetadataArray::Bool(_) => ValueType::Bool,
            MetadataArray::String(_) => ValueType::String,
            MetadataArray::Array(_) => ValueType::Array,
            MetadataArray::U64(_) => ValueType::U64,
            MetadataArray::I64(_) => ValueType::I64,
            MetadataArray::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetadataArray::U8(v) => v.len(),
            MetadataArray::I8(v) => v.len(),
            MetadataArray::U16(v) => v.len(),
            MetadataArray::I16(v) => v.len(),
            MetadataArray::U32(v) => v.len(),
            MetadataArray::I32(v) => v.len(),
            MetadataArray::F32(v) => v.len(),
            MetadataArray::Bool(v) => v.len(),
            MetadataArray::String(v) => v.len(),
            MetadataArray::Array(v) => v.len(),
            MetadataArray::U64(v) => v.len(),
            MetadataArray::I64(v) => v.len(),
            MetadataArray::F64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as unsigned integers, for integer arrays whose elements are all
    /// non-negative; `None` otherwise.
    pub fn to_u64_vec(&self) -> Option<Vec<u64>> {
        fn conv<T: Copy>(v: &[T], f: impl Fn(T) -> Option<u64>) -> Option<Vec<u64>> {
            v.iter().map(|&x| f(x)).collect()
        }
        match self {
            MetadataArray::U8(v) => conv(v, |x| Some(x.into())),
            MetadataArray::U16(v) => conv(v, |x| Some(x.into())),
            MetadataArray::U32(v) => conv(v, |x| Some(x.into())),
            MetadataArray::U64(v) => Some(v.clone()),
            MetadataArray::I8(v) => conv(v, |x| u64::try_from(x).ok()),
            MetadataArray::I16(v) => conv(v, |x| u64::try_from(x).ok()),
            MetadataArray::I32(v) => conv(v, |x| u64::try_from(x).ok()),
            MetadataArray::I64(v) => conv(v, |x| u64::try_from(x).ok()),
            _ => None,
        }
    }
}

impl From<u8> for MetadataValue {
    fn from(v: u8) -> Self {
        MetadataValue::U8(v)
    }
}
impl From<i8> for MetadataValue {
    fn from(v: i8) -> Self {
        MetadataValue::I8(v)
    }
}
impl From<u16> for MetadataValue {
    fn from(v: u16) -> Self {
        MetadataValue::U16(v)
    }
}
impl From<i16> for MetadataValue {
    fn from(v: i16) -> Self {
        MetadataValue::I16(v)
    }
}
impl From<u32> for MetadataValue {
    fn from(v: u32) -> Self {
        MetadataValue::U32(v)
    }
}
impl From<i32> for MetadataValue {
    fn from(v: i32) -> Self {
        MetadataValue::I32(v)
    }
}
impl From<f32> for MetadataValue {
    fn from(v: f32) -> Self {
        MetadataValue::F32(v)
    }
}
impl From<bool> for MetadataValue {
    fn from(v: bool) -> Self {
        MetadataValue::Bool(v)
    }
}
impl From<String> for MetadataValue {
    fn from(v: String) -> Self {
        MetadataValue::String(v)
    }
}
impl From<&str> for MetadataValue {
    fn from(v: &str) -> Self {
        MetadataValue::String(v.to_owned())
    }
}
impl From<MetadataArray> for MetadataValue {
    fn from(v: MetadataArray) -> Self {
        MetadataValue::Array(v)
    }
}
impl From<u64> for MetadataValue {
    fn from(v: u64) -> Self {
        MetadataValue::U64(v)
    }
}
impl From<i64> for MetadataValue {
    fn from(v: i64) -> Self {
        MetadataValue::I64(v)
    }
}
impl From<f64> for MetadataValue {
    fn from(v: f64) -> Self {
        MetadataValue::F64(v)
    }
}

impl fmt::Display for MetadataValue {
    /// A short rendering for messages: scalars as themselves, strings quoted, arrays as
    /// their element type and length.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetadataValue::U8(v) => write!(f, "{v}"),
            MetadataValue::I8(v) => write!(f, "{v}"),
            MetadataValue::U16(v) => write!(f, "{v}"),
            MetadataValue::I16(v) => write!(f, "{v}"),
            MetadataValue::U32(v) => write!(f, "{v}"),
            MetadataValue::I32(v) => write!(f, "{v}"),
            MetadataValue::F32(v) => write!(f, "{v}"),
            MetadataValue::Bool(v) => write!(f, "{v}"),
            MetadataValue::String(v) => write!(f, "{v:?}"),
            MetadataValue::Array(a) => write!(f, "[{}; {}]", a.element_type(), a.len()),
            MetadataValue::U64(v) => write!(f, "{v}"),
            MetadataValue::I64(v) => write!(f, "{v}"),
            MetadataValue::F64(v) => write!(f, "{v}"),
        }
    }
}
