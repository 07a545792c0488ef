//! ggml's tensor types: their numeric ids as stored in GGUF files, their block layout
//! (elements per block, bytes per block), and the byte size of a tensor of given dimensions.
//!
//! The table follows `enum ggml_type` in llama.cpp's `ggml/include/ggml.h` and the
//! `type_traits` table in `ggml/src/ggml.c` (block structs in `ggml/src/ggml-common.h`), as
//! of llama.cpp build 11434. Ids 4, 5 and 31..=33, 36..=38 belonged to types that were
//! removed from GGUF files and are rejected as unknown.

use std::fmt;

use crate::error::GgufError;

/// The most dimensions a ggml tensor has (`GGML_MAX_DIMS`).
pub const GGML_MAX_DIMS: usize = 4;

/// Elements per block of the k-quant and i-quant families (`QK_K`).
const QK_K: u64 = 256;

macro_rules! ggml_types {
    ($( $(#[$doc:meta])* $variant:ident = $id:literal, $name:literal, $block:expr, $bytes:expr; )*) => {
        /// A ggml tensor type, with the numeric id GGUF files store.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(non_camel_case_types)]
        #[non_exhaustive]
        pub enum GgmlType {
            $( $(#[$doc])* $variant = $id, )*
        }

        impl GgmlType {
            /// Every type, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant),*];

            /// The type with GGUF id `id`; an error naming the id when ggml has no such type.
            pub fn from_id(id: u32) -> Result<GgmlType, GgufError> {
                match id {
                    $( $id => Ok(GgmlType::$variant), )*
                    _ => Err(GgufError::UnknownGgmlType { id }),
                }
            }

            /// ggml's name for the type, e.g. `q4_K`, as llama.cpp prints it.
            pub fn name(self) -> &'static str {
                match self {
                    $( GgmlType::$variant => $name, )*
                }
            }

            /// Elements per block (1 for plain types).
            pub fn block_size(self) -> u64 {
                match self {
                    $( GgmlType::$variant => $block, )*
                }
            }

            /// Bytes per block (the element size for plain types).
            pub fn type_size(self) -> u64 {
                match self {
                    $( GgmlType::$variant => $bytes, )*
                }
            }
        }
    };
}

ggml_types! {
    /// 32-bit float.
    F32 = 0, "f32", 1, 4;
    /// 16-bit IEEE float.
    F16 = 1, "f16", 1, 2;
    /// 4-bit, one f16 scale per 32 elements.
    Q4_0 = 2, "q4_0", 32, 18;
    /// 4-bit, f16 scale and min per 32 elements.
    Q4_1 = 3, "q4_1", 32, 20;
    /// 5-bit, one f16 scale per 32 elements.
    Q5_0 = 6, "q5_0", 32, 22;
    /// 5-bit, f16 scale and min per 32 elements.
    Q5_1 = 7, "q5_1", 32, 24;
    /// 8-bit, one f16 scale per 32 elements.
    Q8_0 = 8, "q8_0", 32, 34;
    /// 8-bit with scale and sum per 32 elements (intermediate type).
    Q8_1 = 9, "q8_1", 32, 36;
    /// 2-bit k-quant.
    Q2_K = 10, "q2_K", QK_K, 84;
    /// 3-bit k-quant.
    Q3_K = 11, "q3_K", QK_K, 110;
    /// 4-bit k-quant.
    Q4_K = 12, "q4_K", QK_K, 144;
    /// 5-bit k-quant.
    Q5_K = 13, "q5_K", QK_K, 176;
    /// 6-bit k-quant.
    Q6_K = 14, "q6_K", QK_K, 210;
    /// 8-bit k-quant (intermediate type).
    Q8_K = 15, "q8_K", QK_K, 292;
    /// 2.06 bits per weight i-quant.
    IQ2_XXS = 16, "iq2_xxs", QK_K, 66;
    /// 2.31 bits per weight i-quant.
    IQ2_XS = 17, "iq2_xs", QK_K, 74;
    /// 3.06 bits per weight i-quant.
    IQ3_XXS = 18, "iq3_xxs", QK_K, 98;
    /// 1.56 bits per weight i-quant.
    IQ1_S = 19, "iq1_s", QK_K, 50;
    /// 4-bit non-linear, blocks of 32.
    IQ4_NL = 20, "iq4_nl", 32, 18;
    /// 3.44 bits per weight i-quant.
    IQ3_S = 21, "iq3_s", QK_K, 110;
    /// 2.5 bits per weight i-quant.
    IQ2_S = 22, "iq2_s", QK_K, 82;
    /// 4.25 bits per weight non-linear.
    IQ4_XS = 23, "iq4_xs", QK_K, 136;
    /// 8-bit integer.
    I8 = 24, "i8", 1, 1;
    /// 16-bit integer.
    I16 = 25, "i16", 1, 2;
    /// 32-bit integer.
    I32 = 26, "i32", 1, 4;
    /// 64-bit integer.
    I64 = 27, "i64", 1, 8;
    /// 64-bit float.
    F64 = 28, "f64", 1, 8;
    /// 1.75 bits per weight i-quant.
    IQ1_M = 29, "iq1_m", QK_K, 56;
    /// bfloat16.
    BF16 = 30, "bf16", 1, 2;
    /// Ternary, 1.69 bits per weight.
    TQ1_0 = 34, "tq1_0", QK_K, 54;
    /// Ternary, 2.06 bits per weight.
    TQ2_0 = 35, "tq2_0", QK_K, 66;
    /// Microscaling FP4: 32 e2m1 values and one e8m0 scale.
    MXFP4 = 39, "mxfp4", 32, 17;
    /// NVIDIA FP4: 64 e2m1 values with four e4m3 sub-block scales.
    NVFP4 = 40, "nvfp4", 64, 36;
    /// 1-bit, blocks of 128.
    Q1_0 = 41, "q1_0", 128, 18;
    /// 2-bit, blocks of 64.
    Q2_0 = 42, "q2_0", 64, 18;
}

impl GgmlType {
    /// The numeric id GGUF files store for this type.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Whether elements are stored in blocks of more than one (quantized types).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes of one row of `n_elements` elements: `n_elements / block_size * type_size`.
    /// `n_elements` must be a multiple of the block size.
    pub fn row_bytes(self, n_elements: u64) -> Result<u64, GgufError> {
        let block_size = self.block_size();
        if n_elements % block_size != 0 {
            return Err(GgufError::NotBlockAligned {
                ggml_type: self,
                first_dim: n_elements,
                block_size,
            });
        }
        (n_elements / block_size)
            .checked_mul(self.type_size())
            .ok_or_else(|| GgufError::SizeOverflow {
                ggml_type: self,
                dims: vec![n_elements],
            })
    }

    /// Bytes of a tensor of this type with dimensions `dims` (`ne[0]` first, as in GGUF).
    ///
    /// Blocks run along the first dimension, so `dims[0]` must be a multiple of the block
    /// size; the other dimensions multiply whole rows. A tensor with no dimensions is a
    /// scalar; any zero dimension makes the tensor empty.
    pub fn tensor_bytes(self, dims: &[u64]) -> Result<u64, GgufError> {
        if dims.len() > GGML_MAX_DIMS {
            return Err(GgufError::TooManyDimensions {
                n_dims: dims.len() as u64,
                max: GGML_MAX_DIMS,
            });
        }
        let overflow = || GgufError::SizeOverflow {
            ggml_type: self,
            dims: dims.to_vec(),
        };
        let first = dims.first().copied().unwrap_or(1);
        let row = self.row_bytes(first).map_err(|error| match error {
            GgufError::SizeOverflow { .. } => overflow(),
            other => other,
        })?;
        dims.iter()
            .skip(1)
            .try_fold(row, |bytes, &dim| bytes.checked_mul(dim))
            .ok_or_else(overflow)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Bytes of a tensor of type `ggml_type` with dimensions `dims` (`ne[0]` first); see
/// [`GgmlType::tensor_bytes`].
pub fn tensor_bytes(ggml_type: GgmlType, dims: &[u64]) -> Result<u64, GgufError> {
    ggml_type.tensor_bytes(dims)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for &ty in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(ty.id()).expect("known id"), ty);
            assert!(seen.insert(ty.id()), "duplicate id {}", ty.id());
        }
        assert_eq!(GgmlType::ALL.len(), 35);
    }

    #[test]
    fn ids_match_ggml_h() {
        let expected = [
            (GgmlType::F32, 0),
            (GgmlType::F16, 1),
            (GgmlType::Q4_0, 2),
            (GgmlType::Q4_1, 3),
            (GgmlType::Q5_0, 6),
            (GgmlType::Q5_1, 7),
            (GgmlType::Q8_0, 8),
            (GgmlType::Q8_1, 9),
            (GgmlType::Q2_K, 10),
            (GgmlType::Q3_K, 11),
            (GgmlType::Q4_K, 12),
            (GgmlType::Q5_K, 13),
            (GgmlType::Q6_K, 14),
            (GgmlType::Q8_K, 15),
            (GgmlType::IQ2_XXS, 16),
            (GgmlType::IQ2_XS, 17),
            (GgmlType::IQ3_XXS, 18),
            (GgmlType::IQ1_S, 19),
            (GgmlType::IQ4_NL, 20),
            (GgmlType::IQ3_S, 21),
            (GgmlType::IQ2_S, 22),
            (GgmlType::IQ4_XS, 23),
            (GgmlType::I8, 24),
            (GgmlType::I16, 25),
            (GgmlType::I32, 26),
            (GgmlType::I64, 27),
            (GgmlType::F64, 28),
            (GgmlType::IQ1_M, 29),
            (GgmlType::BF16, 30),
            (GgmlType::TQ1_0, 34),
            (GgmlType::TQ2_0, 35),
            (GgmlType::MXFP4, 39),
            (GgmlType::NVFP4, 40),
            (GgmlType::Q1_0, 41),
            (GgmlType::Q2_0, 42),
        ];
        for (ty, id) in expected {
            assert_eq!(ty.id(), id, "{ty}");
        }
    }

    #[test]
    fn removed_and_future_ids_are_errors_naming_the_id() {
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000, u32::MAX] {
            let error = GgmlType::from_id(id).expect_err("not a ggml type");
            assert!(matches!(error, GgufError::UnknownGgmlType { id: got } if got == id));
            assert!(error.to_string().contains(&id.to_string()), "{error}");
        }
    }

    #[test]
    fn hand_computed_sizes_of_quantized_tensors() {
        // Q4_0: 4096 x 4096 = 16_777_216 elements, 524_288 blocks of 18 bytes.
        assert_eq!(
            GgmlType::Q4_0.tensor_bytes(&[4096, 4096]).expect("valid"),
            9_437_184
        );
        // Q8_0: a 4096-element row is 128 blocks of 34 bytes = 4352 bytes; 32000 rows.
        assert_eq!(
            GgmlType::Q8_0.tensor_bytes(&[4096, 32000]).expect("valid"),
            139_264_000
        );
        // Q4_K: 4096 x 14336 (a Llama-3-8B ffn_up): 16 super-blocks of 144 bytes per row.
        assert_eq!(
            GgmlType::Q4_K.tensor_bytes(&[4096, 14336]).expect("valid"),
            33_030_144
        );
        // Q6_K: 4096 x 128256 (Llama-3-8B output): 16 x 210 bytes per row.
        assert_eq!(
            GgmlType::Q6_K.tensor_bytes(&[4096, 128256]).expect("valid"),
            430_940_160
        );
        // IQ2_XXS: 256 elements in 66 bytes = 2.0625 bits per weight.
        assert_eq!(
            GgmlType::IQ2_XXS.tensor_bytes(&[512, 2]).expect("valid"),
            264
        );
        // MXFP4: 32 elements in 17 bytes; a 3-D expert tensor.
        assert_eq!(
            GgmlType::MXFP4
                .tensor_bytes(&[2880, 2880, 32])
                .expect("valid"),
            2880 / 32 * 17 * 2880 * 32
        );
        // Plain types are element size times element count.
        assert_eq!(GgmlType::F16.tensor_bytes(&[64, 3]).expect("valid"), 384);
        assert_eq!(GgmlType::BF16.tensor_bytes(&[7]).expect("valid"), 14);
        assert_eq!(GgmlType::F32.tensor_bytes(&[]).expect("scalar"), 4);
        assert_eq!(GgmlType::F32.tensor_bytes(&[0, 5]).expect("empty"), 0);
    }

    #[test]
    fn bits_per_weight_match_the_published_figures() {
        let bpw = |ty: GgmlType| ty.type_size() as f64 * 8.0 / ty.block_size() as f64;
        assert_eq!(bpw(GgmlType::Q4_0), 4.5);
        assert_eq!(bpw(GgmlType::Q8_0), 8.5);
        assert_eq!(bpw(GgmlType::Q4_K), 4.5);
        assert_eq!(bpw(GgmlType::Q5_K), 5.5);
        assert_eq!(bpw(GgmlType::Q6_K), 6.5625);
        assert_eq!(bpw(GgmlType::Q2_K), 2.625);
        assert_eq!(bpw(GgmlType::IQ4_XS), 4.25);
        assert_eq!(bpw(GgmlType::IQ1_S), 1.5625);
        assert_eq!(bpw(GgmlType::IQ1_M), 1.75);
        assert_eq!(bpw(GgmlType::IQ3_XXS), 3.0625);
        assert_eq!(bpw(GgmlType::MXFP4), 4.25);
    }

    #[test]
    fn first_dimension_must_be_block_aligned() {
        let error = GgmlType::Q4_K
            .tensor_bytes(&[100, 4])
            .expect_err("100 % 256 != 0");
        assert!(matches!(
            error,
            GgufError::NotBlockAligned {
                first_dim: 100,
                block_size: 256,
                ..
            }
        ));
    }

    #[test]
    fn overflow_and_too_many_dims_are_errors() {
        assert!(matches!(
            GgmlType::F64.tensor_bytes(&[u64::MAX, 2]),
            Err(GgufError::SizeOverflow { .. })
        ));
        assert!(matches!(
            GgmlType::F32.tensor_bytes(&[1 << 40, 1 << 30]),
            Err(GgufError::SizeOverflow { .. })
        ));
        assert!(matches!(
            GgmlType::F32.tensor_bytes(&[1, 1, 1, 1, 1]),
            Err(GgufError::TooManyDimensions { n_dims: 5, .. })
        ));
    }
}
