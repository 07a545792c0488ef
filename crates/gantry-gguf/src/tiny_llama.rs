//! A tiny random-weight llama model that real llama.cpp loads and serves, for tests that
//! need a real `llama-server` without a real model: 2 blocks, width 64, 4 attention heads,
//! F32 weights from a seeded xorshift generator, a SentencePiece-style ("llama") vocabulary
//! of `<unk> <s> </s>`, the 256 byte tokens, two ChatML control tokens and a few words, and
//! a ChatML chat template. About half a megabyte; its output is nonsense, but every byte of
//! the serving path is real.
//!
//! The layout follows llama.cpp's llama loader (`src/models/llama.cpp`): GGUF dimensions are
//! `ne[0]` first, so a weight that maps `n_in` to `n_out` features is `[n_in, n_out]` and the
//! token embedding is `[n_embd, n_vocab]`.

use std::io;
use std::path::Path;

use crate::error::GgufError;
use crate::value::{MetadataArray, MetadataValue};
use crate::writer::GgufWriter;

/// Id of `<unk>`.
pub const UNK_ID: u32 = 0;
/// Id of `<s>` (beginning of sequence).
pub const BOS_ID: u32 = 1;
/// Id of `</s>` (end of sequence).
pub const EOS_ID: u32 = 2;

/// The chat template stored in `tokenizer.chat_template`: ChatML, as llama-server's Jinja
/// engine renders it.
pub const TINY_LLAMA_CHAT_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Words given their own tokens (with every prefix, so that SentencePiece's pairwise merges
/// can reach them); everything else is spelled with letters or byte tokens.
const WORDS: &[&str] = &[
    "hello",
    "world",
    "the",
    "is",
    "a",
    "gantry",
    "model",
    "user",
    "assistant",
    "system",
];

/// SentencePiece's word-boundary marker, U+2581.
const SPACE_MARKER: char = '\u{2581}';

/// llama.cpp's token attribute codes (`llama_token_type`), stored in
/// `tokenizer.ggml.token_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// An ordinary piece of text.
    Normal = 1,
    /// The unknown-token placeholder.
    Unknown = 2,
    /// A control token (`<s>`, `</s>`, chat markers): never produced from plain text.
    Control = 3,
    /// A token the user added to the vocabulary.
    UserDefined = 4,
    /// A reserved, unused slot.
    Unused = 5,
    /// A byte-fallback token `<0xNN>`.
    Byte = 6,
}

/// One vocabulary entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    /// The piece, with U+2581 for a leading space.
    pub text: String,
    /// SentencePiece score: higher pieces are merged first.
    pub score: f32,
    /// The token's type.
    pub token_type: TokenType,
}

/// The model's shape. The default is the model the tests use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TinyLlamaConfig {
    /// Transformer blocks.
    pub n_layer: u32,
    /// Embedding width; a multiple of `n_head`.
    pub n_embd: u32,
    /// Attention heads; `n_embd / n_head` (the head size) must be even for RoPE.
    pub n_head: u32,
    /// Key/value heads; divides `n_head`.
    pub n_head_kv: u32,
    /// Feed-forward width.
    pub n_ff: u32,
    /// Trained context length written to `llama.context_length`.
    pub n_ctx: u32,
    /// Seed of the weight generator; the same seed gives the same file.
    pub seed: u64,
}

impl Default for TinyLlamaConfig {
    fn default() -> Self {
        TinyLlamaConfig {
            n_layer: 2,
            n_embd: 64,
            n_head: 4,
            n_head_kv: 4,
            n_ff: 128,
            n_ctx: 256,
            seed: 0x5EED_6A47_7259_0001,
        }
    }
}

impl TinyLlamaConfig {
    fn validate(&self) -> Result<(), GgufError> {
        let invalid = |msg: String| Err(GgufError::InvalidTinyLlamaConfig(msg));
        if [
            self.n_layer,
            self.n_embd,
            self.n_head,
            self.n_head_kv,
            self.n_ff,
            self.n_ctx,
        ]
        .contains(&0)
        {
            return invalid(format!("every size must be positive: {self:?}"));
        }
        if self.n_embd % self.n_head != 0 {
            return invalid(format!(
                "n_embd {} is not a multiple of n_head {}",
                self.n_embd, self.n_head
            ));
        }
        if (self.n_embd / self.n_head) % 2 != 0 {
            return invalid(format!(
                "head size {} must be even for rotary embeddings",
                self.n_embd / self.n_head
            ));
        }
        if self.n_head % self.n_head_kv != 0 {
            return invalid(format!(
                "n_head {} is not a multiple of n_head_kv {}",
                self.n_head, self.n_head_kv
            ));
        }
        Ok(())
    }
}

/// A xorshift64* generator: small, seeded, and the same on every platform.
#[derive(Debug, Clone)]
pub struct XorShift64 {
    state: u64,
}

impl XorShift64 {
    /// A generator seeded with `seed` (0, which xorshift cannot leave, is replaced).
    pub fn new(seed: u64) -> XorShift64 {
        XorShift64 {
            state: if seed == 0 {
                0x9E37_79B9_7F4A_7C15
            } else {
                seed
            },
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A float uniformly distributed in `[-scale, scale)`.
    pub fn next_symmetric(&mut self, scale: f32) -> f32 {
        // The top 24 bits give every f32 in [0, 1) with a 2^-24 step exactly.
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        (unit * 2.0 - 1.0) * scale
    }
}

/// The vocabulary: `<unk> <s> </s>`, `<0x00>`..`<0xFF>`, `<|im_start|> <|im_end|>`, the
/// space marker and the lowercase letters, then the words with their prefixes.
pub fn tiny_llama_vocabulary() -> Vec<Token> {
    let mut tokens = vec![
        Token {
            text: "<unk>".into(),
            score: 0.0,
            token_type: TokenType::Unknown,
        },
        Token {
            text: "<s>".into(),
            score: 0.0,
            token_type: TokenType::Control,
        },
        Token {
            text: "</s>".into(),
            score: 0.0,
            token_type: TokenType::Control,
        },
    ];
    tokens.extend((0..=255u8).map(|b| Token {
        text: format!("<0x{b:02X}>"),
        score: 0.0,
        token_type: TokenType::Byte,
    }));
    for marker in ["<|im_start|>", "<|im_end|>"] {
        tokens.push(Token {
            text: marker.into(),
            score: 0.0,
            token_type: TokenType::Control,
        });
    }
    let mut pieces: Vec<String> = vec![SPACE_MARKER.to_string()];
    pieces.extend(('a'..='z').map(String::from));
    for word in WORDS {
        let marked: Vec<char> = std::iter::once(SPACE_MARKER).chain(word.chars()).collect();
        for len in 2..=marked.len() {
            pieces.push(marked[..len].iter().collect());
        }
    }
    let mut seen = std::collections::HashSet::new();
    pieces.retain(|p| seen.insert(p.clone()));
    // Later (longer) pieces score higher, so merges prefer completing a word.
    let n = pieces.len();
    tokens.extend(pieces.into_iter().enumerate().map(|(i, text)| Token {
        text,
        score: -((n - i) as f32) / 10.0,
        token_type: TokenType::Normal,
    }));
    tokens
}

/// The model as a [`GgufWriter`], ready to write.
pub fn build_tiny_llama(config: &TinyLlamaConfig) -> Result<GgufWriter, GgufError> {
    config.validate()?;
    let vocab = tiny_llama_vocabulary();
    let n_vocab = vocab.len() as u64;
    let n_embd = u64::from(config.n_embd);
    let head_dim = config.n_embd / config.n_head;
    let n_embd_kv = u64::from(head_dim * config.n_head_kv);
    let n_ff = u64::from(config.n_ff);

    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "llama")?
        .add_metadata("general.name", "gantry-tiny-llama")?
        .add_metadata("general.alignment", 32u32)?
        // LLAMA_FTYPE_ALL_F32.
        .add_metadata("general.file_type", 0u32)?
        .add_metadata("llama.vocab_size", n_vocab as u32)?
        .add_metadata("llama.context_length", config.n_ctx)?
        .add_metadata("llama.embedding_length", config.n_embd)?
        .add_metadata("llama.block_count", config.n_layer)?
        .add_metadata("llama.feed_forward_length", config.n_ff)?
        .add_metadata("llama.attention.head_count", config.n_head)?
        .add_metadata("llama.attention.head_count_kv", config.n_head_kv)?
        .add_metadata("llama.attention.key_length", head_dim)?
        .add_metadata("llama.attention.value_length", head_dim)?
        .add_metadata("llama.attention.layer_norm_rms_epsilon", 1e-5f32)?
        .add_metadata("llama.rope.dimension_count", head_dim)?
        .add_metadata("llama.rope.freq_base", 10_000.0f32)?
        .add_metadata("tokenizer.ggml.model", "llama")?
        .add_metadata(
            "tokenizer.ggml.tokens",
            MetadataArray::String(vocab.iter().map(|t| t.text.clone()).collect()),
        )?
        .add_metadata(
            "tokenizer.ggml.scores",
            MetadataArray::F32(vocab.iter().map(|t| t.score).collect()),
        )?
        .add_metadata(
            "tokenizer.ggml.token_type",
            MetadataArray::I32(vocab.iter().map(|t| t.token_type as i32).collect()),
        )?
        .add_metadata("tokenizer.ggml.bos_token_id", BOS_ID)?
        .add_metadata("tokenizer.ggml.eos_token_id", EOS_ID)?
        .add_metadata("tokenizer.ggml.unknown_token_id", UNK_ID)?
        .add_metadata("tokenizer.ggml.add_bos_token", true)?
        .add_metadata("tokenizer.ggml.add_eos_token", false)?
        .add_metadata(
            "tokenizer.chat_template",
            MetadataValue::String(TINY_LLAMA_CHAT_TEMPLATE.to_owned()),
        )?;

    let mut rng = XorShift64::new(config.seed);
    // Uniform in ±1/sqrt(fan_in) keeps activations near unit scale through every matmul,
    // so the forward pass stays finite whatever the seed.
    let mut random = |n_in: u64, n_out: u64| -> Vec<f32> {
        let scale = 1.0 / (n_in as f32).sqrt();
        (0..n_in * n_out)
            .map(|_| rng.next_symmetric(scale))
            .collect()
    };
    let ones = |n: u64| vec![1.0f32; n as usize];

    let embedding = random(n_embd, n_vocab);
    w.add_f32_tensor("token_embd.weight", &[n_embd, n_vocab], &embedding)?;
    w.add_f32_tensor("output_norm.weight", &[n_embd], &ones(n_embd))?;
    let output = random(n_embd, n_vocab);
    w.add_f32_tensor("output.weight", &[n_embd, n_vocab], &output)?;
    for layer in 0..config.n_layer {
        let name = |part: &str| format!("blk.{layer}.{part}.weight");
        w.add_f32_tensor(name("attn_norm"), &[n_embd], &ones(n_embd))?;
        let q = random(n_embd, n_embd);
        w.add_f32_tensor(name("attn_q"), &[n_embd, n_embd], &q)?;
        let k = random(n_embd, n_embd_kv);
        w.add_f32_tensor(name("attn_k"), &[n_embd, n_embd_kv], &k)?;
        let v = random(n_embd, n_embd_kv);
        w.add_f32_tensor(name("attn_v"), &[n_embd, n_embd_kv], &v)?;
        let o = random(n_embd, n_embd);
        w.add_f32_tensor(name("attn_output"), &[n_embd, n_embd], &o)?;
        w.add_f32_tensor(name("ffn_norm"), &[n_embd], &ones(n_embd))?;
        let gate = random(n_embd, n_ff);
        w.add_f32_tensor(name("ffn_gate"), &[n_embd, n_ff], &gate)?;
        let down = random(n_ff, n_embd);
        w.add_f32_tensor(name("ffn_down"), &[n_ff, n_embd], &down)?;
        let up = random(n_embd, n_ff);
        w.add_f32_tensor(name("ffn_up"), &[n_embd, n_ff], &up)?;
    }
    Ok(w)
}

/// The default tiny model as GGUF bytes.
pub fn tiny_llama_bytes() -> Vec<u8> {
    build_tiny_llama(&TinyLlamaConfig::default())
        .expect("the default configuration is valid")
        .to_bytes()
}

/// Writes the default tiny model to `path`.
pub fn write_tiny_llama(path: &Path) -> io::Result<()> {
    build_tiny_llama(&TinyLlamaConfig::default())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?
        .write_file(path)
}
