//! NomicBERT (`NomicBertModel`, model_type `nomic_bert`: nomic-embed-text-v1 / v1.5), as
//! nomic-ai's published `modeling_hf_nomic_bert.py` (nomic-ai/contrastors) runs it: a
//! post-LayerNorm encoder with rotary positions (GPT-NeoX half rotation) instead of a position
//! table, a fused `Wqkv`, and a SwiGLU feed-forward `fc2(fc11(x) · silu(fc12(x)))`; none of
//! its linear layers has a bias in the published checkpoints.
//!
//! Embeddings are `emb_ln(word + token_type)`; each layer is `norm1(x + attn(x))` then
//! `norm2(h + mlp(h))`, with no final norm. The variants the published code also has but no
//! published text checkpoint uses (pre-norm, partial or interleaved rotary, parallel blocks)
//! are refused at load with the field named.

use super::encoder::{Embeddings, Encoder, EncoderLayer, EncoderModel, FeedForward, Ffn, Norms, RotaryPositions};
use super::weights::{layer_norm, linear_with_bias, stacked_linear};
use super::{parse_config, Architecture, Backbone, BackboneSizes, ModelError};
use crate::kernels::moe::{Expert, Experts};
use crate::kernels::{Activation, GatedActivation, Linear, Rotary};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub struct NomicBert;
pub static NOMIC_BERT: NomicBert = NomicBert;

/// The fields of a NomicBERT `config.json`, with the published config class's defaults where
/// the file leaves one out. The published checkpoints use GPT-2-style names (`n_embd`, …);
/// transformers 5's own `NomicBertConfig` writes BERT-style ones (`hidden_size`, …, with
/// `hidden_act` and `rope_parameters`) over the same tensor names, so both are read.
#[derive(Debug, Clone, Deserialize)]
struct NomicBertConfig {
    #[serde(default = "default_vocab")]
    vocab_size: usize,
    #[serde(default = "one")]
    pad_vocab_size_multiple: usize,
    #[serde(default = "default_width", alias = "hidden_size")]
    n_embd: usize,
    #[serde(default = "default_count", alias = "num_attention_heads")]
    n_head: usize,
    #[serde(default = "default_count", alias = "num_hidden_layers")]
    n_layer: usize,
    #[serde(default)]
    n_inner: Option<usize>,
    /// transformers 5: the feed-forward width as is (the published code rounds `n_inner`).
    #[serde(default)]
    intermediate_size: Option<usize>,
    #[serde(default = "default_positions", alias = "max_position_embeddings")]
    n_positions: usize,
    #[serde(default = "default_act")]
    activation_function: String,
    /// transformers 5: the gate's activation (`silu`: SwiGLU, `gelu`: GeGLU).
    #[serde(default)]
    hidden_act: Option<String>,
    /// transformers 5: `rope_theta`.
    #[serde(default)]
    rope_parameters: Option<RopeParameters>,
    #[serde(default = "default_eps", alias = "layer_norm_eps")]
    layer_norm_epsilon: f64,
    #[serde(default = "default_types")]
    type_vocab_size: usize,
    #[serde(default)]
    rotary_emb_fraction: f64,
    #[serde(default = "default_base")]
    rotary_emb_base: f64,
    #[serde(default)]
    rotary_emb_interleaved: bool,
    #[serde(default)]
    rotary_scaling_factor: Option<f64>,
    #[serde(default = "default_trained")]
    max_trained_positions: usize,
    #[serde(default = "yes")]
    qkv_proj_bias: bool,
    #[serde(default = "yes")]
    mlp_fc1_bias: bool,
    #[serde(default = "yes")]
    mlp_fc2_bias: bool,
    #[serde(default)]
    prenorm: bool,
    #[serde(default)]
    parallel_block: bool,
    #[serde(default)]
    causal: bool,
    /// NomicBERT MoE (nomic-embed-text-v2-moe): experts in every `moe_every_n_layers`-th
    /// layer (those with `i % n == 1`), each token through its `moe_top_k` best.
    #[serde(default)]
    num_experts: usize,
    #[serde(default = "one")]
    moe_top_k: usize,
    #[serde(default)]
    moe_every_n_layers: usize,
    #[serde(default)]
    moe_normalize_expert_weights: bool,
}

#[derive(Debug, Clone, Deserialize)]
struct RopeParameters {
    rope_theta: f64,
}

fn default_vocab() -> usize {
    50257
}
fn one() -> usize {
    1
}
fn default_width() -> usize {
    768
}
fn default_count() -> usize {
    12
}
fn default_positions() -> usize {
    1024
}
fn default_act() -> String {
    "gelu_new".into()
}
fn default_eps() -> f64 {
    1e-5
}
fn default_types() -> usize {
    2
}
fn default_trained() -> usize {
    2048
}
fn default_base() -> f64 {
    10_000.0
}
fn yes() -> bool {
    true
}

impl NomicBertConfig {
    /// The embedding table's rows: the published model rounds the vocabulary up to a multiple
    /// of `pad_vocab_size_multiple`.
    fn padded_vocab(&self) -> usize {
        self.vocab_size.div_ceil(self.pad_vocab_size_multiple.max(1)) * self.pad_vocab_size_multiple.max(1)
    }

    /// The feed-forward width: transformers 5's `intermediate_size`; else `n_inner` (else 8/3
    /// of the width), rounded up to a multiple of 256 as the published MLP does.
    fn inner(&self) -> usize {
        if let Some(exact) = self.intermediate_size {
            return exact;
        }
        let inner = self.n_inner.unwrap_or(8 * self.n_embd / 3);
        inner.div_ceil(256) * 256
    }

    /// Whether the file is transformers 5's own layout (BERT-style names).
    fn is_transformers_layout(&self) -> bool {
        self.hidden_act.is_some() || self.rope_parameters.is_some() || self.intermediate_size.is_some()
    }

    /// The gated feed-forward's activation: `swiglu` / `geglu` in the published configs,
    /// `hidden_act` in transformers 5's.
    fn gate(&self) -> &str {
        match self.hidden_act.as_deref() {
            Some("silu" | "swish") => "swiglu",
            Some("gelu") => "geglu",
            Some(other) => other,
            None => &self.activation_function,
        }
    }

    /// The rotary base: transformers 5's `rope_parameters.rope_theta` (its default, 1000, when
    /// the file is in its layout without one), else the published `rotary_emb_base`.
    fn rotary_base(&self) -> f64 {
        match &self.rope_parameters {
            Some(rope) => rope.rope_theta,
            None if self.is_transformers_layout() => 1000.0,
            None => self.rotary_emb_base,
        }
    }

    /// Rotary positions need no table: `n_positions`, the length the checkpoint declares. With
    /// `rotary_scaling_factor` set, the published code switches to dynamic NTK scaling above
    /// `max_trained_positions`; inputs stop there, where its plain rotary is exact (vLLM too
    /// serves NomicBERT up to `max_trained_positions` by default).
    fn max_positions(&self) -> usize {
        match self.rotary_scaling_factor {
            Some(_) => self.n_positions.min(self.max_trained_positions),
            None => self.n_positions,
        }
    }

    /// What this file does not run, as a config error naming the field.
    fn refuse_unsupported(&self) -> std::result::Result<(), ModelError> {
        let refuse = |what: &str| Err(ModelError::Config(format!("NomicBERT with {what} is not supported")));
        if self.prenorm {
            return refuse("prenorm: true");
        }
        if self.parallel_block {
            return refuse("parallel_block: true");
        }
        if self.causal {
            return refuse("causal: true");
        }
        if !self.is_transformers_layout() && self.rotary_emb_fraction != 1.0 {
            return refuse(&format!("rotary_emb_fraction {} (only 1.0, full rotary positions)", self.rotary_emb_fraction));
        }
        if self.rotary_emb_interleaved {
            return refuse("rotary_emb_interleaved: true");
        }
        if !matches!(self.gate(), "swiglu" | "geglu" | "gelu") {
            return refuse(&format!("activation `{}` (swiglu, geglu and gelu are)", self.gate()));
        }
        if self.num_experts > 0 && self.moe_every_n_layers > 0 {
            if self.moe_normalize_expert_weights {
                return refuse("moe_normalize_expert_weights: true");
            }
            if self.moe_top_k == 0 || self.moe_top_k > self.num_experts {
                return refuse(&format!("moe_top_k {} of {} experts", self.moe_top_k, self.num_experts));
            }
        }
        if !self.n_embd.is_multiple_of(self.n_head) || !(self.n_embd / self.n_head).is_multiple_of(2) {
            return Err(ModelError::Config("n_embd does not split into even-sized heads".into()));
        }
        Ok(())
    }
}

impl Architecture for NomicBert {
    fn name(&self) -> &'static str {
        "NomicBERT"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["NomicBert"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["nomic_bert"]
    }

    fn backbone(&self, config: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        Ok(Box::new(load(config, vb)?))
    }
}

/// An MoE layer's router and experts under the published names: `router.layer` `[E, h]`, and
/// `experts.mlp.w1` / `w2`, each `[E · inner, h]` expert-major (expert e is
/// `gelu(x · w1[e]ᵀ) · w2[e]`), plus `experts.bias`.
fn experts(config: &NomicBertConfig, mlp: &VarBuilder) -> std::result::Result<Experts, ModelError> {
    let (h, inner, n) = (config.n_embd, config.inner(), config.num_experts);
    let w1 = mlp.get((n * inner, h), "experts.mlp.w1")?;
    let w2 = mlp.get((n * inner, h), "experts.mlp.w2")?;
    let experts = (0..n)
        .map(|e| {
            Ok(Expert {
                up: Linear::new(w1.narrow(0, e * inner, inner)?.contiguous()?, None)?,
                down: Linear::new(w2.narrow(0, e * inner, inner)?.t()?.contiguous()?, None)?,
            })
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    Ok(Experts {
        router: Linear::new(mlp.get((n, h), "router.layer.weight")?, None)?,
        experts,
        bias: mlp.get(h, "experts.bias")?,
        top_k: config.moe_top_k,
        activation: Activation::Gelu,
    })
}

/// NomicBERT's backbone: `emb_ln(word + token_type)`, then the shared post-norm encoder with
/// rotary positions and the SwiGLU (or GeGLU) MLP, `fc11` and `fc12` stacked into one product.
fn load(raw: &Value, vb: VarBuilder) -> std::result::Result<EncoderModel, ModelError> {
    let mut config: NomicBertConfig = parse_config(raw)?;
    config.refuse_unsupported()?;
    if config.is_transformers_layout() {
        // transformers 5's NomicBertModel has no biases and no flags for them.
        (config.qkv_proj_bias, config.mlp_fc1_bias, config.mlp_fc2_bias) = (false, false, false);
    }
    // `NomicBertForPreTraining` checkpoints keep the encoder under `bert.`.
    let vb = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") { vb.pp("bert") } else { vb };
    let (h, inner, eps) = (config.n_embd, config.inner(), config.layer_norm_epsilon);
    let mut layers = Vec::with_capacity(config.n_layer);
    for i in 0..config.n_layer {
        let lv = vb.pp(format!("encoder.layers.{i}"));
        let mlp = lv.pp("mlp");
        let moe = config.num_experts > 0 && config.moe_every_n_layers > 0 && i % config.moe_every_n_layers == 1;
        let ffn = match config.gate() {
            _ if moe => Ffn::Experts(Box::new(experts(&config, &mlp)?)),
            // nomic-embed-text-v2-moe's dense layers: `fc2(gelu(fc1(x)))`, erf GELU.
            "gelu" => Ffn::Dense {
                up: linear_with_bias(&mlp.pp("fc1"), inner, h, config.mlp_fc1_bias)?,
                feed_forward: FeedForward::Plain(Activation::Gelu),
                down: linear_with_bias(&mlp.pp("fc2"), h, inner, config.mlp_fc2_bias)?,
            },
            gate => Ffn::Dense {
                up: stacked_linear(&[(mlp.pp("fc11"), inner), (mlp.pp("fc12"), inner)], h, config.mlp_fc1_bias)?,
                // fc12, the second half, is the gated one.
                feed_forward: FeedForward::Gated(GatedActivation {
                    activation: if gate == "geglu" { Activation::Gelu } else { Activation::Silu },
                    act_on_first: false,
                }),
                down: linear_with_bias(&mlp.pp("fc2"), h, inner, config.mlp_fc2_bias)?,
            },
        };
        layers.push(EncoderLayer {
            qkv: linear_with_bias(&lv.pp("attn.Wqkv"), 3 * h, h, config.qkv_proj_bias)?,
            attention_out: linear_with_bias(&lv.pp("attn.out_proj"), h, h, config.qkv_proj_bias)?,
            ffn,
            norms: Norms::Post {
                attention_norm: layer_norm(&lv.pp("norm1"), h, eps)?,
                feed_forward_norm: layer_norm(&lv.pp("norm2"), h, eps)?,
            },
            local: false,
        });
    }
    let emb = vb.pp("embeddings");
    let embeddings = Embeddings {
        word: emb.get((config.padded_vocab(), h), "word_embeddings.weight")?,
        position: None,
        position_offset: 0,
        token_type: match config.type_vocab_size {
            0 => None,
            types => Some(emb.get((types, h), "token_type_embeddings.weight")?),
        },
        norm: layer_norm(&vb.pp("emb_ln"), h, eps)?,
        projection: None,
    };
    let heads = config.n_head;
    let rotary = RotaryPositions { global: Rotary::new(h / heads, config.rotary_base()), local: None };
    Ok(EncoderModel {
        embeddings,
        encoder: Encoder { layers, num_heads: heads, head_dim: h / heads, rotary: Some(rotary), relative: None },
        final_norm: None,
        sizes: BackboneSizes { hidden: h, vocab: config.padded_vocab(), max_positions: config.max_positions() },
    })
}
