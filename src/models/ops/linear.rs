//! Dense layers: `y = x·Wᵀ + b (+ residual)` as one kernel on the CPU, the bias and the
//! residual folded into the gemm's accumulation, split over the pool by rows or by columns;
//! int8 weights take [`super::int8`]'s kernel through the same op.

use super::dispatch::{contiguous, dims2, fused, host_f32, SharedConst, SharedMut};
use super::int8::Int8Weight;
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use gemm::Parallelism;
use rayon::prelude::*;

/// Below this many multiply-adds a gemm call runs on the calling thread: spreading a tiny
/// product over the pool costs more than it saves.
const PARALLEL_GEMM_MIN_WORK: usize = 1 << 18;

/// Below this many rows a product is split by output columns rather than by rows.
const SPLIT_ROWS_MIN: usize = 256;

/// `dst (+)= x·w` for row-major `x` (m×k), `w` (k×n), `dst` (m×n), one single-threaded gemm
/// per pool thread. Tall products (many tokens) are split by rows: each thread packs its own
/// copy of `w`, which costs less than gemm's own fine-grained synchronization (measured ~105 →
/// ~112 GFLOP/s on two cores at BERT shapes). Short ones (a few queries) are split by columns,
/// so that each thread streams only its share of the weights, which dominate the traffic there.
///
/// # Safety
/// `dst` points to m×n writable floats, initialized when `read_dst` (gemm reads `dst` only
/// then, so a fresh output is never zeroed first).
unsafe fn gemm_parallel(dst: *mut f32, x: &[f32], w: &[f32], m: usize, n: usize, k: usize, read_dst: bool) {
    let threads = rayon::current_num_threads();
    let big = m * n * k >= PARALLEL_GEMM_MIN_WORK && threads > 1;
    // SAFETY (every call): dst is m×n row-major, x is m×k row-major, w is k×n row-major; each
    // block handed to gemm lies inside them and no two blocks overlap.
    let block = |dst: *mut f32, x: *const f32, w: *const f32, rows: usize, cols: usize| unsafe {
        gemm::gemm(
            rows, cols, k,
            dst, 1, n as isize, read_dst,
            x, 1, k as isize,
            w, 1, n as isize,
            1.0, 1.0, false, false, false,
            Parallelism::None,
        );
    };
    let (out, input, weights) = (SharedMut(dst), SharedConst(x.as_ptr()), SharedConst(w.as_ptr()));
    if !big {
        block(dst, x.as_ptr(), w.as_ptr(), m, n);
    } else if m >= SPLIT_ROWS_MIN {
        let rows_per_part = m.div_ceil(threads);
        (0..m.div_ceil(rows_per_part)).into_par_iter().for_each(|part| {
            let (out, input, weights) = (out, input, weights);
            let r0 = part * rows_per_part;
            // SAFETY: rows r0..r0+rows of dst and of x.
            let (d, x) = unsafe { (out.0.add(r0 * n), input.0.add(r0 * k)) };
            block(d, x, weights.0, rows_per_part.min(m - r0), n);
        });
    } else {
        // Column blocks of a multiple of 16 (gemm's register tile width).
        let cols_per_part = n.div_ceil(threads).div_ceil(16) * 16;
        (0..n.div_ceil(cols_per_part)).into_par_iter().for_each(|part| {
            let (out, input, weights) = (out, input, weights);
            let c0 = part * cols_per_part;
            let cols = cols_per_part.min(n - c0);
            // SAFETY: column block c0..c0+cols of dst and of w.
            let (d, w) = unsafe { (out.0.add(c0), weights.0.add(c0)) };
            block(d, input.0, w, m, cols);
        });
    }
}

/// A bias vector, on the device for the composite path and on the host for the CPU kernels.
#[derive(Debug, Clone)]
pub struct Bias {
    pub tensor: Tensor,
    pub host: Vec<f32>,
}

impl Bias {
    pub fn new(tensor: Tensor) -> Result<Self> {
        Ok(Self { host: host_f32(&tensor)?, tensor })
    }
}

/// A dense layer `y = x·Wᵀ + b`. Checkpoints store `W` as `[out, in]`; it is kept transposed,
/// `[in, out]` row-major, the layout gemm packs fastest, or quantized to int8
/// ([`Linear::quantize_int8`]).
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Weight,
    bias: Option<Bias>,
}

#[derive(Debug, Clone)]
enum Weight {
    /// `Wᵀ`, `[in, out]`.
    Transposed(Tensor),
    Int8(std::sync::Arc<Int8Weight>),
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        let weight_t = weight.t()?.contiguous()?;
        let bias = bias.map(Bias::new).transpose()?;
        Ok(Self { weight: Weight::Transposed(weight_t), bias })
    }

    pub fn out_features(&self) -> usize {
        match &self.weight {
            Weight::Transposed(w) => w.dims()[1],
            Weight::Int8(w) => w.out_features(),
        }
    }

    pub fn in_features(&self) -> usize {
        match &self.weight {
            Weight::Transposed(w) => w.dims()[0],
            Weight::Int8(w) => w.in_features(),
        }
    }

    pub fn bias(&self) -> Option<&Bias> {
        self.bias.as_ref()
    }

    /// Replaces the f32 weight by its int8 quantization (CPU, f32 activations only). The f32
    /// copy is dropped: quantized layers keep a quarter of the memory.
    pub fn quantize_int8(&mut self) -> Result<()> {
        if let Weight::Transposed(w) = &self.weight {
            if !fused(w) {
                bail!("int8 quantization needs f32 weights on the CPU");
            }
            let (k, n) = w.dims2()?;
            let host = w.flatten_all()?.to_vec1::<f32>()?;
            self.weight = Weight::Int8(std::sync::Arc::new(Int8Weight::quantize(&host, k, n)));
        }
        Ok(())
    }

    /// `x·Wᵀ (+ b) (+ residual)`, one kernel on CPU f32, candle's ops elsewhere.
    fn apply(&self, x: &Tensor, bias: Option<&Bias>, residual: Option<&Tensor>) -> Result<Tensor> {
        let op = LinearOp { bias: bias.map(|b| b.host.as_slice()), int8: None };
        match (&self.weight, residual) {
            (Weight::Transposed(w), _) if !fused(x) => {
                let mut y = x.matmul(w)?;
                if let Some(b) = bias {
                    y = y.broadcast_add(&b.tensor)?;
                }
                match residual {
                    Some(r) => y.add(r),
                    None => Ok(y),
                }
            }
            (Weight::Transposed(w), None) => x.apply_op2_no_bwd(w, &op),
            (Weight::Transposed(w), Some(r)) => x.apply_op3_no_bwd(w, r, &op),
            (Weight::Int8(_), _) if !fused(x) => bail!("int8 layers run on the CPU in f32 only"),
            (Weight::Int8(w), None) => x.apply_op1_no_bwd(&LinearOp { int8: Some(w), ..op }),
            (Weight::Int8(w), Some(r)) => x.apply_op2_no_bwd(r, &LinearOp { int8: Some(w), ..op }),
        }
    }

    /// `x·Wᵀ + b` for `x` of shape `[tokens, in]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.apply(x, self.bias.as_ref(), None)
    }

    /// `x·Wᵀ` alone, for callers that fold the bias into their next pass.
    pub fn forward_unbiased(&self, x: &Tensor) -> Result<Tensor> {
        self.apply(x, None, None)
    }

    /// `x·Wᵀ + b + residual`: the residual connection costs no extra pass on CPU.
    pub fn forward_add(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        self.apply(x, self.bias.as_ref(), Some(residual))
    }
}

/// The CPU kernel of [`Linear`]: f32 gemm with the weight as second operand, or the int8
/// product with the weight held here; an optional residual is the last operand either way.
struct LinearOp<'a> {
    bias: Option<&'a [f32]>,
    int8: Option<&'a Int8Weight>,
}

#[derive(Clone, Copy)]
enum WeightRef<'a> {
    F32(&'a [f32], &'a Layout),
    Int8(&'a Int8Weight),
}

impl LinearOp<'_> {
    fn run(&self, x: &[f32], x_l: &Layout, w: WeightRef<'_>, residual: Option<&[f32]>) -> Result<(CpuStorage, Shape)> {
        let (m, k) = dims2(x_l)?;
        let (k2, n) = match w {
            WeightRef::F32(_, w_l) => dims2(w_l)?,
            WeightRef::Int8(q) => (q.in_features(), q.out_features()),
        };
        if k != k2 {
            bail!("linear: input has {k} features, weight expects {k2}");
        }
        // Pre-fill the output with residual + bias (or the bias alone), then let gemm accumulate.
        let mut dst: Vec<f32> = Vec::with_capacity(m * n);
        let read_dst = match (residual, self.bias) {
            (Some(r), bias) => {
                if r.len() != m * n {
                    bail!("linear: residual has {} elements, expected {}", r.len(), m * n);
                }
                match bias {
                    Some(b) => r.chunks_exact(n).for_each(|row| dst.extend(row.iter().zip(b).map(|(r, b)| r + b))),
                    None => dst.extend_from_slice(r),
                }
                true
            }
            (None, Some(b)) => {
                for _ in 0..m {
                    dst.extend_from_slice(b);
                }
                true
            }
            // No input features: nothing would write the output.
            (None, None) if k == 0 => {
                dst.resize(m * n, 0.0);
                true
            }
            // A fresh output: the kernels write every element, so it is not zeroed first.
            (None, None) => false,
        };
        // SAFETY: dst has room for m×n floats, all initialized when read_dst; otherwise both
        // kernels write every one of them before the length is set.
        unsafe {
            match w {
                WeightRef::F32(w, _) => gemm_parallel(dst.as_mut_ptr(), x, w, m, n, k, read_dst),
                WeightRef::Int8(q) => q.matmul(dst.as_mut_ptr(), x, m, read_dst),
            }
            dst.set_len(m * n);
        }
        Ok((CpuStorage::F32(dst), Shape::from((m, n))))
    }
}

/// Int8: `x`.
impl CustomOp1 for LinearOp<'_> {
    fn name(&self) -> &'static str {
        "linear_int8"
    }
    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout) -> Result<(CpuStorage, Shape)> {
        let Some(q) = self.int8 else { bail!("linear: no weight") };
        self.run(contiguous(s1, l1)?, l1, WeightRef::Int8(q), None)
    }
}

/// F32: `x`, `Wᵀ`. Int8: `x`, residual.
impl CustomOp2 for LinearOp<'_> {
    fn name(&self) -> &'static str {
        "linear"
    }
    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (x, second) = (contiguous(s1, l1)?, contiguous(s2, l2)?);
        match self.int8 {
            Some(q) => self.run(x, l1, WeightRef::Int8(q), Some(second)),
            None => self.run(x, l1, WeightRef::F32(second, l2), None),
        }
    }
}

/// F32: `x`, `Wᵀ`, residual.
impl CustomOp3 for LinearOp<'_> {
    fn name(&self) -> &'static str {
        "linear_add"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.run(contiguous(s1, l1)?, l1, WeightRef::F32(contiguous(s2, l2)?, l2), Some(contiguous(s3, l3)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::ops::test_util::{max_diff, random};

    #[test]
    fn linear_kernel_matches_candle_matmul() {
        // Shapes on both sides of the parallel thresholds: small, tall (row split), short and
        // wide (column split).
        for (m, k, n) in [(7, 5, 3), (300, 64, 40), (16, 96, 200)] {
            let x = random((m, k), 1);
            let w = random((n, k), 2);
            let b = random((1, n), 3).flatten_all().unwrap();
            let r = random((m, n), 4);
            let lin = Linear::new(w.clone(), Some(b.clone())).unwrap();
            let expected = x.matmul(&w.t().unwrap()).unwrap().broadcast_add(&b).unwrap();
            assert!(max_diff(&lin.forward(&x).unwrap(), &expected) < 1e-4, "{m}x{k}x{n}");
            let unbiased = x.matmul(&w.t().unwrap()).unwrap();
            assert!(max_diff(&lin.forward_unbiased(&x).unwrap(), &unbiased) < 1e-4);
            let expected_add = (&expected + &r).unwrap();
            assert!(max_diff(&lin.forward_add(&x, &r).unwrap(), &expected_add) < 1e-4);
        }
    }
}
