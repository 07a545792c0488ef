//! The metadata of a corpus model: the keys llama.cpp's loader reads for the architecture
//! (`load_hparams` in `src/llama-model.cpp`, `load_arch_hparams` in `src/models/<arch>.cpp`),
//! with the exact value types it requires (it refuses a `u32` key stored as `i32`), and the
//! vocabulary (`src/llama-vocab.cpp`).
//!
//! The generative architectures get the tiny llama model's SentencePiece ("llama")
//! vocabulary and ChatML template, padded with unused tokens; BERT gets a WordPiece ("bert")
//! vocabulary with BERT's special tokens at BERT's ids, written in llama.cpp's "phantom
//! space" form (word-initial pieces start with U+2581, continuations carry no `##`).

use super::layout::BERT_TOKEN_TYPE_COUNT;
use super::{CorpusArch, CorpusModel};
use crate::error::GgufError;
use crate::tiny_llama::{
    tiny_llama_vocabulary, Token, TokenType, BOS_ID, EOS_ID, TINY_LLAMA_CHAT_TEMPLATE, UNK_ID,
};
use crate::value::{MetadataArray, MetadataValue};
use crate::writer::GgufWriter;

/// BERT's special tokens and their ids in BERT's own vocabulary (ids 1 to 99 are
/// `[unused0]` .. `[unused98]`).
const BERT_PAD_ID: u32 = 0;
const BERT_UNK_ID: u32 = 100;
const BERT_CLS_ID: u32 = 101;
const BERT_SEP_ID: u32 = 102;
const BERT_MASK_ID: u32 = 103;

/// Words of more than one letter given their own WordPiece token; other words are spelled
/// from letters.
const BERT_WORDS: &[&str] = &[
    "the",
    "is",
    "hello",
    "world",
    "gantry",
    "model",
    "sentence",
    "embedding",
    "query",
];

/// SentencePiece's and llama.cpp's WordPiece word-boundary marker, U+2581.
const SPACE_MARKER: char = '\u{2581}';

/// `bert.pooling_type` of the BERT model: mean pooling, as sentence-transformers models use.
const BERT_POOLING_MEAN: u32 = 1;

/// Adds every metadata entry of `model` to `w`.
pub(super) fn add_metadata(model: &CorpusModel, w: &mut GgufWriter) -> Result<(), GgufError> {
    let arch = model.arch;
    let key = |suffix: &str| format!("{arch}.{suffix}");
    let file_type = model
        .file_type()
        .expect("the weight type was validated before building");

    w.add_metadata("general.architecture", arch.name())?
        .add_metadata(
            "general.name",
            format!("gantry-corpus-{arch}-{}", model.weight_type),
        )?
        .add_metadata("general.alignment", 32u32)?
        .add_metadata("general.file_type", file_type)?
        .add_metadata(key("block_count"), model.block_count)?
        .add_metadata(key("context_length"), model.context_length)?
        .add_metadata(key("embedding_length"), model.embedding_length)?
        .add_metadata(key("feed_forward_length"), model.feed_forward_length)?
        .add_metadata(key("attention.head_count"), model.head_count)?
        .add_metadata(key("attention.head_count_kv"), model.head_count_kv)?
        .add_metadata(key("attention.key_length"), model.head_dim)?
        .add_metadata(key("attention.value_length"), model.head_dim)?;

    if arch == CorpusArch::Bert {
        w.add_metadata(key("attention.layer_norm_epsilon"), 1e-12f32)?
            .add_metadata(key("attention.causal"), false)?
            .add_metadata(key("pooling_type"), BERT_POOLING_MEAN)?;
    } else {
        let (rms_epsilon, rope_base) = match arch {
            CorpusArch::Llama | CorpusArch::Phi3 => (1e-5f32, 10_000.0f32),
            CorpusArch::Gemma2 => (1e-6, 10_000.0),
            _ => (1e-6, 1_000_000.0),
        };
        w.add_metadata(key("attention.layer_norm_rms_epsilon"), rms_epsilon)?
            .add_metadata(key("rope.dimension_count"), model.head_dim)?
            .add_metadata(key("rope.freq_base"), rope_base)?;
    }
    if arch == CorpusArch::Gemma2 {
        w.add_metadata(key("attn_logit_softcapping"), 50.0f32)?
            .add_metadata(key("final_logit_softcapping"), 30.0f32)?;
    }
    if let Some(window) = model.sliding_window {
        w.add_metadata(key("attention.sliding_window"), window)?;
    }
    if arch.is_mixture_of_experts() {
        w.add_metadata(key("expert_count"), model.expert_count)?
            .add_metadata(key("expert_used_count"), model.expert_used_count)?
            .add_metadata(
                key("expert_feed_forward_length"),
                model.expert_feed_forward_length,
            )?;
    }

    if arch == CorpusArch::Bert {
        add_wordpiece_vocabulary(w, &wordpiece_vocabulary(model.vocab_size))
    } else {
        add_sentencepiece_vocabulary(w, &sentencepiece_vocabulary(arch, model.vocab_size))
    }
}

/// The fewest tokens a model of `arch` can have: its base vocabulary, unpadded.
pub(super) fn minimum_vocab_size(arch: CorpusArch) -> u32 {
    let base = match arch {
        CorpusArch::Bert => wordpiece_vocabulary(0).len(),
        _ => sentencepiece_vocabulary(arch, 0).len(),
    };
    u32::try_from(base).expect("the base vocabularies have a few hundred tokens")
}

/// Appends unused tokens named by `name` until `tokens` holds `size` (if it holds fewer).
fn pad(tokens: &mut Vec<Token>, size: u32, name: impl Fn(usize) -> String) {
    let missing = (size as usize).saturating_sub(tokens.len());
    tokens.extend((0..missing).map(|i| Token {
        text: name(i),
        score: 0.0,
        token_type: TokenType::Unused,
    }));
}

/// The tiny llama vocabulary, plus the added tokens llama.cpp looks up by name for `arch`,
/// padded with `<unused{i}>` to `size` tokens.
fn sentencepiece_vocabulary(arch: CorpusArch, size: u32) -> Vec<Token> {
    let mut tokens = tiny_llama_vocabulary();
    if arch == CorpusArch::Phi3 {
        // llama.cpp sets attributes of Phi-3's `<|endoftext|>` (found through a model name
        // containing "phi3") and refuses a vocabulary without it, as every real Phi-3 has.
        tokens.push(Token {
            text: "<|endoftext|>".into(),
            score: 0.0,
            token_type: TokenType::Control,
        });
    }
    pad(&mut tokens, size, |i| format!("<unused{i}>"));
    tokens
}

fn add_sentencepiece_vocabulary(w: &mut GgufWriter, tokens: &[Token]) -> Result<(), GgufError> {
    w.add_metadata("tokenizer.ggml.model", "llama")?
        .add_metadata("tokenizer.ggml.tokens", texts(tokens))?
        .add_metadata(
            "tokenizer.ggml.scores",
            MetadataArray::F32(tokens.iter().map(|t| t.score).collect()),
        )?
        .add_metadata("tokenizer.ggml.token_type", token_types(tokens))?
        .add_metadata("tokenizer.ggml.bos_token_id", BOS_ID)?
        .add_metadata("tokenizer.ggml.eos_token_id", EOS_ID)?
        .add_metadata("tokenizer.ggml.unknown_token_id", UNK_ID)?
        .add_metadata("tokenizer.ggml.add_bos_token", true)?
        .add_metadata("tokenizer.ggml.add_eos_token", false)?
        .add_metadata("tokenizer.chat_template", TINY_LLAMA_CHAT_TEMPLATE)?;
    Ok(())
}

/// BERT's layout: `[PAD]`, `[unused0]`..`[unused98]`, `[UNK] [CLS] [SEP] [MASK]`, then
/// word-initial and continuation pieces for letters, digits, punctuation and a few words,
/// padded with more `[unused{i}]` to `size` tokens.
fn wordpiece_vocabulary(size: u32) -> Vec<Token> {
    let control = |text: &str| Token {
        text: text.to_owned(),
        score: 0.0,
        token_type: TokenType::Control,
    };
    let unused = |i: usize| Token {
        text: format!("[unused{i}]"),
        score: 0.0,
        token_type: TokenType::Unused,
    };
    let mut tokens = vec![control("[PAD]")];
    tokens.extend((0..99).map(unused));
    for special in ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] {
        tokens.push(control(special));
    }
    debug_assert_eq!(tokens[BERT_UNK_ID as usize].text, "[UNK]");
    debug_assert_eq!(tokens[BERT_MASK_ID as usize].text, "[MASK]");

    let mut pieces: Vec<String> = Vec::new();
    let characters = ('a'..='z').chain('0'..='9').chain(".,!?'-".chars());
    for c in characters {
        pieces.push(format!("{SPACE_MARKER}{c}"));
        pieces.push(c.to_string());
    }
    pieces.extend(BERT_WORDS.iter().map(|w| format!("{SPACE_MARKER}{w}")));
    tokens.extend(pieces.into_iter().map(|text| Token {
        text,
        score: 0.0,
        token_type: TokenType::Normal,
    }));
    pad(&mut tokens, size, |i| format!("[unused{}]", 99 + i));
    tokens
}

fn add_wordpiece_vocabulary(w: &mut GgufWriter, tokens: &[Token]) -> Result<(), GgufError> {
    w.add_metadata("tokenizer.ggml.model", "bert")?
        .add_metadata("tokenizer.ggml.tokens", texts(tokens))?
        .add_metadata("tokenizer.ggml.token_type", token_types(tokens))?
        // The bert loader refuses a model that does not say how many token types it has.
        .add_metadata("tokenizer.ggml.token_type_count", BERT_TOKEN_TYPE_COUNT)?
        // llama.cpp prepends the "BOS" token: BERT's [CLS].
        .add_metadata("tokenizer.ggml.bos_token_id", BERT_CLS_ID)?
        .add_metadata("tokenizer.ggml.cls_token_id", BERT_CLS_ID)?
        .add_metadata("tokenizer.ggml.unknown_token_id", BERT_UNK_ID)?
        // "seperator" is llama.cpp's spelling of the key.
        .add_metadata("tokenizer.ggml.seperator_token_id", BERT_SEP_ID)?
        .add_metadata("tokenizer.ggml.padding_token_id", BERT_PAD_ID)?
        .add_metadata("tokenizer.ggml.mask_token_id", BERT_MASK_ID)?;
    Ok(())
}

fn texts(tokens: &[Token]) -> MetadataValue {
    MetadataArray::String(tokens.iter().map(|t| t.text.clone()).collect()).into()
}

fn token_types(tokens: &[Token]) -> MetadataValue {
    MetadataArray::I32(tokens.iter().map(|t| t.token_type as i32).collect()).into()
}
