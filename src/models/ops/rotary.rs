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
        let inv_freq = (0..head_dim / 2).map(|k| 1.0 / (theta as f32).powf((2 * k) as f32 / head_dim as f32)).collect();
        Self { inv_freq }
    }

    /// The table for tokens at `positions` (each token's position inside its own sequence).
    pub fn table(&self, positions: &[u32]) -> RotaryTable {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let angle = (p as f32 * f) as f64;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        RotaryTable {
            cos,
            sin,
            half,
            #[cfg(feature = "cuda")]
            on_device: std::sync::OnceLock::new(),
        }
    }
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
        #[cfg(feature = "cuda")]
        if super::cuda::takes(qkv) && qkv.is_contiguous() {
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
        let head_dim = 2 * half;
        if width != (self.num_heads + 2 * self.num_kv_heads) * head_dim || self.table.cos.len() != tokens * half {
            bail!("rotary: {tokens}×{width} QKV does not fit {} + 2×{} heads of {head_dim}", self.num_heads, self.num_kv_heads);
        }
        let x = contiguous_mut(storage, layout)?;
        x.par_chunks_mut(width).enumerate().for_each(|(t, row)| {
            let (cos, sin) = (&self.table.cos[t * half..(t + 1) * half], &self.table.sin[t * half..(t + 1) * half]);
            for (h, head) in row[..(self.num_heads + self.num_kv_heads) * head_dim].chunks_exact_mut(head_dim).enumerate() {
                if let Some(norm) = self.norm {
                    let weight = if h < self.num_heads { &norm.q } else { &norm.k };
                    RmsNorm::normalize_row(head, weight, norm.eps);
                }
                let (a, b) = head.split_at_mut(half);
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
}
