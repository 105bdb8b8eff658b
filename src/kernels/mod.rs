//! The kernels: fused tensor operations the backbones are built from, at the bottom of the
//! layers (they import nothing of ours; `models` and the layers above use them, as candle keeps
//! candle-nn apart from candle-transformers and TEI its `layers/` apart from its `models/`).
//!
//! On CPU each operation is one custom kernel over all tokens of the flat batch: the bias and
//! the residual are folded into the matrix multiplication (gemm accumulates onto them), the
//! bias of the QKV projection into attention and that of the intermediate layer into GELU,
//! GELU and LayerNorm run in place as single parallel passes, and attention reads Q, K and V
//! straight out of the fused QKV rows. Candle's composite ops would make several passes and
//! copies for each of these, which is where stock candle models lose to PyTorch. On CUDA
//! (`--features cuda`) the same operations are our own kernels in [`cuda`]; on other devices
//! (and where a CUDA kernel does not apply) every operation falls back to candle's composite
//! ops, so the same model code runs there.
//!
//! One subject a file: [`dispatch`] (run-time kernel choice, storage access), [`math`]
//! (approximations, reductions), [`sgemm`] (products on weights packed in f32 or bf16, on AMX
//! tiles where the CPU has them), [`amx`] (the tile instructions and their plain-Rust model), [`linear`] (dense
//! layers with folded bias and residual), [`layer_norm`],
//! [`activation`], [`attention`], plus [`rms_norm`], [`rotary`], [`gated`], [`moe`], [`conv`] and [`int8`]; `cuda`
//! holds the GPU kernels of all of them.

#[macro_use]
mod dispatch;
mod activation;
mod amx;
mod attention;
pub mod conv;
#[cfg(feature = "cuda")]
pub mod cuda;
mod gated;
pub mod int8;
mod layer_norm;
mod linear;
pub mod lora;
mod math;
pub mod moe;
mod rms_norm;
mod rotary;
mod sgemm;

pub use activation::Activation;
pub use attention::{with_bf16_tiles, Attention, AttentionMask, DisentangledBias, PositionBias};
pub use dispatch::settle_thread_pools;
pub(crate) use dispatch::{contiguous, contiguous_mut, dims2, fused, host_f32};
pub use gated::GatedActivation;
pub use int8::Int8Weight;
pub use layer_norm::LayerNorm;
pub use linear::{with_cpu_weight_format, Bias, Linear};
pub(crate) use math::sum_squares;
pub use math::{erf, exp, softplus};
pub use rms_norm::RmsNorm;
pub use rotary::{QkNorm, RopeScaling, Rotary, RotaryTable};
pub use sgemm::{native_bf16, PackedMatrix, WeightFormat};

/// Deterministic inputs and a tensor distance for the kernels' unit tests.
#[cfg(test)]
pub(crate) mod test_util {
    use candle_core::{Device, Tensor};

    /// `len` values in [-1, 1): a small LCG keeps the tests deterministic without a rand
    /// dependency.
    pub(crate) fn random_values(len: usize, seed: u64) -> Vec<f32> {
        let mut state = seed;
        (0..len)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    pub(crate) fn random(shape: (usize, usize), seed: u64) -> Tensor {
        Tensor::from_vec(random_values(shape.0 * shape.1, seed), shape, &Device::Cpu).unwrap()
    }

    pub(crate) fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
    }
}
