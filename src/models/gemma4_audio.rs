//! Gemma 4's audio tower (`Gemma4AudioModel`) and the embedder into a text model's space
//! (`embed_audio`), as transformers 5.24's `modeling_gemma4.py` runs them; EmbeddingGemma 2
//! reuses both verbatim for its audio soft tokens.
//!
//! An audio arrives as its real log-mel frames (`[frames, mel_bins]`,
//! as the feature extractor makes them: the input layer's `audio::features`). The tower, top-down:
//! - **sub-sampling** (`subsample_conv_projection`): twice a 3×3 convolution of stride 2 over
//!   (time, frequency), a LayerNorm over channels (weight, no bias) and ReLU; then the
//!   `[time, frequency, channel]` rows, flattened frequency-major, through `input_proj_linear`.
//!   Four frames become one soft token: `⌈⌈frames / 2⌉ / 2⌉`;
//! - **Conformer layers**, each: a half-step feed-forward (RMSNorm, SiLU MLP, RMSNorm, ×½ into
//!   the residual); attention; a light convolution (RMSNorm, GLU, a causal depthwise
//!   convolution over time, RMSNorm, SiLU, linear); a second half-step feed-forward; RMSNorm.
//!   Every linear but the relative-position one is a clipped linear;
//! - **attention** is local: query `t` sees keys `t − left + 2 … t` (and `right − 1` after it),
//!   scores `q·k + q·r(t − s)` with `r` a learned projection of a sinusoid of the distance,
//!   queries scaled per dimension by `softplus(per_dim_scale) · head_dim^-½ / ln 2`, keys by
//!   `ln(1 + e) / ln 2`, capped by `cap · tanh(score / cap)`;
//! - `output_proj` (with bias), then `embed_audio`: a weightless RMSNorm and a linear map to
//!   the text model's width.
//!
//! The processor pads a batch's audio to one length and masks the padding; the convolutions
//! are re-masked, the light convolution is causal and attention ignores padded keys, so each
//! audio's real frames alone give the same soft tokens (transformers' batched and single runs
//! agree to 0.0 there): each audio runs as its own sequence of real frames.

use super::gemma4_vision::{clipped, norm, ClippedLinear};
use super::{parse_config, ModelError};
use crate::kernels::{host_f32, softplus, Linear, RmsNorm};
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

/// The fields of a `gemma4_audio` config the tower needs, with `Gemma4AudioConfig`'s defaults.
#[derive(Debug, Clone, Deserialize)]
struct AudioConfig {
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default = "default_channels")]
    subsampling_conv_channels: Vec<usize>,
    #[serde(default = "default_kernel")]
    conv_kernel_size: usize,
    #[serde(default = "default_residual")]
    residual_weight: f64,
    #[serde(default = "default_chunk")]
    attention_chunk_size: usize,
    #[serde(default = "default_left")]
    attention_context_left: usize,
    #[serde(default)]
    attention_context_right: usize,
    #[serde(default = "default_cap")]
    attention_logit_cap: f64,
    #[serde(default = "default_true")]
    use_clipped_linears: bool,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    #[serde(default = "default_output")]
    output_proj_dims: usize,
}

fn default_act() -> String {
    "silu".into()
}
fn default_channels() -> Vec<usize> {
    vec![128, 32]
}
fn default_kernel() -> usize {
    5
}
fn default_residual() -> f64 {
    0.5
}
fn default_chunk() -> usize {
    12
}
fn default_left() -> usize {
    13
}
fn default_cap() -> f64 {
    50.0
}
fn default_true() -> bool {
    true
}
fn default_eps() -> f64 {
    1e-6
}
fn default_output() -> usize {
    1536
}

/// Frames per soft token: two stride-2 convolutions make `⌈⌈f / 2⌉ / 2⌉ = ⌈f / 4⌉` of them.
pub const FRAMES_PER_TOKEN: usize = 4;

struct FeedForward {
    pre_norm: RmsNorm,
    up: ClippedLinear,
    down: ClippedLinear,
    post_norm: RmsNorm,
}

struct Layer {
    feed_forward1: FeedForward,
    pre_attention_norm: RmsNorm,
    q: ClippedLinear,
    k: ClippedLinear,
    v: ClippedLinear,
    post: ClippedLinear,
    /// Per query dimension: `softplus(per_dim_scale) · head_dim^-½ / ln 2`.
    query_scale: Vec<f32>,
    /// `[positions, hidden]`: the relative-position keys, `relative_k_proj` of the sinusoids
    /// (fixed, so projected once at load).
    relative_keys: Vec<f32>,
    post_attention_norm: RmsNorm,
    conv_pre_norm: RmsNorm,
    linear_start: ClippedLinear,
    /// `[hidden, kernel]`.
    depthwise: Vec<f32>,
    conv_norm: RmsNorm,
    linear_end: ClippedLinear,
    feed_forward2: FeedForward,
    out_norm: RmsNorm,
}

/// The audio tower and `embed_audio`: log-mel frames in, soft tokens of the text model's width
/// out.
pub struct Gemma4Audio {
    conv0: Tensor,
    norm0: Tensor,
    conv1: Tensor,
    norm1: Tensor,
    /// `subsampling_conv_channels[1]`: the channels of each frequency row after sub-sampling.
    channels: usize,
    /// `input_proj_linear` takes `(channels[0] / 4) × channels[1]` inputs (transformers builds it
    /// so): the sub-sampled frequency rows times `channels`.
    input_proj: Linear,
    input_width: usize,
    layers: Vec<Layer>,
    output_proj: Linear,
    embed_norm: RmsNorm,
    embed_projection: Linear,
    hidden: usize,
    heads: usize,
    kernel: usize,
    /// Keys before the query it sees (itself included), and after it.
    left: usize,
    right: usize,
    /// Rows of the relative-position table, and the distance of row 0.
    positions: usize,
    cap: f32,
    /// `ln(1 + e) / ln 2`: the keys' scale (after their clipped output; not the relative keys').
    key_scale: f32,
    residual_weight: f64,
    eps: f64,
    device: Device,
    dtype: DType,
}

/// The relative-position sinusoids: `[sin(p·f) | cos(p·f)]` over `hidden / 2` timescales, for
/// distances `context/2, context/2 − 1, …, 0` (row r has distance context/2 − r), on the host.
fn relative_sinusoids(context: usize, h: usize) -> Result<Tensor> {
    let positions = context / 2 + 1;
    let timescales = h / 2;
    let step = (10000f64).ln() / (timescales.max(2) - 1) as f64;
    let mut sinusoids = Vec::with_capacity(positions * h);
    for r in 0..positions {
        let distance = (context / 2 - r) as f64;
        let angles: Vec<f64> = (0..timescales).map(|j| distance * (-(j as f64) * step).exp()).collect();
        sinusoids.extend(angles.iter().map(|a| a.sin() as f32));
        sinusoids.extend(angles.iter().map(|a| a.cos() as f32));
        sinusoids.resize((r + 1) * h, 0.0);
    }
    Tensor::from_vec(sinusoids, (positions, h), &Device::Cpu)
}

impl Layer {
    /// One Conformer layer under `vb` (`layers.{i}`); its relative-position keys projected
    /// once from `sinusoids`.
    fn load(vb: &VarBuilder, config: &AudioConfig, sinusoids: &Tensor) -> Result<Self> {
        let (h, clip, eps) = (config.hidden_size, config.use_clipped_linears, config.rms_norm_eps);
        let head_dim = h / config.num_attention_heads;
        let feed_forward = |name: &str| -> Result<FeedForward> {
            let vb = vb.pp(name);
            Ok(FeedForward {
                pre_norm: norm(vb.pp("pre_layer_norm"), h, eps)?,
                up: clipped(vb.pp("ffw_layer_1"), 4 * h, h, clip)?,
                down: clipped(vb.pp("ffw_layer_2"), h, 4 * h, clip)?,
                post_norm: norm(vb.pp("post_layer_norm"), h, eps)?,
            })
        };
        let attn = vb.pp("self_attn");
        let per_dim = host_f32(&attn.get(head_dim, "per_dim_scale")?)?;
        let q_scale = (head_dim as f64).powf(-0.5) / std::f64::consts::LN_2;
        let query_scale = per_dim.iter().map(|&p| (softplus(p) as f64 * q_scale) as f32).collect();
        let relative = attn.pp("relative_k_proj").get((h, h), "weight")?.to_dtype(DType::F32)?.to_device(&Device::Cpu)?;
        let relative_keys = host_f32(&sinusoids.matmul(&relative.t()?)?)?;
        let conv = vb.pp("lconv1d");
        Ok(Layer {
            feed_forward1: feed_forward("feed_forward1")?,
            pre_attention_norm: norm(vb.pp("norm_pre_attn"), h, eps)?,
            q: clipped(attn.pp("q_proj"), h, h, clip)?,
            k: clipped(attn.pp("k_proj"), h, h, clip)?,
            v: clipped(attn.pp("v_proj"), h, h, clip)?,
            post: clipped(attn.pp("post"), h, h, clip)?,
            query_scale,
            relative_keys,
            post_attention_norm: norm(vb.pp("norm_post_attn"), h, eps)?,
            conv_pre_norm: norm(conv.pp("pre_layer_norm"), h, eps)?,
            linear_start: clipped(conv.pp("linear_start"), 2 * h, h, clip)?,
            depthwise: host_f32(&conv.pp("depthwise_conv1d").get((h, 1, config.conv_kernel_size), "weight")?)?,
            conv_norm: norm(conv.pp("conv_norm"), h, eps)?,
            linear_end: clipped(conv.pp("linear_end"), h, h, clip)?,
            feed_forward2: feed_forward("feed_forward2")?,
            out_norm: norm(vb.pp("norm_out"), h, eps)?,
        })
    }
}

impl Gemma4Audio {
    /// The tower from `audio_config` and the weights under `tower` (`audio_tower`), and the
    /// embedder under `embedder` (`embed_audio`) into a text model `text_hidden` wide.
    pub fn load(raw: &Value, tower: VarBuilder, embedder: VarBuilder, text_hidden: usize) -> std::result::Result<Self, ModelError> {
        let config: AudioConfig = parse_config(raw)?;
        let bad = |message: String| ModelError::Config(format!("audio_config: {message}"));
        if config.hidden_act != "silu" {
            return Err(bad(format!("hidden_act `{}` is not supported (Gemma 4's audio tower uses silu)", config.hidden_act)));
        }
        let &[c0, c1] = config.subsampling_conv_channels.as_slice() else {
            return Err(bad(format!("subsampling_conv_channels must name two widths, not {:?}", config.subsampling_conv_channels)));
        };
        if c0 < 4 || c1 == 0 {
            return Err(bad(format!("subsampling_conv_channels {:?}: the first must be at least 4, the second above 0", [c0, c1])));
        }
        let (h, heads) = (config.hidden_size, config.num_attention_heads);
        if heads == 0 || h % heads != 0 || h < 2 || config.attention_context_left == 0 || config.conv_kernel_size == 0 {
            return Err(bad(format!(
                "{heads} heads over hidden {h}, context_left {}, kernel {}",
                config.attention_context_left, config.conv_kernel_size
            )));
        }
        let eps = config.rms_norm_eps;
        let device = tower.device().clone();
        let f32_weight = |vb: &VarBuilder, shape: &[usize], name: &str| -> Result<Tensor> { vb.get(shape, name)?.to_dtype(DType::F32) };
        let sub = tower.pp("subsample_conv_projection");
        let conv0 = f32_weight(&sub.pp("layer0.conv"), &[c0, 1, 3, 3], "weight")?;
        let norm0 = f32_weight(&sub.pp("layer0.norm"), &[c0], "weight")?;
        let conv1 = f32_weight(&sub.pp("layer1.conv"), &[c1, c0, 3, 3], "weight")?;
        let norm1 = f32_weight(&sub.pp("layer1.norm"), &[c1], "weight")?;
        let input_width = c0 / 4 * c1;
        let input_proj = Linear::new(sub.pp("input_proj_linear").get((h, input_width), "weight")?, None)?;

        let (left, right) = (config.attention_context_left - 1, config.attention_context_right);
        let context = config.attention_chunk_size + left + right;
        let positions = context / 2 + 1;
        let sinusoids = relative_sinusoids(context, h)?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| Layer::load(&tower.pp(format!("layers.{i}")), &config, &sinusoids))
            .collect::<Result<Vec<_>>>()?;
        let o = config.output_proj_dims;
        let output_proj = Linear::new(tower.pp("output_proj").get((o, h), "weight")?, Some(tower.pp("output_proj").get(o, "bias")?))?;
        let embed_norm = RmsNorm::new(Tensor::ones(o, DType::F32, &device)?, eps)?;
        let embed_projection = Linear::new(embedder.pp("embedding_projection").get((text_hidden, o), "weight")?, None)?;
        Ok(Gemma4Audio {
            conv0,
            norm0,
            conv1,
            norm1,
            channels: c1,
            input_proj,
            input_width,
            layers,
            output_proj,
            embed_norm,
            embed_projection,
            hidden: h,
            heads,
            kernel: config.conv_kernel_size,
            left,
            right,
            positions,
            cap: config.attention_logit_cap as f32,
            key_scale: ((1.0 + std::f64::consts::E).ln() / std::f64::consts::LN_2) as f32,
            residual_weight: config.residual_weight,
            eps,
            device,
            dtype: tower.dtype(),
        })
    }

    /// Whether log-mel frames of `bins` bins fit the input projection: the two stride-2
    /// convolutions leave `⌈⌈bins / 2⌉ / 2⌉` frequency rows, each `channels` wide
    /// (transformers sizes the projection from `subsampling_conv_channels[0]`, which the
    /// published checkpoints set to their 128 bins; a folder's feature extractor says how many
    /// it makes).
    pub fn takes_mel_bins(&self, bins: usize) -> bool {
        bins.div_ceil(2).div_ceil(2) * self.channels == self.input_width
    }

    /// Each audio's soft tokens, `[Σ soft tokens, text_hidden]` in the model's dtype, audio in
    /// order; `frames` are each audio's `[frames, mel bins]` log-mel rows.
    pub fn forward(&self, audio: &[(&[f32], usize)]) -> Result<Tensor> {
        let mut rows = Vec::with_capacity(audio.len());
        let mut cu_seqlens = vec![0];
        for &(values, frames) in audio {
            let bins = values.len().checked_div(frames).unwrap_or(0);
            if bins == 0 || values.len() != frames * bins || !self.takes_mel_bins(bins) {
                candle_core::bail!("an audio of {frames} frames has {} mel values, which the input projection does not take", values.len());
            }
            let x = Tensor::from_slice(values, (1, 1, frames, bins), &self.device)?;
            let x = self.subsample(&x, &self.conv0, &self.norm0)?;
            let x = self.subsample(&x, &self.conv1, &self.norm1)?;
            // [1, C, T, F] → [T, F·C], frequency-major.
            let (_, channels, time, freq) = x.dims4()?;
            rows.push(x.permute((0, 2, 3, 1))?.reshape((time, freq * channels))?);
            cu_seqlens.push(cu_seqlens[cu_seqlens.len() - 1] + time);
        }
        let mut hidden = self.input_proj.forward(&Tensor::cat(&rows, 0)?.to_dtype(self.dtype)?)?;
        for layer in &self.layers {
            hidden = self.feed_forward(&layer.feed_forward1, &hidden)?;
            let x = layer.pre_attention_norm.forward(&hidden)?;
            let attended = self.attention(layer, &x, &cu_seqlens)?;
            hidden = (&hidden + layer.post_attention_norm.forward(&layer.post.forward(&attended)?)?)?;
            hidden = (&hidden + self.light_conv(layer, &hidden, &cu_seqlens)?)?;
            hidden = self.feed_forward(&layer.feed_forward2, &hidden)?;
            hidden = layer.out_norm.forward(&hidden)?;
        }
        let out = self.output_proj.forward(&hidden)?;
        self.embed_projection.forward(&self.embed_norm.forward(&out)?)?.to_dtype(self.dtype)
    }

    /// A 3×3 convolution of stride 2 (padding 1), a LayerNorm over channels, ReLU.
    fn subsample(&self, x: &Tensor, conv: &Tensor, weight: &Tensor) -> Result<Tensor> {
        let y = x.conv2d(conv, 1, 2, 1, 1)?;
        let channels_last = y.permute((0, 2, 3, 1))?.contiguous()?;
        let zeros = weight.zeros_like()?;
        let normed = candle_nn::ops::layer_norm(&channels_last, weight, &zeros, self.eps as f32)?;
        normed.relu()?.permute((0, 3, 1, 2))?.contiguous()
    }

    fn feed_forward(&self, ff: &FeedForward, x: &Tensor) -> Result<Tensor> {
        let y = ff.down.forward(&ff.up.forward(&ff.pre_norm.forward(x)?)?.silu()?)?;
        x + (ff.post_norm.forward(&y)? * self.residual_weight)?
    }

    /// Local attention with relative positions and the logit cap, on the host: each query
    /// sees at most `left + right` keys, so this is a few dozen products per query and head.
    fn attention(&self, layer: &Layer, x: &Tensor, cu_seqlens: &[usize]) -> Result<Tensor> {
        let (h, heads) = (self.hidden, self.heads);
        let head_dim = h / heads;
        let q = host_f32(&layer.q.forward(x)?)?;
        let k = host_f32(&layer.k.forward(x)?)?;
        let v = host_f32(&layer.v.forward(x)?)?;
        let tokens = q.len() / h;
        let mut out = vec![0f32; tokens * h];
        let mut scores = Vec::with_capacity(self.left + self.right);
        let mut query = vec![0f32; head_dim];
        for w in cu_seqlens.windows(2) {
            let (start, end) = (w[0], w[1]);
            for t in start..end {
                let first = t.saturating_sub(self.left - 1).max(start);
                let last = (t + self.right.saturating_sub(1)).min(end - 1);
                for n in 0..heads {
                    let cols = n * head_dim..(n + 1) * head_dim;
                    for ((q, &raw), &scale) in query.iter_mut().zip(&q[t * h..][cols.clone()]).zip(&layer.query_scale) {
                        *q = raw * scale;
                    }
                    scores.clear();
                    for s in first..=last {
                        let mut score = dot(&query, &k[s * h..][cols.clone()]) * self.key_scale;
                        // The relative key of distance t − s sits at row left − (t − s).
                        let row = self.left as isize - (t as isize - s as isize);
                        if (0..self.positions as isize).contains(&row) {
                            score += dot(&query, &layer.relative_keys[row as usize * h..][cols.clone()]);
                        }
                        scores.push(self.cap * (score / self.cap).tanh());
                    }
                    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut total = 0.0;
                    for s in scores.iter_mut() {
                        *s = (*s - max).exp();
                        total += *s;
                    }
                    let target = &mut out[t * h..][cols.clone()];
                    for (i, weight) in scores.iter().map(|s| s / total).enumerate() {
                        let value = &v[(first + i) * h..][cols.clone()];
                        for (o, &x) in target.iter_mut().zip(value) {
                            *o += weight * x;
                        }
                    }
                }
            }
        }
        Tensor::from_vec(out, (tokens, h), &self.device)?.to_dtype(x.dtype())
    }

    /// The light convolution's residual branch: RMSNorm, `linear_start`, GLU, the causal
    /// depthwise convolution over each audio's time (on the host), RMSNorm, SiLU, `linear_end`.
    fn light_conv(&self, layer: &Layer, x: &Tensor, cu_seqlens: &[usize]) -> Result<Tensor> {
        let h = self.hidden;
        let gated = layer.linear_start.forward(&layer.conv_pre_norm.forward(x)?)?;
        let glu = (gated.narrow(1, 0, h)? * candle_nn::ops::sigmoid(&gated.narrow(1, h, h)?)?)?;
        let glu = host_f32(&glu)?;
        let mut out = vec![0f32; glu.len()];
        for w in cu_seqlens.windows(2) {
            for t in w[0]..w[1] {
                for tap in 0..self.kernel {
                    // Tap `kernel − 1` is the current frame; earlier taps reach back in time.
                    let Some(s) = (t + tap + 1).checked_sub(self.kernel) else { continue };
                    if s < w[0] {
                        continue;
                    }
                    for c in 0..h {
                        out[t * h + c] += layer.depthwise[c * self.kernel + tap] * glu[s * h + c];
                    }
                }
            }
        }
        let conv = Tensor::from_vec(out, (glu.len() / h, h), &self.device)?.to_dtype(x.dtype())?;
        layer.linear_end.forward(&layer.conv_norm.forward(&conv)?.silu()?)
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
