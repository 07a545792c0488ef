//! Unit tests across the reader, writer, model accessors and tiny model: round trips,
//! hand-made malformed files, and truncated or random input that must give errors, never
//! panics.

use proptest::prelude::*;

use crate::tiny_llama::{
    build_tiny_llama, tiny_llama_bytes, tiny_llama_vocabulary, TinyLlamaConfig, TokenType,
    TINY_LLAMA_CHAT_TEMPLATE,
};
use crate::*;

/// A little-endian byte builder for hand-made (often malformed) GGUF files.
#[derive(Default)]
struct Bytes(Vec<u8>);

impl Bytes {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Bytes {
        let mut b = Bytes::default();
        b.raw(b"GGUF").u32(version).u64(n_tensors).u64(n_kv);
        b
    }
    fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.extend_from_slice(bytes);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    fn string(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).raw(s.as_bytes())
    }
}

fn tiny() -> (GgufWriter, Vec<u8>, GgufFile) {
    let writer = build_tiny_llama(&TinyLlamaConfig::default()).expect("valid config");
    let bytes = writer.to_bytes();
    let file = GgufFile::parse(&bytes).expect("tiny model parses");
    (writer, bytes, file)
}

#[test]
fn tiny_model_round_trips_every_metadata_entry_and_tensor() {
    let (writer, bytes, file) = tiny();
    assert_eq!(file.version, 3);
    assert_eq!(file.metadata.as_slice(), writer.metadata());
    assert_eq!(file.alignment, 32);
    assert_eq!(file.data_offset % 32, 0);
    assert!(file.data_offset >= file.header_len && file.data_offset - file.header_len < 32);

    let names: Vec<&str> = writer.tensor_names().collect();
    let read_names: Vec<&str> = file.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(read_names, names);
    for tensor in &file.tensors {
        assert_eq!(tensor.ggml_type, GgmlType::F32);
        assert_eq!(
            tensor.n_bytes,
            tensor_bytes(tensor.ggml_type, &tensor.dims).expect("valid")
        );
        assert_eq!(tensor.n_bytes, tensor.n_elements() * 4);
        assert_eq!(tensor.offset % file.alignment, 0);
        let start = (file.data_offset + tensor.offset) as usize;
        let data = &bytes[start..start + tensor.n_bytes as usize];
        assert_eq!(
            Some(data),
            writer.tensor_data(&tensor.name),
            "{}",
            tensor.name
        );
    }
    // The writer pads after every tensor, llama.cpp's writer does the same.
    assert_eq!(
        bytes.len() as u64,
        file.expected_file_len().next_multiple_of(32)
    );
}

#[test]
fn tiny_model_has_what_llama_cpp_expects() {
    let (_, bytes, file) = tiny();
    let kb = bytes.len() / 1024;
    assert!((200..1024).contains(&kb), "tiny model is {kb} KiB");

    let vocab = tiny_llama_vocabulary();
    let tokens = file
        .get("tokenizer.ggml.tokens")
        .and_then(MetadataValue::as_array)
        .expect("tokens array");
    assert_eq!(tokens.len(), vocab.len());
    let MetadataArray::String(tokens) = tokens else {
        panic!("tokens are strings")
    };
    assert_eq!(&tokens[..3], ["<unk>", "<s>", "</s>"]);
    assert_eq!(tokens[3], "<0x00>");
    assert_eq!(tokens[3 + 0x0A], "<0x0A>");
    assert_eq!(tokens[3 + 255], "<0xFF>");
    assert!(tokens.contains(&"\u{2581}hello".to_owned()));
    let unique: std::collections::HashSet<_> = tokens.iter().collect();
    assert_eq!(unique.len(), tokens.len(), "token texts are unique");
    assert_eq!(vocab[0].token_type, TokenType::Unknown);
    assert_eq!(vocab[1].token_type, TokenType::Control);
    assert_eq!(vocab[3].token_type, TokenType::Byte);
    assert_eq!(
        file.get_str("tokenizer.ggml.model").expect("string"),
        Some("llama")
    );
    assert_eq!(
        file.get_str("tokenizer.chat_template").expect("string"),
        Some(TINY_LLAMA_CHAT_TEMPLATE)
    );
    assert_eq!(
        file.get("tokenizer.ggml.scores")
            .and_then(MetadataValue::as_array)
            .map(MetadataArray::len),
        Some(vocab.len())
    );
    for name in [
        "token_embd.weight",
        "output_norm.weight",
        "output.weight",
        "blk.1.attn_norm.weight",
        "blk.1.attn_q.weight",
        "blk.1.attn_k.weight",
        "blk.1.attn_v.weight",
        "blk.1.attn_output.weight",
        "blk.1.ffn_norm.weight",
        "blk.1.ffn_gate.weight",
        "blk.1.ffn_up.weight",
        "blk.1.ffn_down.weight",
    ] {
        assert!(file.tensor(name).is_some(), "missing {name}");
    }
    let n_vocab = vocab.len() as u64;
    assert_eq!(
        file.tensor("token_embd.weight").map(|t| t.dims.clone()),
        Some(vec![64, n_vocab])
    );
    assert_eq!(
        file.tensor("blk.0.ffn_down.weight").map(|t| t.dims.clone()),
        Some(vec![128, 64])
    );
    // Weights are finite and small.
    for tensor in &file.tensors {
        let start = (file.data_offset + tensor.offset) as usize;
        for chunk in bytes[start..start + tensor.n_bytes as usize].chunks_exact(4) {
            let v = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            assert!(v.is_finite() && v.abs() <= 1.0, "{}: {v}", tensor.name);
        }
    }
}

#[test]
fn tiny_model_is_deterministic_and_seeded() {
    assert_eq!(tiny_llama_bytes(), tiny_llama_bytes());
    let other = TinyLlamaConfig {
        seed: 7,
        ..TinyLlamaConfig::default()
    };
    assert_ne!(
        build_tiny_llama(&other).expect("valid").to_bytes(),
        tiny_llama_bytes()
    );
}

#[test]
fn tiny_model_config_is_validated() {
    for config in [
        TinyLlamaConfig {
            n_head: 3,
            ..TinyLlamaConfig::default()
        },
        TinyLlamaConfig {
            n_head_kv: 3,
            ..TinyLlamaConfig::default()
        },
        TinyLlamaConfig {
            n_layer: 0,
            ..TinyLlamaConfig::default()
        },
    ] {
        assert!(matches!(
            build_tiny_llama(&config),
            Err(GgufError::InvalidTinyLlamaConfig(_))
        ));
    }
}

#[test]
fn estimator_accessors_on_the_tiny_model() {
    let (_, _, file) = tiny();
    let vocab = tiny_llama_vocabulary().len() as u64;
    assert_eq!(
        file.model_dimensions().expect("all keys present"),
        ModelDimensions {
            architecture: "llama".into(),
            block_count: 2,
            context_length: 256,
            embedding_length: 64,
            head_count: 4,
            head_count_kv: 4,
            key_length: Some(16),
            value_length: Some(16),
            vocab_size: Some(vocab),
        }
    );

    let by_layer = file.tensor_bytes_by_layer();
    let embd = 64 * vocab * 4;
    let block = (64 + 64 * 64 * 4 + 64 + 3 * 64 * 128) * 4;
    assert_eq!(by_layer.blocks, vec![block, block]);
    assert_eq!(by_layer.input, embd);
    assert_eq!(by_layer.output, embd + 64 * 4);
    assert_eq!(by_layer.other, 0);
    assert_eq!(by_layer.total(), file.total_tensor_bytes());
    assert_eq!(by_layer.non_block(), 2 * embd + 64 * 4);
    assert!(!file.output_is_tied_to_embedding());
}

#[test]
fn head_count_kv_defaults_to_head_count_and_per_layer_arrays_give_the_maximum() {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "toy")
        .and_then(|w| w.add_metadata("toy.attention.head_count", 8u32))
        .and_then(|w| w.add_metadata("toy.block_count", 3u64))
        .and_then(|w| w.add_metadata("toy.feed_forward_length", MetadataArray::I32(vec![5, 9, 7])))
        .and_then(|w| w.add_metadata("toy.negative", -1i32))
        .and_then(|w| w.add_metadata("toy.float", 1.5f32))
        .expect("valid metadata");
    let file = GgufFile::parse(&w.to_bytes()).expect("parses");
    assert_eq!(file.head_count_kv().expect("defaults"), 8);
    assert_eq!(file.block_count().expect("u64 accepted"), 3);
    assert_eq!(
        file.get_u64("toy.feed_forward_length").expect("array"),
        Some(9)
    );
    assert_eq!(file.key_length().expect("optional"), None);
    assert!(matches!(
        file.context_length(),
        Err(GgufError::MissingKey { key }) if key == "toy.context_length"
    ));
    assert!(matches!(
        file.get_u64("toy.negative"),
        Err(GgufError::InvalidValue { .. })
    ));
    assert!(matches!(
        file.get_u64("toy.float"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(
        file.get_u64("general.architecture"),
        Err(GgufError::WrongType { .. })
    ));
    assert_eq!(file.vocab_size().expect("optional"), None);
}

#[test]
fn tensor_bytes_by_layer_separates_blocks_input_output_and_other() {
    let mut w = GgufWriter::new();
    let t = |w: &mut GgufWriter, name: &str, n: u64| {
        w.add_f32_tensor(name, &[n], &vec![0.0; n as usize])
            .map(|_| ())
            .expect("valid tensor");
    };
    t(&mut w, "token_embd.weight", 10);
    t(&mut w, "blk.0.attn_q.weight", 1);
    t(&mut w, "blk.2.attn_q.weight", 2);
    t(&mut w, "blk.2.ffn_up.weight", 3);
    t(&mut w, "blk.x.weird", 4);
    t(&mut w, "output_norm.weight", 5);
    t(&mut w, "rope_freqs.weight", 6);
    let file = GgufFile::parse(&w.to_bytes()).expect("parses");
    let by_layer = file.tensor_bytes_by_layer();
    assert_eq!(by_layer.blocks, vec![4, 0, 20]);
    assert_eq!(by_layer.input, 40);
    assert_eq!(by_layer.output, 20);
    assert_eq!(by_layer.other, 40);
    assert!(file.output_is_tied_to_embedding());
}

#[test]
fn every_value_type_round_trips_including_nested_and_empty_arrays() {
    let values: Vec<(&str, MetadataValue)> = vec![
        ("u8", MetadataValue::U8(200)),
        ("i8", MetadataValue::I8(-100)),
        ("u16", MetadataValue::U16(60_000)),
        ("i16", MetadataValue::I16(-30_000)),
        ("u32", MetadataValue::U32(4_000_000_000)),
        ("i32", MetadataValue::I32(-2_000_000_000)),
        ("f32", MetadataValue::F32(-1.25)),
        ("bool.t", MetadataValue::Bool(true)),
        ("bool.f", MetadataValue::Bool(false)),
        ("string", MetadataValue::String("héllo \u{2581}".into())),
        ("empty.string", MetadataValue::String(String::new())),
        ("u64", MetadataValue::U64(u64::MAX)),
        ("i64", MetadataValue::I64(i64::MIN)),
        ("f64", MetadataValue::F64(std::f64::consts::PI)),
        ("a.u8", MetadataArray::U8(vec![1, 2, 255]).into()),
        ("a.i8", MetadataArray::I8(vec![-1, 2]).into()),
        ("a.u16", MetadataArray::U16(vec![1, 65535]).into()),
        ("a.i16", MetadataArray::I16(vec![-5]).into()),
        ("a.u32", MetadataArray::U32(vec![]).into()),
        ("a.i32", MetadataArray::I32(vec![i32::MIN, i32::MAX]).into()),
        ("a.f32", MetadataArray::F32(vec![0.5, -0.0]).into()),
        (
            "a.bool",
            MetadataArray::Bool(vec![true, false, true]).into(),
        ),
        (
            "a.string",
            MetadataArray::String(vec!["x".into(), String::new()]).into(),
        ),
        ("a.empty.string", MetadataArray::String(vec![]).into()),
        ("a.u64", MetadataArray::U64(vec![u64::MAX]).into()),
        ("a.i64", MetadataArray::I64(vec![-1]).into()),
        ("a.f64", MetadataArray::F64(vec![1e300]).into()),
        (
            "a.nested",
            MetadataArray::Array(vec![
                MetadataArray::U32(vec![1, 2]),
                MetadataArray::String(vec!["in".into()]),
                MetadataArray::Array(vec![
                    MetadataArray::F64(vec![]),
                    MetadataArray::Array(vec![]),
                ]),
            ])
            .into(),
        ),
    ];
    let mut w = GgufWriter::new();
    for (key, value) in &values {
        w.add_metadata(*key, value.clone()).expect("valid");
    }
    let file = GgufFile::parse(&w.to_bytes()).expect("parses");
    assert_eq!(file.metadata.len(), values.len());
    for ((key, value), (read_key, read_value)) in values.iter().zip(&file.metadata) {
        assert_eq!(key, read_key);
        assert_eq!(value, read_value, "{key}");
        assert_eq!(value.value_type(), read_value.value_type());
    }
    assert!(file.tensors.is_empty());
}

#[test]
fn version_2_files_are_read() {
    let mut bytes = tiny().1;
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let file = GgufFile::parse(&bytes).expect("v2 has the same layout as v3");
    assert_eq!(file.version, 2);
    assert_eq!(file.tensors.len(), tiny().2.tensors.len());
}

#[test]
fn every_truncated_prefix_is_a_truncation_error_and_the_header_alone_suffices() {
    let (_, bytes, file) = tiny();
    let header_len = file.header_len as usize;
    for len in 0..header_len {
        match GgufFile::parse(&bytes[..len]) {
            Err(GgufError::Truncated { offset, .. }) => {
                assert!(offset <= len as u64, "offset {offset} past prefix {len}")
            }
            other => panic!("prefix of {len} bytes: expected Truncated, got {other:?}"),
        }
    }
    // Weights are never read: the header prefix alone gives the same answer.
    assert_eq!(
        GgufFile::parse(&bytes[..header_len]).expect("header only"),
        file
    );
    let error = GgufFile::parse(&bytes[..header_len / 2]).expect_err("truncated");
    assert!(error.to_string().contains("truncated"), "{error}");
}

/// A reader that hands out one byte per call, as a slow socket might.
struct Trickle<'a>(&'a [u8]);

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match (self.0.split_first(), buf.first_mut()) {
            (Some((&b, rest)), Some(slot)) => {
                *slot = b;
                self.0 = rest;
                Ok(1)
            }
            _ => Ok(0),
        }
    }
}

#[test]
fn reading_from_a_trickling_reader_gives_the_same_result() {
    let (_, bytes, file) = tiny();
    assert_eq!(
        GgufFile::read_header(Trickle(&bytes)).expect("parses"),
        file
    );
}

#[test]
fn open_reads_a_file_on_disk_and_names_a_missing_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("tiny.gguf");
    write_tiny_llama(&path).expect("write");
    assert_eq!(GgufFile::open(&path).expect("parses"), tiny().2);
    let missing = dir.path().join("missing.gguf");
    let error = GgufFile::open(&missing).expect_err("missing");
    assert!(matches!(error, GgufError::Open { .. }));
    assert!(error.to_string().contains("missing.gguf"), "{error}");
}

#[test]
fn bad_magic_and_unsupported_versions_are_rejected() {
    let mut bytes = tiny().1;
    bytes[0] = b'X';
    assert!(matches!(
        GgufFile::parse(&bytes),
        Err(GgufError::BadMagic { found }) if &found == b"XGUF"
    ));
    for (version, hint) in [
        (1u32, "v1"),
        (4, ""),
        (3u32.swap_bytes(), "big-endian"),
        (0, ""),
    ] {
        let bytes = Bytes::header(version, 0, 0).0;
        let error = GgufFile::parse(&bytes).expect_err("unsupported");
        assert!(matches!(error, GgufError::UnsupportedVersion { version: v, .. } if v == version));
        assert!(error.to_string().contains(hint), "{error}");
    }
}

#[test]
fn absurd_counts_and_lengths_are_rejected_without_allocating() {
    // Tensor and metadata counts over the limit.
    let error = GgufFile::parse(&Bytes::header(3, 1 << 40, 0).0).expect_err("too many");
    assert!(matches!(
        error,
        GgufError::LimitExceeded {
            what: "tensor count",
            ..
        }
    ));
    let error = GgufFile::parse(&Bytes::header(3, 0, u64::MAX).0).expect_err("too many");
    assert!(matches!(error, GgufError::LimitExceeded { .. }));

    // A key claiming 2^62 bytes.
    let mut b = Bytes::header(3, 0, 1);
    b.u64(1 << 62);
    let error = GgufFile::parse(&b.0).expect_err("too long");
    assert!(matches!(
        error,
        GgufError::LimitExceeded {
            what: "string length",
            ..
        }
    ));

    // A string just under the limit with nothing behind it: truncated, after allocating at
    // most what arrived.
    let mut b = Bytes::header(3, 0, 1);
    b.string("k")
        .u32(ValueType::String.id())
        .u64(MAX_STRING_LENGTH)
        .raw(b"abc");
    assert!(matches!(
        GgufFile::parse(&b.0),
        Err(GgufError::Truncated { .. })
    ));

    // An array of 2^30 u64 (8 GiB) with three elements present.
    let mut b = Bytes::header(3, 0, 1);
    b.string("k")
        .u32(ValueType::Array.id())
        .u32(ValueType::U64.id())
        .u64(MAX_ARRAY_LENGTH)
        .u64(1)
        .u64(2)
        .u64(3);
    assert!(matches!(
        GgufFile::parse(&b.0),
        Err(GgufError::Truncated {
            what: "array elements",
            ..
        })
    ));

    // An array of 2^30 strings, two present.
    let mut b = Bytes::header(3, 0, 1);
    b.string("k")
        .u32(ValueType::Array.id())
        .u32(ValueType::String.id())
        .u64(MAX_ARRAY_LENGTH)
        .string("a")
        .string("b");
    assert!(matches!(
        GgufFile::parse(&b.0),
        Err(GgufError::Truncated { .. })
    ));

    // Over the array limit.
    let mut b = Bytes::header(3, 0, 1);
    b.string("k")
        .u32(ValueType::Array.id())
        .u32(ValueType::U8.id())
        .u64(MAX_ARRAY_LENGTH + 1);
    assert!(matches!(
        GgufFile::parse(&b.0),
        Err(GgufError::LimitExceeded {
            what: "array length",
            ..
        })
    ));
}

#[test]
fn arrays_nested_too_deeply_are_rejected() {
    let mut b = Bytes::header(3, 0, 1);
    b.string("deep").u32(ValueType::Array.id());
    for _ in 0..100 {
        b.u32(ValueType::Array.id()).u64(1);
    }
    let error = GgufFile::parse(&b.0).expect_err("too deep");
    assert!(matches!(error, GgufError::NestingTooDeep { ref key, .. } if key == "deep"));

    let mut deep = MetadataArray::U8(vec![]);
    for _ in 0..MAX_ARRAY_NESTING {
        deep = MetadataArray::Array(vec![deep]);
    }
    assert!(matches!(
        GgufWriter::new().add_metadata("deep", deep),
        Err(GgufError::NestingTooDeep { .. })
    ));
}

#[test]
fn malformed_metadata_is_rejected_with_the_key_named() {
    let mut b = Bytes::header(3, 0, 1);
    b.string("weird").u32(13);
    let error = GgufFile::parse(&b.0).expect_err("unknown type");
    assert!(matches!(error, GgufError::UnknownValueType { id: 13, .. }));
    assert!(error.to_string().contains("weird"), "{error}");

    let mut b = Bytes::header(3, 0, 2);
    b.string("k").u32(ValueType::U8.id()).raw(&[1]);
    b.string("k").u32(ValueType::U8.id()).raw(&[2]);
    assert!(matches!(
        GgufFile::parse(&b.0),
        Err(GgufError::DuplicateKey { key }) if key == "k"
    ));

    let mut b = Bytes::header(3, 0, 1);
    b.string("").u32(ValueType::U8.id()).raw(&[1]);
    assert!(matches!(
        GgufFile::parse(&b.0),
        Err(GgufError::EmptyKey { index: 0 })
    ));

    for value in [
        MetadataValue::U32(48),
        MetadataValue::U32(0),
        MetadataValue::U64(32),
    ] {
        let mut b = Bytes::header(3, 0, 1);
        b.string(ALIGNMENT_KEY).u32(value.value_type().id());
        match value {
            MetadataValue::U32(v) => b.u32(v),
            MetadataValue::U64(v) => b.u64(v),
            _ => unreachable!(),
        };
        assert!(matches!(
            GgufFile::parse(&b.0),
            Err(GgufError::InvalidAlignment { .. })
        ));
        assert!(matches!(
            GgufWriter::new().add_metadata(ALIGNMENT_KEY, value),
            Err(GgufError::InvalidAlignment { .. })
        ));
    }
}

fn one_tensor(name: &str, dims: &[u64], type_id: u32, offset: u64) -> Vec<u8> {
    let mut b = Bytes::header(3, 1, 0);
    b.string(name).u32(dims.len() as u32);
    for &d in dims {
        b.u64(d);
    }
    b.u32(type_id).u64(offset);
    b.0
}

#[test]
fn malformed_tensor_entries_are_rejected_with_the_tensor_named() {
    let error = GgufFile::parse(&one_tensor("t", &[32], 99, 0)).expect_err("unknown type");
    assert!(matches!(
        &error,
        GgufError::InvalidTensor { name, source } if name == "t"
            && matches!(**source, GgufError::UnknownGgmlType { id: 99 })
    ));
    assert!(error.to_string().contains("99"), "{error}");

    let error = GgufFile::parse(&one_tensor("t", &[1, 1, 1, 1, 1], 0, 0)).expect_err("5 dims");
    assert!(error.to_string().contains("dimensions"), "{error}");

    let error = GgufFile::parse(&one_tensor("t", &[100], GgmlType::Q4_0.id(), 0))
        .expect_err("100 % 32 != 0");
    assert!(error.to_string().contains("block size"), "{error}");

    let error =
        GgufFile::parse(&one_tensor("t", &[u64::MAX, u64::MAX], 0, 0)).expect_err("overflow");
    assert!(error.to_string().contains("overflows"), "{error}");

    let error = GgufFile::parse(&one_tensor("t", &[32], 0, 7)).expect_err("misaligned");
    assert!(error.to_string().contains("alignment"), "{error}");

    let mut b = Bytes::header(3, 2, 0);
    for _ in 0..2 {
        b.string("same").u32(1).u64(4).u32(0).u64(0);
    }
    assert!(matches!(
        GgufFile::parse(&b.0),
        Err(GgufError::DuplicateTensor { name }) if name == "same"
    ));
}

#[test]
fn the_writer_checks_tensor_data_and_names() {
    let mut w = GgufWriter::new();
    assert!(matches!(
        w.add_tensor("t", &[4], GgmlType::F32, vec![0; 15]),
        Err(GgufError::TensorDataSize {
            expected: 16,
            actual: 15,
            ..
        })
    ));
    w.add_tensor("t", &[32], GgmlType::Q8_0, vec![0; 34])
        .expect("one Q8_0 block");
    assert!(matches!(
        w.add_tensor("t", &[32], GgmlType::Q8_0, vec![0; 34]),
        Err(GgufError::DuplicateTensor { .. })
    ));
    let long = "x".repeat(GGML_MAX_NAME);
    assert!(matches!(
        w.add_tensor(long, &[1], GgmlType::F32, vec![0; 4]),
        Err(GgufError::InvalidTensor { .. })
    ));
    assert!(matches!(
        w.add_tensor("q", &[31], GgmlType::Q8_0, vec![0; 34]),
        Err(GgufError::InvalidTensor { .. })
    ));
    let file = GgufFile::parse(&w.to_bytes()).expect("parses");
    assert_eq!(file.tensors[0].ggml_type, GgmlType::Q8_0);
    assert_eq!(file.tensors[0].n_bytes, 34);
}

#[test]
fn a_custom_alignment_is_honoured_by_writer_and_reader() {
    let mut w = GgufWriter::new();
    w.add_metadata(ALIGNMENT_KEY, 64u32).expect("valid");
    w.add_f32_tensor("a", &[3], &[1.0, 2.0, 3.0])
        .expect("valid");
    w.add_f32_tensor("b", &[1], &[4.0]).expect("valid");
    let bytes = w.to_bytes();
    let file = GgufFile::parse(&bytes).expect("parses");
    assert_eq!(file.alignment, 64);
    assert_eq!(file.data_offset % 64, 0);
    assert_eq!(file.tensors[1].offset, 64);
    let b = (file.data_offset + 64) as usize;
    assert_eq!(&bytes[b..b + 4], &4.0f32.to_le_bytes());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = GgufFile::parse(&bytes);
        let mut with_magic = b"GGUF\x03\0\0\0".to_vec();
        with_magic.extend_from_slice(&bytes);
        let _ = GgufFile::parse(&with_magic);
    }

    #[test]
    fn corrupted_tiny_headers_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let (_, bytes, file) = TINY.with(|t| t.clone());
        let mut bytes = bytes[..file.header_len as usize].to_vec();
        for (index, byte) in edits {
            let i = index.index(bytes.len());
            bytes[i] = byte;
        }
        let len = cut.index(bytes.len() + 1);
        let _ = GgufFile::parse(&bytes[..len]);
    }
}

thread_local! {
    static TINY: (GgufWriter, Vec<u8>, GgufFile) = tiny();
}
