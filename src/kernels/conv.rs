//! Short causal convolutions over the flat batch: a depthwise convolution of a few taps along
//! each sequence, as the hybrid decoders mix tokens without attention (Qwen3.5's Gated
//! DeltaNet input, LFM2's short-convolution blocks). Each sequence starts from zeros, so
//! sequences never see each other: torch's `conv1d(padding = taps − 1)[:len]` on each alone.

use rayon::prelude::*;

/// A depthwise causal convolution: one filter of `taps` weights per channel.
pub struct CausalConv {
    /// `[channels, taps]`: tap `j` of a channel reads the token `taps − 1 − j` back.
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
    pub taps: usize,
}

impl CausalConv {
    /// The convolution of `x` (`[tokens, channels]` row-major) over each sequence of `spans`
    /// (`(start, len)` in tokens), `then` applied to every output.
    pub fn forward(&self, x: &[f32], tokens: usize, spans: &[(usize, usize)], then: impl Fn(f32) -> f32 + Sync) -> Vec<f32> {
        let channels = x.len() / tokens.max(1);
        let taps = self.taps;
        let mut out = vec![0f32; x.len()];
        for &(start, len) in spans {
            out[start * channels..(start + len) * channels].par_chunks_mut(channels).enumerate().for_each(|(t, row)| {
                for (ch, o) in row.iter_mut().enumerate() {
                    let w = &self.weight[ch * taps..(ch + 1) * taps];
                    let acc: f32 =
                        (0..taps).filter(|&j| t + j + 1 >= taps).map(|j| w[j] * x[(start + t + j + 1 - taps) * channels + ch]).sum();
                    *o = then(acc + self.bias.as_ref().map_or(0.0, |b| b[ch]));
                }
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sequences of one channel, taps [1, 10, 100]: each output is 100·x[t] + 10·x[t−1] +
    /// x[t−2] within its own sequence (zeros before it), plus the bias.
    #[test]
    fn convolves_each_sequence_from_zeros() {
        let conv = CausalConv { weight: vec![1.0, 10.0, 100.0], bias: Some(vec![0.5]), taps: 3 };
        let x = [1.0, 2.0, 3.0, 4.0, 5.0];
        let out = conv.forward(&x, 5, &[(0, 3), (3, 2)], |v| v);
        assert_eq!(out, vec![100.5, 210.5, 321.5, 400.5, 540.5]);
    }
}
