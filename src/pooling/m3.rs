//! BGE-M3's sparse and multi-vector outputs from one sequence's token states, as FlagEmbedding's
//! `BGEM3FlagModel.encode` computes them, and the shapes vLLM serves them in:
//!
//! - lexical weights (`embed_sparse`, `/embed_sparse`): `relu(sparse_linear(h))` per token, the
//!   largest per token id, the tokenizer's cls / eos / pad / unk ids dropped, zeros dropped;
//! - per-token weights (`token_classify`, vLLM's shape): the same `relu(sparse_linear(h))` of
//!   every token but a leading BOS and a trailing EOS, one `[w]` row each;
//! - ColBERT vectors (`token_embed`): `colbert_linear(h)` of every token but a leading BOS,
//!   L2-normalized unless the request turns normalization off.
//!
//! [`MultiOutput`] asks for several of them (and the dense embedding) from one forward pass; with
//! `token_weights`, the dense embedding and the per-token weights are vLLM 0.33's compound
//! pooling task `embed&token_classify` (its `BgeM3Pooler`), which only IO-processor plugins ask
//! for (IO-processor plugins).

use crate::models::bge_m3::M3Weights;
use candle_core::{Device, Result, Tensor};

/// Which of BGE-M3's outputs one request wants from the same pass (FlagEmbedding's
/// `return_dense`, `return_sparse`, `return_colbert_vecs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MultiOutput {
    pub dense: bool,
    pub sparse: bool,
    pub colbert: bool,
    /// The per-token weights, as `token_classify` gives them (a plugin's compound task).
    pub token_weights: bool,
}

/// BGE-M3's outputs of one input, those asked for.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MultiVectors {
    /// The dense embedding (the embedding head's, normalized as asked).
    pub dense: Option<Vec<f32>>,
    /// Lexical weights, `(token id, weight)` in id order.
    pub sparse: Option<Vec<(u32, f32)>>,
    /// One ColBERT vector per token but the first.
    pub colbert: Option<Vec<Vec<f32>>>,
    /// One weight per token but a leading BOS and a trailing EOS (`token_classify`'s rows).
    pub token_weights: Option<Vec<f32>>,
}

/// The heads and the token ids they treat specially.
pub struct M3Head {
    pub weights: M3Weights,
    /// The ids lexical weights leave out: the tokenizer's cls, eos, pad and unk tokens.
    pub unused: Vec<u32>,
    /// The tokenizer's BOS (cls) and EOS ids: per-token outputs drop a leading BOS (ColBERT,
    /// token_classify) and a trailing EOS (token_classify), as vLLM's BOS/EOS filter does.
    pub bos: Option<u32>,
    pub eos: Option<u32>,
}

fn host(rows: &[f32], width: usize) -> Result<Tensor> {
    Tensor::from_slice(rows, (rows.len() / width, width), &Device::Cpu)
}

impl M3Head {
    /// `relu(sparse_linear(h))` of every token row.
    pub fn token_weights(&self, rows: &[f32], width: usize) -> Result<Vec<f32>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        self.weights.sparse.forward(&host(rows, width)?)?.relu()?.flatten_all()?.to_vec1()
    }

    /// FlagEmbedding's lexical weights of a sequence: for each token id the largest positive
    /// weight among its tokens, special ids left out; in id order.
    pub fn lexical_weights(&self, ids: &[u32], weights: &[f32]) -> Vec<(u32, f32)> {
        let mut best = std::collections::BTreeMap::<u32, f32>::new();
        for (&id, &w) in ids.iter().zip(weights) {
            if w > 0.0 && !self.unused.contains(&id) {
                let entry = best.entry(id).or_insert(0.0);
                *entry = entry.max(w);
            }
        }
        best.into_iter().collect()
    }

    /// The rows of a sequence that per-token outputs keep: without a leading BOS, and (when
    /// `drop_eos`) without a trailing EOS.
    pub fn kept(&self, ids: &[u32], drop_eos: bool) -> std::ops::Range<usize> {
        let start = usize::from(self.bos.is_some() && ids.first() == self.bos.as_ref());
        let end = ids.len() - usize::from(drop_eos && ids.len() > start && self.eos.is_some() && ids.last() == self.eos.as_ref());
        start..end
    }

    /// vLLM's token_classify for BGE-M3: one `[weight]` row per kept token.
    pub fn token_rows(&self, ids: &[u32], rows: &[f32], width: usize) -> Result<Vec<Vec<f32>>> {
        let kept = self.kept(ids, true);
        let weights = self.token_weights(&rows[kept.start * width..kept.end * width], width)?;
        Ok(weights.into_iter().map(|w| vec![w]).collect())
    }

    /// ColBERT vectors of the kept tokens, normalized when `normalize`.
    pub fn colbert(&self, ids: &[u32], rows: &[f32], width: usize, normalize: bool) -> Result<Vec<Vec<f32>>> {
        let kept = self.kept(ids, false);
        let rows = &rows[kept.start * width..kept.end * width];
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let out = self.weights.colbert.forward(&host(rows, width)?)?;
        let size = out.dim(1)?;
        let flat: Vec<f32> = out.flatten_all()?.to_vec1()?;
        Ok(flat
            .chunks(size)
            .map(|row| {
                let mut row = row.to_vec();
                if normalize {
                    super::embedding_head::l2_normalize(&mut row);
                }
                row
            })
            .collect())
    }
}

/// FlagEmbedding's lexical matching score: Σ over shared token ids of the two weights' product.
pub fn lexical_score(a: &[(u32, f32)], b: &[(u32, f32)]) -> f32 {
    let (mut i, mut j, mut sum) = (0, 0, 0f64);
    // Both lists are in id order.
    while i < a.len() && j < b.len() {
        match a[i].0.cmp(&b[j].0) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                sum += a[i].1 as f64 * b[j].1 as f64;
                i += 1;
                j += 1;
            }
        }
    }
    sum as f32
}

/// FlagEmbedding's ColBERT score: the mean over query vectors of the best dot product with a
/// passage vector (vLLM's late-interaction MaxSim is the sum).
pub fn colbert_score(query: &[Vec<f32>], passage: &[Vec<f32>]) -> f32 {
    if query.is_empty() || passage.is_empty() {
        return 0.0;
    }
    let total: f64 = query
        .iter()
        .map(|q| passage.iter().map(|p| q.iter().zip(p).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>()).fold(f64::NEG_INFINITY, f64::max))
        .sum();
    (total / query.len() as f64) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Linear;

    fn head() -> M3Head {
        let sparse =
            Linear::new(Tensor::new(&[[1f32, -1.0]], &Device::Cpu).unwrap(), Some(Tensor::new(&[0f32], &Device::Cpu).unwrap())).unwrap();
        let colbert = Linear::new(Tensor::new(&[[1f32, 0.0], [0.0, 2.0]], &Device::Cpu).unwrap(), None).unwrap();
        M3Head { weights: M3Weights { sparse, colbert }, unused: vec![0, 1, 2, 3], bos: Some(0), eos: Some(2) }
    }

    #[test]
    fn lexical_weights_keep_the_largest_per_id_without_specials() {
        let head = head();
        // Tokens: <s>, 7, 7, 9, 5, </s>; rows give weights relu(x0 - x1).
        let ids = [0, 7, 7, 9, 5, 2];
        let rows = [5.0, 0.0, 1.0, 0.5, 2.0, 0.5, 0.0, 1.0, 3.0, 0.0, 4.0, 0.0];
        let weights = head.token_weights(&rows, 2).unwrap();
        assert_eq!(weights, vec![5.0, 0.5, 1.5, 0.0, 3.0, 4.0]);
        assert_eq!(head.lexical_weights(&ids, &weights), vec![(5, 3.0), (7, 1.5)]);
        // token_classify drops the leading BOS and the trailing EOS.
        let rows_out = head.token_rows(&ids, &rows, 2).unwrap();
        assert_eq!(rows_out, vec![vec![0.5], vec![1.5], vec![0.0], vec![3.0]]);
        // ColBERT drops only the BOS.
        assert_eq!(head.colbert(&ids, &rows, 2, false).unwrap().len(), 5);
        assert_eq!(head.colbert(&[7, 9], &rows[..4], 2, false).unwrap(), vec![vec![5.0, 0.0], vec![1.0, 1.0]]);
    }

    #[test]
    fn scores_follow_flag_embedding() {
        assert_eq!(lexical_score(&[(1, 0.5), (4, 2.0), (9, 1.0)], &[(4, 3.0), (9, 0.5), (10, 7.0)]), 6.5);
        let q = vec![vec![1.0, 0.0], vec![0.0, 1.0]];
        let p = vec![vec![0.6, 0.8], vec![1.0, 0.0]];
        assert!((colbert_score(&q, &p) - 0.9).abs() < 1e-6);
    }
}
