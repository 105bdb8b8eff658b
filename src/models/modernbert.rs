//! ModernBERT: a pre-LayerNorm encoder with rotary positions, alternating global and local
//! (sliding-window) attention layers with their own RoPE theta, a GeGLU MLP, and no biases by
//! default. Local layers see `|i − j| ≤ local_attention / 2`.

use super::encoder::{Embeddings, Encoder, EncoderLayer, EncoderModel, FeedForward, Ffn, Norms, RotaryPositions};
use super::head_weights::{host_linear, on_host, ClassifierWeights, HeadInput, PreClassifier};
use super::weights::linear_with_bias;
use super::{parse_config, Architecture, Backbone, BackboneSizes, ModelError};
use crate::kernels::{Activation, GatedActivation, LayerNorm, Linear, Rotary};
use candle_core::{Device, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize)]
struct ModernBertConfig {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default = "default_eps")]
    norm_eps: f64,
    #[serde(default)]
    norm_bias: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default = "default_act")]
    hidden_activation: String,
    #[serde(default = "default_every")]
    global_attn_every_n_layers: usize,
    #[serde(default = "default_window")]
    local_attention: usize,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default = "default_positions")]
    max_position_embeddings: usize,
    #[serde(default = "default_act")]
    classifier_activation: String,
    #[serde(default)]
    classifier_bias: bool,
    #[serde(default = "default_pooling")]
    classifier_pooling: String,
}

fn default_eps() -> f64 {
    1e-5
}
fn default_act() -> String {
    "gelu".into()
}
fn default_every() -> usize {
    3
}
fn default_window() -> usize {
    128
}
fn default_positions() -> usize {
    8192
}
fn default_pooling() -> String {
    "cls".into()
}

fn parse(raw: &Value) -> std::result::Result<ModernBertConfig, ModelError> {
    parse_config(raw)
}

pub struct ModernBertArchitecture;
pub static MODERNBERT: ModernBertArchitecture = ModernBertArchitecture;

impl Architecture for ModernBertArchitecture {
    fn name(&self) -> &'static str {
        "ModernBERT"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["ModernBert"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["modernbert"]
    }

    fn backbone(&self, config: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        Ok(Box::new(load(config, vb)?))
    }

    /// `ModernBertForSequenceClassification`'s head: `head.dense` → activation → `head.norm`,
    /// then `classifier`, on the token(s) `classifier_pooling` names.
    fn classifier(
        &self,
        raw: &Value,
        vb: VarBuilder,
        num_labels: usize,
        _from_tokens: Option<&[u32]>,
    ) -> std::result::Result<ClassifierWeights, ModelError> {
        let config = parse(raw)?;
        let h = config.hidden_size;
        let cpu = Device::Cpu;
        let activation = Activation::from_config(&config.classifier_activation)
            .ok_or_else(|| ModelError::Config(format!("classifier_activation `{}` is not supported", config.classifier_activation)))?;
        let head = vb.pp("head");
        let dense = Linear::new(
            on_host(head.pp("dense").get((h, h), "weight")?)?,
            if config.classifier_bias { Some(on_host(head.pp("dense").get(h, "bias")?)?) } else { None },
        )?;
        let norm_bias =
            if config.norm_bias { on_host(head.pp("norm").get(h, "bias")?)? } else { Tensor::zeros(h, candle_core::DType::F32, &cpu)? };
        let head_norm = LayerNorm::new(on_host(head.pp("norm").get(h, "weight")?)?, norm_bias, config.norm_eps)?;
        let input = match config.classifier_pooling.as_str() {
            "mean" => HeadInput::Mean,
            _ => HeadInput::First,
        };
        Ok(ClassifierWeights {
            pre: Some(PreClassifier { dense, activation: Some(activation), norm: Some(head_norm) }),
            classifier: host_linear(&vb.pp("classifier"), num_labels, h)?,
            input,
            pre_on_tokens: false,
        })
    }
}

/// (global, local) RoPE thetas: transformers 5's `rope_parameters.{full,sliding}_attention`, or
/// the older `global_rope_theta` / `local_rope_theta`.
fn thetas(raw: &Value) -> (f64, f64) {
    let nested = |kind: &str| raw.pointer(&format!("/rope_parameters/{kind}/rope_theta")).and_then(Value::as_f64);
    let flat = |key: &str| raw.get(key).and_then(Value::as_f64);
    (
        nested("full_attention").or_else(|| flat("global_rope_theta")).unwrap_or(160_000.0),
        nested("sliding_attention").or_else(|| flat("local_rope_theta")).unwrap_or(10_000.0),
    )
}

/// A LayerNorm whose bias is zero unless the checkpoint has one (`norm_bias`).
fn norm(vb: &VarBuilder, h: usize, config: &ModernBertConfig) -> Result<LayerNorm> {
    let bias = if config.norm_bias { vb.get(h, "bias")? } else { Tensor::zeros(h, vb.dtype(), vb.device())? };
    LayerNorm::new(vb.get(h, "weight")?, bias, config.norm_eps)
}

fn root<'a>(vb: VarBuilder<'a>) -> VarBuilder<'a> {
    if vb.contains_tensor("model.embeddings.tok_embeddings.weight") {
        vb.pp("model")
    } else {
        vb
    }
}

/// ModernBERT's backbone: normalized token embeddings, then the shared encoder with its norms
/// before each sub-layer, rotary positions with a base per layer type, sliding-window local
/// layers and a GeGLU feed-forward, then the final norm.
pub(super) fn load(raw: &Value, vb: VarBuilder) -> std::result::Result<EncoderModel, ModelError> {
    let config = parse(raw)?;
    let (h, heads) = (config.hidden_size, config.num_attention_heads);
    if h % heads != 0 || (h / heads) % 2 != 0 {
        return Err(ModelError::Config("hidden_size does not split into even-sized heads".into()));
    }
    let activation = Activation::from_config(&config.hidden_activation)
        .ok_or_else(|| ModelError::Config(format!("hidden_activation `{}` is not supported", config.hidden_activation)))?;
    let vb = root(vb);
    let inter = config.intermediate_size;
    // `Wi` holds the activated half first.
    let gate = GatedActivation { activation, act_on_first: true };
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for i in 0..config.num_hidden_layers {
        let lv = vb.pp(format!("layers.{i}"));
        let global = match &config.layer_types {
            Some(types) => types.get(i).map(|t| t == "full_attention").unwrap_or(true),
            None => i % config.global_attn_every_n_layers.max(1) == 0,
        };
        // The first layer has none: its input is the normalized embedding already.
        let attn_norm = if lv.contains_tensor("attn_norm.weight") { Some(norm(&lv.pp("attn_norm"), h, &config)?) } else { None };
        layers.push(EncoderLayer {
            qkv: linear_with_bias(&lv.pp("attn.Wqkv"), 3 * h, h, config.attention_bias)?,
            attention_out: linear_with_bias(&lv.pp("attn.Wo"), h, h, config.attention_bias)?,
            ffn: Ffn::Dense {
                up: linear_with_bias(&lv.pp("mlp.Wi"), 2 * inter, h, config.mlp_bias)?,
                feed_forward: FeedForward::Gated(gate),
                down: linear_with_bias(&lv.pp("mlp.Wo"), h, inter, config.mlp_bias)?,
            },
            norms: Norms::Pre { attention_norm: attn_norm, feed_forward_norm: norm(&lv.pp("mlp_norm"), h, &config)? },
            local: !global,
        });
    }
    let (global_theta, local_theta) = thetas(raw);
    let word = word_table(&vb.pp("embeddings.tok_embeddings"), config.vocab_size, h)?;
    let vocab = word.dim(0)?;
    let embeddings = Embeddings {
        word,
        position: None,
        position_offset: 0,
        token_type: None,
        norm: norm(&vb.pp("embeddings.norm"), h, &config)?,
        projection: None,
    };
    let rotary = RotaryPositions {
        global: Rotary::new(h / heads, global_theta),
        local: Some((Rotary::new(h / heads, local_theta), config.local_attention / 2)),
    };
    Ok(EncoderModel {
        embeddings,
        encoder: Encoder { layers, num_heads: heads, head_dim: h / heads, rotary: Some(rotary), relative: None },
        final_norm: Some(norm(&vb.pp("final_norm"), h, &config)?),
        sizes: BackboneSizes { hidden: h, vocab, max_positions: config.max_position_embeddings },
    })
}

/// The word embeddings: `weight`, then, where the checkpoint splits the table as ModernVBert's
/// `DecoupledEmbedding` does (the hub's colmodernvbert), `additional_embedding.weight`'s rows
/// after it, as vLLM joins them (the added tokens' ids follow the base vocabulary).
fn word_table(vb: &VarBuilder, vocab: usize, h: usize) -> std::result::Result<Tensor, ModelError> {
    let base = vb.get((vocab, h), "weight")?;
    if !vb.contains_tensor("additional_embedding.weight") {
        return Ok(base);
    }
    let extra = vb.get_unchecked_dtype("additional_embedding.weight", vb.dtype())?;
    match extra.dims() {
        [_, width] if *width == h => Ok(Tensor::cat(&[&base, &extra], 0)?),
        dims => Err(ModelError::Config(format!("{}.additional_embedding.weight is {dims:?}; rows of {h} expected", vb.prefix()))),
    }
}
