//! Gemma 4's vision tower (`Gemma4VisionModel`) and the embedder that maps its output into a
//! text model's embedding space (`embed_vision`), as transformers 5.24's `modeling_gemma4.py`
//! runs them; EmbeddingGemma 2 reuses both verbatim for its image soft tokens.
//!
//! An image arrives as its patches (`patch_size`² pixels × 3, rescaled to [0, 1], row-major
//! over the patch grid) with each patch's `(x, y)` grid position, as `Gemma4ImageProcessor`
//! makes them. The tower:
//! - embeds each patch: `W · 2(p − ½)`, plus the learned row of `x` from the first position
//!   table and of `y` from the second;
//! - runs Gemma-4-style blocks (RMSNorm by `w` before and after attention and MLP, per-head q/k
//!   norms with weights and a weightless value norm, GeGLU MLP, no attention scale) with
//!   bidirectional attention over the image's patches and *axial* rotary positions: the first
//!   half of each head rotates by `x`, the second by `y`, each with `head_dim / 2`-dim
//!   frequencies;
//! - average-pools each `pooling_kernel_size`² block of patches into one soft token (row-major
//!   over the pooled grid), times √hidden, then `(h − std_bias) · std_scale` where the config
//!   asks (`standardize`);
//! - and `embed_vision`: a weightless RMSNorm, then a linear map to the text model's width.
//!
//! The processor pads every image to the same patch count; padding patches are masked out of
//! attention and pooling there, so leaving them out here (each image runs as its own sequence
//! of real patches) computes the same soft tokens.

use super::weights::stacked_linear;
use super::{parse_config, ModelError};
use crate::kernels::{host_f32, Activation, Attention, AttentionMask, GatedActivation, Linear, RmsNorm};
use candle_core::{DType, Device, Result, Tensor, D};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

/// The fields of a `gemma4_vision` config the tower needs.
#[derive(Debug, Clone, Deserialize)]
struct VisionConfig {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    head_dim: usize,
    #[serde(default = "default_activation")]
    hidden_activation: String,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    #[serde(default)]
    rope_parameters: Option<Value>,
    pooling_kernel_size: usize,
    patch_size: usize,
    position_embedding_size: usize,
    #[serde(default)]
    use_clipped_linears: bool,
    #[serde(default)]
    standardize: bool,
    #[serde(default)]
    attention_bias: bool,
}

/// Gemma 4's defaults, shared with EmbeddingGemma 2's text config.
pub(super) fn default_activation() -> String {
    "gelu_pytorch_tanh".into()
}

pub(super) fn default_eps() -> f64 {
    1e-6
}

/// One image as the processor makes it: its real patches and their grid positions.
#[derive(Debug, Clone, PartialEq)]
pub struct ImagePatches {
    /// `[patches, 3 · patch_size²]` values in [0, 1], each patch's pixels row by row with the
    /// three channels innermost.
    pub pixels: Vec<f32>,
    /// Each patch's `(x, y)`: column and row in the patch grid.
    pub positions: Vec<(u32, u32)>,
}

impl ImagePatches {
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }
}

/// A `Gemma4ClippableLinear`: a bias-free linear layer, with its input and output clamped to
/// the checkpoint's ranges when the config uses clipped linears.
pub(super) struct ClippedLinear {
    linear: Linear,
    input: Option<(f64, f64)>,
    output: Option<(f64, f64)>,
}

impl ClippedLinear {
    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let clamp = |t: Tensor, range: Option<(f64, f64)>| match range {
            Some((lo, hi)) => t.clamp(lo, hi),
            None => Ok(t),
        };
        clamp(self.linear.forward(&clamp(x.clone(), self.input)?)?, self.output)
    }
}

/// The clamp range `[min, max]` stored beside a clipped linear, `None` when unbounded.
fn clip_range(vb: &VarBuilder, which: &str) -> Result<Option<(f64, f64)>> {
    let bound = |name: &str| -> Result<f64> { vb.get((), &format!("{which}_{name}"))?.to_dtype(DType::F64)?.to_scalar::<f64>() };
    let (lo, hi) = (bound("min")?, bound("max")?);
    Ok((lo.is_finite() || hi.is_finite()).then_some((lo, hi)))
}

pub(super) fn clipped(vb: VarBuilder, out: usize, input: usize, clipped: bool) -> Result<ClippedLinear> {
    let linear = Linear::new(vb.pp("linear").get((out, input), "weight")?, None)?;
    if !clipped {
        return Ok(ClippedLinear { linear, input: None, output: None });
    }
    Ok(ClippedLinear { linear, input: clip_range(&vb, "input")?, output: clip_range(&vb, "output")? })
}

struct Layer {
    input_norm: RmsNorm,
    q: ClippedLinear,
    k: ClippedLinear,
    v: ClippedLinear,
    /// Query norm weights with √head_dim folded in (the kernel scales by head_dim^-½; the
    /// tower does not scale).
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    v_norm: RmsNorm,
    o: ClippedLinear,
    post_attention_norm: RmsNorm,
    pre_mlp_norm: RmsNorm,
    /// Gate and up fused where the linears are not clipped.
    gate_up: Option<Linear>,
    gate: Option<ClippedLinear>,
    up: Option<ClippedLinear>,
    down: ClippedLinear,
    post_mlp_norm: RmsNorm,
}

/// The vision tower and `embed_vision`: image patches in, soft tokens of the text model's width
/// out.
pub struct Gemma4Vision {
    input_proj: Linear,
    /// `[2, position_embedding_size, hidden]` on the host: rows are looked up per patch.
    position_table: Vec<f32>,
    position_rows: usize,
    layers: Vec<Layer>,
    /// `head_dim / 2`-dim rotary frequencies, shared by both axes.
    inv_freq: Vec<f32>,
    standardize: Option<(Tensor, Tensor)>,
    embed_norm: RmsNorm,
    embed_projection: Linear,
    gated: GatedActivation,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    hidden: usize,
    pub patch_size: usize,
    pub pooling_kernel_size: usize,
    device: Device,
    dtype: DType,
}

/// A Gemma 4 RMSNorm: `x / rms(x) · w` (not Gemma 3's `1 + w`), in f32.
pub(super) fn norm(vb: VarBuilder, size: usize, eps: f64) -> Result<RmsNorm> {
    RmsNorm::new(vb.get(size, "weight")?.to_dtype(DType::F32)?, eps)
}

impl Gemma4Vision {
    /// The tower from `vision_config` and the weights under `tower` (`vision_tower`), and the
    /// embedder under `embedder` (`embed_vision`) into a text model `text_hidden` wide.
    pub fn load(raw: &Value, tower: VarBuilder, embedder: VarBuilder, text_hidden: usize) -> std::result::Result<Self, ModelError> {
        let config: VisionConfig = parse_config(raw)?;
        let activation = Activation::from_config(&config.hidden_activation)
            .ok_or_else(|| ModelError::Config(format!("vision hidden activation `{}` is not supported", config.hidden_activation)))?;
        let rope = config.rope_parameters.as_ref();
        let rope_type = rope.and_then(|r| r.get("rope_type")).and_then(Value::as_str).unwrap_or("axial");
        if rope_type != "axial" {
            return Err(ModelError::Config(format!("vision rope_type `{rope_type}` is not supported (Gemma 4's tower is axial)")));
        }
        if config.attention_bias {
            return Err(ModelError::Config("vision attention_bias is not supported (Gemma 4's tower has none)".into()));
        }
        let theta = rope.and_then(|r| r.get("rope_theta")).and_then(Value::as_f64).unwrap_or(100.0);
        let (h, hd, heads, kv_heads) = (config.hidden_size, config.head_dim, config.num_attention_heads, config.num_key_value_heads);
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) || !hd.is_multiple_of(4) {
            return Err(ModelError::Config(format!("vision: {heads} heads over {kv_heads} key/value heads of {hd} dims")));
        }
        let (eps, inter, clip) = (config.rms_norm_eps, config.intermediate_size, config.use_clipped_linears);
        let device = tower.device().clone();
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let lv = tower.pp(format!("encoder.layers.{i}"));
            let at = lv.pp("self_attn");
            let mlp = lv.pp("mlp");
            let head_norm = |name: &str, scale: f64| -> Result<RmsNorm> {
                RmsNorm::new((at.pp(name).get(hd, "weight")?.to_dtype(DType::F32)? * scale)?, eps)
            };
            let fused = (!clip)
                .then(|| stacked_linear(&[(mlp.pp("gate_proj").pp("linear"), inter), (mlp.pp("up_proj").pp("linear"), inter)], h, false))
                .transpose()?;
            layers.push(Layer {
                input_norm: norm(lv.pp("input_layernorm"), h, eps)?,
                q: clipped(at.pp("q_proj"), heads * hd, h, clip)?,
                k: clipped(at.pp("k_proj"), kv_heads * hd, h, clip)?,
                v: clipped(at.pp("v_proj"), kv_heads * hd, h, clip)?,
                q_norm: head_norm("q_norm", (hd as f64).sqrt())?,
                k_norm: head_norm("k_norm", 1.0)?,
                v_norm: RmsNorm::new(Tensor::ones(hd, DType::F32, &device)?, eps)?,
                o: clipped(at.pp("o_proj"), h, heads * hd, clip)?,
                post_attention_norm: norm(lv.pp("post_attention_layernorm"), h, eps)?,
                pre_mlp_norm: norm(lv.pp("pre_feedforward_layernorm"), h, eps)?,
                gate: clip.then(|| clipped(mlp.pp("gate_proj"), inter, h, true)).transpose()?,
                up: clip.then(|| clipped(mlp.pp("up_proj"), inter, h, true)).transpose()?,
                gate_up: fused,
                down: clipped(mlp.pp("down_proj"), h, inter, clip)?,
                post_mlp_norm: norm(lv.pp("post_feedforward_layernorm"), h, eps)?,
            });
        }
        let pe = tower.pp("patch_embedder");
        let patch_width = 3 * config.patch_size * config.patch_size;
        let input_proj = pe.pp("input_proj").get((h, patch_width), "weight")?;
        let dtype = input_proj.dtype();
        let standardize = if config.standardize {
            let stat = |name: &str| tower.get(h, name).and_then(|t| t.to_dtype(DType::F32));
            Some((stat("std_bias")?, stat("std_scale")?))
        } else {
            None
        };
        let embed_norm = RmsNorm::new(Tensor::ones(h, DType::F32, &device)?, eps)?;
        let embed_projection = Linear::new(embedder.pp("embedding_projection").get((text_hidden, h), "weight")?, None)?;
        let spatial = hd / 2;
        Ok(Self {
            input_proj: Linear::new(input_proj, None)?,
            position_table: host_f32(&pe.get((2, config.position_embedding_size, h), "position_embedding_table")?)?,
            position_rows: config.position_embedding_size,
            layers,
            inv_freq: (0..spatial / 2).map(|k| 1.0 / (theta as f32).powf((2 * k) as f32 / spatial as f32)).collect(),
            standardize,
            embed_norm,
            embed_projection,
            gated: GatedActivation { activation, act_on_first: true },
            heads,
            kv_heads,
            head_dim: hd,
            hidden: h,
            patch_size: config.patch_size,
            pooling_kernel_size: config.pooling_kernel_size,
            device,
            dtype,
        })
    }

    /// The soft tokens an image of `patches` real patches becomes.
    pub fn soft_tokens(&self, patches: usize) -> usize {
        patches / (self.pooling_kernel_size * self.pooling_kernel_size)
    }

    /// Each image's soft tokens, `[Σ soft tokens, text_hidden]`, images in order.
    pub fn forward(&self, images: &[&ImagePatches]) -> Result<Tensor> {
        let patch_width = 3 * self.patch_size * self.patch_size;
        let mut cu_seqlens = vec![0];
        let (mut pixels, mut positions) = (Vec::new(), Vec::new());
        for image in images {
            if image.pixels.len() != image.len() * patch_width {
                candle_core::bail!("an image of {} patches has {} pixel values", image.len(), image.pixels.len());
            }
            // The patch embedder reads `2 · (p − ½)`.
            pixels.extend(image.pixels.iter().map(|p| 2.0 * (p - 0.5)));
            positions.extend_from_slice(&image.positions);
            cu_seqlens.push(positions.len());
        }
        let tokens = positions.len();
        let mut position_rows = Vec::with_capacity(tokens * self.hidden);
        for &(x, y) in &positions {
            let (x, y) = (x as usize, y as usize);
            if x >= self.position_rows || y >= self.position_rows {
                candle_core::bail!("patch position ({x}, {y}) is past the {}-row position table", self.position_rows);
            }
            let row = |axis: usize, i: usize| &self.position_table[(axis * self.position_rows + i) * self.hidden..][..self.hidden];
            position_rows.extend(row(0, x).iter().zip(row(1, y)).map(|(a, b)| a + b));
        }
        let to_model = |v: Vec<f32>, cols: usize| Tensor::from_vec(v, (tokens, cols), &self.device)?.to_dtype(self.dtype);
        let mut hidden = (self.input_proj.forward(&to_model(pixels, patch_width)?)? + to_model(position_rows, self.hidden)?)?;
        let (cos_x, sin_x) = self.angles(positions.iter().map(|p| p.0))?;
        let (cos_y, sin_y) = self.angles(positions.iter().map(|p| p.1))?;
        let axial = |t: Tensor, heads: usize| -> Result<Tensor> {
            let t = t.reshape((tokens, heads, self.head_dim))?;
            let half = self.head_dim / 2;
            let by_x = rotate(&t.narrow(2, 0, half)?, &cos_x, &sin_x)?;
            let by_y = rotate(&t.narrow(2, half, half)?, &cos_y, &sin_y)?;
            Tensor::cat(&[by_x, by_y], 2)?.reshape((tokens, heads * self.head_dim))
        };
        let head_norm = |t: Tensor, norm: &RmsNorm, heads: usize| -> Result<Tensor> {
            norm.forward(&t.reshape((tokens * heads, self.head_dim))?)?.reshape((tokens, heads * self.head_dim))
        };
        let attention = Attention {
            num_heads: self.heads,
            num_kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            cu_seqlens: &cu_seqlens,
            mask: AttentionMask::Bidirectional,
            position_bias: None,
            disentangled: None,
            softcap: None,
        };
        for layer in &self.layers {
            let x = layer.input_norm.forward(&hidden)?;
            let q = axial(head_norm(layer.q.forward(&x)?, &layer.q_norm, self.heads)?, self.heads)?;
            let k = axial(head_norm(layer.k.forward(&x)?, &layer.k_norm, self.kv_heads)?, self.kv_heads)?;
            let v = head_norm(layer.v.forward(&x)?, &layer.v_norm, self.kv_heads)?;
            let attended = attention.forward(&Tensor::cat(&[q, k, v], 1)?.contiguous()?, None)?;
            hidden = (&hidden + layer.post_attention_norm.forward(&layer.o.forward(&attended)?)?)?;
            let x = layer.pre_mlp_norm.forward(&hidden)?;
            let inner = match (&layer.gate_up, &layer.gate, &layer.up) {
                (Some(gate_up), _, _) => self.gated.forward(&gate_up.forward(&x)?)?,
                (None, Some(gate), Some(up)) => (self.gated.activation.forward(&gate.forward(&x)?)? * up.forward(&x)?)?,
                _ => candle_core::bail!("vision MLP without its gate"),
            };
            hidden = (&hidden + layer.post_mlp_norm.forward(&layer.down.forward(&inner)?)?)?;
        }
        let pooled = self.pool(&hidden.to_dtype(DType::F32)?, &cu_seqlens, &positions)?;
        let pooled = match &self.standardize {
            Some((bias, scale)) => pooled.broadcast_sub(bias)?.broadcast_mul(scale)?,
            None => pooled,
        };
        let pooled = pooled.to_dtype(self.dtype)?;
        self.embed_projection.forward(&self.embed_norm.forward(&pooled)?)
    }

    /// cos and sin, `[tokens, 1, head_dim / 2]` (the frequencies twice, rotate-half form), of
    /// each token's position along one axis.
    fn angles(&self, positions: impl Iterator<Item = u32>) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        let mut tokens = 0;
        for p in positions {
            for _ in 0..2 {
                for &f in &self.inv_freq {
                    let angle = p as f32 * f;
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
            tokens += 1;
        }
        let table = |v: Vec<f32>| Tensor::from_vec(v, (tokens, 1, 2 * half), &self.device)?.to_dtype(self.dtype);
        Ok((table(cos)?, table(sin)?))
    }

    /// Each image's `k × k` blocks of patches averaged (k = `pooling_kernel_size`), in row-major
    /// order over the pooled grid, times √hidden; f32, `[Σ soft tokens, hidden]`.
    fn pool(&self, hidden: &Tensor, cu_seqlens: &[usize], positions: &[(u32, u32)]) -> Result<Tensor> {
        let k = self.pooling_kernel_size as u32;
        let states = hidden.to_device(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?;
        let scale = (self.hidden as f32).sqrt() / (k * k) as f32;
        let mut pooled = Vec::new();
        for w in cu_seqlens.windows(2) {
            let image = &positions[w[0]..w[1]];
            let grid_width = image.iter().map(|p| p.0).max().map_or(0, |x| x + 1);
            let outputs = image.len() / (k * k) as usize;
            let mut sums = vec![0f32; outputs * self.hidden];
            for (t, &(x, y)) in image.iter().enumerate() {
                let out = ((y / k) * (grid_width / k) + x / k) as usize;
                if out >= outputs {
                    candle_core::bail!("patch ({x}, {y}) pools outside the image's {outputs} soft tokens");
                }
                let row = &states[(w[0] + t) * self.hidden..][..self.hidden];
                sums[out * self.hidden..][..self.hidden].iter_mut().zip(row).for_each(|(s, v)| *s += v);
            }
            pooled.extend(sums.into_iter().map(|s| s * scale));
        }
        let rows = pooled.len() / self.hidden;
        Tensor::from_vec(pooled, (rows, self.hidden), &self.device)
    }
}

/// `x · cos + rotate_half(x) · sin` over the last dimension.
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let rotated = Tensor::cat(&[x.narrow(D::Minus1, half, half)?.neg()?, x.narrow(D::Minus1, 0, half)?], D::Minus1)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}
