//! Alibaba GTE (`GteModel`, hub `NewModel`: gte-base-en-v1.5, gte-multilingual-base): a
//! post-LayerNorm encoder with rotary positions instead of a position table, fused `qkv_proj`,
//! and a gated MLP (`up_gate_proj`: rows up, then gate; `down(gelu(gate) · up)`).

use super::batch::Batch;
use super::bert::{layer_norm, linear};
use super::ops::{Activation, Attention, AttentionMask, GatedActivation, LayerNorm, Linear, Rotary};
use super::qwen::rope_theta;
use super::{parse_config, Architecture, Backbone, ModelError};
use candle_core::{Result, Tensor};
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

struct Layer {
    qkv: Linear,
    o_proj: Linear,
    attn_ln: LayerNorm,
    up_gate: Linear,
    down: Linear,
    mlp_ln: LayerNorm,
}

pub struct Gte {
    word: Tensor,
    token_type: Tensor,
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
    rotary: Rotary,
    gated: GatedActivation,
    num_heads: usize,
    config: GteConfig,
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
        Ok(Box::new(Gte::load(config, vb)?))
    }
}

impl Gte {
    pub fn load(raw: &serde_json::Value, vb: VarBuilder) -> std::result::Result<Self, ModelError> {
        let config: GteConfig = parse_config(raw)?;
        let (h, heads) = (config.hidden_size, config.num_attention_heads);
        if h % heads != 0 || (h / heads) % 2 != 0 {
            return Err(ModelError::Config("hidden_size does not split into even-sized heads".into()));
        }
        let activation = Activation::from_config(&config.hidden_act)
            .ok_or_else(|| ModelError::Config(format!("hidden_act `{}` is not supported", config.hidden_act)))?;
        let vb = if vb.contains_tensor("new.embeddings.word_embeddings.weight") { vb.pp("new") } else { vb };
        let (inter, eps) = (config.intermediate_size, config.layer_norm_eps);
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let lv = vb.pp(format!("encoder.layer.{i}"));
            layers.push(Layer {
                qkv: linear(&lv.pp("attention.qkv_proj"), 3 * h, h)?,
                o_proj: linear(&lv.pp("attention.o_proj"), h, h)?,
                attn_ln: layer_norm(&lv.pp("attn_ln"), h, eps)?,
                up_gate: Linear::new(lv.pp("mlp.up_gate_proj").get((2 * inter, h), "weight")?, None)?
                    .named(&lv.pp("mlp.up_gate_proj").prefix()),
                down: linear(&lv.pp("mlp.down_proj"), h, inter)?,
                mlp_ln: layer_norm(&lv.pp("mlp_ln"), h, eps)?,
            });
        }
        let emb = vb.pp("embeddings");
        Ok(Self {
            word: emb.get((config.vocab_size, h), "word_embeddings.weight")?,
            token_type: emb.get((config.type_vocab_size, h), "token_type_embeddings.weight")?,
            embedding_norm: layer_norm(&emb.pp("LayerNorm"), h, eps)?,
            layers,
            rotary: Rotary::new(h / heads, rope_theta(raw)?),
            gated: GatedActivation { activation, act_on_first: false },
            num_heads: heads,
            config,
        })
    }
}

impl Backbone for Gte {
    fn forward(&self, batch: &Batch) -> Result<Tensor> {
        let n = batch.num_tokens();
        let ids = Tensor::from_slice(&batch.input_ids, n, self.word.device())?;
        let word = self.word.index_select(&ids, 0)?;
        let embedded = if self.config.type_vocab_size > 1 && batch.token_type_ids.iter().any(|&t| t != 0) {
            let types = Tensor::from_slice(&batch.token_type_ids, n, self.word.device())?;
            (word + self.token_type.index_select(&types, 0)?)?
        } else {
            word.broadcast_add(&self.token_type.get(0)?)?
        };
        let mut hidden = self.embedding_norm.forward(embedded)?;
        let table = self.rotary.table(&batch.positions(0));
        let heads = self.num_heads;
        let attention = Attention {
            num_heads: heads,
            num_kv_heads: heads,
            head_dim: self.config.hidden_size / heads,
            cu_seqlens: &batch.cu_seqlens,
            mask: AttentionMask::Bidirectional,
            position_bias: None,
            disentangled: None,
            softcap: None,
        };
        for layer in &self.layers {
            // The bias must be in Q and K before they are rotated, so it is not folded here.
            let qkv = table.apply(&layer.qkv.forward(&hidden)?, heads, heads, None)?;
            hidden = layer.attn_ln.forward_add(&layer.o_proj, &attention.forward(&qkv, None)?, &hidden)?;
            let inner = self.gated.forward(&layer.up_gate.forward(&hidden)?)?;
            hidden = layer.mlp_ln.forward_add(&layer.down, &inner, &hidden)?;
        }
        Ok(hidden)
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
        self.layers.iter_mut().flat_map(|l| [&mut l.o_proj, &mut l.up_gate, &mut l.down]).collect()
    }

    fn attention_input_linears(&mut self) -> Vec<&mut Linear> {
        self.layers.iter_mut().map(|l| &mut l.qkv).collect()
    }
}
