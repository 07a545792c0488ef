//! The tensors of each corpus architecture, named and shaped as llama.cpp's loader for it
//! creates them (`load_arch_tensors` in `src/models/<arch>.cpp` of build 11434). Every
//! tensor listed here is one the loader requires or, for the optional ones (biases, the
//! output layer), one it reads when present; a tensor the loader does not read would make
//! it refuse the file ("wrong number of tensors").
//!
//! GGUF dimensions are `ne[0]` first: a weight mapping `n_in` to `n_out` features is
//! `[n_in, n_out]`, and an expert tensor adds the expert count as a third dimension.

use super::{CorpusArch, CorpusModel};
use crate::ggml_type::GgmlType;

/// One tensor of the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TensorSpec {
    /// The GGUF name, e.g. `blk.0.attn_q.weight`.
    pub(super) name: String,
    /// Dimensions, `ne[0]` first.
    pub(super) dims: Vec<u64>,
    /// The element type.
    pub(super) ggml_type: GgmlType,
}

/// Token types of BERT's `token_types` embedding ("sentence A" and "sentence B").
pub(super) const BERT_TOKEN_TYPE_COUNT: u32 = 2;

/// Collects tensors: matrices take the model's weight type, vectors and the matrices real
/// converters keep in full precision are F32.
struct Layout {
    weight_type: GgmlType,
    tensors: Vec<TensorSpec>,
}

impl Layout {
    fn push(&mut self, name: String, dims: &[u64], ggml_type: GgmlType) {
        self.tensors.push(TensorSpec {
            name,
            dims: dims.to_vec(),
            ggml_type,
        });
    }

    /// A weight matrix (or expert stack) in the model's weight type.
    fn matrix(&mut self, name: String, dims: &[u64]) {
        self.push(name, dims, self.weight_type);
    }

    /// A norm, a bias, or a matrix llama.cpp never quantizes: F32.
    fn full_precision(&mut self, name: String, dims: &[u64]) {
        self.push(name, dims, GgmlType::F32);
    }
}

/// The model's tensors in file order: the input layer, the blocks, the output layer.
pub(super) fn tensors(model: &CorpusModel) -> Vec<TensorSpec> {
    let mut layout = Layout {
        weight_type: model.weight_type,
        tensors: Vec::new(),
    };
    let n_embd = u64::from(model.embedding_length);
    let n_vocab = u64::from(model.vocab_size);

    layout.matrix("token_embd.weight".into(), &[n_embd, n_vocab]);
    if model.arch == CorpusArch::Bert {
        let n_types = u64::from(BERT_TOKEN_TYPE_COUNT);
        let n_positions = u64::from(model.context_length);
        layout.full_precision("token_types.weight".into(), &[n_embd, n_types]);
        layout.full_precision("position_embd.weight".into(), &[n_embd, n_positions]);
        layout.full_precision("token_embd_norm.weight".into(), &[n_embd]);
        layout.full_precision("token_embd_norm.bias".into(), &[n_embd]);
    }
    for block in 0..model.block_count {
        add_block(&mut layout, model, block);
    }
    if model.arch != CorpusArch::Bert {
        layout.full_precision("output_norm.weight".into(), &[n_embd]);
        if !model.tied_embeddings {
            layout.matrix("output.weight".into(), &[n_embd, n_vocab]);
        }
    }
    layout.tensors
}

/// The tensors of block `block`.
fn add_block(layout: &mut Layout, model: &CorpusModel, block: u32) {
    let name = |part: &str, kind: &str| format!("blk.{block}.{part}.{kind}");
    let n_embd = u64::from(model.embedding_length);
    let n_q = u64::from(model.query_width());
    let n_kv = u64::from(model.key_value_width());
    let head_dim = u64::from(model.head_dim);
    let n_ff = u64::from(model.feed_forward_length);

    match model.arch {
        CorpusArch::Bert => {
            // Post-norm encoder with biases everywhere; no norm before attention.
            for (part, width) in [("attn_q", n_q), ("attn_k", n_kv), ("attn_v", n_kv)] {
                layout.matrix(name(part, "weight"), &[n_embd, width]);
                layout.full_precision(name(part, "bias"), &[width]);
            }
            layout.matrix(name("attn_output", "weight"), &[n_q, n_embd]);
            layout.full_precision(name("attn_output", "bias"), &[n_embd]);
            layout.full_precision(name("attn_output_norm", "weight"), &[n_embd]);
            layout.full_precision(name("attn_output_norm", "bias"), &[n_embd]);
            layout.matrix(name("ffn_up", "weight"), &[n_embd, n_ff]);
            layout.full_precision(name("ffn_up", "bias"), &[n_ff]);
            layout.matrix(name("ffn_down", "weight"), &[n_ff, n_embd]);
            layout.full_precision(name("ffn_down", "bias"), &[n_embd]);
            layout.full_precision(name("layer_output_norm", "weight"), &[n_embd]);
            layout.full_precision(name("layer_output_norm", "bias"), &[n_embd]);
        }
        CorpusArch::Phi3 => {
            layout.full_precision(name("attn_norm", "weight"), &[n_embd]);
            layout.matrix(name("attn_qkv", "weight"), &[n_embd, n_q + 2 * n_kv]);
            layout.matrix(name("attn_output", "weight"), &[n_q, n_embd]);
            layout.full_precision(name("ffn_norm", "weight"), &[n_embd]);
            // Gate and up projections fused into one matrix twice the width.
            layout.matrix(name("ffn_up", "weight"), &[n_embd, 2 * n_ff]);
            layout.matrix(name("ffn_down", "weight"), &[n_ff, n_embd]);
        }
        CorpusArch::Llama
        | CorpusArch::Qwen2
        | CorpusArch::Qwen3
        | CorpusArch::Gemma2
        | CorpusArch::Gemma3
        | CorpusArch::Qwen3Moe => {
            let arch = model.arch;
            layout.full_precision(name("attn_norm", "weight"), &[n_embd]);
            layout.matrix(name("attn_q", "weight"), &[n_embd, n_q]);
            layout.matrix(name("attn_k", "weight"), &[n_embd, n_kv]);
            layout.matrix(name("attn_v", "weight"), &[n_embd, n_kv]);
            if arch == CorpusArch::Qwen2 {
                layout.full_precision(name("attn_q", "bias"), &[n_q]);
                layout.full_precision(name("attn_k", "bias"), &[n_kv]);
                layout.full_precision(name("attn_v", "bias"), &[n_kv]);
            }
            layout.matrix(name("attn_output", "weight"), &[n_q, n_embd]);
            if matches!(
                arch,
                CorpusArch::Qwen3 | CorpusArch::Gemma3 | CorpusArch::Qwen3Moe
            ) {
                layout.full_precision(name("attn_q_norm", "weight"), &[head_dim]);
                layout.full_precision(name("attn_k_norm", "weight"), &[head_dim]);
            }
            let gemma = matches!(arch, CorpusArch::Gemma2 | CorpusArch::Gemma3);
            if gemma {
                layout.full_precision(name("post_attention_norm", "weight"), &[n_embd]);
            }
            layout.full_precision(name("ffn_norm", "weight"), &[n_embd]);
            if arch == CorpusArch::Qwen3Moe {
                let n_expert = u64::from(model.expert_count);
                let n_ff_exp = u64::from(model.expert_feed_forward_length);
                // The router stays F32 in converted and quantized files alike.
                layout.full_precision(name("ffn_gate_inp", "weight"), &[n_embd, n_expert]);
                layout.matrix(
                    name("ffn_gate_exps", "weight"),
                    &[n_embd, n_ff_exp, n_expert],
                );
                layout.matrix(name("ffn_up_exps", "weight"), &[n_embd, n_ff_exp, n_expert]);
                layout.matrix(
                    name("ffn_down_exps", "weight"),
                    &[n_ff_exp, n_embd, n_expert],
                );
            } else {
                layout.matrix(name("ffn_gate", "weight"), &[n_embd, n_ff]);
                layout.matrix(name("ffn_up", "weight"), &[n_embd, n_ff]);
                layout.matrix(name("ffn_down", "weight"), &[n_ff, n_embd]);
            }
            if gemma {
                layout.full_precision(name("post_ffw_norm", "weight"), &[n_embd]);
            }
        }
    }
}
