//! jina-embeddings-v5 (`JinaEmbeddingsV5Model`, `model_type: jina_embeddings_v5`), as vLLM's
//! `jina.py` serves it: one architecture name over two backbones, told apart by `is_decoder`:
//! - `-small` (the default, `is_decoder` absent or true): Qwen3-0.6B-Base, a causal decoder
//!   with q/k norms;
//! - `-nano` (`is_decoder: false`): EuroBERT-210m, which vLLM runs as a Llama attending both
//!   ways.
//!
//! Both keep four task adapters beside the weights (`adapters/<task>/adapter_config.json` and
//! `adapter_model.safetensors`, PEFT's layout): the one `jina_task` names (`--hf-overrides`;
//! retrieval, text-matching, classification or clustering; retrieval by default, an unknown
//! name falls back to it as vLLM's does) is merged into the weights at load
//! ([`Architecture::adapter_folders`]), `W + (lora_alpha / r) · B·A`; beyond vLLM, a request
//! picks any of the four with `task` (`loader::lora::merged`). Embeddings are the last
//! token's state, L2-normalized (vLLM's default for the family). Weights are stored unprefixed
//! (`layers.…`, as `Qwen3Model` saves itself), or under `model.`.

use super::llama::{Decoder, DecoderConfig, DecoderLayout};
use super::{parse_config, AdapterFolders, Architecture, Backbone, ModelError, SequencePooling};
use candle_nn::VarBuilder;
use serde_json::Value;

pub static JINA_V5: JinaV5 = JinaV5;

const MODEL_TYPE: &str = "jina_embeddings_v5";
const ARCHITECTURE: &str = "JinaEmbeddingsV5Model";
const TASKS: [&str; 4] = ["retrieval", "text-matching", "classification", "clustering"];

#[derive(Debug, Clone, Copy)]
pub struct JinaV5;

/// `-nano`'s EuroBERT encoder (`is_decoder: false`) rather than `-small`'s Qwen3 decoder.
fn is_encoder(config: &Value) -> bool {
    config.get("is_decoder").and_then(Value::as_bool) == Some(false)
}

impl Architecture for JinaV5 {
    fn name(&self) -> &'static str {
        "jina-embeddings-v5"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["JinaEmbeddingsV5"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &[MODEL_TYPE]
    }

    fn claims(&self, config: &Value) -> bool {
        config.get("model_type").and_then(Value::as_str) == Some(MODEL_TYPE)
            || config.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str) == Some(ARCHITECTURE)
    }

    fn default_pooling(&self, _config: &Value) -> SequencePooling {
        SequencePooling::Last
    }

    fn backbone(&self, raw: &Value, vb: VarBuilder) -> Result<Box<dyn Backbone>, ModelError> {
        let config: DecoderConfig = parse_config(raw)?;
        let encoder = is_encoder(raw);
        let layout = DecoderLayout {
            qkv_bias: config.attention_bias.unwrap_or(false),
            mlp_bias: config.mlp_bias,
            // Qwen3's per-head q/k RMSNorm; EuroBERT has none.
            qk_norm: !encoder,
            sliding_window: None,
        };
        let decoder = Decoder::load(raw, layout, vb)?;
        Ok(Box::new(if encoder { decoder.into_bidirectional() } else { decoder }))
    }

    /// Its four tasks, each selectable per request (`task`); the merged one is `jina_task`'s.
    fn has_task_adapters(&self, _config: &Value) -> bool {
        true
    }

    fn adapter_folders(&self, config: &Value) -> Option<AdapterFolders> {
        let merged = match config.get("jina_task").and_then(Value::as_str) {
            None => TASKS[0],
            Some(task) if TASKS.contains(&task) => task,
            Some(task) => {
                tracing::warn!("Unknown jina_task={task:?}. Falling back to {:?}.", TASKS[0]);
                TASKS[0]
            }
        };
        Some(AdapterFolders { merged: merged.to_string(), tasks: TASKS.iter().map(|t| (t.to_string(), format!("adapters/{t}"))).collect() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_task_adapter_is_jina_task_or_retrieval() {
        let merged = |config: Value| JINA_V5.adapter_folders(&config).unwrap().merged;
        assert_eq!(merged(json!({})), "retrieval");
        assert_eq!(merged(json!({"jina_task": "clustering"})), "clustering");
        assert_eq!(merged(json!({"jina_task": "summarize"})), "retrieval");
        assert_eq!(
            JINA_V5.adapter_folders(&json!({})).unwrap().tasks[1],
            ("text-matching".to_string(), "adapters/text-matching".to_string())
        );
        assert!(is_encoder(&json!({"is_decoder": false})) && !is_encoder(&json!({})));
    }
}
