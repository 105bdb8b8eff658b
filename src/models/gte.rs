//! Alibaba GTE (`GteModel`, hub `NewModel`: gte-base-en-v1.5, gte-multilingual-base,
//! snowflake-arctic-embed-m-v2.0): a post-LayerNorm encoder with rotary positions instead of a
//! position table, fused `qkv_proj`, and a gated MLP (`up_gate_proj`: rows up, then gate;
//! `down(gelu(gate) · up)`).
//!
//! As Alibaba's published code (Alibaba-NLP/new-impl) reads its config:
//! - `rope_scaling: {"type": "ntk", "factor"}` (gte-multilingual-base: 8; the v1.5 models: 2)
//!   scales the frequencies at every position ([`crate::kernels::RopeScaling::Ntk`], through [`super::llama::rope_of`]);
//! - `type_vocab_size: 0` (gte-base-en-v1.5) means no token-type table;
//! - the switches it has that no published checkpoint turns on (`logn_attention_scale`,
//!   `layer_norm_type: rms_norm`, a `position_embedding_type` other than rope) are refused, as
//!   TEI refuses them, rather than served wrong.
//!
//! `NewForSequenceClassification` (gte-multilingual-reranker-base): the first token through
//! `pooler.dense` and tanh, then `classifier`, as BERT's head.

use super::bert::{bert_embeddings, TableSizes};
use super::encoder::{Encoder, EncoderLayer, EncoderModel, FeedForward, Ffn, Norms, RotaryPositions};
use super::head_weights::{host_linear, ClassifierWeights, HeadInput, PreClassifier};
use super::llama::rope_of;
use super::weights::{layer_norm, linear, linear_with_bias};
use super::{parse_config, Architecture, Backbone, BackboneSizes, ModelError};
use crate::kernels::{Activation, GatedActivation};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

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
    #[serde(default)]
    logn_attention_scale: bool,
    #[serde(default)]
    layer_norm_type: Option<String>,
    #[serde(default)]
    position_embedding_type: Option<String>,
}

impl GteConfig {
    /// Refuses the switches of the published code that no checkpoint here uses.
    fn check(&self) -> std::result::Result<(), ModelError> {
        if self.logn_attention_scale {
            return Err(ModelError::Config("logn_attention_scale is not supported".into()));
        }
        if let Some(kind) = self.layer_norm_type.as_deref().filter(|k| *k != "layer_norm") {
            return Err(ModelError::Config(format!("layer_norm_type `{kind}` is not supported")));
        }
        if let Some(kind) = self.position_embedding_type.as_deref().filter(|k| !matches!(*k, "rope" | "rotary")) {
            return Err(ModelError::Config(format!("position_embedding_type `{kind}` is not supported (GTE rotates)")));
        }
        Ok(())
    }
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

/// GTE, with `NewForSequenceClassification`'s head; no masked-LM head here.
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

    /// `NewForSequenceClassification`: `new.pooler.dense` (tanh) on the first token, then
    /// `classifier`.
    fn classifier(
        &self,
        config: &Value,
        vb: VarBuilder,
        num_labels: usize,
        _from_tokens: Option<&[u32]>,
    ) -> std::result::Result<ClassifierWeights, ModelError> {
        let h = parse_config::<GteConfig>(config)?.hidden_size;
        Ok(ClassifierWeights {
            pre: Some(PreClassifier::tanh(host_linear(&gte_root(vb.clone()).pp("pooler.dense"), h, h)?)),
            classifier: host_linear(&vb.pp("classifier"), num_labels, h)?,
            input: HeadInput::First,
            pre_on_tokens: false,
        })
    }
}

/// Task checkpoints keep the encoder under `new.` (transformers 5's own GTE: `gte.`).
fn gte_root(vb: VarBuilder) -> VarBuilder {
    ["new", "gte"]
        .into_iter()
        .find(|prefix| vb.contains_tensor(&format!("{prefix}.embeddings.word_embeddings.weight")))
        .map_or(vb.clone(), |prefix| vb.pp(prefix))
}

/// GTE's backbone: word and token-type embeddings, then the shared post-norm encoder with
/// rotary positions and the gated MLP.
fn load(raw: &Value, vb: VarBuilder) -> std::result::Result<EncoderModel, ModelError> {
    let config: GteConfig = parse_config(raw)?;
    config.check()?;
    let (h, heads) = (config.hidden_size, config.num_attention_heads);
    if h % heads != 0 || (h / heads) % 2 != 0 {
        return Err(ModelError::Config("hidden_size does not split into even-sized heads".into()));
    }
    let activation = Activation::from_config(&config.hidden_act)
        .ok_or_else(|| ModelError::Config(format!("hidden_act `{}` is not supported", config.hidden_act)))?;
    let vb = gte_root(vb);
    let (inter, eps) = (config.intermediate_size, config.layer_norm_eps);
    // `up_gate_proj` holds the up rows first, then the gate's.
    let gate = GatedActivation { activation, act_on_first: false };
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for i in 0..config.num_hidden_layers {
        let lv = vb.pp(format!("encoder.layer.{i}"));
        layers.push(EncoderLayer {
            qkv: linear(&lv.pp("attention.qkv_proj"), 3 * h, h)?,
            attention_out: linear(&lv.pp("attention.o_proj"), h, h)?,
            ffn: Ffn::Dense {
                up: linear_with_bias(&lv.pp("mlp.up_gate_proj"), 2 * inter, h, false)?,
                feed_forward: FeedForward::Gated(gate),
                down: linear(&lv.pp("mlp.down_proj"), h, inter)?,
            },
            norms: Norms::Post {
                attention_norm: layer_norm(&lv.pp("attn_ln"), h, eps)?,
                feed_forward_norm: layer_norm(&lv.pp("mlp_ln"), h, eps)?,
            },
            local: false,
        });
    }
    let emb = vb.pp("embeddings");
    let tables = TableSizes {
        width: h,
        vocab: config.vocab_size,
        positions: None,
        types: (config.type_vocab_size > 0).then_some(config.type_vocab_size),
        eps,
    };
    let embeddings = bert_embeddings(&emb, tables)?;
    // `rope_theta` under `rope_scaling` (the published code's fixed `ntk` among the scalings).
    let (global, _) = rope_of(raw, h / heads, config.max_position_embeddings)?;
    let rotary = RotaryPositions { global, local: None };
    Ok(EncoderModel {
        embeddings,
        encoder: Encoder { layers, num_heads: heads, head_dim: h / heads, rotary: Some(rotary), relative: None },
        final_norm: None,
        sizes: BackboneSizes { hidden: h, vocab: config.vocab_size, max_positions: config.max_position_embeddings },
    })
}
