//! Qwen2 and Qwen3: Llama's decoder ([`super::llama::Decoder`]) with q/k/v biases (Qwen2) or
//! per-head q/k RMSNorm (Qwen3); Qwen2.5-Math's reward heads; Qwen3-Reranker's prompt.
//!
//! Qwen3 read as an encoder (`use_bidirectional_attention`, as TEI reads it):
//! - voyage-4-nano: a `qwen3` config with `num_labels` and a root `linear` (hidden →
//!   `num_labels`, no bias) applied to every token after the final norm, then mean pooling
//!   (vLLM serves it as `VoyageQwen3BidirectionalEmbedModel`, which attends both ways whatever
//!   the config says);
//! - pplx-embed-v1 (`bidirectional_pplx_qwen3`, `PPLXQwen3Model`): mean pooling, then TEI's
//!   int8 scaling of the pooled vector (`round(127 · tanh(x))`), before any normalization.

use super::head_weights::{host_linear, ClassifierWeights, HeadInput, LmHeadWeights, PreClassifier, RerankTemplate};
use super::llama::{causal_lm_head, last_token_classifier, Decoder, DecoderConfig, DecoderLayout};
use super::{parse_config, Architecture, Backbone, ModelError, SequencePooling};
use crate::kernels::Activation;
use candle_nn::VarBuilder;
use serde_json::Value;

pub static QWEN2: QwenVersion = QwenVersion::Qwen2;
pub static QWEN3: QwenVersion = QwenVersion::Qwen3;

impl Architecture for QwenVersion {
    fn name(&self) -> &'static str {
        match self {
            QwenVersion::Qwen2 => "Qwen2",
            QwenVersion::Qwen3 => "Qwen3",
        }
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        match self {
            QwenVersion::Qwen2 => &["Qwen2"],
            QwenVersion::Qwen3 => &["Qwen3", VOYAGE_STEM, "PPLXQwen3"],
        }
    }

    fn model_types(&self) -> &'static [&'static str] {
        match self {
            QwenVersion::Qwen2 => &["qwen2"],
            QwenVersion::Qwen3 => &["qwen3", PPLX_MODEL_TYPE],
        }
    }

    /// The last token; a decoder read as an encoder averages (voyage-4-nano's published
    /// recipe passes MEAN, pplx-embed's Pooling module says it).
    fn default_pooling(&self, config: &Value) -> SequencePooling {
        if bidirectional(config) {
            SequencePooling::Mean
        } else {
            SequencePooling::Last
        }
    }

    fn pooled_int8(&self, config: &Value) -> bool {
        config.get("model_type").and_then(Value::as_str) == Some(PPLX_MODEL_TYPE)
    }

    fn backbone(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        let config: DecoderConfig = parse_config(raw)?;
        if config.use_sliding_window {
            return Err(ModelError::Config("use_sliding_window is not supported".into()));
        }
        let layout = DecoderLayout {
            qkv_bias: match self {
                QwenVersion::Qwen2 => true,
                QwenVersion::Qwen3 => config.attention_bias.unwrap_or(false),
            },
            mlp_bias: false,
            qk_norm: *self == QwenVersion::Qwen3,
            sliding_window: None,
        };
        let decoder = Decoder::load(raw, layout, vb.clone())?;
        let decoder = if bidirectional(raw) { decoder.into_bidirectional() } else { decoder };
        // voyage-4-nano's projection, where TEI looks for it: `num_labels` and a root `linear`.
        match raw.get("num_labels").and_then(Value::as_u64) {
            Some(width) if decoder.is_bidirectional() && vb.contains_tensor("linear.weight") => {
                let weight = vb.get((width as usize, config.hidden_size), "linear.weight")?;
                Ok(Box::new(decoder.with_projection(weight)?))
            }
            _ => Ok(Box::new(decoder)),
        }
    }

    /// A reward model's head on the last token, or the decoders' classifier
    /// ([`last_token_classifier`]).
    fn classifier(
        &self,
        raw: &Value,
        vb: VarBuilder,
        num_labels: usize,
        from_tokens: Option<&[u32]>,
    ) -> std::result::Result<ClassifierWeights, ModelError> {
        if vb.contains_tensor("score.0.weight") {
            // A reward model's sequence reward: its head on the last token.
            return reward_head(&vb, parse_config::<DecoderConfig>(raw)?.hidden_size, num_labels, HeadInput::Last);
        }
        last_token_classifier(raw, vb, num_labels, from_tokens)
    }

    fn lm_head(&self, config: &Value, vb: VarBuilder) -> std::result::Result<LmHeadWeights, ModelError> {
        causal_lm_head(config, vb)
    }

    /// The reward head of `Qwen2ForRewardModel` / `Qwen2ForProcessRewardModel` on every token.
    fn token_classifier(&self, raw: &Value, vb: VarBuilder, num_labels: usize) -> std::result::Result<ClassifierWeights, ModelError> {
        if !vb.contains_tensor("score.0.weight") {
            return Err(ModelError::NoHead(format!("token classification heads for {} are the reward heads of Qwen2ForRewardModel / Qwen2ForProcessRewardModel (`score.0`, `score.2`); this checkpoint has none", self.name())));
        }
        reward_head(&vb, parse_config::<DecoderConfig>(raw)?.hidden_size, num_labels, HeadInput::EveryToken)
    }

    /// Qwen3 one-label classifiers are Qwen3-Reranker conversions, whose pairs are always wrapped
    /// in its chat prompt.
    fn rerank_template(&self, _config: &Value, num_labels: usize) -> Option<RerankTemplate> {
        (*self == QwenVersion::Qwen3 && num_labels == 1).then(RerankTemplate::qwen3)
    }
}

/// vLLM's name for voyage-4-nano (its published recipe sets it with `--hf-overrides`), by stem.
const VOYAGE_STEM: &str = "VoyageQwen3BidirectionalEmbed";
/// pplx-embed-v1's `model_type`.
const PPLX_MODEL_TYPE: &str = "bidirectional_pplx_qwen3";

/// Whether a Qwen config is read as an encoder: its own switch, or vLLM's Voyage architecture.
fn bidirectional(raw: &Value) -> bool {
    let voyage =
        raw.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str).is_some_and(|a| a.trim_end_matches("Model") == VOYAGE_STEM);
    voyage || parse_config::<DecoderConfig>(raw).is_ok_and(|c| c.bidirectional())
}

/// Which generation: Qwen2 has q/k/v biases, Qwen3 per-head q/k norms (and biases only if
/// `attention_bias`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QwenVersion {
    Qwen2,
    Qwen3,
}

/// RoPE theta from transformers 5's `rope_parameters` or the older top-level `rope_theta`;
/// scaled RoPE variants are refused rather than silently computed wrong (GTE's use of it).
pub fn rope_theta(raw: &Value) -> std::result::Result<f64, ModelError> {
    if let Some(params) = raw.get("rope_parameters").or_else(|| raw.get("rope_scaling")).filter(|v| v.is_object()) {
        let kind = params.get("rope_type").or_else(|| params.get("type")).and_then(Value::as_str).unwrap_or("default");
        if kind != "default" {
            return Err(ModelError::Config(format!("rope_type `{kind}` is not supported")));
        }
        if let Some(theta) = params.get("rope_theta").and_then(Value::as_f64) {
            return Ok(theta);
        }
    }
    Ok(raw.get("rope_theta").and_then(Value::as_f64).unwrap_or(10_000.0))
}

/// Qwen2.5-Math-RM / -PRM's `score`: Linear(hidden, hidden) → ReLU → Linear(hidden,
/// num_labels), both with biases (`score.0`, `score.2` of an `nn.Sequential`).
fn reward_head(vb: &VarBuilder, h: usize, num_labels: usize, input: HeadInput) -> std::result::Result<ClassifierWeights, ModelError> {
    let dense = host_linear(&vb.pp("score.0"), h, h)?;
    Ok(ClassifierWeights {
        pre: Some(PreClassifier { dense, activation: Some(Activation::Relu), norm: None }),
        classifier: host_linear(&vb.pp("score.2"), num_labels, h)?,
        input,
        pre_on_tokens: true,
    })
}
