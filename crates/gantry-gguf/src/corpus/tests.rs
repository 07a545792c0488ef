//! Unit tests of the corpus: every preset in every weight type reads back through this
//! crate's reader with the tensors and metadata llama.cpp expects, split models read back
//! as the whole model, and shapes llama.cpp would refuse are refused here first. Loading
//! the corpus into a real llama-server is the job of the memory-estimate test that uses it.

use std::collections::HashSet;

use super::*;
use crate::reader::GgufFile;
use crate::split::split_paths;
use crate::value::{MetadataArray, MetadataValue};

/// Every preset in every weight type, plus a tied-output llama.
fn corpus() -> Vec<CorpusModel> {
    let mut models = Vec::new();
    for arch in CorpusArch::ALL {
        for weight_type in CorpusModel::WEIGHT_TYPES {
            models.push(CorpusModel {
                weight_type,
                ..CorpusModel::preset(arch)
            });
        }
    }
    models.push(CorpusModel {
        tied_embeddings: true,
        ..CorpusModel::preset(CorpusArch::Llama)
    });
    models
}

fn read_back(model: &CorpusModel) -> (Vec<u8>, GgufFile) {
    let bytes = model.build().expect("presets are valid").to_bytes();
    let file = GgufFile::parse(&bytes).expect("the corpus writes valid GGUF");
    (bytes, file)
}

/// The tensor count, derived by hand from each architecture's `load_arch_tensors`.
fn expected_tensor_count(model: &CorpusModel) -> usize {
    let blocks = model.block_count as usize;
    let output = usize::from(!model.tied_embeddings);
    // token_embd and output_norm, then the tensors of one block.
    let per_block = match model.arch {
        CorpusArch::Llama => 9,
        CorpusArch::Qwen2 => 12,
        CorpusArch::Qwen3 => 11,
        CorpusArch::Gemma2 => 11,
        CorpusArch::Gemma3 => 13,
        CorpusArch::Phi3 => 6,
        CorpusArch::Qwen3Moe => 12,
        // token_embd, token_types, position_embd, token_embd_norm weight and bias.
        CorpusArch::Bert => return 5 + 16 * blocks,
    };
    2 + output + per_block * blocks
}

/// Tensor bytes from parameter counts: elements of the weight-type matrices and of the F32
/// tensors, derived by hand from each architecture's tensor shapes.
fn expected_tensor_bytes(model: &CorpusModel) -> u64 {
    let e = u64::from(model.embedding_length);
    let q = u64::from(model.head_count * model.head_dim);
    let kv = u64::from(model.head_count_kv * model.head_dim);
    let hd = u64::from(model.head_dim);
    let ff = u64::from(model.feed_forward_length);
    let vocab = u64::from(model.vocab_size);
    let attention = e * q + 2 * e * kv + q * e;
    let (block_matrix, block_f32) = match model.arch {
        CorpusArch::Llama => (attention + 3 * e * ff, 2 * e),
        CorpusArch::Qwen2 => (attention + 3 * e * ff, 2 * e + q + 2 * kv),
        CorpusArch::Qwen3 => (attention + 3 * e * ff, 2 * e + 2 * hd),
        CorpusArch::Gemma2 => (attention + 3 * e * ff, 4 * e),
        CorpusArch::Gemma3 => (attention + 3 * e * ff, 4 * e + 2 * hd),
        CorpusArch::Phi3 => (e * (q + 2 * kv) + q * e + 2 * e * ff + ff * e, 2 * e),
        CorpusArch::Qwen3Moe => {
            let experts = u64::from(model.expert_count);
            let expert_ff = u64::from(model.expert_feed_forward_length);
            (
                attention + 3 * e * expert_ff * experts,
                2 * e + 2 * hd + e * experts,
            )
        }
        CorpusArch::Bert => (attention + 2 * e * ff, q + 2 * kv + 6 * e + ff),
    };
    let blocks = u64::from(model.block_count);
    let (mut matrix, mut f32s) = (blocks * block_matrix, blocks * block_f32);
    matrix += e * vocab;
    if model.arch == CorpusArch::Bert {
        f32s += 2 * e + 2 * e + e * u64::from(model.context_length);
    } else {
        f32s += e;
        if !model.tied_embeddings {
            matrix += e * vocab;
        }
    }
    let t = model.weight_type;
    matrix / t.block_size() * t.type_size() + 4 * f32s
}

fn u64_of(file: &GgufFile, key: &str) -> Option<u64> {
    file.get_u64(key).expect("integer keys are integers")
}

#[test]
fn every_preset_in_every_weight_type_reads_back_with_its_tensors_and_metadata() {
    for model in corpus() {
        let label = format!("{} {}", model.arch, model.weight_type);
        let (bytes, file) = read_back(&model);
        let arch = model.arch.name();

        assert_eq!(file.tensors.len(), expected_tensor_count(&model), "{label}");
        assert_eq!(
            file.total_tensor_bytes(),
            expected_tensor_bytes(&model),
            "{label}"
        );
        assert_eq!(file.expected_file_len(), bytes.len() as u64, "{label}");

        let dims = file
            .model_dimensions()
            .expect("the dimension keys are there");
        assert_eq!(dims.architecture, arch, "{label}");
        assert_eq!(dims.block_count, u64::from(model.block_count), "{label}");
        assert_eq!(
            dims.context_length,
            u64::from(model.context_length),
            "{label}"
        );
        assert_eq!(
            dims.embedding_length,
            u64::from(model.embedding_length),
            "{label}"
        );
        assert_eq!(dims.head_count, u64::from(model.head_count), "{label}");
        assert_eq!(
            dims.head_count_kv,
            u64::from(model.head_count_kv),
            "{label}"
        );
        assert_eq!(dims.key_length, Some(u64::from(model.head_dim)), "{label}");
        assert_eq!(
            dims.value_length,
            Some(u64::from(model.head_dim)),
            "{label}"
        );
        assert_eq!(
            dims.vocab_size,
            Some(u64::from(model.vocab_size)),
            "{label}"
        );
        assert_eq!(
            u64_of(&file, "general.file_type"),
            model.file_type().map(u64::from),
            "{label}"
        );
        assert_eq!(
            u64_of(&file, &format!("{arch}.attention.sliding_window")),
            model.sliding_window.map(u64::from),
            "{label}"
        );
        let expert_key = format!("{arch}.expert_count");
        if model.arch.is_mixture_of_experts() {
            assert_eq!(u64_of(&file, &expert_key), Some(8), "{label}");
            let used = format!("{arch}.expert_used_count");
            assert_eq!(u64_of(&file, &used), Some(2), "{label}");
            let width = format!("{arch}.expert_feed_forward_length");
            assert_eq!(u64_of(&file, &width), Some(256), "{label}");
        } else {
            assert_eq!(u64_of(&file, &expert_key), None, "{label}");
        }
        assert_eq!(
            file.tensor("output.weight").is_none(),
            model.tied_embeddings || model.arch == CorpusArch::Bert,
            "{label}"
        );

        // Vectors and the matrices llama.cpp keeps in full precision are F32; every other
        // matrix has the weight type.
        for tensor in &file.tensors {
            let full_precision = tensor.dims.len() == 1
                || [
                    "ffn_gate_inp.weight",
                    "position_embd.weight",
                    "token_types.weight",
                ]
                .iter()
                .any(|suffix| tensor.name.ends_with(suffix));
            let expected = if full_precision {
                GgmlType::F32
            } else {
                model.weight_type
            };
            assert_eq!(tensor.ggml_type, expected, "{label}: {}", tensor.name);
        }
    }
}

#[test]
fn tokenizers_are_the_ones_llama_cpp_expects_of_each_architecture() {
    for arch in CorpusArch::ALL {
        let model = CorpusModel::preset(arch);
        let (_, file) = read_back(&model);
        let tokens = match file.get("tokenizer.ggml.tokens") {
            Some(MetadataValue::Array(MetadataArray::String(tokens))) => tokens.clone(),
            other => panic!("{arch}: tokens are {other:?}"),
        };
        assert_eq!(tokens.len(), model.vocab_size as usize, "{arch}");
        // llama.cpp asserts that no two tokens share a text.
        let unique: HashSet<&String> = tokens.iter().collect();
        assert_eq!(unique.len(), tokens.len(), "{arch}: duplicate tokens");
        let token_types = match file.get("tokenizer.ggml.token_type") {
            Some(MetadataValue::Array(MetadataArray::I32(types))) => types.clone(),
            other => panic!("{arch}: token types are {other:?}"),
        };
        assert_eq!(token_types.len(), tokens.len(), "{arch}");
        let tokenizer = file.get_str("tokenizer.ggml.model").expect("a string");
        let id = |key: &str| u64_of(&file, key).map(|id| tokens[id as usize].as_str());
        if arch == CorpusArch::Bert {
            assert_eq!(tokenizer, Some("bert"));
            assert_eq!(tokens[0], "[PAD]");
            assert_eq!(id("tokenizer.ggml.unknown_token_id"), Some("[UNK]"));
            assert_eq!(id("tokenizer.ggml.bos_token_id"), Some("[CLS]"));
            assert_eq!(id("tokenizer.ggml.seperator_token_id"), Some("[SEP]"));
            assert_eq!(id("tokenizer.ggml.mask_token_id"), Some("[MASK]"));
            assert_eq!(u64_of(&file, "tokenizer.ggml.token_type_count"), Some(2));
            assert_eq!(u64_of(&file, "bert.pooling_type"), Some(1));
            assert_eq!(
                file.get("bert.attention.causal"),
                Some(&MetadataValue::Bool(false))
            );
            assert!(tokens.contains(&"\u{2581}hello".to_owned()));
            assert_eq!(file.get("tokenizer.chat_template"), None);
        } else {
            assert_eq!(tokenizer, Some("llama"), "{arch}");
            assert_eq!(id("tokenizer.ggml.bos_token_id"), Some("<s>"), "{arch}");
            assert_eq!(id("tokenizer.ggml.eos_token_id"), Some("</s>"), "{arch}");
            assert_eq!(tokens[13], "<0x0A>", "{arch}: llama.cpp's newline token");
            assert!(file.get("tokenizer.chat_template").is_some(), "{arch}");
            let endoftext = tokens.iter().any(|t| t == "<|endoftext|>");
            assert_eq!(endoftext, arch == CorpusArch::Phi3, "{arch}: <|endoftext|>");
            let last = tokens.last().expect("a padded vocabulary");
            assert!(last.starts_with("<unused"), "{arch}: {last}");
        }
        // The padding is unused tokens, which never come out of tokenizing text.
        assert_eq!(token_types.last(), Some(&5), "{arch}");
    }
}

#[test]
fn presets_stay_small_enough_to_load_in_a_second() {
    for arch in CorpusArch::ALL {
        let bytes = expected_tensor_bytes(&CorpusModel::preset(arch));
        assert!(bytes < 96 << 20, "{arch}: {bytes} bytes of F32 weights");
    }
}

#[test]
fn a_split_model_reads_back_as_the_whole_model() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let model = CorpusModel {
        weight_type: GgmlType::Q4_K,
        ..CorpusModel::preset(CorpusArch::Qwen3Moe)
    };
    let paths = model
        .write(dir.path(), "moe", 3)
        .expect("the model is written");
    let names: Vec<String> = paths
        .iter()
        .map(|p| {
            p.file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(
        names,
        [
            "moe-00001-of-00003.gguf",
            "moe-00002-of-00003.gguf",
            "moe-00003-of-00003.gguf"
        ]
    );
    assert_eq!(split_paths(&paths[0]), Some(paths.clone()));

    let whole = GgufFile::parse(&model.build().expect("valid").to_bytes()).expect("valid");
    let mut first = GgufFile::open(&paths[0]).expect("the first part opens");
    assert_eq!(first.split_count(), 3);
    let total = i32::try_from(whole.tensors.len()).expect("a few dozen tensors");
    for (index, path) in paths.iter().enumerate() {
        let part = if index == 0 {
            first.clone()
        } else {
            GgufFile::open(path).expect("every part opens")
        };
        // The exact types llama.cpp's loader reads: u16, u16, i32.
        assert_eq!(
            part.get(SPLIT_NO_KEY),
            Some(&MetadataValue::U16(index as u16))
        );
        assert_eq!(part.get("split.count"), Some(&MetadataValue::U16(3)));
        assert_eq!(
            part.get(SPLIT_TENSORS_COUNT_KEY),
            Some(&MetadataValue::I32(total))
        );
        assert!(!part.tensors.is_empty(), "part {index} holds tensors");
        let on_disk = std::fs::metadata(path).expect("the part exists").len();
        assert_eq!(on_disk, part.expected_file_len(), "part {index}");
        if index == 0 {
            assert_eq!(first.metadata.len(), whole.metadata.len() + 3);
        } else {
            assert_eq!(part.metadata.len(), 3, "later parts hold only split keys");
            first
                .absorb_split_part(part)
                .expect("no tensor is in two parts");
        }
    }
    let summary = |file: &GgufFile| -> Vec<(String, Vec<u64>, GgmlType)> {
        let mut tensors: Vec<_> = file
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.dims.clone(), t.ggml_type))
            .collect();
        tensors.sort();
        tensors
    };
    assert_eq!(summary(&first), summary(&whole));
    assert_eq!(first.total_tensor_bytes(), whole.total_tensor_bytes());
    assert_eq!(first.model_dimensions().ok(), whole.model_dimensions().ok());
}

#[test]
fn one_part_is_the_plain_model_without_split_keys() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let model = CorpusModel::preset(CorpusArch::Gemma3);
    let paths = model.write(dir.path(), "gemma3", 1).expect("written");
    assert_eq!(paths, [dir.path().join("gemma3.gguf")]);
    let on_disk = std::fs::read(&paths[0]).expect("the file exists");
    assert_eq!(on_disk, model.build().expect("valid").to_bytes());
    let file = GgufFile::parse(&on_disk).expect("valid");
    assert!(file
        .metadata
        .iter()
        .all(|(key, _)| !key.starts_with("split.")));
}

#[test]
fn impossible_splits_are_rejected() {
    let model = CorpusModel::preset(CorpusArch::Llama);
    let tensors = expected_tensor_count(&model);
    for parts in [0, tensors as u32 + 1] {
        match model.build_parts(parts) {
            Err(CorpusError::InvalidSplit {
                parts: p,
                tensors: t,
            }) => {
                assert_eq!((p, t), (parts, tensors));
            }
            other => panic!("{parts} parts gave {other:?}"),
        }
    }
    assert_eq!(
        model
            .build_parts(tensors as u32)
            .expect("one tensor a part")
            .len(),
        tensors
    );
}

#[test]
fn shapes_llama_cpp_refuses_are_rejected_naming_the_field() {
    let cases: Vec<(CorpusModel, &str)> = vec![
        (
            CorpusModel {
                weight_type: GgmlType::Q6_K,
                ..CorpusModel::preset(CorpusArch::Llama)
            },
            "weight_type",
        ),
        (
            CorpusModel {
                head_count_kv: 3,
                ..CorpusModel::preset(CorpusArch::Llama)
            },
            "head_count_kv",
        ),
        (
            CorpusModel {
                head_dim: 128,
                ..CorpusModel::preset(CorpusArch::Qwen2)
            },
            "embedding_length",
        ),
        (
            CorpusModel {
                tied_embeddings: false,
                ..CorpusModel::preset(CorpusArch::Gemma2)
            },
            "ties",
        ),
        (
            CorpusModel {
                tied_embeddings: true,
                ..CorpusModel::preset(CorpusArch::Bert)
            },
            "no output layer",
        ),
        (
            CorpusModel {
                sliding_window: Some(128),
                ..CorpusModel::preset(CorpusArch::Qwen3)
            },
            "sliding window",
        ),
        (
            CorpusModel {
                expert_used_count: 9,
                ..CorpusModel::preset(CorpusArch::Qwen3Moe)
            },
            "expert_used_count",
        ),
        (
            CorpusModel {
                expert_count: 4,
                ..CorpusModel::preset(CorpusArch::Llama)
            },
            "dense",
        ),
        (
            CorpusModel {
                vocab_size: 100,
                ..CorpusModel::preset(CorpusArch::Phi3)
            },
            "vocab_size",
        ),
        (
            CorpusModel {
                weight_type: GgmlType::Q4_K,
                feed_forward_length: 1000,
                ..CorpusModel::preset(CorpusArch::Llama)
            },
            "feed_forward_length 1000",
        ),
        (
            CorpusModel {
                block_count: 0,
                ..CorpusModel::preset(CorpusArch::Bert)
            },
            "block_count",
        ),
    ];
    for (model, field) in cases {
        match model.build() {
            Err(error @ CorpusError::InvalidModel { .. }) => {
                let message = error.to_string();
                assert!(message.contains(field), "{message:?} names {field:?}");
            }
            other => panic!("{model:?} gave {other:?}"),
        }
    }
}
