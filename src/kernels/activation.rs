//! The activations transformer configs name in `hidden_act`, applied in place with an optional
//! bias folded in (the intermediate layer's bias costs no extra pass).

use super::dispatch::{contiguous_mut, dims2, fused};
use super::linear::Bias;
use super::math::{erf, exp, tanh};
use candle_core::{bail, CpuStorage, InplaceOp1, Layout, Result, Tensor};
use rayon::prelude::*;

/// The activation functions that transformer configs name in `hidden_act`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// Exact GELU, `x·Φ(x)` with the error function (`"gelu"`).
    Gelu,
    /// The tanh approximation of GELU (`"gelu_new"`, `"gelu_pytorch_tanh"`).
    GeluTanh,
    Relu,
    Silu,
    /// CLIP's `x·σ(1.702·x)` (`"quick_gelu"`).
    QuickGelu,
}

impl Activation {
    /// How the CUDA kernels number this activation.
    #[cfg(feature = "cuda")]
    pub(crate) fn kernel(self) -> super::cuda::KernelActivation {
        use super::cuda::KernelActivation;
        match self {
            Activation::Gelu => KernelActivation::Gelu,
            Activation::GeluTanh => KernelActivation::GeluTanh,
            Activation::Relu => KernelActivation::Relu,
            Activation::Silu => KernelActivation::Silu,
            Activation::QuickGelu => KernelActivation::QuickGelu,
        }
    }

    pub fn from_config(name: &str) -> Option<Self> {
        match name {
            "gelu" => Some(Self::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Some(Self::GeluTanh),
            "relu" => Some(Self::Relu),
            "silu" | "swish" => Some(Self::Silu),
            "quick_gelu" => Some(Self::QuickGelu),
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
        #[cfg(feature = "cuda")]
        if super::cuda::takes(&x) {
            return super::cuda::bias_activation(&x, bias.map(|b| &b.tensor), self.kernel());
        }
        let x = match bias {
            Some(b) => x.broadcast_add(&b.tensor)?,
            None => x,
        };
        Self::composite(&x, self)
    }

    /// `act(x)` with candle's ops (the fallback, and the CUDA kernels' reference).
    pub(crate) fn composite(x: &Tensor, act: Self) -> Result<Tensor> {
        match act {
            Self::Gelu => x.gelu_erf(),
            Self::GeluTanh => x.gelu(),
            Self::Relu => x.relu(),
            Self::Silu => x.silu(),
            Self::QuickGelu => x * candle_nn::ops::sigmoid(&(x * 1.702)?)?,
        }
    }

    #[inline(always)]
    pub(crate) fn apply(self, x: f32) -> f32 {
        match self {
            Self::Gelu => 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2)),
            Self::GeluTanh => {
                let inner = 0.797_884_6 * (x + 0.044_715 * x * x * x);
                0.5 * x * (1.0 + tanh(inner))
            }
            Self::Relu => x.max(0.0),
            Self::Silu => x / (1.0 + exp(-x)),
            Self::QuickGelu => x / (1.0 + exp(-1.702 * x)),
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
            Activation::QuickGelu => each!(Activation::QuickGelu),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_util::{max_diff, random};

    #[test]
    fn gelu_kernel_matches_candle() {
        let x = (random((4, 300), 8) * 6.0).unwrap();
        let ours = Activation::Gelu.forward(&x).unwrap();
        assert!(max_diff(&ours, &x.gelu_erf().unwrap()) < 1e-6);
        let ours = Activation::GeluTanh.forward(&x).unwrap();
        assert!(max_diff(&ours, &x.gelu().unwrap()) < 1e-5);
        let ours = Activation::QuickGelu.forward(&x).unwrap();
        assert!(max_diff(&ours, &Activation::composite(&x, Activation::QuickGelu).unwrap()) < 1e-5);
        let bias = Bias::new(random((1, 300), 11).flatten_all().unwrap()).unwrap();
        let ours = Activation::Gelu.forward_biased(x.copy().unwrap(), Some(&bias)).unwrap();
        assert!(max_diff(&ours, &x.broadcast_add(&bias.tensor).unwrap().gelu_erf().unwrap()) < 1e-6);
    }
}
