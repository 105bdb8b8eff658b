//! RMSNorm (`x / sqrt(mean(x²) + eps) · weight`), the normalization of decoder models.

use super::dispatch::contiguous_mut;
use super::{contiguous, dims2, fused, host_f32, sum_squares};
use candle_core::{bail, CpuStorage, CustomOp1, InplaceOp1, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// f32 copy for the composite path.
    weight: Tensor,
    /// In the model's dtype, for the CUDA kernel.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    native: Tensor,
    weight_host: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    pub fn new(weight: Tensor, eps: f64) -> Result<Self> {
        Ok(Self { weight_host: host_f32(&weight)?, weight: weight.to_dtype(candle_core::DType::F32)?, native: weight, eps: eps as f32 })
    }

    /// The normalized rows as a new tensor (decoders keep `x` for the residual).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if fused(x) {
            return x.apply_op1_no_bwd(self);
        }
        #[cfg(feature = "cuda")]
        if super::cuda::takes(x) && self.native.dtype() == x.dtype() {
            return super::cuda::rms_norm(x, &self.native, self.eps);
        }
        // In f32, then back to the model's dtype, as transformers' RMSNorm does.
        candle_nn::ops::rms_norm(&x.to_dtype(candle_core::DType::F32)?, &self.weight, self.eps)?.to_dtype(x.dtype())
    }

    /// Normalizes, in place, `heads` consecutive groups of `weight.len()` columns from column
    /// `start` of every row of `x` (a fused QKV's value heads, say), and says whether it did:
    /// `false`, with `x` untouched, where `x` does not take the fused kernels (the caller
    /// then normalizes a copy).
    pub fn forward_heads_in_place(&self, x: &Tensor, start: usize, heads: usize) -> Result<bool> {
        if !fused(x) {
            return Ok(false);
        }
        x.inplace_op1(&HeadsInPlace { norm: self, start, heads })?;
        Ok(true)
    }

    /// Normalizes one row in place (also used per attention head by [`super::Rotary`]).
    pub(super) fn normalize_row(row: &mut [f32], weight: &[f32], eps: f32) {
        rms_rows(row, weight, eps, None)
    }
}

impl CustomOp1 for RmsNorm {
    fn name(&self) -> &'static str {
        "rms_norm"
    }
    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, n) = dims2(layout)?;
        if n != self.weight_host.len() {
            bail!("rms_norm: {n} features, weight has {}", self.weight_host.len());
        }
        let x = contiguous(storage, layout)?;
        let mut out = vec![0f32; rows * n];
        const ROWS: usize = 16;
        out.par_chunks_mut(n * ROWS)
            .zip(x.par_chunks(n * ROWS))
            .for_each(|(dst, src)| rms_rows(dst, &self.weight_host, self.eps, Some(src)));
        Ok((CpuStorage::F32(out), Shape::from((rows, n))))
    }
}

/// [`RmsNorm::forward_heads_in_place`]'s op.
struct HeadsInPlace<'a> {
    norm: &'a RmsNorm,
    start: usize,
    heads: usize,
}

impl InplaceOp1 for HeadsInPlace<'_> {
    fn name(&self) -> &'static str {
        "rms_norm_heads"
    }
    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        let (_, width) = dims2(layout)?;
        let head_dim = self.norm.weight_host.len();
        let end = self.start + self.heads * head_dim;
        if end > width {
            bail!("rms_norm: columns {}..{end} lie outside rows of {width}", self.start);
        }
        let x = contiguous_mut(storage, layout)?;
        x.par_chunks_mut(width).for_each(|row| {
            for head in row[self.start..end].chunks_exact_mut(head_dim) {
                RmsNorm::normalize_row(head, &self.norm.weight_host, self.norm.eps);
            }
        });
        Ok(())
    }
}

multiversion! {
    /// Normalizes the rows of `src` into `dst` (or `dst` in place when `src` is `None`).
    fn rms_rows(dst: &mut [f32], weight: &[f32], eps: f32, src: Option<&[f32]>) {
        let n = weight.len();
        for (r, row) in dst.chunks_exact_mut(n).enumerate() {
            if let Some(src) = src {
                row.copy_from_slice(&src[r * n..(r + 1) * n]);
            }
            let inv = 1.0 / (sum_squares::<FMA>(row) / n as f32 + eps).sqrt();
            row.iter_mut().zip(weight).for_each(|(v, w)| *v = *v * inv * w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn matches_candle_rms_norm() {
        let x = Tensor::from_vec((0..60).map(|i| ((i * 37 % 23) as f32 - 11.0) / 3.0).collect::<Vec<_>>(), (3, 20), &Device::Cpu).unwrap();
        let w = Tensor::from_vec((0..20).map(|i| 0.5 + i as f32 / 20.0).collect::<Vec<_>>(), 20, &Device::Cpu).unwrap();
        let ours = RmsNorm::new(w.clone(), 1e-6).unwrap().forward(&x).unwrap();
        let reference = candle_nn::ops::rms_norm_slow(&x, &w, 1e-6).unwrap();
        let diff = (ours - reference).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
        assert!(diff < 1e-5, "{diff}");
    }

    #[test]
    fn heads_in_place_normalize_only_their_columns() {
        // Rows of 3 + 2 × 4 + 1 columns: the two heads of 4 from column 3 are normalized, as
        // the composite op normalizes a copy of them; the columns around them are untouched.
        let x = Tensor::from_vec((0..36).map(|i| ((i * 37 % 23) as f32 - 11.0) / 3.0).collect::<Vec<_>>(), (3, 12), &Device::Cpu).unwrap();
        let w = Tensor::from_vec(vec![0.5f32, 1.0, 1.5, 2.0], 4, &Device::Cpu).unwrap();
        let norm = RmsNorm::new(w.clone(), 1e-6).unwrap();
        let before = x.to_vec2::<f32>().unwrap();
        let heads = x.narrow(1, 3, 8).unwrap().contiguous().unwrap().reshape((6, 4)).unwrap();
        let expected = candle_nn::ops::rms_norm_slow(&heads, &w, 1e-6).unwrap().reshape((3, 8)).unwrap().to_vec2::<f32>().unwrap();
        assert!(norm.forward_heads_in_place(&x, 3, 2).unwrap());
        let after = x.to_vec2::<f32>().unwrap();
        for r in 0..3 {
            assert_eq!(after[r][..3], before[r][..3]);
            assert_eq!(after[r][11], before[r][11]);
            after[r][3..11].iter().zip(&expected[r]).for_each(|(a, e)| assert!((a - e).abs() < 1e-5, "{a} vs {e}"));
        }
        assert!(norm.forward_heads_in_place(&x, 9, 1).is_err(), "columns past the row");
        assert!(!norm.forward_heads_in_place(&x.to_dtype(candle_core::DType::BF16).unwrap(), 3, 2).unwrap());
    }
}
