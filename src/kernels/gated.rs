//! Gated linear units (SwiGLU, GeGLU): the fused gate/up projection's output `[tokens, 2·I]`
//! becomes `act(first half) · second half`, `[tokens, I]`, in one pass.

use super::{contiguous, dims2, fused, Activation};
use candle_core::{bail, CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

#[derive(Debug, Clone, Copy)]
pub struct GatedActivation {
    pub activation: Activation,
    /// Which half the activation applies to: the first (Qwen's fused `[gate; up]`, ModernBERT's
    /// `Wi`) or the second (GTE's `up_gate_proj`).
    pub act_on_first: bool,
}

impl GatedActivation {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if fused(x) {
            return x.apply_op1_no_bwd(self);
        }
        #[cfg(feature = "cuda")]
        if super::cuda::takes(x) {
            return super::cuda::gated(x, self.activation.kernel(), self.act_on_first);
        }
        let half = x.dim(1)? / 2;
        let (first, second) = (x.narrow(1, 0, half)?, x.narrow(1, half, half)?);
        let (act, other) = if self.act_on_first { (first, second) } else { (second, first) };
        self.activation.forward(&act.contiguous()?)? * other
    }
}

impl CustomOp1 for GatedActivation {
    fn name(&self) -> &'static str {
        "gated_activation"
    }
    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, width) = dims2(layout)?;
        if width % 2 != 0 {
            bail!("gated activation: {width} columns do not split in two");
        }
        let half = width / 2;
        let x = contiguous(storage, layout)?;
        let mut out = vec![0f32; rows * half];
        let (act, first) = (self.activation, self.act_on_first);
        out.par_chunks_mut(half).zip(x.par_chunks(width)).for_each(|(dst, src)| gate_row(act, first, dst, src));
        Ok((CpuStorage::F32(out), Shape::from((rows, half))))
    }
}

multiversion! {
    fn gate_row(act: Activation, act_on_first: bool, dst: &mut [f32], src: &[f32]) {
        let (a, b) = src.split_at(dst.len());
        let (gate, up) = if act_on_first { (a, b) } else { (b, a) };
        macro_rules! each {
            ($variant:expr) => {
                dst.iter_mut().zip(gate).zip(up).for_each(|((d, g), u)| *d = $variant.apply(*g) * u)
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
    use candle_core::Device;

    #[test]
    fn matches_composite() {
        let x = Tensor::from_vec((0..48).map(|i| ((i * 29 % 17) as f32 - 8.0) / 2.0).collect::<Vec<_>>(), (3, 16), &Device::Cpu).unwrap();
        for act_on_first in [true, false] {
            let op = GatedActivation { activation: Activation::Silu, act_on_first };
            let ours = op.forward(&x).unwrap();
            let (a, b) = (x.narrow(1, 0, 8).unwrap(), x.narrow(1, 8, 8).unwrap());
            let (g, u) = if act_on_first { (a, b) } else { (b, a) };
            let reference = (g.silu().unwrap() * u).unwrap();
            let diff = (ours - reference).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
            assert!(diff < 1e-5, "{diff}");
        }
    }
}
