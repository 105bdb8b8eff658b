//! Alibaba GTE (`GteModel`, hub `NewModel`: gte-base-en-v1.5, gte-multilingual-base): a
//! post-LayerNorm encoder with rotary positions instead of a position table, fused `qkv_proj`,
//! and a gated MLP (`up_gate_proj`: rows up, then gate; `down(gelu(gate) · up)`).

use super::bert::{bert_embeddings, TableSizes};
use super::encoder::{Encoder, EncoderLayer, EncoderModel, FeedForward, Norms, RotaryPositions};
use super::ops::{Activation, GatedActivation, Rotary};
use super::qwen::rope_theta;
use super::weights::{layer_norm, linear, linear_with_bias};
use super::{parse_config, Architecture, Backbone, BackboneSizes, ModelError};
use candle_nn::VarBuilder;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
struct GteConfig {
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    #[serde(default = "default_act")]
    hidden_act: String,
    max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    layer_norm_eps: f64,
    #[serde(default = "default_types")]
    type_vocab_size: usize,
}

fn default_act() -> String {
    "gelu".into()
}
fn default_eps() -> f64 {
    1e-12
}
fn default_types() -> usize {
    1
}

/// GTE has no classification or masked-LM heads here (the trait's defaults say so).
pub struct GteArchitecture;
pub static GTE: GteArchitecture = GteArchitecture;

impl Architecture for GteArchitecture {
    fn name(&self) -> &'static str {
        "GTE (GteModel/NewModel)"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["Gte", "New"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["gte", "new"]
    }

    fn backbone(&self, config: &serde_json::Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        Ok(Box::new(load(config, vb)?))
    }
}

/// GTE's backbone: word and token-type embeddings, then the shared post-norm encoder with
/// rotary positions and the gated MLP.
fn load(raw: &serde_json::Value, vb: VarBuilder) -> std::result::Result<EncoderModel, ModelError> {
    let config: GteConfig = parse_config(raw)?;
    let (h, heads) = (config.hidden_size, config.num_attention_heads);
    if h % heads != 0 || (h / heads) % 2 != 0 {
        return Err(ModelError::Config("hidden_size does not split into even-sized heads".into()));
    }
    let activation = Activation::from_config(&config.hidden_act)
        .ok_or_else(|| ModelError::Config(format!("hidden_act `{}` is not supported", config.hidden_act)))?;
    let vb = if vb.contains_tensor("new.embeddings.word_embeddings.weight") { vb.pp("new") } else { vb };
    let (inter, eps) = (config.intermediate_size, config.layer_norm_eps);
    // `up_gate_proj` holds the up rows first, then the gate's.
    let gate = GatedActivation { activation, act_on_first: false };
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for i in 0..config.num_hidden_layers {
        let lv = vb.pp(format!("encoder.layer.{i}"));
        layers.push(EncoderLayer {
            qkv: linear(&lv.pp("attention.qkv_proj"), 3 * h, h)?,
            attention_out: linear(&lv.pp("attention.o_proj"), h, h)?,
            up: linear_with_bias(&lv.pp("mlp.up_gate_proj"), 2 * inter, h, false)?,
            feed_forward: FeedForward::Gated(gate),
            down: linear(&lv.pp("mlp.down_proj"), h, inter)?,
            norms: Norms::Post {
                attention_norm: layer_norm(&lv.pp("attn_ln"), h, eps)?,
                feed_forward_norm: layer_norm(&lv.pp("mlp_ln"), h, eps)?,
            },
            local: false,
        });
    }
    let emb = vb.pp("embeddings");
    let tables = TableSizes { width: h, vocab: config.vocab_size, positions: None, types: Some(config.type_vocab_size), eps };
    let embeddings = bert_embeddings(&emb, tables)?;
    let rotary = RotaryPositions { global: Rotary::new(h / heads, rope_theta(raw)?), local: None };
    Ok(EncoderModel {
        embeddings,
        encoder: Encoder { layers, num_heads: heads, head_dim: h / heads, rotary: Some(rotary), relative: None },
        final_norm: None,
        sizes: BackboneSizes { hidden: h, vocab: config.vocab_size, max_positions: config.max_position_embeddings },
    })
}
