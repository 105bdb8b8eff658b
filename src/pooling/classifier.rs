//! The sequence-classification head: pooled token → optional pooler layer → classifier →
//! minus `logit_bias`, over `logit_sigma` → activation. Cross-encoders are classifiers with one label whose
//! activated logit is the relevance score.
//!
//! Which weights form the pooler and the classifier is architecture knowledge and lives with
//! each backbone (`models/`); everything after the weights is shared and lives here.

use super::method::{HiddenStates, PoolingMethod};
use super::task::Task;
use crate::kernels::Linear;
use crate::models::head_weights::{ClassifierWeights, PreClassifier};
use candle_core::{Device, Result, Tensor};

/// The function applied to the logits when `use_activation` is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassifierActivation {
    Identity,
    Sigmoid,
    Softmax,
    Tanh,
}

impl ClassifierActivation {
    pub fn apply(self, logits: &mut [f32]) {
        match self {
            Self::Identity => {}
            Self::Sigmoid => logits.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp())),
            Self::Tanh => logits.iter_mut().for_each(|x| *x = x.tanh()),
            Self::Softmax => {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0;
                logits.iter_mut().for_each(|x| {
                    *x = (*x - max).exp();
                    sum += *x;
                });
                logits.iter_mut().for_each(|x| *x /= sum);
            }
        }
    }
}

/// STEP pooling of process reward models (vLLM's `StepPooler`): of a token classifier's
/// per-token logits keep only the tokens whose id is `step_tag_id` and only the label columns
/// `returned_token_ids`; the activation then runs over the kept columns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepFilter {
    pub step_tag_id: Option<u32>,
    pub columns: Option<Vec<usize>>,
}

impl StepFilter {
    /// The kept rows (of `labels` logits each) of one sequence with token ids `ids`.
    pub fn apply(&self, ids: &[u32], logits: &[f32], labels: usize) -> Vec<Vec<f32>> {
        ids.iter()
            .zip(logits.chunks(labels))
            .filter(|(id, _)| self.step_tag_id.is_none_or(|tag| **id == tag))
            .map(|(_, row)| match &self.columns {
                Some(columns) => columns.iter().map(|&c| row[c]).collect(),
                None => row.to_vec(),
            })
            .collect()
    }
}

/// Pooled vectors → class logits → probabilities.
pub struct ClassifierHead {
    /// Token classifiers with STEP pooling.
    pub step: Option<StepFilter>,
    /// Which token feeds the head (CLS for BERT-style heads, the last one for decoders).
    pub pooling: Box<dyn PoolingMethod>,
    pub pooler: Option<PreClassifier>,
    /// Whether token rows go through `pooler` too ([`ClassifierWeights::pre_on_tokens`]).
    pub pooler_on_tokens: bool,
    pub classifier: Linear,
    /// Subtracted from every logit before the activation (`--pooler-config logit_mean`, or
    /// `logit_bias`).
    pub logit_bias: Option<f32>,
    /// Divides every logit after the bias (`--pooler-config logit_sigma`, Platt scaling).
    pub logit_sigma: Option<f32>,
    pub classify_activation: ClassifierActivation,
    pub score_activation: ClassifierActivation,
}

impl std::fmt::Debug for ClassifierHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClassifierHead").field("num_labels", &self.num_labels()).field("step", &self.step.is_some()).finish()
    }
}

impl ClassifierHead {
    /// The head over an architecture's classifier weights, with the activations the model spec
    /// decided (`score_activation` matters only to one-label cross-encoders).
    pub fn new(
        weights: ClassifierWeights,
        step: Option<StepFilter>,
        (logit_bias, logit_sigma): (Option<f32>, Option<f32>),
        classify_activation: ClassifierActivation,
        score_activation: ClassifierActivation,
    ) -> Self {
        ClassifierHead {
            step,
            pooling: super::method::for_head(weights.input),
            pooler: weights.pre,
            pooler_on_tokens: weights.pre_on_tokens,
            classifier: weights.classifier,
            logit_bias,
            logit_sigma,
            classify_activation,
            score_activation,
        }
    }

    pub fn num_labels(&self) -> usize {
        self.classifier.out_features()
    }

    /// Pools one sequence for the head.
    pub fn pool(&self, task: Task, hidden: &HiddenStates, start: usize, len: usize) -> Vec<f32> {
        // token_classify reads every token whatever token the sequence-level head reads (a
        // reward model serves both from one head).
        match task {
            Task::TokenClassify => super::method::All.pool(hidden, start, len),
            _ => self.pooling.pool(hidden, start, len),
        }
    }

    /// Logits for every pooled row (row-major, `width` columns), as one batched product;
    /// returns `num_labels` logits per row, calibrated: `(logit - logit_bias) / logit_sigma`.
    /// `tokens`: the rows are token states of `token_classify`, not pooled sequences.
    pub fn logits(&self, rows: Vec<f32>, width: usize, tokens: bool) -> Result<Vec<f32>> {
        if rows.is_empty() {
            return Ok(rows);
        }
        let n = rows.len() / width;
        let mut x = Tensor::from_vec(rows, (n, width), &Device::Cpu)?;
        if let Some(pooler) = self.pooler.as_ref().filter(|_| !tokens || self.pooler_on_tokens) {
            x = pooler.forward(&x)?;
        }
        let mut logits = self.classifier.forward(&x)?.flatten_all()?.to_vec1::<f32>()?;
        if let Some(bias) = self.logit_bias {
            logits.iter_mut().for_each(|l| *l -= bias);
        }
        if let Some(sigma) = self.logit_sigma {
            logits.iter_mut().for_each(|l| *l /= sigma);
        }
        Ok(logits)
    }

    /// The activation a task applies (`use_activation`).
    pub fn activation(&self, task: Task) -> ClassifierActivation {
        match task {
            Task::Score => self.score_activation,
            _ => self.classify_activation,
        }
    }
}

/// Index of the largest value, the first one on ties (as `torch.argmax` does): the winning
/// class of `/classify`, the library's `classify` and the `classify` batch command alike.
pub fn argmax(values: &[f32]) -> usize {
    values.iter().enumerate().fold(0, |best, (i, v)| if *v > values[best] { i } else { best })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_filter_keeps_tagged_rows_and_chosen_columns() {
        let filter = StepFilter { step_tag_id: Some(7), columns: Some(vec![2, 0]) };
        let logits = [0.0, 1.0, 2.0, 10.0, 11.0, 12.0, 20.0, 21.0, 22.0];
        assert_eq!(filter.apply(&[7, 3, 7], &logits, 3), vec![vec![2.0, 0.0], vec![22.0, 20.0]]);
        assert_eq!(StepFilter::default().apply(&[1], &logits[..3], 3), vec![vec![0.0, 1.0, 2.0]]);
    }

    #[test]
    fn activations_compute() {
        let mut v = vec![0.0, 0.0];
        ClassifierActivation::Softmax.apply(&mut v);
        assert_eq!(v, vec![0.5, 0.5]);
        let mut v = vec![0.0];
        ClassifierActivation::Sigmoid.apply(&mut v);
        assert_eq!(v, vec![0.5]);
        let mut v = vec![1000.0, 0.0];
        ClassifierActivation::Softmax.apply(&mut v);
        assert!((v[0] - 1.0).abs() < 1e-6 && v[1].abs() < 1e-6);
    }
}
