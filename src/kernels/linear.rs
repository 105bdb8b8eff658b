//! Dense layers: `y = x·Wᵀ + b (+ residual)` as one kernel on the CPU, the bias and the
//! residual folded into the product's accumulation. f32 weights are packed once at load for
//! [`super::sgemm`]; int8 weights take [`super::int8`]'s kernel through the same op. Other
//! devices and dtypes keep the weight as a tensor for candle's matmul (cuBLAS on CUDA, where
//! bias and residual then take one kernel of [`super::cuda`]).

use super::dispatch::{contiguous, dims2, fused, host_f32};
use super::int8::Int8Weight;
use super::lora::{self, ModulePart};
use super::sgemm::{PackedMatrix, WeightFormat};
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use std::cell::Cell;
use std::sync::Arc;

thread_local! {
    static CPU_WEIGHT_FORMAT: Cell<WeightFormat> = const { Cell::new(WeightFormat::F32) };
}

/// Runs `load` with every [`Linear`] it creates on the CPU packed in `format`: how the loader
/// serves `--dtype bfloat16` on a CPU (f32 activations, bf16 weights and products) without each
/// architecture's constructor carrying the choice. Layers made outside (heads) stay f32.
pub fn with_cpu_weight_format<R>(format: WeightFormat, load: impl FnOnce() -> R) -> R {
    /// Puts the previous format back, also when `load` unwinds.
    struct Restore(WeightFormat);
    impl Drop for Restore {
        fn drop(&mut self) {
            CPU_WEIGHT_FORMAT.set(self.0);
        }
    }
    let _restore = Restore(CPU_WEIGHT_FORMAT.replace(format));
    load()
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

/// A dense layer `y = x·Wᵀ + b`. Checkpoints store `W` as `[out, in]`. On the CPU in f32 it is
/// packed for [`super::sgemm`] at load (in f32, or bf16 under [`with_cpu_weight_format`]), or
/// quantized to int8 ([`Linear::quantize_int8`]);
/// elsewhere it is kept transposed, `[in, out]`, for candle's matmul.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Weight,
    bias: Option<Bias>,
    /// The checkpoint modules this layer computes, where its architecture names them: what a
    /// LoRA adapter's keys are matched against.
    modules: Vec<ModulePart>,
    /// Its number among the backbone's LoRA sites, once the loader enabled adapters.
    lora_site: Option<usize>,
}

#[derive(Debug, Clone)]
enum Weight {
    /// `Wᵀ`, `[in, out]`, on a device or in a dtype the CPU kernels do not take.
    Transposed(Tensor),
    Packed(Arc<PackedMatrix>),
    Int8(Arc<Int8Weight>),
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        // Shapes come from model files: a bias that disagrees with its weight must be a load
        // error, not a kernel writing past what it checked.
        let (out, _) = weight.dims2()?;
        if let Some(b) = &bias {
            if b.elem_count() != out {
                bail!("a bias of {} values for a weight of {out} outputs ({:?})", b.elem_count(), weight.shape());
            }
        }
        let bias = bias.map(Bias::new).transpose()?;
        let weight = if fused(&weight) {
            let (n, k) = weight.dims2()?;
            let format = CPU_WEIGHT_FORMAT.get();
            Weight::Packed(Arc::new(PackedMatrix::pack_out_in(format, &weight.flatten_all()?.to_vec1::<f32>()?, n, k)))
        } else {
            Weight::Transposed(weight.t()?.contiguous()?)
        };
        Ok(Self { weight, bias, modules: Vec::new(), lora_site: None })
    }

    /// Names the checkpoint module this layer computes (its weight's prefix), for LoRA.
    pub fn named(self, name: &str) -> Self {
        let len = self.out_features();
        self.with_modules(vec![ModulePart { name: name.to_string(), offset: 0, len }])
    }

    /// Names the modules a fused layer computes, in output order with their widths (a fused
    /// Q/K/V layer: `query`, `key`, `value`), for LoRA.
    pub fn named_parts(self, parts: &[(String, usize)]) -> Self {
        let mut offset = 0;
        let modules = parts
            .iter()
            .map(|(name, len)| {
                offset += len;
                ModulePart { name: name.clone(), offset: offset - len, len: *len }
            })
            .collect();
        self.with_modules(modules)
    }

    fn with_modules(mut self, modules: Vec<ModulePart>) -> Self {
        self.modules = modules;
        self
    }

    pub fn modules(&self) -> &[ModulePart] {
        &self.modules
    }

    /// Makes this layer LoRA site `site`: passes with adapters ([`lora::with_segments`]) add
    /// theirs to its output.
    pub fn set_lora_site(&mut self, site: usize) {
        self.lora_site = Some(site);
    }

    /// Test hook: the same layer on candle's products (as on a GPU), on the CPU.
    #[cfg(test)]
    pub(super) fn on_candle(mut self) -> Result<Self> {
        if let Weight::Packed(w) = &self.weight {
            let t = Tensor::from_vec(w.unpack(), (w.in_features(), w.out_features()), &candle_core::Device::Cpu)?;
            self.weight = Weight::Transposed(t);
        }
        Ok(self)
    }

    pub fn out_features(&self) -> usize {
        match &self.weight {
            Weight::Transposed(w) => w.dims()[1],
            Weight::Packed(w) => w.out_features(),
            Weight::Int8(w) => w.out_features(),
        }
    }

    pub fn in_features(&self) -> usize {
        match &self.weight {
            Weight::Transposed(w) => w.dims()[0],
            Weight::Packed(w) => w.in_features(),
            Weight::Int8(w) => w.in_features(),
        }
    }

    /// Whether the weight is a tensor for candle's matmul (on a GPU, or in half precision),
    /// rather than packed for the CPU kernels.
    pub fn on_device(&self) -> bool {
        matches!(self.weight, Weight::Transposed(_))
    }

    /// Where its products run, and in which dtype (packed and int8 weights: the CPU, f32).
    pub fn device_and_dtype(&self) -> (candle_core::Device, candle_core::DType) {
        match &self.weight {
            Weight::Transposed(w) => (w.device().clone(), w.dtype()),
            Weight::Packed(_) | Weight::Int8(_) => (candle_core::Device::Cpu, candle_core::DType::F32),
        }
    }

    pub fn bias(&self) -> Option<&Bias> {
        self.bias.as_ref()
    }

    /// Replaces the packed weight by its int8 quantization (CPU, f32 activations only). The
    /// packed copy is dropped: quantized layers keep a quarter of f32's memory.
    pub fn quantize_int8(&mut self) -> Result<()> {
        match &self.weight {
            Weight::Packed(w) => {
                let q = Int8Weight::quantize(&w.unpack(), w.in_features(), w.out_features());
                self.weight = Weight::Int8(Arc::new(q));
                Ok(())
            }
            Weight::Transposed(_) => bail!("int8 quantization needs f32 weights on the CPU"),
            Weight::Int8(_) => Ok(()),
        }
    }

    /// `x·Wᵀ (+ b) (+ residual)`, one kernel on CPU f32, candle's ops elsewhere.
    fn apply(&self, x: &Tensor, bias: Option<&Bias>, residual: Option<&Tensor>) -> Result<Tensor> {
        let kernel = match &self.weight {
            Weight::Transposed(w) => {
                let mut y = x.matmul(w)?;
                if let Some(site) = self.lora_site {
                    if let Some(d) = lora::delta(site, x, w.dims()[1])? {
                        y = (y + d)?;
                    }
                }
                #[cfg(feature = "cuda")]
                if super::cuda::takes(&y) && (bias.is_some() || residual.is_some()) {
                    return super::cuda::bias_residual(&y, bias.map(|b| &b.tensor), residual);
                }
                if let Some(b) = bias {
                    y = y.broadcast_add(&b.tensor)?;
                }
                return match residual {
                    Some(r) => y.add(r),
                    None => Ok(y),
                };
            }
            Weight::Packed(w) => Kernel::Packed(w),
            Weight::Int8(w) => Kernel::Int8(w),
        };
        if !fused(x) {
            // A host-f32 head under a model run in another dtype: compute in f32, hand back the
            // caller's dtype.
            let as_f32 = |t: &Tensor| t.to_device(&candle_core::Device::Cpu)?.to_dtype(candle_core::DType::F32);
            let residual = residual.map(as_f32).transpose()?;
            let y = self.apply(&as_f32(x)?, bias, residual.as_ref())?;
            return y.to_dtype(x.dtype())?.to_device(x.device());
        }
        let op = LinearOp { bias: bias.map(|b| b.host.as_slice()), kernel, lora_site: self.lora_site };
        match residual {
            None => x.apply_op1_no_bwd(&op),
            Some(r) => x.apply_op2_no_bwd(r, &op),
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

/// The weight a CPU product runs on.
#[derive(Clone, Copy)]
enum Kernel<'a> {
    Packed(&'a PackedMatrix),
    Int8(&'a Int8Weight),
}

/// The CPU kernel of [`Linear`]: `x`, and optionally the residual as second operand.
struct LinearOp<'a> {
    bias: Option<&'a [f32]>,
    kernel: Kernel<'a>,
    lora_site: Option<usize>,
}

impl LinearOp<'_> {
    fn run(&self, x: &[f32], x_l: &Layout, residual: Option<&[f32]>) -> Result<(CpuStorage, Shape)> {
        let (m, k) = dims2(x_l)?;
        let (k2, n) = match self.kernel {
            Kernel::Packed(w) => (w.in_features(), w.out_features()),
            Kernel::Int8(q) => (q.in_features(), q.out_features()),
        };
        if k != k2 {
            bail!("linear: input has {k} features, weight expects {k2}");
        }
        // Pre-fill the output with residual + bias (or the bias alone), then let the kernel
        // accumulate.
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
            match self.kernel {
                Kernel::Packed(w) => w.matmul(dst.as_mut_ptr(), x, m, read_dst),
                Kernel::Int8(q) => q.matmul(dst.as_mut_ptr(), x, m, read_dst),
            }
            dst.set_len(m * n);
        }
        if let Some(site) = self.lora_site {
            lora::add_on_cpu(site, x, &mut dst, m, k, n)?;
        }
        Ok((CpuStorage::F32(dst), Shape::from((m, n))))
    }
}

/// `x`.
impl CustomOp1 for LinearOp<'_> {
    fn name(&self) -> &'static str {
        "linear"
    }
    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout) -> Result<(CpuStorage, Shape)> {
        self.run(contiguous(s1, l1)?, l1, None)
    }
}

/// `x`, residual.
impl CustomOp2 for LinearOp<'_> {
    fn name(&self) -> &'static str {
        "linear_add"
    }
    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        self.run(contiguous(s1, l1)?, l1, Some(contiguous(s2, l2)?))
    }
}

#[cfg(test)]
mod bias_shape_tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn a_bias_that_disagrees_with_the_weight_is_an_error() {
        let weight = Tensor::zeros((4, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
        let err = Linear::new(weight.clone(), Some(Tensor::zeros(5, candle_core::DType::F32, &Device::Cpu).unwrap())).unwrap_err();
        assert!(err.to_string().contains("bias of 5 values for a weight of 4 outputs"), "{err}");
        assert!(Linear::new(weight, Some(Tensor::zeros(4, candle_core::DType::F32, &Device::Cpu).unwrap())).is_ok());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_util::{max_diff, random};

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
