//! Qwen2 and Qwen3 decoders on the flat batch: RMSNorm, rotary positions, grouped-query causal
//! attention (Qwen3 with per-head q/k RMSNorm, Qwen2 with q/k/v biases), SwiGLU MLP.
//!
//! Every sequence starts at position 0 at its first token, so left or right padding in the
//! client's tokenizer cannot matter: there is no padding. Q, K and V are fused into one
//! projection and gate/up into another at load time.

use super::batch::Batch;
use super::heads::{host_linear, on_host, ClassifierWeights, HeadInput, PreClassifier, RerankTemplate};
use super::ops::{host_f32, Activation, Attention, AttentionMask, GatedActivation, Linear, QkNorm, RmsNorm, Rotary};
use super::{parse_config, Architecture, Backbone, ModelError, SequencePooling};
use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
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
            QwenVersion::Qwen3 => &["Qwen3"],
        }
    }

    fn model_types(&self) -> &'static [&'static str] {
        match self {
            QwenVersion::Qwen2 => &["qwen2"],
            QwenVersion::Qwen3 => &["qwen3"],
        }
    }

    fn default_pooling(&self) -> SequencePooling {
        SequencePooling::Last
    }

    fn backbone(&self, config: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        Ok(Box::new(Qwen::load(config, *self, vb)?))
    }

    /// `score` (no bias) on the rightmost non-padding token, as transformers'
    /// `Qwen*ForSequenceClassification`; or, for a causal LM converted with
    /// `classifier_from_token`, rows of the LM head (tied to the embeddings unless
    /// `lm_head.weight` exists) on the last token: the difference `row(tokens[1]) − row(tokens[0])`
    /// for Qwen3-Reranker (`is_original_qwen3_reranker`), else one row per token.
    fn classifier(
        &self,
        raw: &Value,
        vb: VarBuilder,
        num_labels: usize,
        from_tokens: Option<&[u32]>,
    ) -> std::result::Result<ClassifierWeights, ModelError> {
        let config: QwenConfig = parse_config(raw)?;
        let h = config.hidden_size;
        if vb.contains_tensor("score.0.weight") {
            // A reward model's sequence reward: its head on the last token.
            return reward_head(&vb, h, num_labels, HeadInput::Last);
        }
        let Some(tokens) = from_tokens else {
            let input = match raw.get("pad_token_id").and_then(Value::as_u64) {
                Some(pad) => HeadInput::LastNonPad { pad_token_id: pad as u32 },
                None => HeadInput::Last,
            };
            let classifier = Linear::new(on_host(vb.pp("score").get((num_labels, h), "weight")?)?, None)?;
            return Ok(ClassifierWeights { pre: None, classifier, input, pre_on_tokens: false });
        };
        let lm_head = if vb.contains_tensor("lm_head.weight") {
            vb.get((config.vocab_size, h), "lm_head.weight")?
        } else {
            decoder_root(vb).get((config.vocab_size, h), "embed_tokens.weight")?
        };
        let ids = Tensor::from_slice(tokens, tokens.len(), lm_head.device())?;
        let rows = on_host(lm_head.index_select(&ids, 0)?)?;
        let original_reranker = raw.get("is_original_qwen3_reranker").and_then(Value::as_bool).unwrap_or(false);
        let weight = if original_reranker && tokens.len() == 2 { (rows.get(1)? - rows.get(0)?)?.unsqueeze(0)? } else { rows };
        Ok(ClassifierWeights { pre: None, classifier: Linear::new(weight, None)?, input: HeadInput::Last, pre_on_tokens: false })
    }

    /// The reward head of `Qwen2ForRewardModel` / `Qwen2ForProcessRewardModel` on every token.
    fn token_classifier(&self, raw: &Value, vb: VarBuilder, num_labels: usize) -> std::result::Result<ClassifierWeights, ModelError> {
        if !vb.contains_tensor("score.0.weight") {
            return Err(ModelError::NoHead(format!("token classification heads for {} are the reward heads of Qwen2ForRewardModel / Qwen2ForProcessRewardModel (`score.0`, `score.2`); this checkpoint has none", self.name())));
        }
        reward_head(&vb, parse_config::<QwenConfig>(raw)?.hidden_size, num_labels, HeadInput::EveryToken)
    }

    /// Qwen3 one-label classifiers are Qwen3-Reranker conversions, whose pairs are always wrapped
    /// in its chat prompt.
    fn rerank_template(&self, num_labels: usize) -> Option<RerankTemplate> {
        (*self == QwenVersion::Qwen3 && num_labels == 1).then(|| RerankTemplate {
            system: "Judge whether the Document meets the requirements based on the Query and the Instruct provided. \
                     Note that the answer can only be \"yes\" or \"no\"."
                .into(),
            instruction: "Given a web search query, retrieve relevant passages that answer the query".into(),
        })
    }
}

/// The fields of a Qwen2/Qwen3 `config.json` the forward pass needs.
#[derive(Debug, Clone, Deserialize)]
pub struct QwenConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    pub intermediate_size: usize,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub attention_bias: Option<bool>,
    #[serde(default)]
    pub use_sliding_window: bool,
}

fn default_act() -> String {
    "silu".into()
}
fn default_eps() -> f64 {
    1e-6
}

/// Which generation: Qwen2 has q/k/v biases, Qwen3 per-head q/k norms (and biases only if
/// `attention_bias`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QwenVersion {
    Qwen2,
    Qwen3,
}

/// RoPE theta from transformers 5's `rope_parameters` or the older top-level `rope_theta`;
/// scaled RoPE variants are refused rather than silently computed wrong.
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

struct Layer {
    input_norm: RmsNorm,
    qkv: Linear,
    qk_norm: Option<QkNorm>,
    o_proj: Linear,
    post_norm: RmsNorm,
    gate_up: Linear,
    down: Linear,
}

pub struct Qwen {
    embed_tokens: Tensor,
    layers: Vec<Layer>,
    norm: RmsNorm,
    rotary: Rotary,
    gated: GatedActivation,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    config: QwenConfig,
}

/// Task checkpoints (`*ForSequenceClassification`, `*ForCausalLM`) keep the decoder under `model.`.
pub fn decoder_root<'a>(vb: VarBuilder<'a>) -> VarBuilder<'a> {
    if vb.contains_tensor("model.embed_tokens.weight") {
        vb.pp("model")
    } else {
        vb
    }
}

impl Qwen {
    pub fn load(raw: &Value, version: QwenVersion, vb: VarBuilder) -> std::result::Result<Self, ModelError> {
        let config: QwenConfig = parse_config(raw)?;
        if config.use_sliding_window {
            return Err(ModelError::Config("use_sliding_window is not supported".into()));
        }
        let activation = Activation::from_config(&config.hidden_act)
            .ok_or_else(|| ModelError::Config(format!("hidden_act `{}` is not supported", config.hidden_act)))?;
        let (h, heads) = (config.hidden_size, config.num_attention_heads);
        let kv_heads = config.num_key_value_heads.unwrap_or(heads);
        let head_dim = config.head_dim.unwrap_or(h / heads);
        if kv_heads == 0 || heads % kv_heads != 0 || !head_dim.is_multiple_of(2) {
            return Err(ModelError::Config(format!("{heads} heads over {kv_heads} key/value heads of {head_dim} dims")));
        }
        let qkv_bias = match version {
            QwenVersion::Qwen2 => true,
            QwenVersion::Qwen3 => config.attention_bias.unwrap_or(false),
        };
        let vb = decoder_root(vb);
        let (q_out, kv_out) = (heads * head_dim, kv_heads * head_dim);
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let lv = vb.pp(format!("layers.{i}"));
            let at = lv.pp("self_attn");
            let weight = |name: &str, out: usize| at.pp(name).get((out, h), "weight");
            let qkv_weight = Tensor::cat(&[weight("q_proj", q_out)?, weight("k_proj", kv_out)?, weight("v_proj", kv_out)?], 0)?;
            let qkv_bias = if qkv_bias {
                let bias = |name: &str, out: usize| at.pp(name).get(out, "bias");
                Some(Tensor::cat(&[bias("q_proj", q_out)?, bias("k_proj", kv_out)?, bias("v_proj", kv_out)?], 0)?)
            } else {
                None
            };
            let qk_norm = match version {
                QwenVersion::Qwen3 => Some(QkNorm {
                    q: host_f32(&at.pp("q_norm").get(head_dim, "weight")?)?,
                    k: host_f32(&at.pp("k_norm").get(head_dim, "weight")?)?,
                    eps: config.rms_norm_eps as f32,
                }),
                QwenVersion::Qwen2 => None,
            };
            let mlp = lv.pp("mlp");
            let inter = config.intermediate_size;
            let gate_up = Tensor::cat(&[mlp.pp("gate_proj").get((inter, h), "weight")?, mlp.pp("up_proj").get((inter, h), "weight")?], 0)?;
            layers.push(Layer {
                input_norm: RmsNorm::new(lv.pp("input_layernorm").get(h, "weight")?, config.rms_norm_eps)?,
                qkv: Linear::new(qkv_weight, qkv_bias)?,
                qk_norm,
                o_proj: Linear::new(at.pp("o_proj").get((h, q_out), "weight")?, None)?,
                post_norm: RmsNorm::new(lv.pp("post_attention_layernorm").get(h, "weight")?, config.rms_norm_eps)?,
                gate_up: Linear::new(gate_up, None)?,
                down: Linear::new(mlp.pp("down_proj").get((h, inter), "weight")?, None)?,
            });
        }
        Ok(Self {
            embed_tokens: vb.get((config.vocab_size, h), "embed_tokens.weight")?,
            norm: RmsNorm::new(vb.pp("norm").get(h, "weight")?, config.rms_norm_eps)?,
            rotary: Rotary::new(head_dim, rope_theta(raw)?),
            gated: GatedActivation { activation, act_on_first: true },
            layers,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            config,
        })
    }
}

impl Backbone for Qwen {
    fn forward(&self, batch: &Batch) -> Result<Tensor> {
        let device = self.embed_tokens.device();
        let ids = Tensor::from_slice(&batch.input_ids, batch.num_tokens(), device)?;
        let mut hidden = self.embed_tokens.index_select(&ids, 0)?;
        let table = self.rotary.table(&batch.positions(0));
        let attention = Attention {
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            cu_seqlens: &batch.cu_seqlens,
            mask: AttentionMask::Causal,
            position_bias: None,
            disentangled: None,
        };
        for layer in &self.layers {
            let qkv = layer.qkv.forward(&layer.input_norm.forward(&hidden)?)?;
            let qkv = table.apply(&qkv, self.num_heads, self.num_kv_heads, layer.qk_norm.as_ref())?;
            hidden = layer.o_proj.forward_add(&attention.forward(&qkv, None)?, &hidden)?;
            let inner = self.gated.forward(&layer.gate_up.forward(&layer.post_norm.forward(&hidden)?)?)?;
            hidden = layer.down.forward_add(&inner, &hidden)?;
        }
        self.norm.forward(&hidden)
    }

    fn hidden_size(&self) -> usize {
        self.config.hidden_size
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn max_positions(&self) -> usize {
        self.config.max_position_embeddings
    }

    fn int8_linears(&mut self) -> Vec<&mut Linear> {
        self.layers.iter_mut().flat_map(|l| [&mut l.o_proj, &mut l.gate_up, &mut l.down]).collect()
    }

    fn attention_input_linears(&mut self) -> Vec<&mut Linear> {
        self.layers.iter_mut().map(|l| &mut l.qkv).collect()
    }
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
