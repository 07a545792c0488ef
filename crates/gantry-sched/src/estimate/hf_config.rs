//! The fields of a Hugging Face `config.json` that memory estimation needs.
//!
//! Multimodal models keep their language model's fields under `text_config`; a field
//! missing at the top level is looked up there.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

/// Why a `config.json` could not be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HfConfigError {
    /// Not a JSON object.
    #[error("config.json is not a JSON object: {0}")]
    Json(String),
    /// A required field is absent or not a positive integer.
    #[error("config.json field {field} is missing or not a positive integer")]
    MissingField {
        /// The field name.
        field: &'static str,
    },
    /// Fields contradict each other.
    #[error("config.json field {field}: {reason}")]
    Invalid {
        /// The field name.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// The architecture facts of a Hugging Face transformer model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HfModelConfig {
    /// `num_hidden_layers`.
    pub num_hidden_layers: u32,
    /// `num_attention_heads`.
    pub num_attention_heads: u32,
    /// `num_key_value_heads`; equal to the attention heads when absent (no GQA).
    pub num_key_value_heads: u32,
    /// `hidden_size`.
    pub hidden_size: u64,
    /// `head_dim` when given; else `hidden_size / num_attention_heads`.
    pub head_dim: u64,
    /// `torch_dtype` (or the newer `dtype`), e.g. `bfloat16`, when given.
    pub torch_dtype: Option<String>,
    /// `max_position_embeddings`, when given.
    pub max_position_embeddings: Option<u64>,
}

impl HfModelConfig {
    /// Parses `config.json` bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, HfConfigError> {
        let root: Value =
            serde_json::from_slice(bytes).map_err(|e| HfConfigError::Json(e.to_string()))?;
        if !root.is_object() {
            return Err(HfConfigError::Json("top level is not an object".to_owned()));
        }
        let lookup = |field: &str| -> Option<&Value> {
            root.get(field)
                .filter(|v| !v.is_null())
                .or_else(|| root.get("text_config")?.get(field).filter(|v| !v.is_null()))
        };
        let positive = |field: &'static str| -> Result<Option<u64>, HfConfigError> {
            match lookup(field) {
                None => Ok(None),
                Some(value) => match value.as_u64() {
                    Some(n) if n > 0 => Ok(Some(n)),
                    _ => Err(HfConfigError::MissingField { field }),
                },
            }
        };
        let required = |field: &'static str| -> Result<u64, HfConfigError> {
            positive(field)?.ok_or(HfConfigError::MissingField { field })
        };
        let small = |field: &'static str, n: u64| -> Result<u32, HfConfigError> {
            u32::try_from(n).map_err(|_| HfConfigError::Invalid {
                field,
                reason: format!("{n} is too large"),
            })
        };

        let num_hidden_layers = small("num_hidden_layers", required("num_hidden_layers")?)?;
        let num_attention_heads = small("num_attention_heads", required("num_attention_heads")?)?;
        let num_key_value_heads = match positive("num_key_value_heads")? {
            Some(n) => small("num_key_value_heads", n)?,
            None => num_attention_heads,
        };
        let hidden_size = required("hidden_size")?;
        let head_dim = match positive("head_dim")? {
            Some(n) => n,
            None => {
                if hidden_size % u64::from(num_attention_heads) != 0 {
                    return Err(HfConfigError::Invalid {
                        field: "head_dim",
                        reason: format!(
                            "absent, and hidden_size {hidden_size} is not divisible by \
                             {num_attention_heads} heads"
                        ),
                    });
                }
                hidden_size / u64::from(num_attention_heads)
            }
        };
        let torch_dtype = lookup("torch_dtype")
            .or_else(|| lookup("dtype"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        Ok(HfModelConfig {
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            hidden_size,
            head_dim,
            torch_dtype,
            max_position_embeddings: positive("max_position_embeddings")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_llama_style_config() {
        let json = br#"{
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "max_position_embeddings": 131072,
            "torch_dtype": "bfloat16", "vocab_size": 128256
        }"#;
        let config = HfModelConfig::parse(json).expect("valid config");
        assert_eq!(
            config,
            HfModelConfig {
                num_hidden_layers: 32,
                num_attention_heads: 32,
                num_key_value_heads: 8,
                hidden_size: 4096,
                head_dim: 128,
                torch_dtype: Some("bfloat16".to_owned()),
                max_position_embeddings: Some(131_072),
            }
        );
    }

    #[test]
    fn explicit_head_dim_and_missing_kv_heads() {
        let json = br#"{"hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
                        "head_dim": 256, "head_dim_unused": null, "dtype": "float16"}"#;
        let config = HfModelConfig::parse(json).expect("valid config");
        assert_eq!(config.head_dim, 256);
        assert_eq!(config.num_key_value_heads, 8);
        assert_eq!(config.torch_dtype.as_deref(), Some("float16"));
        assert_eq!(config.max_position_embeddings, None);
    }

    #[test]
    fn falls_back_to_text_config() {
        let json = br#"{"architectures": ["Mistral3ForConditionalGeneration"], "head_dim": null,
            "text_config": {"hidden_size": 5120, "num_hidden_layers": 40,
                            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                            "max_position_embeddings": 131072}}"#;
        let config = HfModelConfig::parse(json).expect("valid config");
        assert_eq!(config.num_hidden_layers, 40);
        assert_eq!(config.head_dim, 128);
        assert_eq!(config.max_position_embeddings, Some(131_072));
    }

    #[test]
    fn names_the_missing_field() {
        let e = HfModelConfig::parse(br#"{"hidden_size": 64, "num_attention_heads": 4}"#)
            .expect_err("no layers");
        assert_eq!(
            e,
            HfConfigError::MissingField {
                field: "num_hidden_layers"
            }
        );
        let e = HfModelConfig::parse(
            br#"{"hidden_size": 65, "num_attention_heads": 4, "num_hidden_layers": 2}"#,
        )
        .expect_err("indivisible");
        assert!(matches!(
            e,
            HfConfigError::Invalid {
                field: "head_dim",
                ..
            }
        ));
        assert!(HfModelConfig::parse(b"[]").is_err());
    }
}
