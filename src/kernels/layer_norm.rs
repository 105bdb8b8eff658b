//! LayerNorm over the last dimension: one in-place parallel pass on the CPU.

use super::dispatch::{contiguous_mut, dims2, fma, fused, host_f32};
use super::linear::Linear;
use super::math::{sum_lanes, sum_squares};
use candle_core::{bail, CpuStorage, InplaceOp1, Layout, Result, Tensor};
use rayon::prelude::*;

/// LayerNorm over the last dimension.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    weight_host: Vec<f32>,
    bias_host: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    pub fn new(weight: Tensor, bias: Tensor, eps: f64) -> Result<Self> {
        Ok(Self { weight_host: host_f32(&weight)?, bias_host: host_f32(&bias)?, weight, bias, eps: eps as f32 })
    }

    /// Normalizes `x`, reusing its buffer on CPU (callers pass a tensor they own alone).
    pub fn forward(&self, x: Tensor) -> Result<Tensor> {
        if fused(&x) {
            x.inplace_op1(self)?;
            return Ok(x);
        }
        #[cfg(feature = "cuda")]
        if super::cuda::takes(&x) && x.dim(1)? <= super::cuda::MAX_NORM_COLS {
            return super::cuda::layer_norm(&x, None, None, &self.weight, &self.bias, self.eps);
        }
        // In f32 whatever the model's dtype, as PyTorch accumulates half-precision norms.
        let dtype = x.dtype();
        let x = x.to_dtype(candle_core::DType::F32)?;
        let mean = x.mean_keepdim(1)?;
        let centered = x.broadcast_sub(&mean)?;
        let var = centered.sqr()?.mean_keepdim(1)?;
        let normed = centered.broadcast_div(&(var + self.eps as f64)?.sqrt()?)?;
        let f32 = |t: &Tensor| t.to_dtype(candle_core::DType::F32);
        normed.broadcast_mul(&f32(&self.weight)?)?.broadcast_add(&f32(&self.bias)?)?.to_dtype(dtype)
    }

    /// `LayerNorm(x·Wᵀ + b + residual)` for `linear`'s `W` and `b`, the post-norm block's
    /// residual step: on CUDA, bias, residual and norm are one kernel after the product.
    pub fn forward_add(&self, linear: &Linear, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if super::cuda::takes(x) && linear.on_device() && linear.out_features() <= super::cuda::MAX_NORM_COLS {
            let product = linear.forward_unbiased(x)?;
            return super::cuda::layer_norm(&product, linear.bias().map(|b| &b.tensor), Some(residual), &self.weight, &self.bias, self.eps);
        }
        self.forward(linear.forward_add(x, residual)?)
    }
}

impl InplaceOp1 for LayerNorm {
    fn name(&self) -> &'static str {
        "layer_norm"
    }
    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        let (_, n) = dims2(layout)?;
        if n != self.weight_host.len() {
            bail!("layer_norm: {n} features, weight has {}", self.weight_host.len());
        }
        let x = contiguous_mut(storage, layout)?;
        const ROWS: usize = 16;
        x.par_chunks_mut(n * ROWS).for_each(|rows| layer_norm_rows(rows, &self.weight_host, &self.bias_host, self.eps));
        Ok(())
    }
}

multiversion! {
    fn layer_norm_rows(x: &mut [f32], weight: &[f32], bias: &[f32], eps: f32) {
        let n = weight.len();
        for row in x.chunks_exact_mut(n) {
            let mean = sum_lanes(row) / n as f32;
            row.iter_mut().for_each(|v| *v -= mean);
            let inv = 1.0 / (sum_squares::<FMA>(row) / n as f32 + eps).sqrt();
            for ((v, w), b) in row.iter_mut().zip(weight).zip(bias) {
                *v = fma::<FMA>(*v * inv, *w, *b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_util::{max_diff, random};

    #[test]
    fn layer_norm_kernel_matches_composite() {
        let x = random((6, 20), 5);
        let w = random((1, 20), 6).flatten_all().unwrap();
        let b = random((1, 20), 7).flatten_all().unwrap();
        let ln = LayerNorm::new(w.clone(), b.clone(), 1e-12).unwrap();
        let reference = candle_nn::ops::layer_norm(&x, &w, &b, 1e-12).unwrap();
        assert!(max_diff(&ln.forward(x.copy().unwrap()).unwrap(), &reference) < 1e-5);
    }
}
