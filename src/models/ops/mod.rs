//! Fused tensor operations shared by the backbones.
//!
//! On CPU each operation is one custom kernel over all tokens of the flat batch: the bias and
//! the residual are folded into the matrix multiplication (gemm accumulates onto them), the
//! bias of the QKV projection into attention and that of the intermediate layer into GELU,
//! GELU and LayerNorm run in place as single parallel passes, and attention reads Q, K and V
//! straight out of the fused QKV rows. Candle's composite ops would make several passes and
//! copies for each of these, which is where stock candle models lose to PyTorch. On other
//! devices every operation falls back to candle's composite ops, so the same model code runs
//! there.

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, InplaceOp1, Layout, Result, Shape, Tensor};
use gemm::Parallelism;
use rayon::prelude::*;

/// Below this many multiply-adds a gemm call runs on the calling thread: spreading a tiny
/// product over the pool costs more than it saves.
const PARALLEL_GEMM_MIN_WORK: usize = 1 << 18;

/// Below this many rows a product is split by output columns rather than by rows.
const SPLIT_ROWS_MIN: usize = 256;

/// Defines `fn $name` twice: as written, and compiled with AVX2+FMA for CPUs that have them
/// (chosen at run time, so one binary stays portable). The kernels are plain loops; this is
/// what lets LLVM turn them into 8-wide code, with `floor` as one instruction. Inside the body,
/// the const `FMA` says whether fused multiply-add is native (use [`fma`]).
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])* $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn portable<const FMA: bool>($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    portable::<true>($($arg),*)
                }
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    // SAFETY: the running CPU has the features `avx2` was compiled for.
                    return unsafe { avx2($($arg),*) };
                }
            }
            portable::<{ cfg!(target_arch = "aarch64") }>($($arg),*)
        }
    };
}

mod gated;
pub mod int8;
mod rms_norm;
mod rotary;

pub use gated::GatedActivation;
pub use int8::Int8Weight;
pub use rms_norm::RmsNorm;
pub use rotary::{QkNorm, Rotary, RotaryTable};

/// `a·b + c`, fused when the kernel was compiled with native FMA (a software fused
/// multiply-add would be far slower than the two plain operations).
#[inline(always)]
fn fma<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Whether `x` takes the fused CPU kernels (f32 on the CPU); anything else takes candle's
/// composite ops (GPUs, and float16/bfloat16 on the CPU).
pub(crate) fn fused(x: &Tensor) -> bool {
    x.device().is_cpu() && x.dtype() == candle_core::DType::F32
}

/// A small parameter vector as host f32, whatever the checkpoint's dtype.
pub(crate) fn host_f32(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(candle_core::DType::F32)?.flatten_all()?.to_vec1()
}

fn contiguous<'a>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
    let data = storage.as_slice::<f32>()?;
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => bail!("fused op expects a contiguous f32 tensor"),
    }
}

fn contiguous_mut<'a>(storage: &'a mut CpuStorage, layout: &Layout) -> Result<&'a mut [f32]> {
    let CpuStorage::F32(data) = storage else { bail!("fused op expects an f32 tensor") };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&mut data[start..end]),
        None => bail!("fused op expects a contiguous f32 tensor"),
    }
}

fn dims2(layout: &Layout) -> Result<(usize, usize)> {
    layout.shape().dims2()
}

/// Raw output pointers that rayon tasks may share because each writes a disjoint region.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

#[derive(Clone, Copy)]
struct SharedConst(*const f32);
unsafe impl Send for SharedConst {}
unsafe impl Sync for SharedConst {}

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

    /// `act(x)` (a new tensor).
    pub fn forward(self, x: &Tensor) -> Result<Tensor> {
        self.forward_biased(x.copy()?, None)
    }

    /// `act(x + bias)`, reusing `x`'s buffer on CPU (callers pass a tensor they own alone).
    pub fn forward_biased(self, x: Tensor, bias: Option<&Bias>) -> Result<Tensor> {
        if fused(&x) {
            x.inplace_op1(&BiasActivation { activation: self, bias: bias.map(|b| b.host.as_slice()) })?;
            return Ok(x);
        }
        let x = match bias {
            Some(b) => x.broadcast_add(&b.tensor)?,
            None => x,
        };
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

struct BiasActivation<'a> {
    activation: Activation,
    bias: Option<&'a [f32]>,
}

impl InplaceOp1 for BiasActivation<'_> {
    fn name(&self) -> &'static str {
        "bias_activation"
    }
    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        let (_, n) = dims2(layout)?;
        if let Some(b) = self.bias {
            if b.len() != n {
                bail!("activation: bias has {} elements for rows of {n}", b.len());
            }
        }
        let x = contiguous_mut(storage, layout)?;
        let rows_per_task = (4096 / n.max(1)).max(1);
        let act = self.activation;
        x.par_chunks_mut(n * rows_per_task).for_each(|rows| activation_rows(act, rows, self.bias, n));
        Ok(())
    }
}

multiversion! {
    fn activation_rows(act: Activation, x: &mut [f32], bias: Option<&[f32]>, n: usize) {
        if let Some(b) = bias {
            x.chunks_exact_mut(n).for_each(|row| row.iter_mut().zip(b).for_each(|(v, b)| *v += b));
        }
        // One loop per variant, so that each inner loop is branch-free and vectorizes.
        macro_rules! each {
            ($variant:expr) => {
                x.iter_mut().for_each(|v| *v = $variant.apply(*v))
            };
        }
        match act {
            Activation::Gelu => each!(Activation::Gelu),
            Activation::GeluTanh => each!(Activation::GeluTanh),
            Activation::Relu => each!(Activation::Relu),
            Activation::Silu => each!(Activation::Silu),
        }
    }
}

/// `e^x` in f32 without branches (so loops over it vectorize): range reduction to
/// `x = k·ln2 + r`, a degree-6 polynomial for `e^r`, and the exponent bits for `2^k`.
/// Relative error below 3e-7 over the clamped range.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let k = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let r = x - k * 0.693_145_75 - k * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0 + r * (0.5 + r * (0.166_666_67 + r * (0.041_666_668 + r * (0.008_333_334 + r * 0.001_388_888_9)))));
    // 2^k from the exponent bits. k + 127 is an integer in 1..=254 after the clamp; adding 2^23
    // puts it in the low mantissa bits, so plain bit operations build 2^k. (`k as i32` would
    // be a saturating, NaN-checking conversion that LLVM does one lane at a time: measured as
    // most of the time of GELU.)
    let biased = (k + 127.0 + 8_388_608.0).to_bits() & 0xff;
    p * f32::from_bits(biased << 23)
}

/// The error function, Abramowitz & Stegun 7.1.26 (absolute error below 5e-7 in f32).
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
    /// Token `i` sees tokens `0..=i` of its sequence (decoders).
    Causal,
    /// Token `i` sees tokens `j` with `|i − j| ≤ w` (local attention).
    Window(usize),
}

impl AttentionMask {
    /// The keys `lo..hi` query `i` of a `len`-token sequence attends to.
    #[inline(always)]
    fn keys(self, i: usize, len: usize) -> (usize, usize) {
        match self {
            Self::Bidirectional => (0, len),
            Self::Causal => (0, i + 1),
            Self::Window(w) => (i.saturating_sub(w), (i + w + 1).min(len)),
        }
    }
}

/// Multi-head (and grouped-query) attention over a flat batch.
///
/// `qkv` is `[tokens, (heads + 2·kv_heads)·head_dim]`: the query heads, then the key heads, then
/// the value heads, side by side; query head `h` uses key/value head `h / (heads / kv_heads)`.
/// `bias` is their bias (added here rather than in a separate pass over `qkv`); `cu_seqlens`
/// holds the cumulative sequence lengths (`[0, l0, l0+l1, …]`). Tokens only attend within their
/// own sequence, so no padding or mask tensor exists at all. Output: `[tokens, heads·head_dim]`.
pub struct Attention<'a> {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub cu_seqlens: &'a [usize],
    pub mask: AttentionMask,
    /// Added to the scaled scores by relative distance (MPNet).
    pub position_bias: Option<&'a PositionBias>,
}

/// A learned bias per head and relative distance `j − i`, for one batch: head `h`'s values are
/// `values[h·(2·max_len − 1)..]`, distance `d` at index `max_len − 1 + d`.
#[derive(Debug, Clone)]
pub struct PositionBias {
    pub values: Vec<f32>,
    pub max_len: usize,
}

impl PositionBias {
    fn head(&self, head: usize) -> &[f32] {
        let span = 2 * self.max_len - 1;
        &self.values[head * span..(head + 1) * span]
    }
}

struct AttentionOp<'a> {
    attention: &'a Attention<'a>,
    bias: Option<&'a [f32]>,
}

/// Where one head's query, key and value columns sit in a fused QKV row, and its output columns.
#[derive(Clone, Copy)]
struct HeadColumns {
    /// Width of a QKV row.
    width: usize,
    q: usize,
    k: usize,
    v: usize,
    head_dim: usize,
    /// Width of an output row; this head writes columns `q..q + head_dim` of it.
    out_width: usize,
}

impl<'a> Attention<'a> {
    fn q_width(&self) -> usize {
        self.num_heads * self.head_dim
    }

    fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    fn columns(&self, head: usize) -> HeadColumns {
        let (qw, kvw) = (self.q_width(), self.kv_width());
        let kv_head = head / (self.num_heads / self.num_kv_heads);
        HeadColumns {
            width: qw + 2 * kvw,
            q: head * self.head_dim,
            k: qw + kv_head * self.head_dim,
            v: qw + kvw + kv_head * self.head_dim,
            head_dim: self.head_dim,
            out_width: qw,
        }
    }

    pub fn forward(&self, qkv: &Tensor, bias: Option<&Bias>) -> Result<Tensor> {
        if fused(qkv) {
            return qkv.apply_op1_no_bwd(&AttentionOp { attention: self, bias: bias.map(|b| b.host.as_slice()) });
        }
        match bias {
            Some(b) => self.forward_generic(&qkv.broadcast_add(&b.tensor)?),
            None => self.forward_generic(qkv),
        }
    }

    /// Composite candle ops, one sequence at a time: the path for GPUs and the reference the
    /// CPU kernel is tested against.
    pub fn forward_generic(&self, qkv: &Tensor) -> Result<Tensor> {
        let (qw, kvw, hd) = (self.q_width(), self.kv_width(), self.head_dim);
        let group = self.num_heads / self.num_kv_heads;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut outputs = Vec::with_capacity(self.cu_seqlens.len().saturating_sub(1));
        for w in self.cu_seqlens.windows(2) {
            let (start, len) = (w[0], w[1] - w[0]);
            let seq = qkv.narrow(0, start, len)?;
            let heads = |offset: usize, n: usize| -> Result<Tensor> {
                seq.narrow(1, offset, n * hd)?.reshape((len, n, hd))?.transpose(0, 1)?.contiguous()
            };
            let q = heads(0, self.num_heads)?;
            // Repeat each key/value head for the query heads of its group.
            let repeat = |t: Tensor| -> Result<Tensor> {
                if group == 1 {
                    return Ok(t);
                }
                t.unsqueeze(1)?.repeat((1, group, 1, 1))?.reshape((self.num_heads, len, hd))
            };
            let k = repeat(heads(qw, self.num_kv_heads)?)?;
            let v = repeat(heads(qw + kvw, self.num_kv_heads)?)?;
            // Scores and softmax in f32 (as transformers does for half-precision models).
            let mut scores = (q.matmul(&k.t()?)?.to_dtype(candle_core::DType::F32)? * scale)?;
            if let Some(bias) = self.position_bias {
                let center = bias.max_len - 1;
                let values: Vec<f32> = (0..self.num_heads * len * len)
                    .map(|x| {
                        let (h, i, j) = (x / (len * len), x / len % len, x % len);
                        bias.head(h)[center + j - i]
                    })
                    .collect();
                scores = (scores + Tensor::from_vec(values, (self.num_heads, len, len), qkv.device())?)?;
            }
            if self.mask != AttentionMask::Bidirectional {
                let mask: Vec<f32> = (0..len * len)
                    .map(|x| {
                        let (i, j) = (x / len, x % len);
                        let (lo, hi) = self.mask.keys(i, len);
                        if (lo..hi).contains(&j) { 0.0 } else { f32::NEG_INFINITY }
                    })
                    .collect();
                scores = scores.broadcast_add(&Tensor::from_vec(mask, (len, len), qkv.device())?)?;
            }
            let probs = candle_nn::ops::softmax_last_dim(&scores)?.to_dtype(v.dtype())?;
            outputs.push(probs.matmul(&v)?.transpose(0, 1)?.reshape((len, qw))?);
        }
        Tensor::cat(&outputs, 0)
    }
}

impl CustomOp1 for AttentionOp<'_> {
    fn name(&self) -> &'static str {
        "flat_attention"
    }
    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let this = self.attention;
        let qkv = contiguous(storage, layout)?;
        let (tokens, width) = dims2(layout)?;
        if this.num_kv_heads == 0 || this.num_heads % this.num_kv_heads != 0 {
            bail!("attention: {} heads do not group over {} key/value heads", this.num_heads, this.num_kv_heads);
        }
        if width != this.q_width() + 2 * this.kv_width() {
            bail!("attention: {width} columns do not split into q, k, v of {}+2×{} heads of {}", this.num_heads, this.num_kv_heads, this.head_dim);
        }
        if this.cu_seqlens.last().copied() != Some(tokens) {
            bail!("attention: cu_seqlens does not cover the {tokens} tokens");
        }
        let heads = this.num_heads;
        let out_width = this.q_width();
        let scale = 1.0 / (this.head_dim as f32).sqrt();
        let zeros;
        let bias = match self.bias {
            Some(b) if b.len() == width => b,
            Some(b) => bail!("attention: bias has {} elements for {width} columns", b.len()),
            None => {
                zeros = vec![0f32; width];
                &zeros
            }
        };
        // Every head of every sequence writes its columns of its rows, so the output is not
        // zeroed first; its length is set once they all have.
        let mut dst: Vec<f32> = Vec::with_capacity(tokens * out_width);
        let out = SharedMut(dst.as_mut_ptr());
        let num_seqs = this.cu_seqlens.len() - 1;
        if let Some(bias) = this.position_bias {
            let longest = this.cu_seqlens.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
            if bias.max_len < longest || bias.values.len() != heads * (2 * bias.max_len - 1) {
                bail!("attention: position bias does not cover sequences of {longest} tokens");
            }
        }
        (0..num_seqs * heads).into_par_iter().for_each_init(Vec::new, |scratch: &mut Vec<f32>, job| {
            let (seq, head) = (job / heads, job % heads);
            let start = this.cu_seqlens[seq];
            let len = this.cu_seqlens[seq + 1] - start;
            if len == 0 {
                return;
            }
            let rows = &qkv[start * width..(start + len) * width];
            let dst = out;
            // SAFETY: the pointer addresses row `start` of the tokens×out_width output; this job
            // alone writes its rows' columns of this head.
            let out_rows = unsafe { dst.0.add(start * out_width) };
            let relative = this.position_bias.map(|b| (b.head(head), b.max_len - 1));
            attention_head(rows, bias, out_rows, this.columns(head), this.mask, relative, scale, scratch);
        });
        // SAFETY: the cu_seqlens checked above cover all tokens, so the jobs wrote every row.
        unsafe { dst.set_len(tokens * out_width) };
        Ok((CpuStorage::F32(dst), Shape::from((tokens, out_width))))
    }
}

/// Query rows and key columns of one score tile; the tile's 4×16 accumulators (and the 4×16
/// output tile of P·V) stay in eight AVX registers.
const TILE_Q: usize = 4;
const TILE_K: usize = 16;

multiversion! {
    /// One head of one sequence. `rows` are the sequence's fused QKV rows; `cols` says where
    /// the head's columns are; the output rows start at `out`.
    ///
    /// Q (biased, pre-scaled) and Kᵀ (biased) are packed into zero-padded tiles, scores are
    /// computed tile by tile, softmaxed over the keys the mask allows (the others get weight
    /// 0), and multiplied into V straight from the QKV rows.
    fn attention_head(
        rows: &[f32],
        bias: &[f32],
        out: *mut f32,
        cols: HeadColumns,
        mask: AttentionMask,
        relative: Option<(&[f32], usize)>,
        scale: f32,
        scratch: &mut Vec<f32>,
    ) {
        let HeadColumns { width, q: qc, k: kc, v: vc, head_dim, out_width } = cols;
        let len = rows.len() / width;
        let lq = len.div_ceil(TILE_Q) * TILE_Q;
        let lk = len.div_ceil(TILE_K) * TILE_K;
        scratch.clear();
        scratch.resize(lq * head_dim + head_dim * lk + lq * lk, 0.0);
        let (q, rest) = scratch.split_at_mut(lq * head_dim);
        let (kt, scores) = rest.split_at_mut(head_dim * lk);
        let (q_bias, k_bias, v_bias) = (&bias[qc..qc + head_dim], &bias[kc..kc + head_dim], &bias[vc..vc + head_dim]);
        for i in 0..len {
            let src = &rows[i * width + qc..i * width + qc + head_dim];
            let dst = &mut q[i * head_dim..(i + 1) * head_dim];
            dst.iter_mut().zip(src).zip(q_bias).for_each(|((d, s), b)| *d = (s + b) * scale);
            let k = &rows[i * width + kc..i * width + kc + head_dim];
            for (d, (&value, b)) in k.iter().zip(k_bias).enumerate() {
                kt[d * lk + i] = value + b;
            }
        }
        // scores = (scale·Q)·Kᵀ, tile by tile.
        for i0 in (0..lq).step_by(TILE_Q) {
            for j0 in (0..lk).step_by(TILE_K) {
                let mut acc = [[0f32; TILE_K]; TILE_Q];
                for d in 0..head_dim {
                    let kv: &[f32; TILE_K] = kt[d * lk + j0..d * lk + j0 + TILE_K].try_into().unwrap();
                    for (r, acc_row) in acc.iter_mut().enumerate() {
                        let qv = q[(i0 + r) * head_dim + d];
                        for c in 0..TILE_K {
                            acc_row[c] = fma::<FMA>(qv, kv[c], acc_row[c]);
                        }
                    }
                }
                for (r, acc_row) in acc.iter().enumerate() {
                    scores[(i0 + r) * lk + j0..(i0 + r) * lk + j0 + TILE_K].copy_from_slice(acc_row);
                }
            }
        }
        for i in 0..len {
            let row = &mut scores[i * lk..i * lk + len];
            if let Some((bias, center)) = relative {
                // Distance j − i of key j is at center + j − i.
                row.iter_mut().zip(&bias[center - i..center - i + len]).for_each(|(s, b)| *s += b);
            }
            let (lo, hi) = mask.keys(i, len);
            softmax_in_place(&mut row[lo..hi]);
            row[..lo].fill(0.0);
            row[hi..].fill(0.0);
        }
        // out = P·V + v_bias (each row of P sums to 1, so V's bias passes through unchanged),
        // 4 queries × 16 head dims at a time (head_dim is a multiple of 16 for every model we
        // serve; the remainder loop below keeps other sizes correct).
        let dims_tiled = head_dim / TILE_K * TILE_K;
        for i0 in (0..lq).step_by(TILE_Q) {
            for d0 in (0..dims_tiled).step_by(TILE_K) {
                let vb: &[f32; TILE_K] = v_bias[d0..d0 + TILE_K].try_into().unwrap();
                let mut acc = [*vb; TILE_Q];
                for j in 0..len {
                    let base = j * width + vc + d0;
                    let vv: &[f32; TILE_K] = rows[base..base + TILE_K].try_into().unwrap();
                    for (r, acc_row) in acc.iter_mut().enumerate() {
                        let p = scores[(i0 + r) * lk + j];
                        for c in 0..TILE_K {
                            acc_row[c] = fma::<FMA>(p, vv[c], acc_row[c]);
                        }
                    }
                }
                for (r, acc_row) in acc.iter().enumerate().take(len.saturating_sub(i0)) {
                    // SAFETY: row i0+r < len, columns qc+d0.. of this head, inside the output.
                    unsafe { std::ptr::copy_nonoverlapping(acc_row.as_ptr(), out.add((i0 + r) * out_width + qc + d0), TILE_K) };
                }
            }
            for i in i0..(i0 + TILE_Q).min(len) {
                for d in dims_tiled..head_dim {
                    let sum = v_bias[d] + (0..len).map(|j| scores[i * lk + j] * rows[j * width + vc + d]).sum::<f32>();
                    // SAFETY: as above.
                    unsafe { *out.add(i * out_width + qc + d) = sum };
                }
            }
        }
    }
}

#[inline(always)]
fn softmax_in_place(row: &mut [f32]) {
    let max = max_lanes(row);
    // Separate passes: a loop that both exponentiates and sums would not vectorize.
    row.iter_mut().for_each(|v| *v = exp(*v - max));
    let inv = 1.0 / sum_lanes(row);
    row.iter_mut().for_each(|v| *v *= inv);
}

/// Sum with eight independent accumulators, so the loop vectorizes (a single running sum is a
/// serial chain that LLVM may not reorder).
#[inline(always)]
fn sum_lanes(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for l in 0..8 {
            acc[l] += c[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Σ x² with eight independent accumulators (see [`sum_lanes`]).
#[inline(always)]
fn sum_squares<const FMA: bool>(x: &[f32]) -> f32 {
    let mut squares = [0f32; 8];
    for c in x.chunks_exact(8) {
        for l in 0..8 {
            squares[l] = fma::<FMA>(c[l], c[l], squares[l]);
        }
    }
    squares.iter().sum::<f32>() + x.chunks_exact(8).remainder().iter().map(|v| v * v).sum::<f32>()
}

#[inline(always)]
fn max_lanes(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder().iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for c in chunks {
        for l in 0..8 {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    acc.iter().copied().fold(tail, f32::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

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
            worst_erf = worst_erf.max((erf(x) as f64 - reference_erf(x as f64)).abs() as f32);
            worst_exp = worst_exp.max(((exp(x) - x.exp()) / x.exp()).abs());
        }
        assert!(worst_erf < 5e-7, "erf error {worst_erf}");
        assert!(worst_exp < 3e-7, "exp error {worst_exp}");
    }

    /// erf by its Taylor series in f64, accurate for |x| ≤ 5 when summed long enough.
    fn reference_erf(x: f64) -> f64 {
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

    #[test]
    fn layer_norm_kernel_matches_composite() {
        let x = random((6, 20), 5);
        let w = random((1, 20), 6).flatten_all().unwrap();
        let b = random((1, 20), 7).flatten_all().unwrap();
        let ln = LayerNorm::new(w.clone(), b.clone(), 1e-12).unwrap();
        let reference = candle_nn::ops::layer_norm(&x, &w, &b, 1e-12).unwrap();
        assert!(max_diff(&ln.forward(x.copy().unwrap()).unwrap(), &reference) < 1e-5);
    }

    #[test]
    fn gelu_kernel_matches_candle() {
        let x = (random((4, 300), 8) * 6.0).unwrap();
        let ours = Activation::Gelu.forward(&x).unwrap();
        assert!(max_diff(&ours, &x.gelu_erf().unwrap()) < 1e-6);
        let ours = Activation::GeluTanh.forward(&x).unwrap();
        assert!(max_diff(&ours, &x.gelu().unwrap()) < 1e-5);
        let bias = Bias::new(random((1, 300), 11).flatten_all().unwrap()).unwrap();
        let ours = Activation::Gelu.forward_biased(x.copy().unwrap(), Some(&bias)).unwrap();
        assert!(max_diff(&ours, &x.broadcast_add(&bias.tensor).unwrap().gelu_erf().unwrap()) < 1e-6);
    }

    #[test]
    fn attention_kernel_matches_composite_per_sequence() {
        let cu = [0usize, 5, 6, 17];
        // head_dim 4 exercises the remainder path, 32 the register tiles; with and without bias.
        for (hidden, heads) in [(8, 2), (64, 2)] {
            let qkv = (random((17, 3 * hidden), 9) * 3.0).unwrap();
            let bias = Bias::new((random((1, 3 * hidden), 10).flatten_all().unwrap() * 2.0).unwrap()).unwrap();
            let att = Attention { num_heads: heads, num_kv_heads: heads, head_dim: hidden / heads, cu_seqlens: &cu, mask: AttentionMask::Bidirectional, position_bias: None };
            let fast = att.forward(&qkv, None).unwrap();
            assert_eq!(fast.dims(), &[17, hidden]);
            assert_eq!(fast.dtype(), DType::F32);
            assert!(max_diff(&fast, &att.forward_generic(&qkv).unwrap()) < 1e-5);
            let biased = att.forward(&qkv, Some(&bias)).unwrap();
            let reference = att.forward_generic(&qkv.broadcast_add(&bias.tensor).unwrap()).unwrap();
            assert!(max_diff(&biased, &reference) < 1e-5, "hidden {hidden}");
        }
    }

    #[test]
    fn grouped_query_and_masked_attention_match_composite() {
        let cu = [0usize, 5, 6, 25];
        // 4 query heads over 2 key/value heads of 16 dims: q 64 + k 32 + v 32 columns.
        let qkv = (random((25, 128), 12) * 3.0).unwrap();
        let bias = Bias::new(random((1, 128), 13).flatten_all().unwrap()).unwrap();
        for mask in [AttentionMask::Bidirectional, AttentionMask::Causal, AttentionMask::Window(2)] {
            let att = Attention { num_heads: 4, num_kv_heads: 2, head_dim: 16, cu_seqlens: &cu, mask, position_bias: None };
            let fast = att.forward(&qkv, Some(&bias)).unwrap();
            assert_eq!(fast.dims(), &[25, 64]);
            let reference = att.forward_generic(&qkv.broadcast_add(&bias.tensor).unwrap()).unwrap();
            assert!(max_diff(&fast, &reference) < 1e-5, "{mask:?}");
        }
        // A relative position bias (MPNet), longer than the longest sequence.
        let max_len = 20;
        let values = random((2, 2 * max_len - 1), 14).flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let position_bias = PositionBias { values, max_len };
        let qkv = random((25, 96), 15);
        let att = Attention { num_heads: 2, num_kv_heads: 2, head_dim: 16, cu_seqlens: &cu, mask: AttentionMask::Bidirectional, position_bias: Some(&position_bias) };
        assert!(max_diff(&att.forward(&qkv, None).unwrap(), &att.forward_generic(&qkv).unwrap()) < 1e-5, "position bias");
    }
}
