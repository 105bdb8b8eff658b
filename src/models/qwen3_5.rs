//! Qwen3.5's language model (`Qwen3_5TextModel`, transformers 5.24's `modeling_qwen3_5.py`): a
//! hybrid decoder whose layers (`layer_types`, by default three in four) mix tokens by linear
//! attention ([`GatedDeltaNet`]) or by gated full attention ([`GatedAttention`]), each followed
//! by Qwen's SwiGLU feed-forward. ColQwen3.5 ([`super::colqwen3_5`]) serves it with Qwen3-VL's
//! vision tower.
//!
//! - **Norms:** every RMSNorm but the DeltaNet's output norm is zero-centred (`x̂ · (1 + w)`);
//!   the `1 + w` is folded into the weights at load.
//! - **Gated attention:** `q_proj` gives each head its query and an output gate side by side
//!   (split apart at load), q/k norms, RoPE over the first `partial_rotary_factor` of each head
//!   with interleaved M-RoPE (Qwen3-VL's, [`super::qwen3_vl`]), causal attention, the output
//!   times `sigmoid(gate)`, then `o_proj`.
//! - **Gated DeltaNet:** `in_proj_qkv` → a causal depthwise convolution over each sequence
//!   (`linear_conv_kernel_dim` taps, no bias) → SiLU → queries, keys (L2-normalized; queries
//!   also scaled by `1/√d_k`) and values; per value head a `d_k × d_v` state decays by
//!   `exp(g)`, `g = −exp(A_log) · softplus(a + dt_bias)`, and takes the delta rule's update
//!   `S += k ⊗ β(v − Sᵀk)`, `β = sigmoid(b)`; a token reads `Sᵀq`. Key heads serve
//!   `value_heads / key_heads` consecutive value heads. The output is RMS-normalized per head,
//!   times `silu(z)`, then `out_proj`. The recurrence runs token by token on the host in f32
//!   (transformers' reference computes it in chunks, equal up to rounding), on every device.

use super::batch::Batch;
use super::llama::fused_gate_up;
use super::qwen2_vl::{mrope_positions, mrope_section};
use super::qwen3_vl::interleaved_axes;
use super::{parse_config, Backbone, BackboneSizes, ModelError};
use crate::kernels::conv::CausalConv;
use crate::kernels::{
    host_f32, softplus, Activation, Attention, AttentionMask, GatedActivation, Linear, QkNorm, RmsNorm, Rotary, RotaryTable,
};
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use rayon::prelude::*;
use serde::Deserialize;
use serde_json::Value;

/// `Qwen3_5TextConfig`'s fields (its defaults where absent).
#[derive(Debug, Deserialize)]
struct TextConfig {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    #[serde(default = "default_head_dim")]
    head_dim: usize,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default = "default_positions")]
    max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default = "default_conv")]
    linear_conv_kernel_dim: usize,
    #[serde(default = "default_linear_dim")]
    linear_key_head_dim: usize,
    #[serde(default = "default_linear_dim")]
    linear_value_head_dim: usize,
    #[serde(default = "default_key_heads")]
    linear_num_key_heads: usize,
    #[serde(default = "default_value_heads")]
    linear_num_value_heads: usize,
    layer_types: Option<Vec<String>>,
    #[serde(default = "default_interval")]
    full_attention_interval: usize,
}

fn default_head_dim() -> usize {
    256
}
fn default_act() -> String {
    "silu".into()
}
fn default_positions() -> usize {
    32_768
}
fn default_eps() -> f64 {
    1e-6
}
fn default_conv() -> usize {
    4
}
fn default_linear_dim() -> usize {
    128
}
fn default_key_heads() -> usize {
    16
}
fn default_value_heads() -> usize {
    32
}
fn default_interval() -> usize {
    4
}

/// A zero-centred RMSNorm (`x̂ · (1 + w)`) as a plain one.
fn centred_norm(vb: &VarBuilder, size: usize, eps: f64) -> Result<RmsNorm> {
    RmsNorm::new((vb.get(size, "weight")?.to_dtype(DType::F32)? + 1.0)?.to_dtype(vb.dtype())?, eps)
}

fn centred_host(vb: &VarBuilder, size: usize) -> Result<Vec<f32>> {
    Ok(host_f32(&vb.get(size, "weight")?)?.into_iter().map(|w| 1.0 + w).collect())
}

/// Full attention with an output gate.
struct GatedAttention {
    /// `[q; k; v]`, the queries taken out of `q_proj`'s interleaved rows.
    qkv: Linear,
    /// The gates, the other half of `q_proj`'s rows.
    gate: Linear,
    qk_norm: QkNorm,
    o_proj: Linear,
}

impl GatedAttention {
    fn load(vb: &VarBuilder, c: &TextConfig) -> Result<Self> {
        let (h, heads, kv, d) = (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        // `q_proj` rows: per head, `d` query rows then `d` gate rows.
        let halves = |t: Tensor, rest: &[usize]| -> Result<(Tensor, Tensor)> {
            let mut shape = vec![heads, 2, d];
            shape.extend_from_slice(rest);
            let t = t.reshape(shape)?;
            let flat = |x: Tensor| -> Result<Tensor> {
                let mut s = vec![heads * d];
                s.extend_from_slice(rest);
                x.contiguous()?.reshape(s)
            };
            Ok((flat(t.narrow(1, 0, 1)?)?, flat(t.narrow(1, 1, 1)?)?))
        };
        let at = vb.pp("self_attn");
        let (q, gate) = halves(at.pp("q_proj").get((2 * heads * d, h), "weight")?, &[h])?;
        let k = at.pp("k_proj").get((kv * d, h), "weight")?;
        let v = at.pp("v_proj").get((kv * d, h), "weight")?;
        let (qkv_bias, gate_bias, o_bias) = if c.attention_bias {
            let (qb, gb) = halves(at.pp("q_proj").get(2 * heads * d, "bias")?, &[])?;
            let qkv = Tensor::cat(&[qb, at.pp("k_proj").get(kv * d, "bias")?, at.pp("v_proj").get(kv * d, "bias")?], 0)?;
            (Some(qkv), Some(gb), Some(at.pp("o_proj").get(h, "bias")?))
        } else {
            (None, None, None)
        };
        let parts = super::llama::qkv_parts(&at, heads * d, kv * d);
        Ok(Self {
            qkv: Linear::new(Tensor::cat(&[q, k, v], 0)?, qkv_bias)?.named_parts(&parts),
            gate: Linear::new(gate, gate_bias)?,
            qk_norm: QkNorm { q: centred_host(&at.pp("q_norm"), d)?, k: centred_host(&at.pp("k_norm"), d)?, eps: c.rms_norm_eps as f32 },
            o_proj: Linear::new(at.pp("o_proj").get((h, heads * d), "weight")?, o_bias)?.named(&at.pp("o_proj").prefix()),
        })
    }

    /// The mixer's output added to `residual`.
    fn forward(&self, x: &Tensor, residual: &Tensor, table: &RotaryTable, attention: &Attention) -> Result<Tensor> {
        let qkv = table.apply(&self.qkv.forward(x)?, attention.num_heads, attention.num_kv_heads, Some(&self.qk_norm))?;
        let gate = candle_nn::ops::sigmoid(&self.gate.forward(x)?)?;
        self.o_proj.forward_add(&(attention.forward(&qkv, None)? * gate)?, residual)
    }
}

/// Linear attention by the gated delta rule.
struct GatedDeltaNet {
    in_qkv: Linear,
    in_z: Linear,
    in_b: Linear,
    in_a: Linear,
    /// The depthwise causal convolution (no bias), SiLU after it.
    conv: CausalConv,
    /// `exp(A_log)` per value head.
    decay_rate: Vec<f32>,
    dt_bias: Vec<f32>,
    /// The output RMSNorm's weight (not zero-centred), per value-head dimension.
    norm: Vec<f32>,
    eps: f32,
    out_proj: Linear,
    key_heads: usize,
    value_heads: usize,
    dk: usize,
    dv: usize,
}

impl GatedDeltaNet {
    fn load(vb: &VarBuilder, c: &TextConfig) -> std::result::Result<Self, ModelError> {
        let (h, nk, nv, dk, dv) =
            (c.hidden_size, c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim);
        if nk == 0 || !nv.is_multiple_of(nk) {
            return Err(ModelError::Config(format!("linear_num_value_heads {nv} is not a multiple of linear_num_key_heads {nk}")));
        }
        let at = vb.pp("linear_attn");
        let channels = 2 * nk * dk + nv * dv;
        let taps = c.linear_conv_kernel_dim;
        let linear = |name: &str, out: usize, inp: usize| -> Result<Linear> {
            Ok(Linear::new(at.pp(name).get((out, inp), "weight")?, None)?.named(&at.pp(name).prefix()))
        };
        Ok(Self {
            in_qkv: linear("in_proj_qkv", channels, h)?,
            in_z: linear("in_proj_z", nv * dv, h)?,
            in_b: linear("in_proj_b", nv, h)?,
            in_a: linear("in_proj_a", nv, h)?,
            conv: CausalConv { weight: host_f32(&at.pp("conv1d").get((channels, 1, taps), "weight")?)?, bias: None, taps },
            decay_rate: host_f32(&at.get(nv, "A_log")?)?.into_iter().map(f32::exp).collect(),
            dt_bias: host_f32(&at.get(nv, "dt_bias")?)?,
            norm: host_f32(&at.pp("norm").get(dv, "weight")?)?,
            eps: c.rms_norm_eps as f32,
            out_proj: linear("out_proj", h, nv * dv)?,
            key_heads: nk,
            value_heads: nv,
            dk,
            dv,
        })
    }

    /// The mixer's output added to `residual`; `spans` are the batch's sequences.
    fn forward(&self, x: &Tensor, residual: &Tensor, spans: &[(usize, usize)]) -> Result<Tensor> {
        let host = |t: Tensor| -> Result<Vec<f32>> { t.to_device(&Device::Cpu)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1() };
        let mixed = host(self.in_qkv.forward(x)?)?;
        let z = host(self.in_z.forward(x)?)?;
        let b = host(self.in_b.forward(x)?)?;
        let a = host(self.in_a.forward(x)?)?;
        let tokens = x.dim(0)?;
        let mixed = self.conv.forward(&mixed, tokens, spans, |v| v * sigmoid(v));
        let (nk, nv, dk, dv) = (self.key_heads, self.value_heads, self.dk, self.dv);
        let channels = 2 * nk * dk + nv * dv;
        // Each (sequence, value head) runs its own recurrence, into its own column block.
        let jobs: Vec<(usize, usize, usize)> = spans.iter().flat_map(|&(start, len)| (0..nv).map(move |hv| (start, len, hv))).collect();
        let blocks: Vec<(usize, usize, Vec<f32>)> = jobs
            .par_iter()
            .map(|&(start, len, hv)| {
                let hk = hv / (nv / nk);
                let mut state = vec![0f32; dk * dv];
                let mut out = vec![0f32; len * dv];
                let (mut q, mut k) = (vec![0f32; dk], vec![0f32; dk]);
                let mut recall = vec![0f32; dv];
                for t in 0..len {
                    let row = &mixed[(start + t) * channels..(start + t + 1) * channels];
                    q.copy_from_slice(&row[hk * dk..(hk + 1) * dk]);
                    k.copy_from_slice(&row[nk * dk + hk * dk..nk * dk + (hk + 1) * dk]);
                    let v = &row[2 * nk * dk + hv * dv..2 * nk * dk + (hv + 1) * dv];
                    l2_normalize(&mut q, (dk as f32).sqrt().recip());
                    l2_normalize(&mut k, 1.0);
                    let at = (start + t) * nv + hv;
                    let decay = (-self.decay_rate[hv] * softplus(a[at] + self.dt_bias[hv])).exp();
                    let beta = sigmoid(b[at]);
                    state.iter_mut().for_each(|s| *s *= decay);
                    // Sᵀk, then the delta rule's update.
                    recall.iter_mut().for_each(|r| *r = 0.0);
                    for (i, &ki) in k.iter().enumerate() {
                        state[i * dv..(i + 1) * dv].iter().zip(&mut recall).for_each(|(s, r)| *r += s * ki);
                    }
                    recall.iter_mut().zip(v).for_each(|(r, &vi)| *r = (vi - *r) * beta);
                    let o = &mut out[t * dv..(t + 1) * dv];
                    for (i, (&ki, &qi)) in k.iter().zip(&q).enumerate() {
                        let s = &mut state[i * dv..(i + 1) * dv];
                        s.iter_mut().zip(&recall).for_each(|(s, d)| *s += ki * d);
                        s.iter().zip(o.iter_mut()).for_each(|(s, o)| *o += s * qi);
                    }
                }
                (start, hv, out)
            })
            .collect();
        // Per head: RMS-normalized, times silu(z).
        let mut core = vec![0f32; tokens * nv * dv];
        for (start, hv, out) in blocks {
            for (t, o) in out.chunks_exact(dv).enumerate() {
                let at = (start + t) * nv * dv + hv * dv;
                let inv = (o.iter().map(|x| x * x).sum::<f32>() / dv as f32 + self.eps).sqrt().recip();
                for j in 0..dv {
                    let gate = z[at + j];
                    core[at + j] = o[j] * inv * self.norm[j] * gate * sigmoid(gate);
                }
            }
        }
        let core = Tensor::from_vec(core, (tokens, nv * dv), &Device::Cpu)?.to_device(x.device())?.to_dtype(x.dtype())?;
        self.out_proj.forward_add(&core, residual)
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x / √(Σx² + 1e-6) · scale`, as the FLA-aligned `l2norm` does.
fn l2_normalize(x: &mut [f32], scale: f32) {
    let inv = (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt().recip() * scale;
    x.iter_mut().for_each(|v| *v *= inv);
}

enum Mixer {
    Attention(Box<GatedAttention>),
    Linear(Box<GatedDeltaNet>),
}

struct Layer {
    input_norm: RmsNorm,
    mixer: Mixer,
    post_norm: RmsNorm,
    gate_up: Linear,
    down: Linear,
}

/// Qwen3.5's language model, as the final states of every token.
pub struct Qwen3_5Text {
    embed_tokens: Tensor,
    layers: Vec<Layer>,
    norm: RmsNorm,
    rotary: Rotary,
    axes: Vec<usize>,
    gated: GatedActivation,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    sizes: BackboneSizes,
}

impl Qwen3_5Text {
    /// The language model of a `qwen3_5` config's `text_config`, its weights under `vb`.
    pub fn load(text: &Value, vb: VarBuilder) -> std::result::Result<Self, ModelError> {
        let c: TextConfig = parse_config(text)?;
        let (h, heads, kv, d) = (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        if heads == 0 || kv == 0 || !heads.is_multiple_of(kv) {
            return Err(ModelError::Config(format!("{heads} attention heads over {kv} key/value heads")));
        }
        let activation = Activation::from_config(&c.hidden_act)
            .ok_or_else(|| ModelError::Config(format!("hidden_act `{}` is not supported", c.hidden_act)))?;
        let rope = |key: &str| text.pointer(&format!("/rope_parameters/{key}")).or_else(|| text.pointer(&format!("/rope_scaling/{key}")));
        if let Some(kind) = rope("rope_type").and_then(Value::as_str).filter(|k| *k != "default") {
            return Err(ModelError::Config(format!("Qwen3.5 with rope_type `{kind}` is not supported")));
        }
        let theta =
            rope("rope_theta").and_then(Value::as_f64).or_else(|| text.get("rope_theta").and_then(Value::as_f64)).unwrap_or(10_000.0);
        // `Qwen3_5TextConfig`'s default factor.
        let factor = rope("partial_rotary_factor").and_then(Value::as_f64).unwrap_or(0.25);
        let rotary_dim = (d as f64 * factor) as usize;
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) || rotary_dim > d {
            return Err(ModelError::Config(format!("partial_rotary_factor {factor} of head_dim {d}")));
        }
        let section = mrope_section(text, rotary_dim, [11, 11, 10])?;
        let types = c.layer_types.clone().unwrap_or_else(|| {
            let every = c.full_attention_interval.max(1);
            (0..c.num_hidden_layers).map(|i| if (i + 1) % every == 0 { "full_attention" } else { "linear_attention" }.to_string()).collect()
        });
        if types.len() != c.num_hidden_layers {
            return Err(ModelError::Config(format!("{} layer_types for {} layers", types.len(), c.num_hidden_layers)));
        }
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for (i, kind) in types.iter().enumerate() {
            let lv = vb.pp(format!("layers.{i}"));
            let mixer = match kind.as_str() {
                "full_attention" => Mixer::Attention(Box::new(GatedAttention::load(&lv, &c)?)),
                "linear_attention" => Mixer::Linear(Box::new(GatedDeltaNet::load(&lv, &c)?)),
                other => return Err(ModelError::Config(format!("layer_types[{i}] `{other}` is not a Qwen3.5 layer"))),
            };
            let mlp = lv.pp("mlp");
            layers.push(Layer {
                input_norm: centred_norm(&lv.pp("input_layernorm"), h, c.rms_norm_eps)?,
                mixer,
                post_norm: centred_norm(&lv.pp("post_attention_layernorm"), h, c.rms_norm_eps)?,
                gate_up: fused_gate_up(&mlp, h, c.intermediate_size, false)?,
                down: Linear::new(mlp.pp("down_proj").get((h, c.intermediate_size), "weight")?, None)?.named(&mlp.pp("down_proj").prefix()),
            });
        }
        Ok(Self {
            embed_tokens: vb.get((c.vocab_size, h), "embed_tokens.weight")?,
            norm: centred_norm(&vb.pp("norm"), h, c.rms_norm_eps)?,
            rotary: Rotary::new(rotary_dim, theta),
            axes: interleaved_axes(section, rotary_dim / 2),
            gated: GatedActivation { activation, act_on_first: true },
            layers,
            num_heads: heads,
            num_kv_heads: kv,
            head_dim: d,
            sizes: BackboneSizes { hidden: h, vocab: c.vocab_size, max_positions: c.max_position_embeddings },
        })
    }
}

impl Backbone for Qwen3_5Text {
    fn forward(&self, batch: &Batch) -> Result<Tensor> {
        let device = self.embed_tokens.device();
        let ids = Tensor::from_slice(&batch.input_ids, batch.num_tokens(), device)?;
        let mut hidden = self.embed_tokens.index_select(&ids, 0)?;
        if let Some(soft) = &batch.soft_tokens {
            hidden = soft.replace(&hidden)?;
        }
        let axes = &self.axes;
        let table = self.rotary.table_axes(&mrope_positions(batch), |k| axes.get(k).copied().unwrap_or(0));
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
        for layer in &self.layers {
            let x = layer.input_norm.forward(&hidden)?;
            hidden = match &layer.mixer {
                Mixer::Attention(a) => a.forward(&x, &hidden, &table, &attention)?,
                Mixer::Linear(l) => l.forward(&x, &hidden, &spans)?,
            };
            let inner = self.gated.forward(&layer.gate_up.forward(&layer.post_norm.forward(&hidden)?)?)?;
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
                Mixer::Attention(a) => out.push(&mut a.o_proj),
                Mixer::Linear(l) => out.push(&mut l.out_proj),
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
                Mixer::Attention(a) => Some(&mut a.qkv),
                Mixer::Linear(_) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softplus_and_l2_norm_follow_torch() {
        assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
        assert_eq!(softplus(30.0), 30.0);
        let mut x = [3.0f32, 4.0];
        l2_normalize(&mut x, 1.0);
        assert!((x[0] - 0.6).abs() < 1e-6 && (x[1] - 0.8).abs() < 1e-6);
    }
}
