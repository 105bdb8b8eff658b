//! Fused tensor operations shared by the backbones.
//!
//! On CPU each operation is one custom kernel over all tokens of the flat batch: the bias and
//! the residual are folded into the matrix multiplication (gemm accumulates onto them), GELU and
//! LayerNorm are single parallel passes, and attention reads Q, K and V straight out of the
//! fused QKV rows. Candle's composite ops would make several passes and copies for each of these,
//! which is where stock candle models lose to PyTorch. On other devices every operation falls back
//! to candle's composite ops, so the same model code runs there.

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use gemm::Parallelism;
use rayon::prelude::*;

/// Below this many multiply-adds a gemm call runs on the calling thread: spreading a tiny
/// product over the pool costs more than it saves.
const PARALLEL_GEMM_MIN_WORK: usize = 1 << 18;

fn contiguous<'a>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
    let data = storage.as_slice::<f32>()?;
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => bail!("fused op expects a contiguous f32 tensor"),
    }
}

fn dims2(layout: &Layout) -> Result<(usize, usize)> {
    layout.shape().dims2()
}

fn gemm_parallelism(work: usize) -> Parallelism {
    if work >= PARALLEL_GEMM_MIN_WORK && rayon::current_num_threads() > 1 {
        Parallelism::Rayon(rayon::current_num_threads())
    } else {
        Parallelism::None
    }
}

/// A dense layer `y = x·Wᵀ + b`, with `W` stored as `[out, in]` like PyTorch.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    /// The bias on the host, read by the CPU kernel to pre-fill the output.
    bias_host: Option<Vec<f32>>,
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        let weight = weight.contiguous()?;
        let bias_host = match &bias {
            Some(b) => Some(b.to_vec1::<f32>()?),
            None => None,
        };
        Ok(Self { weight, bias, bias_host })
    }

    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }

    /// `x·Wᵀ + b` for `x` of shape `[tokens, in]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.device().is_cpu() {
            let op = LinearOp { bias: self.bias_host.as_deref() };
            return x.apply_op2_no_bwd(&self.weight, &op);
        }
        let y = x.matmul(&self.weight.t()?)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }

    /// `x·Wᵀ + b + residual`: the residual connection costs no extra pass on CPU.
    pub fn forward_add(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        if x.device().is_cpu() {
            let op = LinearOp { bias: self.bias_host.as_deref() };
            return x.apply_op3_no_bwd(&self.weight, residual, &op);
        }
        self.forward(x)?.add(residual)
    }
}

struct LinearOp<'a> {
    bias: Option<&'a [f32]>,
}

impl LinearOp<'_> {
    fn run(&self, x: &[f32], x_l: &Layout, w: &[f32], w_l: &Layout, residual: Option<&[f32]>) -> Result<(CpuStorage, Shape)> {
        let (m, k) = dims2(x_l)?;
        let (n, k2) = dims2(w_l)?;
        if k != k2 {
            bail!("linear: input has {k} features, weight expects {k2}");
        }
        // Pre-fill the output with the residual and/or the bias, then let gemm accumulate.
        let mut dst: Vec<f32> = match residual {
            Some(r) => {
                if r.len() != m * n {
                    bail!("linear: residual has {} elements, expected {}", r.len(), m * n);
                }
                r.to_vec()
            }
            None => Vec::with_capacity(m * n),
        };
        let read_dst = match (residual.is_some(), self.bias) {
            (true, Some(b)) => {
                dst.par_chunks_mut(n).for_each(|row| row.iter_mut().zip(b).for_each(|(d, b)| *d += b));
                true
            }
            (true, None) => true,
            (false, Some(b)) => {
                for _ in 0..m {
                    dst.extend_from_slice(b);
                }
                true
            }
            (false, None) => {
                dst.resize(m * n, 0.0);
                false
            }
        };
        // SAFETY: dst is m×n row-major, x is m×k row-major, w is n×k row-major read as its
        // transpose (k×n with row stride 1 and column stride k); all slices have those lengths.
        unsafe {
            gemm::gemm(
                m, n, k,
                dst.as_mut_ptr(), 1, n as isize, read_dst,
                x.as_ptr(), 1, k as isize,
                w.as_ptr(), k as isize, 1,
                1.0, 1.0, false, false, false,
                gemm_parallelism(m * n * k),
            );
        }
        Ok((CpuStorage::F32(dst), Shape::from((m, n))))
    }
}

impl CustomOp2 for LinearOp<'_> {
    fn name(&self) -> &'static str {
        "linear"
    }
    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        self.run(contiguous(s1, l1)?, l1, contiguous(s2, l2)?, l2, None)
    }
}

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
        self.run(contiguous(s1, l1)?, l1, contiguous(s2, l2)?, l2, Some(contiguous(s3, l3)?))
    }
}

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
        Ok(Self {
            weight_host: weight.to_vec1()?,
            bias_host: bias.to_vec1()?,
            weight,
            bias,
            eps: eps as f32,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.device().is_cpu() {
            return x.apply_op1_no_bwd(self);
        }
        let mean = x.mean_keepdim(1)?;
        let centered = x.broadcast_sub(&mean)?;
        let var = centered.sqr()?.mean_keepdim(1)?;
        let normed = centered.broadcast_div(&(var + self.eps as f64)?.sqrt()?)?;
        normed.broadcast_mul(&self.weight)?.broadcast_add(&self.bias)
    }
}

impl CustomOp1 for LayerNorm {
    fn name(&self) -> &'static str {
        "layer_norm"
    }
    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = contiguous(storage, layout)?;
        let (m, n) = dims2(layout)?;
        if n != self.weight_host.len() {
            bail!("layer_norm: {n} features, weight has {}", self.weight_host.len());
        }
        let mut dst = vec![0f32; m * n];
        dst.par_chunks_mut(n).zip(x.par_chunks(n)).with_min_len(16).for_each(|(out, row)| {
            let mean = row.iter().sum::<f32>() / n as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
            let inv = 1.0 / (var + self.eps).sqrt();
            for (((o, v), w), b) in out.iter_mut().zip(row).zip(&self.weight_host).zip(&self.bias_host) {
                *o = (v - mean) * inv * w + b;
            }
        });
        Ok((CpuStorage::F32(dst), layout.shape().clone()))
    }
}

/// The activation functions that transformer configs name in `hidden_act`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// Exact GELU, `x·Φ(x)` with the error function (`"gelu"`).
    Gelu,
    /// The tanh approximation of GELU (`"gelu_new"`, `"gelu_pytorch_tanh"`).
    GeluTanh,
    Relu,
    Silu,
}

impl Activation {
    pub fn from_config(name: &str) -> Option<Self> {
        match name {
            "gelu" => Some(Self::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Some(Self::GeluTanh),
            "relu" => Some(Self::Relu),
            "silu" | "swish" => Some(Self::Silu),
            _ => None,
        }
    }

    pub fn forward(self, x: &Tensor) -> Result<Tensor> {
        if x.device().is_cpu() {
            return x.apply_op1_no_bwd(&self);
        }
        match self {
            Self::Gelu => x.gelu_erf(),
            Self::GeluTanh => x.gelu(),
            Self::Relu => x.relu(),
            Self::Silu => x.silu(),
        }
    }

    #[inline(always)]
    fn apply(self, x: f32) -> f32 {
        match self {
            Self::Gelu => 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2)),
            Self::GeluTanh => {
                let inner = 0.797_884_6 * (x + 0.044_715 * x * x * x);
                0.5 * x * (1.0 + tanh(inner))
            }
            Self::Relu => x.max(0.0),
            Self::Silu => x / (1.0 + exp(-x)),
        }
    }
}

impl CustomOp1 for Activation {
    fn name(&self) -> &'static str {
        "activation"
    }
    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = contiguous(storage, layout)?;
        let mut dst = vec![0f32; x.len()];
        let act = *self;
        // Monomorphic inner loops so that LLVM vectorizes the polynomial code.
        macro_rules! run {
            ($f:expr) => {
                dst.par_chunks_mut(4096).zip(x.par_chunks(4096)).for_each(|(o, i)| {
                    o.iter_mut().zip(i).for_each(|(o, &v)| *o = $f(v))
                })
            };
        }
        match act {
            Activation::Gelu => run!(|v| Activation::Gelu.apply(v)),
            Activation::GeluTanh => run!(|v| Activation::GeluTanh.apply(v)),
            Activation::Relu => run!(|v| Activation::Relu.apply(v)),
            Activation::Silu => run!(|v| Activation::Silu.apply(v)),
        }
        Ok((CpuStorage::F32(dst), layout.shape().clone()))
    }
}

/// `e^x` in f32 without branches (so loops over it vectorize): range reduction to
/// `x = k·ln2 + r`, a degree-6 polynomial for `e^r`, and the exponent bits for `2^k`.
/// Relative error below 2e-7 over the clamped range.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let k = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let r = x - k * 0.693_145_75 - k * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0 + r * (0.5 + r * (0.166_666_67 + r * (0.041_666_668 + r * (0.008_333_334 + r * 0.001_388_888_9)))));
    p * f32::from_bits(((k as i32 + 127) << 23) as u32)
}

/// The error function, Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t * (0.254_829_6 + t * (-0.284_496_74 + t * (1.421_413_8 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let y = 1.0 - poly * exp(-a * a);
    y.copysign(x)
}

#[inline(always)]
fn tanh(x: f32) -> f32 {
    let e = exp(-2.0 * x.abs());
    ((1.0 - e) / (1.0 + e)).copysign(x)
}

/// Which key positions a query may attend to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionMask {
    /// Every token sees every token of its own sequence (encoders).
    Bidirectional,
}

/// Multi-head attention over a flat batch.
///
/// `qkv` is `[tokens, 3·hidden]` with the query, key and value projections side by side;
/// `cu_seqlens` holds the cumulative sequence lengths (`[0, l0, l0+l1, …]`). Tokens only
/// attend within their own sequence, so no padding or mask tensor exists at all.
pub struct Attention<'a> {
    pub num_heads: usize,
    pub cu_seqlens: &'a [usize],
    pub mask: AttentionMask,
}

impl Attention<'_> {
    pub fn forward(&self, qkv: &Tensor) -> Result<Tensor> {
        if qkv.device().is_cpu() {
            return qkv.apply_op1_no_bwd(self);
        }
        self.forward_generic(qkv)
    }

    /// Composite candle ops, one sequence at a time: the path for GPUs and the reference the
    /// CPU kernel is tested against.
    pub fn forward_generic(&self, qkv: &Tensor) -> Result<Tensor> {
        let (_, three_h) = qkv.dims2()?;
        let hidden = three_h / 3;
        let head_dim = hidden / self.num_heads;
        let scale = 1.0 / (head_dim as f64).sqrt();
        let mut outputs = Vec::with_capacity(self.cu_seqlens.len().saturating_sub(1));
        for w in self.cu_seqlens.windows(2) {
            let (start, len) = (w[0], w[1] - w[0]);
            let seq = qkv.narrow(0, start, len)?;
            let split = |i: usize| -> Result<Tensor> {
                seq.narrow(1, i * hidden, hidden)?
                    .reshape((len, self.num_heads, head_dim))?
                    .transpose(0, 1)?
                    .contiguous()
            };
            let (q, k, v) = (split(0)?, split(1)?, split(2)?);
            let scores = (q.matmul(&k.t()?)? * scale)?;
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            let out = probs.matmul(&v)?.transpose(0, 1)?.reshape((len, hidden))?;
            outputs.push(out);
        }
        Tensor::cat(&outputs, 0)
    }
}

/// A raw output pointer that rayon tasks may share because each writes a disjoint region.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl CustomOp1 for Attention<'_> {
    fn name(&self) -> &'static str {
        "flat_attention"
    }
    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let qkv = contiguous(storage, layout)?;
        let (tokens, three_h) = dims2(layout)?;
        if three_h % 3 != 0 || (three_h / 3) % self.num_heads != 0 {
            bail!("attention: {three_h} columns do not split into q, k, v of {} heads", self.num_heads);
        }
        if self.cu_seqlens.last().copied() != Some(tokens) {
            bail!("attention: cu_seqlens does not cover the {tokens} tokens");
        }
        let hidden = three_h / 3;
        let heads = self.num_heads;
        let head_dim = hidden / heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut dst = vec![0f32; tokens * hidden];
        let out = SharedMut(dst.as_mut_ptr());
        let num_seqs = self.cu_seqlens.len() - 1;
        (0..num_seqs * heads).into_par_iter().for_each_init(Vec::new, |scores: &mut Vec<f32>, job| {
            let (seq, head) = (job / heads, job % heads);
            let start = self.cu_seqlens[seq];
            let len = self.cu_seqlens[seq + 1] - start;
            if len == 0 {
                return;
            }
            scores.clear();
            scores.resize(len * len, 0.0);
            let q = qkv[start * three_h + head * head_dim..].as_ptr();
            let k = qkv[start * three_h + hidden + head * head_dim..].as_ptr();
            let v = qkv[start * three_h + 2 * hidden + head * head_dim..].as_ptr();
            let rs = three_h as isize;
            // SAFETY: q, k and v address `len` rows of `head_dim` values with row stride
            // 3·hidden inside qkv; scores is len×len; the output block (rows start..start+len,
            // columns head·head_dim..) belongs to this job alone.
            unsafe {
                // scores = scale · Q·Kᵀ
                gemm::gemm(
                    len, len, head_dim,
                    scores.as_mut_ptr(), 1, len as isize, false,
                    q, 1, rs,
                    k, rs, 1,
                    0.0, scale, false, false, false,
                    Parallelism::None,
                );
            }
            for row in scores.chunks_mut(len) {
                softmax_in_place(row);
            }
            let dst = out;
            unsafe {
                // out = P·V
                gemm::gemm(
                    len, head_dim, len,
                    dst.0.add(start * hidden + head * head_dim), 1, hidden as isize, false,
                    scores.as_ptr(), 1, len as isize,
                    v, 1, rs,
                    0.0, 1.0, false, false, false,
                    Parallelism::None,
                );
            }
        });
        Ok((CpuStorage::F32(dst), Shape::from((tokens, hidden))))
    }
}

#[inline]
fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in row.iter_mut() {
        *v = exp(*v - max);
        sum += *v;
    }
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, DType};

    fn random(shape: (usize, usize), seed: u64) -> Tensor {
        // A small LCG keeps the test deterministic without a rand dependency.
        let mut state = seed;
        let data: Vec<f32> = (0..shape.0 * shape.1)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
    }

    #[test]
    fn erf_and_exp_match_libm() {
        let mut worst_erf = 0f32;
        let mut worst_exp = 0f32;
        for i in -4000..4000 {
            let x = i as f32 / 500.0;
            worst_erf = worst_erf.max((erf(x) as f64 - libm_erf(x as f64)).abs() as f32);
            worst_exp = worst_exp.max(((exp(x) - x.exp()) / x.exp()).abs());
        }
        assert!(worst_erf < 5e-7, "erf error {worst_erf}");
        assert!(worst_exp < 3e-7, "exp error {worst_exp}");
    }

    /// erf by its Taylor series in f64, accurate for |x| < 8 when summed long enough.
    fn libm_erf(x: f64) -> f64 {
        if x.abs() > 5.0 {
            return x.signum();
        }
        let mut sum = 0.0;
        let mut term = x;
        let mut n = 0.0;
        while term.abs() > 1e-17 || n < 5.0 {
            sum += term / (2.0 * n + 1.0);
            n += 1.0;
            term *= -x * x / n;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn linear_kernel_matches_candle_matmul() {
        let x = random((7, 5), 1);
        let w = random((3, 5), 2);
        let b = random((1, 3), 3).flatten_all().unwrap();
        let r = random((7, 3), 4);
        let lin = Linear::new(w.clone(), Some(b.clone())).unwrap();
        let expected = x.matmul(&w.t().unwrap()).unwrap().broadcast_add(&b).unwrap();
        assert!(max_diff(&lin.forward(&x).unwrap(), &expected) < 1e-5);
        let expected_add = (&expected + &r).unwrap();
        assert!(max_diff(&lin.forward_add(&x, &r).unwrap(), &expected_add) < 1e-5);
    }

    #[test]
    fn layer_norm_kernel_matches_composite() {
        let x = random((6, 16), 5);
        let w = random((1, 16), 6).flatten_all().unwrap();
        let b = random((1, 16), 7).flatten_all().unwrap();
        let ln = LayerNorm::new(w.clone(), b.clone(), 1e-12).unwrap();
        let reference = candle_nn::ops::layer_norm(&x, &w, &b, 1e-12).unwrap();
        assert!(max_diff(&ln.forward(&x).unwrap(), &reference) < 1e-5);
    }

    #[test]
    fn gelu_kernel_matches_candle() {
        let x = (random((4, 300), 8) * 6.0).unwrap();
        let ours = Activation::Gelu.forward(&x).unwrap();
        assert!(max_diff(&ours, &x.gelu_erf().unwrap()) < 1e-6);
        let ours = Activation::GeluTanh.forward(&x).unwrap();
        assert!(max_diff(&ours, &x.gelu().unwrap()) < 1e-5);
    }

    #[test]
    fn attention_kernel_matches_composite_per_sequence() {
        let cu = [0usize, 5, 6, 17];
        let qkv = (random((17, 3 * 8), 9) * 3.0).unwrap();
        let att = Attention { num_heads: 2, cu_seqlens: &cu, mask: AttentionMask::Bidirectional };
        let fast = att.forward(&qkv).unwrap();
        let reference = att.forward_generic(&qkv).unwrap();
        assert_eq!(fast.dims(), &[17, 8]);
        assert!(max_diff(&fast, &reference) < 1e-5);
        assert_eq!(fast.dtype(), DType::F32);
    }
}
