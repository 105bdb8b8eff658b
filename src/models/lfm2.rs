//! LFM2 (`Lfm2Model`, `Lfm2ForCausalLM`, model_type `lfm2`: Liquid AI's LFM2 family, and
//! LiquidAI/LFM2-ColBERT-350M through its PyLate folder), as transformers' `modeling_lfm2.py`
//! runs it: a pre-norm decoder whose layers are either grouped-query causal attention (with
//! per-head RMSNorm on queries and keys before RoPE, `out_proj`) or a short-convolution block,
//! each followed by a SwiGLU feed-forward (`w2(silu(w1 x) · w3 x)`), and a final
//! `embedding_norm`.
//!
//! The short-convolution block: `in_proj` gives `B`, `C` and `x` (in that order), `B · x` runs
//! through a causal depthwise convolution of `conv_L_cache` taps along its sequence
//! ([`CausalConv`]), `C ·` that, then `out_proj`. Which layers attend is `layer_types`
//! (`full_attention` / `conv`) or the older `full_attn_idxs`; the feed-forward width follows
//! `block_auto_adjust_ff_dim` as transformers sizes it. Like the other decoders it embeds with
//! its last token by default; LFM2-ColBERT's PyLate folder makes it a multi-vector retriever.

use super::batch::Batch;
use super::llama::{decoder_root, fused_qkv, grouped_heads, qkv_parts, rope_with_default_theta};
use super::{parse_config, Architecture, Backbone, BackboneSizes, ModelError, SequencePooling};
use crate::kernels::conv::CausalConv;
use crate::kernels::{host_f32, Activation, Attention, AttentionMask, GatedActivation, Linear, QkNorm, RmsNorm, Rotary};
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub struct Lfm2;
pub static LFM2: Lfm2 = Lfm2;

/// The fields of an LFM2 `config.json`, with transformers' defaults and its older names
/// (`block_ff_dim`, `full_attn_idxs`).
#[derive(Debug, Clone, Deserialize)]
struct Lfm2Config {
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    #[serde(alias = "block_ff_dim")]
    intermediate_size: usize,
    #[serde(default = "default_positions")]
    max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    norm_eps: f64,
    #[serde(default)]
    conv_bias: bool,
    #[serde(default = "default_taps", rename = "conv_L_cache")]
    conv_taps: usize,
    #[serde(default = "default_multiple")]
    block_multiple_of: usize,
    #[serde(default = "default_multiplier")]
    block_ffn_dim_multiplier: Option<f64>,
    #[serde(default = "yes")]
    block_auto_adjust_ff_dim: bool,
    #[serde(default)]
    full_attn_idxs: Option<Vec<usize>>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
}

fn default_positions() -> usize {
    128_000
}
fn default_eps() -> f64 {
    1e-5
}
fn default_taps() -> usize {
    3
}
fn default_multiple() -> usize {
    256
}
fn default_multiplier() -> Option<f64> {
    Some(1.0)
}
fn yes() -> bool {
    true
}

impl Lfm2Config {
    /// The feed-forward width, as `Lfm2MLP` computes it: with `block_auto_adjust_ff_dim`, two
    /// thirds of the configured width, scaled by `block_ffn_dim_multiplier` (when set) and
    /// then rounded up to `block_multiple_of`.
    fn feed_forward_width(&self) -> usize {
        if !self.block_auto_adjust_ff_dim {
            return self.intermediate_size;
        }
        let width = (2.0 * self.intermediate_size as f64 / 3.0) as usize;
        match self.block_ffn_dim_multiplier {
            Some(multiplier) => {
                let multiple = self.block_multiple_of.max(1);
                ((multiplier * width as f64) as usize).div_ceil(multiple) * multiple
            }
            None => width,
        }
    }

    /// Whether layer `i` attends (else it convolves).
    fn attends(&self, i: usize) -> std::result::Result<bool, ModelError> {
        if let Some(types) = &self.layer_types {
            return match types.get(i).map(String::as_str) {
                Some("full_attention") => Ok(true),
                Some("conv") => Ok(false),
                other => Err(ModelError::Config(format!("layer_types[{i}] is {other:?} (full_attention or conv)"))),
            };
        }
        // transformers: every layer attends when neither field says otherwise.
        Ok(self.full_attn_idxs.as_ref().is_none_or(|attending| attending.contains(&i)))
    }
}

impl Architecture for Lfm2 {
    fn name(&self) -> &'static str {
        "LFM2"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["Lfm2"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["lfm2"]
    }

    fn default_pooling(&self, _config: &Value) -> SequencePooling {
        SequencePooling::Last
    }

    fn backbone(&self, config: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        Ok(Box::new(Lfm2Model::load(config, vb)?))
    }
}

/// A layer's token mixer.
enum Mixer {
    /// `qkv` fused; `out` is `out_proj`.
    Attention { qkv: Linear, qk_norm: QkNorm, out: Linear },
    /// `in_proj` → `[B; C; x]`, the convolution of `B · x`, `C ·` it, `out_proj`.
    Conv { in_proj: Linear, conv: CausalConv, out: Linear },
}

struct Layer {
    operator_norm: RmsNorm,
    mixer: Mixer,
    ffn_norm: RmsNorm,
    /// `[w1; w3]` fused: the gate, then the up projection.
    gate_up: Linear,
    down: Linear,
}

struct Lfm2Model {
    embed_tokens: Tensor,
    layers: Vec<Layer>,
    norm: RmsNorm,
    rotary: Rotary,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    sizes: BackboneSizes,
}

impl Lfm2Model {
    fn load(raw: &Value, vb: VarBuilder) -> std::result::Result<Self, ModelError> {
        let config: Lfm2Config = parse_config(raw)?;
        let h = config.hidden_size;
        let (heads, kv_heads, head_dim) = grouped_heads(config.num_attention_heads, config.num_key_value_heads, None, h)?;
        // LFM2 rotates with theta 1e6 unless its config says otherwise (transformers' default).
        let (rotary, max_positions) = rope_with_default_theta(raw, head_dim, config.max_position_embeddings, 1_000_000.0)?;
        let vb = decoder_root(vb);
        let eps = config.norm_eps;
        let (q_out, kv_out) = (heads * head_dim, kv_heads * head_dim);
        let inter = config.feed_forward_width();
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let lv = vb.pp(format!("layers.{i}"));
            let mixer = if config.attends(i)? {
                let at = lv.pp("self_attn");
                let (weight, _) = fused_qkv(&at, h, q_out, kv_out, false)?;
                Mixer::Attention {
                    qkv: Linear::new(weight, None)?.named_parts(&qkv_parts(&at, q_out, kv_out)),
                    qk_norm: QkNorm {
                        q: host_f32(&at.pp("q_layernorm").get(head_dim, "weight")?)?,
                        k: host_f32(&at.pp("k_layernorm").get(head_dim, "weight")?)?,
                        eps: eps as f32,
                    },
                    out: Linear::new(at.pp("out_proj").get((h, q_out), "weight")?, None)?.named(&at.pp("out_proj").prefix()),
                }
            } else {
                let cv = lv.pp("conv");
                let linear = |name: &str, out: usize| -> Result<Linear> {
                    let at = cv.pp(name);
                    let bias = if config.conv_bias { Some(at.get(out, "bias")?) } else { None };
                    Ok(Linear::new(at.get((out, h), "weight")?, bias)?.named(&at.prefix()))
                };
                let taps = config.conv_taps;
                let bias = if config.conv_bias { Some(host_f32(&cv.pp("conv").get(h, "bias")?)?) } else { None };
                Mixer::Conv {
                    in_proj: linear("in_proj", 3 * h)?,
                    conv: CausalConv { weight: host_f32(&cv.pp("conv").get((h, 1, taps), "weight")?)?, bias, taps },
                    out: linear("out_proj", h)?,
                }
            };
            let ff = lv.pp("feed_forward");
            layers.push(Layer {
                operator_norm: RmsNorm::new(lv.pp("operator_norm").get(h, "weight")?, eps)?,
                mixer,
                ffn_norm: RmsNorm::new(lv.pp("ffn_norm").get(h, "weight")?, eps)?,
                gate_up: super::weights::stacked_linear(&[(ff.pp("w1"), inter), (ff.pp("w3"), inter)], h, false)?,
                down: Linear::new(ff.pp("w2").get((h, inter), "weight")?, None)?.named(&ff.pp("w2").prefix()),
            });
        }
        Ok(Self {
            embed_tokens: vb.get((config.vocab_size, h), "embed_tokens.weight")?,
            layers,
            norm: RmsNorm::new(vb.pp("embedding_norm").get(h, "weight")?, eps)?,
            rotary,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            sizes: BackboneSizes { hidden: h, vocab: config.vocab_size, max_positions },
        })
    }
}

impl Backbone for Lfm2Model {
    fn forward(&self, batch: &Batch) -> Result<Tensor> {
        let device = self.embed_tokens.device();
        let ids = Tensor::from_slice(&batch.input_ids, batch.num_tokens(), device)?;
        let mut hidden = self.embed_tokens.index_select(&ids, 0)?;
        let table = self.rotary.table_for_sequences(&batch.cu_seqlens);
        let spans: Vec<(usize, usize)> = batch.spans().collect();
        let attention = Attention {
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            cu_seqlens: &batch.cu_seqlens,
            mask: AttentionMask::Causal,
            position_bias: None,
            disentangled: None,
            softcap: None,
        };
        let swiglu = GatedActivation { activation: Activation::Silu, act_on_first: true };
        for layer in &self.layers {
            let x = layer.operator_norm.forward(&hidden)?;
            hidden = match &layer.mixer {
                Mixer::Attention { qkv, qk_norm, out } => {
                    let qkv = table.apply(&qkv.forward(&x)?, self.num_heads, self.num_kv_heads, Some(qk_norm))?;
                    out.forward_add(&attention.forward(&qkv, None)?, &hidden)?
                }
                Mixer::Conv { in_proj, conv, out } => out.forward_add(&short_conv(in_proj, conv, &x, &spans)?, &hidden)?,
            };
            let inner = swiglu.forward(&layer.gate_up.forward(&layer.ffn_norm.forward(&hidden)?)?)?;
            hidden = layer.down.forward_add(&inner, &hidden)?;
        }
        self.norm.forward(&hidden)
    }

    fn sizes(&self) -> BackboneSizes {
        self.sizes
    }

    fn int8_linears(&mut self) -> Vec<&mut Linear> {
        let mut out = Vec::new();
        for layer in &mut self.layers {
            match &mut layer.mixer {
                Mixer::Attention { out: o, .. } => out.push(o),
                Mixer::Conv { in_proj, out: o, .. } => {
                    out.push(in_proj);
                    out.push(o);
                }
            }
            out.push(&mut layer.gate_up);
            out.push(&mut layer.down);
        }
        out
    }

    fn attention_input_linears(&mut self) -> Vec<&mut Linear> {
        self.layers
            .iter_mut()
            .filter_map(|l| match &mut l.mixer {
                Mixer::Attention { qkv, .. } => Some(qkv),
                Mixer::Conv { .. } => None,
            })
            .collect()
    }
}

/// The short-convolution mixer on `x` (`[tokens, hidden]`): `C · conv(B · x)`, in f32 on the
/// host (a few taps per channel: the products around it dominate).
fn short_conv(in_proj: &Linear, conv: &CausalConv, x: &Tensor, spans: &[(usize, usize)]) -> Result<Tensor> {
    let (tokens, h) = x.dims2()?;
    let bcx = host_f32(&in_proj.forward(x)?.to_dtype(DType::F32)?)?;
    let gated: Vec<f32> = bcx.chunks_exact(3 * h).flat_map(|row| row[..h].iter().zip(&row[2 * h..]).map(|(b, x)| b * x)).collect();
    let mixed = conv.forward(&gated, tokens, spans, |v| v);
    let out: Vec<f32> =
        bcx.chunks_exact(3 * h).zip(mixed.chunks_exact(h)).flat_map(|(row, y)| row[h..2 * h].iter().zip(y).map(|(c, y)| c * y)).collect();
    Tensor::from_vec(out, (tokens, h), &Device::Cpu)?.to_device(x.device())?.to_dtype(x.dtype())
}
