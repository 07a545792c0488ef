//! Checks gantry's safetensors weight accounting against a generated corpus of model
//! directories, written byte-exactly as the format specifies.
//!
//! Without a GPU the engines' real allocation cannot be measured, but the weight bytes they
//! load can: they are the data sections of the safetensors files. Every model of the corpus
//! is written to a temporary directory the way the reference `safetensors` writer lays a
//! file out (an 8-byte little-endian header length, the JSON header with `__metadata__`
//! first and the tensors in data order, spaces padding the header to a multiple of 8, then
//! the tensor data back to back), sharded ones with a `model.safetensors.index.json`. The
//! headers are then read the way the server reads them
//! (`gantry-server/src/controllers/analyze.rs`: `read_safetensors_header` takes the 8-byte
//! prefix, asks [`header_length`] for the rest, and hands both to
//! [`SafetensorsHeader::parse`]; the weight files are those the index's `weight_map` names,
//! else every `*.safetensors`; their `total_bytes` are summed and passed to
//! [`estimate_engine`]). The test checks that
//!
//! * per file, the computed bytes equal the file's size minus `8 + header length`;
//! * per model, they equal the index's `metadata.total_size`, and the engine claim carries
//!   them unchanged;
//! * per tensor, `product(shape) × bits / 8` (from a dtype table of the test's own, taken
//!   from the format's specification) equals the span of its `data_offsets`.
//!
//! It prints one table row per model (`cargo test -p gantry-sched --test safetensors_corpus
//! -- --nocapture`). A second group of tests feeds malformed files through the same path and
//! checks that each is refused with an error naming the tensor or the problem.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use gantry_sched::estimate::engine::{estimate_engine, EngineOptions, ServingEngine};
use gantry_sched::estimate::safetensors::{
    header_length, total_weight_bytes, SafetensorsError, SafetensorsHeader, MAX_HEADER_BYTES,
};
use gantry_sched::{HfModelConfig, ModelMemory};
use serde_json::json;

// ---------------------------------------------------------------------------------------
// Deterministic randomness
// ---------------------------------------------------------------------------------------

/// SplitMix64: a small seeded generator, so the corpus is the same on every run.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `low..=high`.
    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low + 1)
    }

    /// A multiple of `step` in `low..=high` (both multiples of `step`).
    fn multiple_of(&mut self, step: u64, low: u64, high: u64) -> u64 {
        step * self.between(low / step, high / step)
    }
}

// ---------------------------------------------------------------------------------------
// The writer
// ---------------------------------------------------------------------------------------

/// Bits per element of every dtype the safetensors format defines, written out here from the
/// format's specification rather than taken from the crate under test.
fn spec_bits(dtype: &str) -> u64 {
    match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => 8,
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "I64" | "U64" | "F64" | "C64" => 64,
        other => panic!("the corpus uses only specified dtypes, not {other}"),
    }
}

/// One tensor to write.
#[derive(Debug, Clone)]
struct Tensor {
    name: String,
    dtype: &'static str,
    shape: Vec<u64>,
}

impl Tensor {
    fn new(name: impl Into<String>, dtype: &'static str, shape: &[u64]) -> Self {
        Tensor {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    /// `product(shape) × bits / 8`; the generator only makes whole-byte tensors.
    fn bytes(&self) -> u64 {
        let bits = self.shape.iter().product::<u64>() * spec_bits(self.dtype);
        assert_eq!(bits % 8, 0, "{} is not a whole number of bytes", self.name);
        bits / 8
    }
}

/// The order in which a writer lays the tensor data out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataOrder {
    /// The reference writer: largest dtype first (for alignment), then by name.
    Reference,
    /// Plain name order, as some older writers did.
    ByName,
}

/// What was written for one tensor.
#[derive(Debug, Clone)]
struct WrittenTensor {
    tensor: Tensor,
    data_offsets: [u64; 2],
}

/// What was written for one file.
#[derive(Debug, Clone)]
struct WrittenFile {
    path: PathBuf,
    header_length: u64,
    file_length: u64,
    tensors: Vec<WrittenTensor>,
}

/// Writes one safetensors file byte by byte as the format specifies.
fn write_safetensors(
    path: &Path,
    tensors: &[Tensor],
    metadata: Option<&BTreeMap<&str, &str>>,
    order: DataOrder,
    rng: &mut SplitMix64,
) -> WrittenFile {
    let mut ordered: Vec<&Tensor> = tensors.iter().collect();
    match order {
        DataOrder::Reference => ordered.sort_by(|a, b| {
            spec_bits(b.dtype)
                .cmp(&spec_bits(a.dtype))
                .then_with(|| a.name.cmp(&b.name))
        }),
        DataOrder::ByName => ordered.sort_by(|a, b| a.name.cmp(&b.name)),
    }
    let mut written = Vec::with_capacity(ordered.len());
    let mut offset = 0u64;
    for tensor in ordered {
        let end = offset + tensor.bytes();
        written.push(WrittenTensor {
            tensor: tensor.clone(),
            data_offsets: [offset, end],
        });
        offset = end;
    }
    // The header, as the reference serialises it: compact JSON, `__metadata__` first, then
    // the tensors in data order (a JSON object's key order carries no meaning, so readers
    // must sort by offset themselves).
    let mut entries = Vec::new();
    if let Some(metadata) = metadata {
        entries.push(format!(
            "\"__metadata__\":{}",
            serde_json::to_string(metadata).expect("a string map serialises")
        ));
    }
    for w in &written {
        entries.push(format!(
            "{}:{}",
            serde_json::to_string(&w.tensor.name).expect("a string serialises"),
            json!({
                "dtype": w.tensor.dtype,
                "shape": w.tensor.shape,
                "data_offsets": w.data_offsets,
            })
        ));
    }
    let mut header = format!("{{{}}}", entries.join(",")).into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');

    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    let data_start = bytes.len();
    let data_length = usize::try_from(offset).expect("the corpus is small");
    while bytes.len() < data_start + data_length {
        bytes.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    bytes.truncate(data_start + data_length);
    std::fs::write(path, &bytes).expect("write a safetensors file");
    WrittenFile {
        path: path.to_owned(),
        header_length: header.len() as u64,
        file_length: bytes.len() as u64,
        tensors: written,
    }
}

// ---------------------------------------------------------------------------------------
// The corpus
// ---------------------------------------------------------------------------------------

/// How a checkpoint stores its linear layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quantization {
    /// Every tensor in one dtype.
    Plain(&'static str),
    /// W8A8 int8 (compressed-tensors): I8 weights, a per-channel scale of `scale_dtype`.
    Int8 { scale_dtype: &'static str },
    /// FP8 weights with per-tensor scalar scales (shape `[]`).
    Fp8(&'static str),
    /// GPTQ 4-bit: I32-packed weights and zeros, F16 group scales, I32 `g_idx`.
    Gptq,
    /// NVFP4: U8-packed pairs of e2m1, F8_E4M3 block scales, F32 scalar global scales.
    Nvfp4,
    /// MXFP4 with the native `F4` dtype and F8_E8M0 block scales.
    Mxfp4,
}

/// The architecture of one generated model.
#[derive(Debug, Clone)]
struct Architecture {
    layers: u64,
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    intermediate: u64,
    vocab: u64,
    /// `Some(n)`: a mixture of `n` experts stored as 3-D tensors.
    experts: Option<u64>,
    /// Qwen2-style attention biases.
    attention_bias: bool,
    tie_embeddings: bool,
    /// The dtype of norms and embeddings.
    base_dtype: &'static str,
    quantization: Quantization,
}

impl Architecture {
    /// A random small architecture: dimensions multiples of 64 so that every packing divides.
    fn random(rng: &mut SplitMix64, base_dtype: &'static str, quantization: Quantization) -> Self {
        let head_dim = rng.multiple_of(64, 64, 128);
        let kv_heads = rng.between(1, 4);
        let heads = kv_heads * rng.between(1, 4);
        Architecture {
            layers: rng.between(1, 6),
            hidden: rng.multiple_of(64, 64, 256),
            heads,
            kv_heads,
            head_dim,
            intermediate: rng.multiple_of(64, 128, 512),
            vocab: rng.multiple_of(64, 256, 1024),
            experts: None,
            attention_bias: false,
            tie_embeddings: false,
            base_dtype,
            quantization,
        }
    }

    fn config(&self) -> serde_json::Value {
        json!({
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate,
            "vocab_size": self.vocab,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": self.tie_embeddings,
            "torch_dtype": "bfloat16",
        })
    }

    /// The linear layer `name` of shape `[out, in]`, with its quantization's companions.
    fn linear(&self, name: &str, out: u64, input: u64) -> Vec<Tensor> {
        match self.quantization {
            Quantization::Plain(dtype) => {
                vec![Tensor::new(format!("{name}.weight"), dtype, &[out, input])]
            }
            Quantization::Int8 { scale_dtype } => vec![
                Tensor::new(format!("{name}.weight"), "I8", &[out, input]),
                Tensor::new(format!("{name}.weight_scale"), scale_dtype, &[out, 1]),
            ],
            Quantization::Fp8(dtype) => vec![
                Tensor::new(format!("{name}.weight"), dtype, &[out, input]),
                Tensor::new(format!("{name}.weight_scale"), "F32", &[]),
                Tensor::new(format!("{name}.input_scale"), "F32", &[]),
            ],
            Quantization::Gptq => {
                let groups = input / 32;
                vec![
                    Tensor::new(format!("{name}.qweight"), "I32", &[input / 8, out]),
                    Tensor::new(format!("{name}.qzeros"), "I32", &[groups, out / 8]),
                    Tensor::new(format!("{name}.scales"), "F16", &[groups, out]),
                    Tensor::new(format!("{name}.g_idx"), "I32", &[input]),
                ]
            }
            Quantization::Nvfp4 => vec![
                Tensor::new(format!("{name}.weight"), "U8", &[out, input / 2]),
                Tensor::new(
                    format!("{name}.weight_scale"),
                    "F8_E4M3",
                    &[out, input / 16],
                ),
                Tensor::new(format!("{name}.weight_scale_2"), "F32", &[]),
                Tensor::new(format!("{name}.input_scale"), "F32", &[]),
            ],
            Quantization::Mxfp4 => vec![
                Tensor::new(format!("{name}.weight"), "F4", &[out, input]),
                Tensor::new(
                    format!("{name}.weight_scale"),
                    "F8_E8M0",
                    &[out, input / 32],
                ),
            ],
        }
    }

    /// Every tensor of the model, in no particular order.
    fn tensors(&self) -> Vec<Tensor> {
        let base = self.base_dtype;
        let (h, q, kv) = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
        );
        let mut tensors = vec![
            Tensor::new("model.embed_tokens.weight", base, &[self.vocab, h]),
            Tensor::new("model.norm.weight", base, &[h]),
        ];
        if !self.tie_embeddings {
            tensors.push(Tensor::new("lm_head.weight", base, &[self.vocab, h]));
        }
        for layer in 0..self.layers {
            let prefix = format!("model.layers.{layer}");
            tensors.push(Tensor::new(
                format!("{prefix}.input_layernorm.weight"),
                base,
                &[h],
            ));
            tensors.push(Tensor::new(
                format!("{prefix}.post_attention_layernorm.weight"),
                base,
                &[h],
            ));
            for (projection, out, input) in [
                ("q_proj", q, h),
                ("k_proj", kv, h),
                ("v_proj", kv, h),
                ("o_proj", h, q),
            ] {
                let name = format!("{prefix}.self_attn.{projection}");
                tensors.extend(self.linear(&name, out, input));
                if self.attention_bias && projection != "o_proj" {
                    tensors.push(Tensor::new(format!("{name}.bias"), base, &[out]));
                }
            }
            match self.experts {
                None => {
                    let i = self.intermediate;
                    for (projection, out, input) in
                        [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)]
                    {
                        tensors.extend(self.linear(
                            &format!("{prefix}.mlp.{projection}"),
                            out,
                            input,
                        ));
                    }
                }
                Some(experts) => {
                    let i = self.intermediate;
                    tensors.push(Tensor::new(
                        format!("{prefix}.mlp.router.weight"),
                        base,
                        &[experts, h],
                    ));
                    tensors.push(Tensor::new(
                        format!("{prefix}.mlp.router.bias"),
                        base,
                        &[experts],
                    ));
                    // gpt-oss style: every expert's projection in one 3-D tensor.
                    let (dtype, scale) = match self.quantization {
                        Quantization::Mxfp4 => ("F4", Some("F8_E8M0")),
                        _ => (base, None),
                    };
                    for (projection, rows, columns) in
                        [("gate_up_proj", 2 * i, h), ("down_proj", h, i)]
                    {
                        let name = format!("{prefix}.mlp.experts.{projection}");
                        tensors.push(Tensor::new(
                            format!("{name}.weight"),
                            dtype,
                            &[experts, rows, columns],
                        ));
                        if let Some(scale) = scale {
                            tensors.push(Tensor::new(
                                format!("{name}.weight_scale"),
                                scale,
                                &[experts, rows, columns / 32],
                            ));
                        }
                        tensors.push(Tensor::new(format!("{name}.bias"), base, &[experts, rows]));
                    }
                }
            }
        }
        tensors
    }
}

/// One model directory of the corpus.
#[derive(Debug, Clone)]
struct ModelSpec {
    name: &'static str,
    config: serde_json::Value,
    tensors: Vec<Tensor>,
    /// 1 without an index: `model.safetensors`; otherwise `model-0000i-of-0000n` shards and
    /// `model.safetensors.index.json`.
    shards: usize,
    /// Write an index even for a single file.
    index_for_single_file: bool,
    order: DataOrder,
    /// Leave `__metadata__` out of the headers (the format makes it optional).
    no_metadata: bool,
    /// Also write a `consolidated.safetensors` the index does not name, as some
    /// repositories do; the engines, and so the estimate, ignore it.
    stray_consolidated: bool,
}

impl ModelSpec {
    fn new(name: &'static str, architecture: &Architecture, shards: usize) -> Self {
        ModelSpec {
            name,
            config: architecture.config(),
            tensors: architecture.tensors(),
            shards,
            index_for_single_file: false,
            order: DataOrder::Reference,
            no_metadata: false,
            stray_consolidated: false,
        }
    }

    /// A model of loose tensors (buffers, odd shapes) with a small llama config.
    fn loose(name: &'static str, tensors: Vec<Tensor>, shards: usize) -> Self {
        let mut rng = SplitMix64(name.len() as u64);
        let architecture = Architecture::random(&mut rng, "BF16", Quantization::Plain("BF16"));
        ModelSpec {
            tensors,
            ..ModelSpec::new(name, &architecture, shards)
        }
    }
}

/// The corpus: 24 model directories, deterministic.
fn corpus() -> Vec<ModelSpec> {
    let mut rng = SplitMix64(0x5AFE_7E45_0125_C0DE);
    let mut models = Vec::new();
    let plain = |rng: &mut SplitMix64, dtype: &'static str| {
        Architecture::random(rng, dtype, Quantization::Plain(dtype))
    };

    models.push(ModelSpec::new("llama-f32", &plain(&mut rng, "F32"), 1));
    models.push(ModelSpec::new("llama-f16", &plain(&mut rng, "F16"), 1));
    models.push(ModelSpec::new(
        "llama-bf16-2shards",
        &plain(&mut rng, "BF16"),
        2,
    ));
    models.push(ModelSpec::new("llama-f64", &plain(&mut rng, "F64"), 1));
    let mut qwen = plain(&mut rng, "BF16");
    qwen.attention_bias = true;
    models.push(ModelSpec::new("qwen2-bias-5shards", &qwen, 5));
    let mut tied = plain(&mut rng, "BF16");
    tied.tie_embeddings = true;
    models.push(ModelSpec::new("llama-tied", &tied, 1));
    models.push(ModelSpec {
        stray_consolidated: true,
        ..ModelSpec::new("mistral-consolidated", &plain(&mut rng, "BF16"), 2)
    });
    models.push(ModelSpec {
        order: DataOrder::ByName,
        ..ModelSpec::new("llama-name-order", &plain(&mut rng, "F16"), 2)
    });
    models.push(ModelSpec {
        no_metadata: true,
        ..ModelSpec::new("llama-no-metadata", &plain(&mut rng, "BF16"), 1)
    });
    models.push(ModelSpec {
        index_for_single_file: true,
        ..ModelSpec::new("llama-indexed-1shard", &plain(&mut rng, "BF16"), 1)
    });

    let quantized = |rng: &mut SplitMix64, base: &'static str, quantization: Quantization| {
        Architecture::random(rng, base, quantization)
    };
    let int8_f32 = Quantization::Int8 { scale_dtype: "F32" };
    let int8_bf16 = Quantization::Int8 {
        scale_dtype: "BF16",
    };
    models.push(ModelSpec::new(
        "w8a8-int8-f32-scales",
        &quantized(&mut rng, "BF16", int8_f32),
        2,
    ));
    models.push(ModelSpec::new(
        "w8a8-int8-bf16-scales",
        &quantized(&mut rng, "BF16", int8_bf16),
        1,
    ));
    models.push(ModelSpec::new(
        "fp8-e4m3-5shards",
        &quantized(&mut rng, "BF16", Quantization::Fp8("F8_E4M3")),
        5,
    ));
    models.push(ModelSpec::new(
        "fp8-e5m2",
        &quantized(&mut rng, "F16", Quantization::Fp8("F8_E5M2")),
        1,
    ));
    models.push(ModelSpec::new(
        "gptq-int4",
        &quantized(&mut rng, "F16", Quantization::Gptq),
        2,
    ));
    models.push(ModelSpec::new(
        "nvfp4",
        &quantized(&mut rng, "BF16", Quantization::Nvfp4),
        2,
    ));
    let mut mxfp4 = quantized(&mut rng, "BF16", Quantization::Mxfp4);
    mxfp4.experts = Some(4);
    models.push(ModelSpec::new("mxfp4-moe-f4", &mxfp4, 1));
    let mut moe = plain(&mut rng, "BF16");
    moe.experts = Some(8);
    models.push(ModelSpec::new("moe-bf16-3d-5shards", &moe, 5));

    // Buffers some checkpoints carry besides weights.
    models.push(ModelSpec::loose(
        "buffers-bool-i64-f64",
        vec![
            Tensor::new("model.embed_tokens.weight", "BF16", &[512, 64]),
            Tensor::new("model.embeddings.position_ids", "I64", &[1, 512]),
            Tensor::new(
                "model.layers.0.self_attn.causal_mask",
                "BOOL",
                &[1, 1, 64, 64],
            ),
            Tensor::new("model.layers.0.self_attn.rotary_emb.inv_freq", "F64", &[32]),
            Tensor::new("model.layers.0.self_attn.token_type_ids", "I32", &[1, 512]),
            Tensor::new("model.layers.0.mlp.expert_bias_mask", "U8", &[8]),
            Tensor::new("model.norm.weight", "F32", &[64]),
        ],
        1,
    ));
    // Scalars, zero-size dimensions, 1-D and 3-D, spread over two shards.
    models.push(ModelSpec::loose(
        "odd-shapes-2shards",
        vec![
            Tensor::new("model.layers.0.self_attn.k_scale", "F32", &[]),
            Tensor::new("model.layers.0.self_attn.v_scale", "F32", &[]),
            Tensor::new("model.layers.0.self_attn.sinks", "BF16", &[0]),
            Tensor::new("model.layers.0.mlp.lora_A.weight", "F16", &[0, 96]),
            Tensor::new("model.layers.0.mlp.lora_B.weight", "F16", &[96, 0]),
            Tensor::new("model.layers.0.mlp.experts.empty", "BF16", &[4, 0, 8]),
            Tensor::new("model.layers.0.mlp.experts.weight", "BF16", &[3, 7, 11]),
            Tensor::new("model.layers.1.input_layernorm.weight", "F32", &[97]),
            Tensor::new("model.layers.1.mlp.down_proj.weight", "F16", &[13, 17]),
            Tensor::new("model.layers.1.flag", "BOOL", &[]),
            Tensor::new("model.layers.1.step", "I64", &[]),
        ],
        2,
    ));
    // Every remaining dtype the format defines.
    models.push(ModelSpec::loose(
        "dtype-zoo",
        vec![
            Tensor::new("zoo.i16", "I16", &[5, 3]),
            Tensor::new("zoo.u16", "U16", &[7]),
            Tensor::new("zoo.u32", "U32", &[2, 2, 2]),
            Tensor::new("zoo.u64", "U64", &[3]),
            Tensor::new("zoo.c64", "C64", &[4]),
            Tensor::new("zoo.f6_e2m3", "F6_E2M3", &[4, 8]),
            Tensor::new("zoo.f6_e3m2", "F6_E3M2", &[12]),
            Tensor::new("zoo.f8_e8m0", "F8_E8M0", &[9]),
            Tensor::new("zoo.f4", "F4", &[6, 2]),
        ],
        1,
    ));
    // Primes everywhere, so no dimension lines up with anything.
    models.push(ModelSpec::loose(
        "prime-shapes-2shards",
        (0..14u64)
            .map(|i| {
                let dtype = ["F16", "BF16", "F32", "I8"][(i % 4) as usize];
                let shape = [[31, 67], [101, 3], [7, 13], [127, 1]][(i % 4) as usize];
                Tensor::new(
                    format!("model.layers.{i}.mlp.up_proj.weight"),
                    dtype,
                    &shape,
                )
            })
            .collect(),
        2,
    ));
    // A vision-language model: language model fields under `text_config`, a vision tower in
    // F32 beside a BF16 language model.
    let text = plain(&mut rng, "BF16");
    let mut vlm = ModelSpec::new("vlm-text-config-5shards", &text, 5);
    vlm.config = json!({
        "architectures": ["LlavaForConditionalGeneration"],
        "text_config": text.config(),
        "vision_config": {"hidden_size": 64, "num_hidden_layers": 2},
    });
    for layer in 0..2 {
        for projection in ["q_proj", "k_proj", "v_proj", "out_proj"] {
            vlm.tensors.push(Tensor::new(
                format!("vision_tower.encoder.layers.{layer}.self_attn.{projection}.weight"),
                "F32",
                &[64, 64],
            ));
        }
    }
    vlm.tensors.push(Tensor::new(
        "multi_modal_projector.linear_1.weight",
        "F32",
        &[text.hidden, 64],
    ));
    models.push(vlm);
    // A larger file: a few MiB of data, so offsets exceed 2^20 and 2^21.
    let mut large = plain(&mut rng, "BF16");
    large.hidden = 512;
    large.intermediate = 1536;
    large.layers = 2;
    models.push(ModelSpec::new("llama-larger", &large, 1));

    models
}

// ---------------------------------------------------------------------------------------
// Writing and reading a model directory
// ---------------------------------------------------------------------------------------

/// What was written for one model directory.
struct WrittenModel {
    dir: PathBuf,
    files: Vec<WrittenFile>,
    /// `metadata.total_size` of the index, when one was written.
    index_total_size: Option<u64>,
}

fn write_model(root: &Path, spec: &ModelSpec, rng: &mut SplitMix64) -> WrittenModel {
    let dir = root.join(spec.name);
    std::fs::create_dir_all(&dir).expect("create the model directory");
    std::fs::write(dir.join("config.json"), spec.config.to_string()).expect("write config");
    let metadata = BTreeMap::from([("format", "pt")]);
    let metadata = (!spec.no_metadata).then_some(&metadata);

    // Deal the tensors into shards in name order, as `save_pretrained` fills shards in
    // state-dict order; every shard gets at least one.
    let mut sorted = spec.tensors.clone();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(
        sorted.len() >= spec.shards,
        "{}: a tensor per shard",
        spec.name
    );
    let indexed = spec.shards > 1 || spec.index_for_single_file;
    let mut files = Vec::new();
    for i in 0..spec.shards {
        let shard = &sorted[i * sorted.len() / spec.shards..(i + 1) * sorted.len() / spec.shards];
        let name = if indexed {
            format!("model-{:05}-of-{:05}.safetensors", i + 1, spec.shards)
        } else {
            "model.safetensors".to_owned()
        };
        files.push(write_safetensors(
            &dir.join(name),
            shard,
            metadata,
            spec.order,
            rng,
        ));
    }
    assert_eq!(
        files.len(),
        spec.shards,
        "{}: every shard written",
        spec.name
    );

    let index_total_size = indexed.then(|| {
        let total_size: u64 = spec.tensors.iter().map(Tensor::bytes).sum();
        let weight_map: BTreeMap<&str, String> = files
            .iter()
            .flat_map(|file| {
                let shard = file_name(&file.path);
                file.tensors
                    .iter()
                    .map(move |w| (w.tensor.name.as_str(), shard.clone()))
            })
            .collect();
        let index = json!({"metadata": {"total_size": total_size}, "weight_map": weight_map});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string())
            .expect("write the index");
        total_size
    });
    if spec.stray_consolidated {
        write_safetensors(
            &dir.join("consolidated.safetensors"),
            &spec.tensors,
            metadata,
            DataOrder::Reference,
            rng,
        );
    }
    WrittenModel {
        dir,
        files,
        index_total_size,
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .and_then(|name| name.to_str())
        .expect("corpus file names are UTF-8")
        .to_owned()
}

/// Reads one header as the server's `read_safetensors_header` does: the 8-byte prefix,
/// [`header_length`], exactly that many more bytes, [`SafetensorsHeader::parse`]; the tensor
/// data is never read.
fn read_header_like_the_server(path: &Path) -> Result<SafetensorsHeader, SafetensorsError> {
    let mut reader = BufReader::new(File::open(path).expect("open a corpus file"));
    let mut bytes = Vec::new();
    (&mut reader)
        .take(8)
        .read_to_end(&mut bytes)
        .expect("read the prefix");
    let length = header_length(&bytes)?;
    reader
        .take(length)
        .read_to_end(&mut bytes)
        .expect("read the header");
    SafetensorsHeader::parse(&bytes)
}

/// The weight files the server reads: those the index's `weight_map` names (sorted, once
/// each), else every `*.safetensors` of the directory.
fn weight_files_like_the_server(dir: &Path) -> Vec<PathBuf> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&index).expect("read the index"))
                .expect("the index is JSON");
        let names: BTreeSet<&str> = index["weight_map"]
            .as_object()
            .expect("the index has a weight_map")
            .values()
            .filter_map(serde_json::Value::as_str)
            .collect();
        return names.iter().map(|name| dir.join(name)).collect();
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("list the model directory")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "safetensors"))
        .collect();
    files.sort();
    files
}

// ---------------------------------------------------------------------------------------
// The check
// ---------------------------------------------------------------------------------------

#[test]
fn computed_weight_bytes_equal_the_safetensors_data_sections_of_every_corpus_model() {
    let root = tempfile::tempdir().expect("temp dir");
    let mut rng = SplitMix64(0xC0_4B05);
    let corpus = corpus();
    assert!(corpus.len() >= 20, "a corpus of at least 20 models");

    println!(
        "\n{:<24} {:>6} {:<50} {:>7} {:>14} {:>14}  match",
        "model", "shards", "dtypes", "tensors", "computed bytes", "file bytes"
    );
    let mut mismatches = Vec::new();
    let mut dtypes_seen = BTreeSet::new();
    for spec in &corpus {
        let written = write_model(root.path(), spec, &mut rng);

        // The files the server would read, and what it computes from their headers.
        let weight_files = weight_files_like_the_server(&written.dir);
        let expected_files: Vec<&PathBuf> = written.files.iter().map(|f| &f.path).collect();
        assert_eq!(
            weight_files.iter().collect::<Vec<_>>(),
            expected_files,
            "{}: the server reads exactly the written shards",
            spec.name
        );
        let headers: Vec<SafetensorsHeader> = weight_files
            .iter()
            .map(|path| {
                read_header_like_the_server(path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            })
            .collect();
        let computed: u64 = headers.iter().map(SafetensorsHeader::total_bytes).sum();
        assert_eq!(total_weight_bytes(&headers), computed);

        // Ground truth: the data sections as the files lie on disk.
        let mut file_data_bytes = 0u64;
        for (file, header) in written.files.iter().zip(&headers) {
            let on_disk = std::fs::metadata(&file.path)
                .expect("stat a corpus file")
                .len();
            assert_eq!(on_disk, file.file_length);
            assert_eq!(header.header_length, file.header_length, "{}", spec.name);
            assert_eq!(header.header_length % 8, 0, "headers are padded to 8 bytes");
            let data_section = on_disk - 8 - header.header_length;
            file_data_bytes += data_section;
            assert_eq!(
                header.total_bytes(),
                data_section,
                "{}",
                file.path.display()
            );
            assert_eq!(header.expected_file_length(), on_disk);
            header
                .check_file_length(on_disk)
                .unwrap_or_else(|e| panic!("{}: {e}", file.path.display()));

            // Per tensor: the spec's `product(shape) × bits / 8` fills the written offsets,
            // and the parser reports the same.
            assert_eq!(header.tensors.len(), file.tensors.len());
            for w in &file.tensors {
                let parsed = header
                    .tensors
                    .iter()
                    .find(|t| t.name == w.tensor.name)
                    .unwrap_or_else(|| panic!("{} is parsed", w.tensor.name));
                let spec_bytes =
                    w.tensor.shape.iter().product::<u64>() * spec_bits(w.tensor.dtype) / 8;
                assert_eq!(spec_bytes, w.data_offsets[1] - w.data_offsets[0]);
                assert_eq!(parsed.bytes, spec_bytes, "{}", w.tensor.name);
                assert_eq!(parsed.data_offsets, w.data_offsets, "{}", w.tensor.name);
                assert_eq!(parsed.shape, w.tensor.shape, "{}", w.tensor.name);
                assert_eq!(parsed.dtype, w.tensor.dtype, "{}", w.tensor.name);
                dtypes_seen.insert(w.tensor.dtype);
            }
        }
        if let Some(total_size) = written.index_total_size {
            assert_eq!(computed, total_size, "{}: index total_size", spec.name);
        }

        // The claim carries the weights unchanged, and its KV figure follows config.json.
        let config_bytes =
            std::fs::read(written.dir.join("config.json")).expect("read config.json");
        let config = HfModelConfig::parse(&config_bytes).expect("the corpus config parses");
        let claim = estimate_engine(
            computed,
            &config,
            &EngineOptions::defaults(ServingEngine::Vllm),
        )
        .expect("the corpus models are estimable");
        let ModelMemory::Engine(engine) = &claim.memory else {
            panic!("{}: an engine claim", spec.name);
        };
        assert_eq!(engine.weight_bytes, file_data_bytes, "{}", spec.name);
        assert_eq!(
            engine.kv_bytes_per_token_per_kv_head,
            2 * u64::from(config.num_hidden_layers) * config.head_dim * 2,
            "{}: 2 (K, V) × layers × head_dim × 2 bytes",
            spec.name
        );

        let dtypes: BTreeSet<&str> = spec.tensors.iter().map(|t| t.dtype).collect();
        let matches = computed == file_data_bytes
            && written.index_total_size.is_none_or(|size| size == computed);
        if !matches {
            mismatches.push(spec.name);
        }
        println!(
            "{:<24} {:>6} {:<50} {:>7} {:>14} {:>14}  {}",
            spec.name,
            spec.shards,
            dtypes.into_iter().collect::<Vec<_>>().join(","),
            spec.tensors.len(),
            computed,
            file_data_bytes,
            if matches { "yes" } else { "NO" }
        );
    }
    assert!(mismatches.is_empty(), "mismatches: {mismatches:?}");
    for dtype in [
        "F32", "F16", "BF16", "I8", "U8", "F8_E4M3", "F8_E5M2", "I32", "I64", "BOOL", "F64", "F4",
    ] {
        assert!(dtypes_seen.contains(dtype), "the corpus covers {dtype}");
    }
}

// ---------------------------------------------------------------------------------------
// Malformed files
// ---------------------------------------------------------------------------------------

/// A file from raw header JSON (padded like the reference writer) and `data` bytes of
/// tensor data.
fn raw_file(dir: &Path, name: &str, header: &str, data: usize) -> PathBuf {
    let mut json = header.as_bytes().to_vec();
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    bytes.resize(bytes.len() + data, 0xA5);
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write a malformed file");
    path
}

/// Reads a file as the server does, then checks it against its length; the error, shown as
/// the server shows it.
fn rejection(path: &Path) -> String {
    let length = std::fs::metadata(path).expect("stat").len();
    let result = read_header_like_the_server(path).and_then(|header| {
        header.check_file_length(length)?;
        Ok(header)
    });
    match result {
        Ok(header) => panic!("{} was accepted: {header:?}", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn overlapping_and_gapped_offsets_are_rejected_naming_the_tensor() {
    let dir = tempfile::tempdir().expect("temp dir");
    let overlap = raw_file(
        dir.path(),
        "overlap.safetensors",
        r#"{"__metadata__":{"format":"pt"},
            "model.layers.0.self_attn.q_proj.weight":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},
            "model.layers.0.self_attn.k_proj.weight":{"dtype":"F16","shape":[4],"data_offsets":[4,12]}}"#,
        12,
    );
    let e = rejection(&overlap);
    assert!(
        e.contains("model.layers.0.self_attn.k_proj.weight")
            && e.contains("overlap")
            && e.contains("q_proj"),
        "{e}"
    );

    // Two tensors on the same bytes: the sum of their sizes would count them twice.
    let aliased = raw_file(
        dir.path(),
        "aliased.safetensors",
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
            "b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
        8,
    );
    let e = rejection(&aliased);
    assert!(e.contains("tensor b") && e.contains("overlap"), "{e}");

    let gap = raw_file(
        dir.path(),
        "gap.safetensors",
        r#"{"model.norm.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
            "lm_head.weight":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}}"#,
        24,
    );
    let e = rejection(&gap);
    assert!(
        e.contains("lm_head.weight") && e.contains("gap of 8 bytes"),
        "{e}"
    );

    let late_start = raw_file(
        dir.path(),
        "late.safetensors",
        r#"{"w":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#,
        8,
    );
    let e = rejection(&late_start);
    assert!(
        e.contains("tensor w") && e.contains("must begin at 0"),
        "{e}"
    );

    let backwards = raw_file(
        dir.path(),
        "backwards.safetensors",
        r#"{"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}"#,
        0,
    );
    let e = rejection(&backwards);
    assert!(e.contains("tensor w") && e.contains("run backwards"), "{e}");
}

#[test]
fn offsets_past_the_end_and_undescribed_bytes_are_rejected() {
    let dir = tempfile::tempdir().expect("temp dir");
    let header = r#"{"model.embed_tokens.weight":{"dtype":"BF16","shape":[8,4],"data_offsets":[0,64]},
        "model.norm.weight":{"dtype":"BF16","shape":[4],"data_offsets":[64,72]}}"#;
    // The data stops 8 bytes short: the header parses, the file check names the tensor.
    let short = raw_file(dir.path(), "short.safetensors", header, 64);
    let e = rejection(&short);
    assert!(
        e.contains("model.norm.weight") && e.contains("past its end"),
        "{e}"
    );
    // Cut inside the first tensor: that one is named.
    let cut = raw_file(dir.path(), "cut.safetensors", header, 10);
    let e = rejection(&cut);
    assert!(e.contains("model.embed_tokens.weight"), "{e}");
    // Bytes after the last tensor that no tensor describes.
    let long = raw_file(dir.path(), "long.safetensors", header, 80);
    let e = rejection(&long);
    assert!(e.contains("describe only"), "{e}");
    assert!(matches!(
        SafetensorsHeader::parse(&std::fs::read(&long).expect("read"))
            .expect("the header itself is fine")
            .check_file_length(std::fs::metadata(&long).expect("stat").len()),
        Err(SafetensorsError::UndescribedBytes { .. })
    ));
    // A file that is all header and no data (how tests stand in for large models) parses;
    // only the length check notices.
    let header_only = raw_file(dir.path(), "header-only.safetensors", header, 0);
    let parsed = read_header_like_the_server(&header_only).expect("the header is valid");
    assert_eq!(parsed.total_bytes(), 72);
    assert!(rejection(&header_only).contains("model.embed_tokens.weight"));
}

#[test]
fn shapes_that_do_not_fill_their_offsets_are_rejected_naming_the_tensor() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, header, data, expected) in [
        (
            "short-offsets",
            r#"{"model.layers.3.mlp.up_proj.weight":{"dtype":"BF16","shape":[4,4],"data_offsets":[0,16]}}"#,
            16,
            "is 32 bytes, but data_offsets [0, 16] hold 16",
        ),
        (
            "scalar",
            r#"{"model.layers.0.self_attn.k_scale":{"dtype":"F32","shape":[],"data_offsets":[0,8]}}"#,
            8,
            "is 4 bytes, but data_offsets [0, 8] hold 8",
        ),
        (
            "zero-size",
            r#"{"model.layers.0.sinks":{"dtype":"F32","shape":[0,3],"data_offsets":[0,4]}}"#,
            4,
            "is 0 bytes",
        ),
        (
            "half-byte",
            r#"{"model.layers.0.mlp.experts.weight":{"dtype":"F4","shape":[3,5],"data_offsets":[0,8]}}"#,
            8,
            "60 bits, not a whole number of bytes",
        ),
        (
            "overflow",
            r#"{"huge":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#,
            8,
            "overflows",
        ),
    ] {
        let path = raw_file(dir.path(), &format!("{name}.safetensors"), header, data);
        let e = rejection(&path);
        let tensor = header
            .split('"')
            .nth(1)
            .expect("the header names its tensor");
        assert!(e.contains(tensor) && e.contains(expected), "{name}: {e}");
    }
}

#[test]
fn malformed_entries_and_headers_are_rejected() {
    let dir = tempfile::tempdir().expect("temp dir");
    // An entry without its offsets, or with a dtype that is not a string: the tensor is named.
    let missing = raw_file(
        dir.path(),
        "missing.safetensors",
        r#"{"lm_head.weight":{"dtype":"F16","shape":[2]}}"#,
        4,
    );
    let e = rejection(&missing);
    assert!(
        e.contains("lm_head.weight") && e.contains("data_offsets"),
        "{e}"
    );
    let numeric_dtype = raw_file(
        dir.path(),
        "numeric-dtype.safetensors",
        r#"{"lm_head.weight":{"dtype":16,"shape":[2],"data_offsets":[0,4]}}"#,
        4,
    );
    assert!(rejection(&numeric_dtype).contains("lm_head.weight"));
    // Not JSON, and not UTF-8.
    let garbage = raw_file(dir.path(), "garbage.safetensors", "{not json", 0);
    assert!(rejection(&garbage).contains("not valid JSON"));
    let not_utf8 = b"{\"\xE9\":1}";
    let latin1 = raw_with_prefix(
        dir.path(),
        "latin1.safetensors",
        not_utf8.len() as u64,
        not_utf8,
    );
    assert!(rejection(&latin1).contains("not valid JSON"));
}

#[test]
fn unknown_dtypes_are_sized_by_their_offsets_but_still_tiled() {
    // A dtype newer than this crate is not refused (the model may well load in an engine
    // built on a newer `safetensors`): its size is its offsets' span, which the tiling check
    // bounds, so the weight total stays the exact size of the data section.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = raw_file(
        dir.path(),
        "future.safetensors",
        r#"{"a":{"dtype":"F8_E4M3","shape":[3],"data_offsets":[0,3]},
            "b":{"dtype":"Q3_FUTURE","shape":[7,7],"data_offsets":[3,22]}}"#,
        22,
    );
    let header = read_header_like_the_server(&path).expect("offsets suffice");
    assert_eq!(header.total_bytes(), 22);
    header
        .check_file_length(std::fs::metadata(&path).expect("stat").len())
        .expect("the data section ends with the file");

    let overlapping = raw_file(
        dir.path(),
        "future-overlap.safetensors",
        r#"{"a":{"dtype":"F8_E4M3","shape":[3],"data_offsets":[0,3]},
            "b":{"dtype":"Q3_FUTURE","shape":[7,7],"data_offsets":[1,22]}}"#,
        22,
    );
    let e = rejection(&overlapping);
    assert!(e.contains("tensor b") && e.contains("overlap"), "{e}");
}

#[test]
fn header_lengths_over_the_limit_and_truncated_files_are_rejected() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A length over the limit is refused from the 8-byte prefix, before anything else is
    // read.
    let huge = dir.path().join("huge.safetensors");
    let mut bytes = (MAX_HEADER_BYTES + 1).to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(&huge, bytes).expect("write");
    let e = rejection(&huge);
    assert!(
        e.contains(&(MAX_HEADER_BYTES + 1).to_string()) && e.contains("limit"),
        "{e}"
    );
    let e = rejection(&raw_with_prefix(
        dir.path(),
        "max.safetensors",
        u64::MAX,
        b"{}",
    ));
    assert!(e.contains("exceeds"), "{e}");

    // Fewer than 8 bytes; fewer header bytes than announced.
    let tiny = dir.path().join("tiny.safetensors");
    std::fs::write(&tiny, [0x10, 0, 0]).expect("write");
    let e = rejection(&tiny);
    assert!(
        e.contains("truncated") && e.contains("need 8 bytes, have 3"),
        "{e}"
    );
    let cut = raw_with_prefix(
        dir.path(),
        "cut-header.safetensors",
        64,
        br#"{"w":{"dtype":"F16","shape":[1],"#,
    );
    let e = rejection(&cut);
    assert!(
        e.contains("truncated") && e.contains("need 72 bytes"),
        "{e}"
    );
}

/// A file with an arbitrary length prefix followed by `rest`.
fn raw_with_prefix(dir: &Path, name: &str, length: u64, rest: &[u8]) -> PathBuf {
    let mut bytes = length.to_le_bytes().to_vec();
    bytes.extend_from_slice(rest);
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write");
    path
}
