//! SPLADE sparse embeddings: the masked-LM head turns each token's hidden state into vocabulary
//! logits; the weight of vocabulary entry `t` is `max over the sequence's tokens of
//! log(1 + ReLU(logit_t))`, and only the non-zero weights are kept.
//!
//! The head's weights are architecture knowledge (`models/`); the computation is shared here.

use crate::models::head_weights::MaskedLmHead;
use candle_core::{Device, Result, Tensor};

/// SPLADE over a model's masked-LM head.
pub struct SparseHead {
    pub lm: MaskedLmHead,
}

/// Rows of the vocabulary logits computed at once: bounds the `[rows, vocab]` scratch matrix
/// (256 × 30,522 floats ≈ 31 MB) for long inputs.
const ROWS_PER_PASS: usize = 256;

impl SparseHead {
    /// `(token id, weight)` for every vocabulary entry with a positive weight, in id order, for
    /// one sequence's hidden states (`len` rows of `width`).
    pub fn weights(&self, rows: &[f32], width: usize) -> Result<Vec<(u32, f32)>> {
        let len = rows.len() / width;
        let mut best: Vec<f32> = Vec::new();
        for start in (0..len).step_by(ROWS_PER_PASS) {
            let n = ROWS_PER_PASS.min(len - start);
            let x = Tensor::from_slice(&rows[start * width..(start + n) * width], (n, width), &Device::Cpu)?;
            let logits = self.lm.logits(&x)?;
            // max over tokens first: log1p(relu(·)) is monotonic, so it commutes with the max.
            let max = logits.max(0)?.to_vec1::<f32>()?;
            if best.is_empty() {
                best = max;
            } else {
                best.iter_mut().zip(max).for_each(|(b, m)| *b = b.max(m));
            }
        }
        Ok(best.into_iter().enumerate().filter(|(_, logit)| *logit > 0.0).map(|(id, logit)| (id as u32, logit.ln_1p())).collect())
    }
}
