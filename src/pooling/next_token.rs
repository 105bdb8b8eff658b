//! A causal LM's next-token probabilities of chosen label tokens, as vLLM's
//! `/generative_scoring` computes them (`generative_scoring/serving.py`): the LM head on the
//! last token's final state (with Gemma 2's final soft-cap), then the first label's probability,
//! softmaxed over the distinct label tokens (`apply_softmax`) or over the whole vocabulary.

use super::PoolingError;
use crate::models::head_weights::LmHeadWeights;
use candle_core::Tensor;

/// What one prompt asks of the LM head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelQuery {
    /// The label tokens, repeats removed (vLLM keys their log-probabilities by id, so a repeated
    /// label counts once); the score is the first one's probability.
    labels: Vec<u32>,
    /// Softmax over the labels alone; `false`: the model's probability over the whole
    /// vocabulary.
    pub apply_softmax: bool,
}

impl LabelQuery {
    /// `label_token_ids` as sent (at least one, each inside the vocabulary: the caller checks).
    pub fn new(label_token_ids: &[u32], apply_softmax: bool) -> Self {
        // A set, not `Vec::contains`: a request may send hundreds of thousands of labels.
        let mut seen = std::collections::HashSet::with_capacity(label_token_ids.len());
        let labels = label_token_ids.iter().copied().filter(|id| seen.insert(*id)).collect();
        LabelQuery { labels, apply_softmax }
    }
}

/// More labels than this read the whole LM head's product rather than gathering their rows
/// (a request may name the whole vocabulary).
const FEW_LABELS: usize = 64;

/// Rows of whole-vocabulary logits computed at once (16 × a 152k vocabulary: 9.7 MB).
const WHOLE_ROWS: usize = 16;

/// `softmax(over)`'s value at `labels[0]` (`labels[0]` is one of `over`'s logits).
fn first_probability(labels: &[f32], over: &[f32]) -> f32 {
    let top = over.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let total: f64 = over.iter().map(|&l| f64::from(l - top).exp()).sum();
    (f64::from(labels[0] - top).exp() / total) as f32
}

/// The LM head of `--runner generate`: `[vocab, hidden]` f32 on the host.
pub struct NextTokenHead {
    weight: Tensor,
    softcap: Option<f32>,
}

impl NextTokenHead {
    pub fn new(weights: LmHeadWeights) -> Self {
        NextTokenHead { weight: weights.weight, softcap: weights.softcap }
    }

    /// The rows of the vocabulary (the label ids a request may name).
    pub fn vocab_size(&self) -> usize {
        self.weight.dims().first().copied().unwrap_or(0)
    }

    /// Each row's score (`rows`: last-token states, `[n, hidden]` flat, one query per row).
    /// Rows asking for the whole vocabulary, or for many labels, take the product with the
    /// whole LM head, [`WHOLE_ROWS`] rows at a time; the others read only their labels' rows.
    pub fn scores(&self, rows: &[f32], hidden: usize, queries: &[&LabelQuery]) -> Result<Vec<f32>, PoolingError> {
        let mut scores = vec![0.0; queries.len()];
        let state = |i: usize| &rows[i * hidden..(i + 1) * hidden];
        let reads_all = |q: &LabelQuery| !q.apply_softmax || q.labels.len() > FEW_LABELS;
        let whole: Vec<usize> = (0..queries.len()).filter(|&i| reads_all(queries[i])).collect();
        for chunk in whole.chunks(WHOLE_ROWS) {
            let states: Vec<f32> = chunk.iter().flat_map(|&i| state(i).iter().copied()).collect();
            let states = Tensor::from_vec(states, (chunk.len(), hidden), self.weight.device())?;
            let logits = states.matmul(&self.weight.t()?)?.to_vec2::<f32>()?;
            for (&i, mut row) in chunk.iter().zip(logits) {
                self.cap(&mut row);
                let query = queries[i];
                let picked = |row: &[f32]| {
                    query
                        .labels
                        .iter()
                        .map(|&id| row.get(id as usize).copied())
                        .collect::<Option<Vec<f32>>>()
                        .ok_or_else(|| PoolingError::Compute("a label token is outside the vocabulary".into()))
                };
                let labels = picked(&row)?;
                scores[i] = match query.apply_softmax {
                    true => first_probability(&labels, &labels),
                    false => first_probability(&labels, &row),
                };
            }
        }
        for (i, query) in queries.iter().enumerate().filter(|(_, q)| !reads_all(q)) {
            let ids = Tensor::from_slice(&query.labels, query.labels.len(), self.weight.device())?;
            let label_rows = self.weight.index_select(&ids, 0)?.to_vec2::<f32>()?;
            let mut logits: Vec<f32> = label_rows.iter().map(|w| w.iter().zip(state(i)).map(|(a, b)| a * b).sum()).collect();
            self.cap(&mut logits);
            scores[i] = first_probability(&logits, &logits);
        }
        Ok(scores)
    }

    fn cap(&self, logits: &mut [f32]) {
        if let Some(cap) = self.softcap {
            logits.iter_mut().for_each(|l| *l = cap * (*l / cap).tanh());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn head(softcap: Option<f32>) -> NextTokenHead {
        // Vocabulary of 3 over a 2-wide state: logits of state [1, 2] are [1, 2, 3].
        let weight = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], (3, 2), &Device::Cpu).unwrap();
        NextTokenHead::new(LmHeadWeights { weight, softcap })
    }

    #[test]
    fn scores_over_the_labels_or_the_whole_vocabulary() {
        let labels = LabelQuery::new(&[2, 0, 2], true);
        let whole = LabelQuery::new(&[2, 0], false);
        let scores = head(None).scores(&[1.0, 2.0, 1.0, 2.0], 2, &[&labels, &whole]).unwrap();
        let e = |x: f32| x.exp();
        assert!((scores[0] - e(3.0) / (e(3.0) + e(1.0))).abs() < 1e-6, "{scores:?}");
        assert!((scores[1] - e(3.0) / (e(1.0) + e(2.0) + e(3.0))).abs() < 1e-6, "{scores:?}");
    }

    #[test]
    fn many_labels_read_the_whole_product_with_the_same_answer() {
        // 3 rows repeated: 70 distinct labels are past FEW_LABELS, served through the product.
        let weight: Vec<f32> = (0..100).flat_map(|i| [(i % 3) as f32, (i % 5) as f32 * 0.1]).collect();
        let head = NextTokenHead::new(LmHeadWeights { weight: Tensor::from_vec(weight, (100, 2), &Device::Cpu).unwrap(), softcap: None });
        let many: Vec<u32> = (0..70).collect();
        let few: Vec<u32> = (0..10).collect();
        let (many, few) = (LabelQuery::new(&many, true), LabelQuery::new(&few, true));
        let scores = head.scores(&[1.0, 2.0, 1.0, 2.0], 2, &[&many, &few]).unwrap();
        let logit = |i: usize| (i % 3) as f32 + (i % 5) as f32 * 0.2;
        let softmax_first = |n: usize| logit(0).exp() / (0..n).map(|i| logit(i).exp()).sum::<f32>();
        assert!((scores[0] - softmax_first(70)).abs() < 1e-6, "{scores:?}");
        assert!((scores[1] - softmax_first(10)).abs() < 1e-6, "{scores:?}");
    }

    #[test]
    fn a_repeated_label_counts_once_and_the_softcap_applies() {
        assert_eq!(LabelQuery::new(&[5, 5, 7, 5], true).labels, vec![5, 7]);
        let query = LabelQuery::new(&[2, 1], true);
        let score = head(Some(2.0)).scores(&[1.0, 2.0], 2, &[&query]).unwrap()[0];
        let capped = |x: f32| (2.0 * (x / 2.0).tanh()).exp();
        assert!((score - capped(3.0) / (capped(3.0) + capped(2.0))).abs() < 1e-6);
    }
}
