//! A mixture-of-experts feed-forward layer (NomicBERT MoE, nomic-embed-text-v2-moe): a router
//! scores every token against each expert, the token runs through its `top_k` experts by
//! softmax probability, and their outputs, weighted by those probabilities as they are (not
//! renormalized: megablocks' `moe_normalize_expert_weights` false, as vLLM's and TEI's ports
//! compute it), are summed with one bias shared by all experts.
//!
//! Each expert gathers its tokens into one product (`index_select`), so a batch runs as
//! `num_experts` pairs of dense products whose rows add up to `top_k` times the tokens, and the
//! results are scattered back (`index_add`).

use super::{host_f32, Activation, Linear};
use candle_core::{DType, Result, Tensor};

/// One expert: `down(act(up(x)))`, neither with a bias.
pub struct Expert {
    pub up: Linear,
    pub down: Linear,
}

/// The router and the experts of one layer.
pub struct Experts {
    /// `[num_experts, hidden]`, no bias.
    pub router: Linear,
    pub experts: Vec<Expert>,
    /// Added once to the summed expert outputs.
    pub bias: Tensor,
    pub top_k: usize,
    pub activation: Activation,
}

impl Experts {
    /// The layer's output for every token of `x` (`[tokens, hidden]`).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let logits = host_f32(&self.router.forward(x)?.to_dtype(DType::F32)?)?;
        let n = self.experts.len();
        // Per expert: the tokens it takes and their weights.
        let mut routed: Vec<(Vec<u32>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); n];
        for (token, row) in logits.chunks(n.max(1)).enumerate() {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exp: Vec<f32> = row.iter().map(|l| (l - max).exp()).collect();
            let sum: f32 = exp.iter().sum();
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|&a, &b| exp[b].total_cmp(&exp[a]));
            for &e in order.iter().take(self.top_k) {
                routed[e].0.push(token as u32);
                routed[e].1.push(exp[e] / sum);
            }
        }
        let mut out = x.zeros_like()?;
        for (expert, (tokens, weights)) in self.experts.iter().zip(routed) {
            if tokens.is_empty() {
                continue;
            }
            let ids = Tensor::from_vec(tokens, weights.len(), x.device())?;
            let inner = self.activation.forward(&expert.up.forward(&x.index_select(&ids, 0)?)?)?;
            let weights = Tensor::from_vec(weights, (ids.dim(0)?, 1), x.device())?.to_dtype(x.dtype())?;
            let y = expert.down.forward(&inner)?.broadcast_mul(&weights)?;
            out = out.index_add(&ids, &y, 0)?;
        }
        out.broadcast_add(&self.bias)
    }

    /// Every dense layer of the experts, for `--quantization int8` and LoRA.
    pub fn linears(&mut self) -> impl Iterator<Item = &mut Linear> {
        self.experts.iter_mut().flat_map(|e| [&mut e.up, &mut e.down])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Two experts that scale by 2 and by 3 (identity up, scaled down, ReLU on positives); the
    /// router sends token 0 to expert 0 and token 1 to expert 1, each weighted by its softmax
    /// probability as it is, and the bias is added once.
    #[test]
    fn routes_each_token_to_its_top_experts_weighted_by_probability() {
        let cpu = &Device::Cpu;
        let eye = Tensor::eye(2, DType::F32, cpu).unwrap();
        let expert =
            |scale: f64| Expert { up: Linear::new(eye.clone(), None).unwrap(), down: Linear::new((&eye * scale).unwrap(), None).unwrap() };
        // Router logits: token [1, 0] → [2, 0]; token [0, 1] → [0, 2].
        let router = Linear::new((&eye * 2.0).unwrap(), None).unwrap();
        let bias = Tensor::new(&[0.5f32, -0.5], cpu).unwrap();
        let mut layer = Experts { router, experts: vec![expert(2.0), expert(3.0)], bias, top_k: 1, activation: Activation::Relu };
        let x = Tensor::new(&[[1f32, 0.], [0., 1.]], cpu).unwrap();
        let p = 1.0 / (1.0 + (-2f32).exp()); // softmax([2, 0])[0]
        let out: Vec<Vec<f32>> = layer.forward(&x).unwrap().to_vec2().unwrap();
        let want = [[2.0 * p + 0.5, -0.5], [0.5, 3.0 * p - 0.5]];
        for (row, want) in out.iter().zip(want) {
            for (a, b) in row.iter().zip(want) {
                assert!((a - b).abs() < 1e-6, "{out:?}");
            }
        }
        // Both experts for every token: each weighted by its own probability.
        layer.top_k = 2;
        let out: Vec<Vec<f32>> = layer.forward(&x).unwrap().to_vec2().unwrap();
        assert!((out[0][0] - (2.0 * p + 3.0 * (1.0 - p) + 0.5)).abs() < 1e-6 && (out[0][1] + 0.5).abs() < 1e-6, "{out:?}");
        assert_eq!(layer.linears().count(), 4);
    }
}
