//! The load-time self-check of the CUDA kernels: each runs on small random inputs against the
//! ops' composite paths (candle's ops) on the same device. It depends on the ops; the kernels
//! (`mod.rs`) do not.

use super::{attention, bias_activation, bias_residual, gated, layer_norm, rms_norm};
use crate::kernels::{Activation, Attention, AttentionMask, PositionBias};
use candle_core::{DType, Device, Result, Tensor};

/// A fused CUDA kernel that disagrees with candle's ops on this device: which one, and by how
/// much (or the error it ran into).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct KernelMismatch(pub String);

/// Runs every kernel on small random inputs in `dtype` against candle's composite ops on the
/// same device; on a mismatch, disables the kernels for this process and says which one.
pub fn self_check(device: &Device, dtype: DType) -> std::result::Result<(), KernelMismatch> {
    let mut check = KernelCheck::new(device, dtype);
    let outcome = check.elementwise().and_then(|()| check.norms()).and_then(|()| check.attention()).and_then(|()| check.rotary());
    let problem = match outcome {
        // The first line of candle's error: the rest is its backtrace.
        Err(e) => Some(e.to_string().lines().next().unwrap_or_default().to_string()),
        Ok(()) => check.problems.into_iter().next(),
    };
    match problem {
        Some(problem) => {
            super::disable();
            Err(KernelMismatch(problem))
        }
        None => Ok(()),
    }
}

/// The kernels' outputs against the composite ops', on pseudo-random inputs.
struct KernelCheck<'a> {
    device: &'a Device,
    dtype: DType,
    /// Largest difference accepted: the dtype's precision.
    tolerance: f32,
    /// Every kernel found off, named.
    problems: Vec<String>,
}

/// Sequences of 5, 1, 39 and 107 tokens: several key tiles, and windows whose tiles see no key
/// of some queries.
const CU_SEQLENS: [usize; 5] = [0, 5, 6, 45, 152];
const TOKENS: usize = 152;

impl<'a> KernelCheck<'a> {
    fn new(device: &'a Device, dtype: DType) -> Self {
        let tolerance = match dtype {
            DType::F32 => 1e-4,
            DType::F16 => 2e-2,
            _ => 1e-1,
        };
        KernelCheck { device, dtype, tolerance, problems: Vec::new() }
    }

    /// Values in [-1, 1) from a fixed generator, in the checked dtype.
    fn random(&self, shape: (usize, usize), seed: u64) -> Result<Tensor> {
        let mut state = seed;
        let values: Vec<f32> = (0..shape.0 * shape.1)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        Tensor::from_vec(values, shape, self.device)?.to_dtype(self.dtype)
    }

    /// Notes `name` when `fast` is off `reference` by more than the tolerance. The largest
    /// difference is taken on the host: a device max would drop NaN (fmaxf), and a NaN must fail.
    fn compare(&mut self, name: &str, fast: Tensor, reference: Tensor) -> Result<()> {
        let host = |t: &Tensor| t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
        let (a, b) = (host(&fast)?, host(&reference)?);
        let d = match a.len() == b.len() {
            true => a
                .iter()
                .zip(&b)
                .map(|(x, y)| if x.is_finite() && y.is_finite() { (x - y).abs() } else { f32::INFINITY })
                .fold(0.0, f32::max),
            false => f32::INFINITY,
        };
        if d.is_nan() || d > self.tolerance {
            self.problems.push(format!("{name} differs from candle's ops by {d}"));
        }
        Ok(())
    }

    /// Bias + activation, bias + residual, and the gated units.
    fn elementwise(&mut self) -> Result<()> {
        let (rows, cols) = (37, 96);
        let x = self.random((rows, cols), 1)?;
        let residual = self.random((rows, cols), 2)?;
        let bias = self.random((1, cols), 3)?.flatten_all()?;
        for act in [Activation::Gelu, Activation::GeluTanh, Activation::Relu, Activation::Silu] {
            let reference = Activation::composite(&x.broadcast_add(&bias)?, act)?;
            self.compare(&format!("bias_activation {act:?}"), bias_activation(&x, Some(&bias), act.kernel())?, reference)?;
        }
        self.compare(
            "activation without bias",
            bias_activation(&x, None, Activation::Gelu.kernel())?,
            Activation::composite(&x, Activation::Gelu)?,
        )?;
        self.compare("bias_residual", bias_residual(&x, Some(&bias), Some(&residual))?, x.broadcast_add(&bias)?.add(&residual)?)?;
        self.compare("bias alone", bias_residual(&x, Some(&bias), None)?, x.broadcast_add(&bias)?)?;
        self.compare("residual alone", bias_residual(&x, None, Some(&residual))?, x.add(&residual)?)?;
        let gate = self.random((rows, 2 * cols), 4)?;
        let (first, second) = (gate.narrow(1, 0, cols)?.contiguous()?, gate.narrow(1, cols, cols)?.contiguous()?);
        self.compare(
            "gated, act on second",
            gated(&gate, Activation::Silu.kernel(), false)?,
            (Activation::composite(&second, Activation::Silu)? * &first)?,
        )?;
        self.compare(
            "gated, act on first",
            gated(&gate, Activation::Gelu.kernel(), true)?,
            (Activation::composite(&first, Activation::Gelu)? * &second)?,
        )
    }

    /// LayerNorm with and without its folded bias and residual, and RMSNorm.
    fn norms(&mut self) -> Result<()> {
        let (rows, cols) = (37, 96);
        let x = self.random((rows, cols), 1)?;
        let residual = self.random((rows, cols), 2)?;
        let bias = self.random((1, cols), 3)?.flatten_all()?;
        let (gamma, beta) = (self.random((1, cols), 5)?.flatten_all()?, self.random((1, cols), 6)?.flatten_all()?);
        let (gamma32, beta32) = (gamma.to_dtype(DType::F32)?, beta.to_dtype(DType::F32)?);
        let layer_norm_of = |t: &Tensor| -> Result<Tensor> {
            let centered = t.broadcast_sub(&t.mean_keepdim(1)?)?;
            let normed = centered.broadcast_div(&(centered.sqr()?.mean_keepdim(1)? + 1e-5)?.sqrt()?)?;
            normed.broadcast_mul(&gamma32)?.broadcast_add(&beta32)
        };
        let summed = x.broadcast_add(&bias)?.add(&residual)?.to_dtype(DType::F32)?;
        self.compare("layer_norm", layer_norm(&x, Some(&bias), Some(&residual), &gamma, &beta, 1e-5)?, layer_norm_of(&summed)?)?;
        let plain = x.to_dtype(DType::F32)?;
        self.compare("layer_norm without bias and residual", layer_norm(&x, None, None, &gamma, &beta, 1e-5)?, layer_norm_of(&plain)?)?;
        let reference = candle_nn::ops::rms_norm(&plain, &gamma32, 1e-6)?;
        self.compare("rms_norm", rms_norm(&x, &gamma, 1e-6)?, reference)
    }

    /// Varlen attention: grouped-query heads of 64 dims under each mask, then head sizes of 128
    /// (Qwen3), 32 (MiniLM), 24 (not a multiple of the warp), 256 (Gemma 3), 200 and 512
    /// (EmbeddingGemma 2's global layers; the opted-in shared memory), and a relative position bias.
    fn attention(&mut self) -> Result<()> {
        for (heads, kv_heads, head_dim) in [(4, 2, 64), (2, 1, 128), (3, 3, 32), (2, 2, 24), (2, 1, 256), (1, 1, 200), (2, 2, 512)] {
            let width = (heads + 2 * kv_heads) * head_dim;
            let qkv = (self.random((TOKENS, width), 7 + head_dim as u64)? * 2.0)?;
            let qkv_bias = self.random((1, width), 8)?.flatten_all()?;
            for mask in [
                AttentionMask::Bidirectional,
                AttentionMask::Causal,
                AttentionMask::Window(3),
                AttentionMask::Window(40),
                AttentionMask::CausalWindow(4),
            ] {
                let att = Attention {
                    num_heads: heads,
                    num_kv_heads: kv_heads,
                    head_dim,
                    cu_seqlens: &CU_SEQLENS,
                    mask,
                    position_bias: None,
                    disentangled: None,
                    softcap: None,
                };
                let reference = att.forward_generic(&qkv.broadcast_add(&qkv_bias)?)?;
                self.compare(
                    &format!("attention {heads}/{kv_heads} heads of {head_dim}, {mask:?}"),
                    attention(&att.kernel(), &qkv, Some(&qkv_bias))?,
                    reference,
                )?;
            }
        }
        let (heads, head_dim) = (4, 64);
        let max_len = 110;
        let values: Vec<f32> = self.random((heads, 2 * max_len - 1), 9)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let position_bias = PositionBias { values, max_len };
        let qkv = self.random((TOKENS, 3 * heads * head_dim), 10)?;
        let att = Attention {
            num_heads: heads,
            num_kv_heads: heads,
            head_dim,
            cu_seqlens: &CU_SEQLENS,
            mask: AttentionMask::Bidirectional,
            position_bias: Some(&position_bias),
            disentangled: None,
            softcap: None,
        };
        self.compare("attention with position bias", attention(&att.kernel(), &qkv, None)?, att.forward_generic(&qkv)?)
    }

    /// RoPE with and without the per-head norm, against the host implementation.
    fn rotary(&mut self) -> Result<()> {
        let (heads, kv_heads, head_dim) = (4, 2, 64);
        let rotary = crate::kernels::Rotary::new(head_dim, 10_000.0);
        let positions: Vec<u32> = CU_SEQLENS.windows(2).flat_map(|w| 0..(w[1] - w[0]) as u32).collect();
        let table = rotary.table(&positions);
        let qkv = self.random((TOKENS, (heads + 2 * kv_heads) * head_dim), 11)?;
        let norm_weights = self.random((2, head_dim), 12)?.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let qk_norm = crate::kernels::QkNorm { q: norm_weights[0].clone(), k: norm_weights[1].clone(), eps: 1e-6 };
        for norm in [None, Some(&qk_norm)] {
            let reference = table.apply_on_host(&qkv, heads, kv_heads, norm)?;
            self.compare(
                if norm.is_some() { "rotary with q/k norm" } else { "rotary" },
                table.apply(&qkv.copy()?, heads, kv_heads, norm)?,
                reference,
            )?;
        }
        Ok(())
    }
}
