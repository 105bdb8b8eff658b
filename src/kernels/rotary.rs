//! Rotary position embeddings (RoPE, rotate-half form) applied in place to the query and key
//! heads of a fused QKV tensor, optionally after a per-head RMSNorm (Qwen3's q/k norms), in one
//! pass over the rows.

use super::rms_norm::RmsNorm;
use super::{contiguous_mut, dims2, fused};
use candle_core::{bail, CpuStorage, DType, Device, InplaceOp1, Layout, Result, Tensor};
use rayon::prelude::*;

/// The frequencies of one model (or one kind of layer: ModernBERT has two thetas).
#[derive(Debug, Clone)]
pub struct Rotary {
    inv_freq: Vec<f32>,
    /// YaRN's factor on cos and sin (1 otherwise).
    attention_factor: f32,
    /// Dynamic NTK scaling, whose frequencies depend on the sequence's length.
    dynamic: Option<DynamicNtk>,
}

/// The rotary scalings of transformers' `ROPE_INIT_FUNCTIONS` that decoders' configs carry
/// (`rope_parameters` / `rope_scaling`), computed as `modeling_rope_utils` computes them.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    Default,
    /// Frequencies divided by `factor` (position interpolation).
    Linear {
        factor: f64,
    },
    /// Llama 3.1's: long wavelengths divided by `factor`, short ones kept, a smooth blend
    /// between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_positions: usize,
    },
    /// NTK-aware: a sequence longer than `max_positions` rotates with a larger theta.
    Dynamic {
        factor: f64,
        max_positions: usize,
    },
    /// Alibaba GTE's fixed NTK (`rope_scaling: {"type": "ntk"}` of gte-multilingual-base and
    /// gte-*-en-v1.5, its published `NTKScalingRotaryEmbedding`): at every position the
    /// frequencies of `theta · factor`, divided by `factor^(2 / head_dim)`; with `mixed_b`,
    /// those of `theta` divided by `λ_j = exp(ln(factor) / (d/2)^b · j^b)`, j = 1..d/2.
    Ntk {
        factor: f64,
        mixed_b: Option<f64>,
    },
    /// YaRN: interpolation blended into extrapolation by a ramp over the dimensions, and cos/sin
    /// scaled by the attention factor.
    Yarn {
        factor: f64,
        original_max_positions: usize,
        attention_factor: Option<f64>,
        beta_fast: f64,
        beta_slow: f64,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        truncate: bool,
    },
}

#[derive(Debug, Clone)]
struct DynamicNtk {
    theta: f64,
    head_dim: usize,
    factor: f64,
    max_positions: usize,
}

/// Per-head RMSNorm weights for queries and keys.
#[derive(Debug, Clone)]
pub struct QkNorm {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub eps: f32,
}

/// cos and sin of every token's angles for one batch.
pub struct RotaryTable {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
    /// cos and sin on the GPU, uploaded by the first layer that rotates on it.
    #[cfg(feature = "cuda")]
    on_device: std::sync::OnceLock<(Tensor, Tensor)>,
}

impl Rotary {
    /// `inv_freq[k] = 1 / theta^(2k / head_dim)`, in f32 as transformers computes it.
    pub fn new(head_dim: usize, theta: f64) -> Self {
        Self { inv_freq: default_frequencies(head_dim, theta), attention_factor: 1.0, dynamic: None }
    }

    /// The frequencies of `theta` under `scaling`, as transformers' `ROPE_INIT_FUNCTIONS`.
    pub fn scaled(head_dim: usize, theta: f64, scaling: &RopeScaling) -> Self {
        let base = default_frequencies(head_dim, theta);
        match *scaling {
            RopeScaling::Default => Self::new(head_dim, theta),
            RopeScaling::Linear { factor } => {
                Self { inv_freq: base.iter().map(|f| f / factor as f32).collect(), attention_factor: 1.0, dynamic: None }
            }
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_positions } => {
                let (factor, old_len) = (factor as f32, original_max_positions as f32);
                let (low_wavelen, high_wavelen) = (old_len / low_freq_factor as f32, old_len / high_freq_factor as f32);
                let inv_freq = base
                    .iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f32::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old_len / wavelen - low_freq_factor as f32) / (high_freq_factor - low_freq_factor) as f32;
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect();
                Self { inv_freq, attention_factor: 1.0, dynamic: None }
            }
            // The published class scales only when its table outgrows max_position_embeddings,
            // which `factor` > 1 always makes it do.
            RopeScaling::Ntk { factor, .. } if factor <= 1.0 => Self::new(head_dim, theta),
            RopeScaling::Ntk { factor, mixed_b: None } => {
                let divisor = factor.powf(2.0 / head_dim as f64) as f32;
                let inv_freq = default_frequencies(head_dim, theta * factor).iter().map(|f| f / divisor).collect();
                Self { inv_freq, attention_factor: 1.0, dynamic: None }
            }
            RopeScaling::Ntk { factor, mixed_b: Some(b) } => {
                let a = factor.ln() / (head_dim as f64 / 2.0).powf(b);
                let inv_freq = base.iter().enumerate().map(|(j, f)| f / (a * ((j + 1) as f64).powf(b)).exp() as f32).collect();
                Self { inv_freq, attention_factor: 1.0, dynamic: None }
            }
            RopeScaling::Dynamic { factor, max_positions } => {
                Self { inv_freq: base, attention_factor: 1.0, dynamic: Some(DynamicNtk { theta, head_dim, factor, max_positions }) }
            }
            RopeScaling::Yarn {
                factor,
                original_max_positions,
                attention_factor,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
                truncate,
            } => {
                let get_mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
                let attention_factor = attention_factor.unwrap_or(match (mscale, mscale_all_dim) {
                    (Some(m), Some(all)) if m != 0.0 && all != 0.0 => get_mscale(factor, m) / get_mscale(factor, all),
                    _ => get_mscale(factor, 1.0),
                });
                let dim = head_dim as f64;
                let correction = |rotations: f64| {
                    dim * (original_max_positions as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
                };
                let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
                if truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
                if low == high {
                    high += 0.001;
                }
                let inv_freq = base
                    .iter()
                    .enumerate()
                    .map(|(k, &extrapolation)| {
                        let interpolation = 1.0 / (factor as f32 * (1.0 / extrapolation));
                        let ramp = ((k as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
                        let extrapolation_share = 1.0 - ramp;
                        interpolation * (1.0 - extrapolation_share) + extrapolation * extrapolation_share
                    })
                    .collect();
                Self { inv_freq, attention_factor: attention_factor as f32, dynamic: None }
            }
        }
    }

    /// The frequencies a sequence of `len` tokens rotates with.
    fn frequencies(&self, len: usize) -> std::borrow::Cow<'_, [f32]> {
        match &self.dynamic {
            Some(d) if len > d.max_positions => {
                let dim = d.head_dim as f64;
                let theta = d.theta * ((d.factor * len as f64 / d.max_positions as f64) - (d.factor - 1.0)).powf(dim / (dim - 2.0));
                std::borrow::Cow::Owned(default_frequencies(d.head_dim, theta))
            }
            _ => std::borrow::Cow::Borrowed(&self.inv_freq),
        }
    }

    /// The table for the sequences `cu_seqlens` delimits, each starting at position 0. Under
    /// dynamic scaling each sequence rotates as transformers rotates it alone (transformers
    /// scales a padded batch by its longest sequence, so a batch there differs from its
    /// sequences run one by one; here it never does).
    pub fn table_for_sequences(&self, cu_seqlens: &[usize]) -> RotaryTable {
        let half = self.inv_freq.len();
        let tokens = cu_seqlens.last().copied().unwrap_or(0);
        let (mut cos, mut sin) = (Vec::with_capacity(tokens * half), Vec::with_capacity(tokens * half));
        for w in cu_seqlens.windows(2) {
            let len = w[1] - w[0];
            self.push_angles(&self.frequencies(len), 0..len as u32, &mut cos, &mut sin);
        }
        self.finish(cos, sin)
    }

    /// The table for tokens at `positions` (each token's position inside its own sequence).
    pub fn table(&self, positions: &[u32]) -> RotaryTable {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        self.push_angles(&self.inv_freq, positions.iter().copied(), &mut cos, &mut sin);
        self.finish(cos, sin)
    }

    /// Multimodal RoPE (Qwen2-VL's M-RoPE): each token has a (temporal, height, width)
    /// position, and frequency pair `k` turns by the position on axis `axis_of(k)` (Qwen2-VL:
    /// consecutive sections of `mrope_section`, one per axis). A text token's three positions
    /// are equal, which is plain RoPE.
    pub fn table_axes(&self, positions: &[[u32; 3]], axis_of: impl Fn(usize) -> usize) -> RotaryTable {
        let half = self.inv_freq.len();
        let (mut cos, mut sin) = (Vec::with_capacity(positions.len() * half), Vec::with_capacity(positions.len() * half));
        for p in positions {
            for (k, &f) in self.inv_freq.iter().enumerate() {
                let angle = (p[axis_of(k).min(2)] as f32 * f) as f64;
                cos.push(angle.cos() as f32 * self.attention_factor);
                sin.push(angle.sin() as f32 * self.attention_factor);
            }
        }
        self.finish(cos, sin)
    }

    /// Axial 2-D RoPE over image patches (Qwen2-VL's vision tower): these frequencies (made for
    /// `head_dim / 2`) turn the first half of a head's pairs by the patch's row and the second
    /// half by its column, with the same frequencies.
    pub fn table_2d(&self, positions: &[(u32, u32)]) -> RotaryTable {
        let quarter = self.inv_freq.len();
        let (mut cos, mut sin) = (Vec::with_capacity(positions.len() * 2 * quarter), Vec::with_capacity(positions.len() * 2 * quarter));
        for &(row, col) in positions {
            for p in [row, col] {
                for &f in &self.inv_freq {
                    let angle = (p as f32 * f) as f64;
                    cos.push(angle.cos() as f32 * self.attention_factor);
                    sin.push(angle.sin() as f32 * self.attention_factor);
                }
            }
        }
        RotaryTable {
            cos,
            sin,
            half: 2 * quarter,
            #[cfg(feature = "cuda")]
            on_device: std::sync::OnceLock::new(),
        }
    }

    fn push_angles(&self, inv_freq: &[f32], positions: impl Iterator<Item = u32>, cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
        for p in positions {
            for &f in inv_freq {
                let angle = (p as f32 * f) as f64;
                cos.push(angle.cos() as f32 * self.attention_factor);
                sin.push(angle.sin() as f32 * self.attention_factor);
            }
        }
    }

    fn finish(&self, cos: Vec<f32>, sin: Vec<f32>) -> RotaryTable {
        let half = self.inv_freq.len();
        RotaryTable {
            cos,
            sin,
            half,
            #[cfg(feature = "cuda")]
            on_device: std::sync::OnceLock::new(),
        }
    }
}

/// `1 / theta^(2k / head_dim)` for each of the `head_dim / 2` pairs.
fn default_frequencies(head_dim: usize, theta: f64) -> Vec<f32> {
    (0..head_dim / 2).map(|k| 1.0 / (theta as f32).powf((2 * k) as f32 / head_dim as f32)).collect()
}

impl RotaryTable {
    /// Rotates the `num_heads` query and `num_kv_heads` key heads at the start of each QKV row
    /// (values untouched), normalizing each head first when `norm` is given.
    pub fn apply(&self, qkv: &Tensor, num_heads: usize, num_kv_heads: usize, norm: Option<&QkNorm>) -> Result<Tensor> {
        let op = RopeOp { table: self, num_heads, num_kv_heads, norm };
        if fused(qkv) {
            qkv.inplace_op1(&op)?;
            return Ok(qkv.clone());
        }
        // The CUDA kernel turns whole heads; a partly rotated head takes the host's path.
        #[cfg(feature = "cuda")]
        if super::cuda::takes(qkv) && qkv.is_contiguous() && qkv.dim(1)? == (num_heads + 2 * num_kv_heads) * 2 * self.half {
            let norm = norm.map(|n| (n.q.as_slice(), n.k.as_slice(), n.eps));
            let (cos, sin) = match self.on_device.get() {
                Some(tables) => tables.clone(),
                None => {
                    let upload = |v: &[f32]| Tensor::from_slice(v, v.len(), qkv.device());
                    let tables = (upload(&self.cos)?, upload(&self.sin)?);
                    self.on_device.get_or_init(|| tables).clone()
                }
            };
            let op = super::cuda::Rotary::new(qkv.device(), cos, sin, norm, (num_heads, num_kv_heads), 2 * self.half)?;
            qkv.inplace_op1(&op)?;
            return Ok(qkv.clone());
        }
        self.apply_on_host(qkv, num_heads, num_kv_heads, norm)
    }

    /// The rotation in f32 on the host, whatever `qkv`'s device and dtype (rotation in f32 is
    /// also what transformers does for half-precision models): the fallback for devices
    /// without a kernel, and the CUDA kernel's reference.
    pub(crate) fn apply_on_host(&self, qkv: &Tensor, num_heads: usize, num_kv_heads: usize, norm: Option<&QkNorm>) -> Result<Tensor> {
        let op = RopeOp { table: self, num_heads, num_kv_heads, norm };
        let host = qkv.to_device(&Device::Cpu)?.to_dtype(DType::F32)?.copy()?;
        host.inplace_op1(&op)?;
        host.to_dtype(qkv.dtype())?.to_device(qkv.device())
    }
}

struct RopeOp<'a> {
    table: &'a RotaryTable,
    num_heads: usize,
    num_kv_heads: usize,
    norm: Option<&'a QkNorm>,
}

impl InplaceOp1 for RopeOp<'_> {
    fn name(&self) -> &'static str {
        "rotary"
    }
    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        let (tokens, width) = dims2(layout)?;
        let half = self.table.half;
        // A head may be wider than its rotated part (Qwen3.5's `partial_rotary_factor`): its
        // first `2·half` dimensions turn, the rest pass as they are.
        let heads = self.num_heads + 2 * self.num_kv_heads;
        let head_dim = width / heads.max(1);
        if head_dim * heads != width || head_dim < 2 * half || self.table.cos.len() != tokens * half {
            bail!("rotary: {tokens}×{width} QKV does not fit {} + 2×{} heads turned over {}", self.num_heads, self.num_kv_heads, 2 * half);
        }
        let x = contiguous_mut(storage, layout)?;
        x.par_chunks_mut(width).enumerate().for_each(|(t, row)| {
            let (cos, sin) = (&self.table.cos[t * half..(t + 1) * half], &self.table.sin[t * half..(t + 1) * half]);
            for (h, head) in row[..(self.num_heads + self.num_kv_heads) * head_dim].chunks_exact_mut(head_dim).enumerate() {
                if let Some(norm) = self.norm {
                    let weight = if h < self.num_heads { &norm.q } else { &norm.k };
                    RmsNorm::normalize_row(head, weight, norm.eps);
                }
                let (a, b) = head[..2 * half].split_at_mut(half);
                for k in 0..half {
                    let (x1, x2) = (a[k], b[k]);
                    a[k] = x1 * cos[k] - x2 * sin[k];
                    b[k] = x2 * cos[k] + x1 * sin[k];
                }
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_pairs_by_position() {
        // One head of 4 dims (2 frequencies), theta 10000: position 0 is the identity, and a
        // rotation keeps each (x_k, x_{k+2}) pair's length.
        let rotary = Rotary::new(4, 10_000.0);
        let qkv = Tensor::from_vec([1f32, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0, 9.0, 9.0, 9.0, 9.0].repeat(2), (2, 12), &Device::Cpu).unwrap();
        let out = rotary.table(&[0, 1]).apply(&qkv, 1, 1, None).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(&out[0][..4], &[1.0, 2.0, 3.0, 4.0]);
        let (c, s) = (1f32.cos(), 1f32.sin());
        assert!((out[1][0] - (1.0 * c - 3.0 * s)).abs() < 1e-6);
        assert!((out[1][2] - (3.0 * c + 1.0 * s)).abs() < 1e-6);
        assert_eq!(&out[1][8..], &[9.0, 9.0, 9.0, 9.0], "values are not rotated");
    }

    #[test]
    fn a_partial_rotation_turns_the_first_dims_of_each_head() {
        // Heads of 8 dims turned over 4 (2 frequencies): dims 4..8 of q and k pass unchanged.
        let rotary = Rotary::new(4, 10_000.0);
        let row: Vec<f32> = (0..24).map(|x| x as f32).collect();
        let qkv = Tensor::from_vec(row.clone(), (1, 24), &Device::Cpu).unwrap();
        let out = rotary.table(&[1]).apply(&qkv, 1, 1, None).unwrap().to_vec2::<f32>().unwrap();
        let (c, s) = (1f32.cos(), 1f32.sin());
        assert!((out[0][0] - (0.0 * c - 2.0 * s)).abs() < 1e-6);
        assert!((out[0][2] - (2.0 * c + 0.0 * s)).abs() < 1e-6);
        assert_eq!(&out[0][4..8], &row[4..8]);
        assert!((out[0][8] - (8.0 * c - 10.0 * s)).abs() < 1e-5, "the key head turns too");
        assert_eq!(&out[0][12..], &row[12..]);
    }
}
