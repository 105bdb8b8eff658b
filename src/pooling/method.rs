//! Pooling methods: how the hidden states of one sequence become its output.
//!
//! They work on the flat batch's host copy of the hidden states and its sequence spans, so no
//! padding mask is ever needed.

use serde::Deserialize;
use std::str::FromStr;

/// Hidden states of a whole flat batch on the host, `[tokens, hidden]` row-major, with the
/// token ids they came from.
pub struct HiddenStates<'a> {
    pub data: &'a [f32],
    pub hidden_size: usize,
    pub input_ids: &'a [u32],
}

impl HiddenStates<'_> {
    fn row(&self, token: usize) -> &[f32] {
        &self.data[token * self.hidden_size..(token + 1) * self.hidden_size]
    }

    fn rows(&self, start: usize, len: usize) -> &[f32] {
        &self.data[start * self.hidden_size..(start + len) * self.hidden_size]
    }
}

/// Reduces (or keeps) the token states of one sequence. Output: a row-major matrix with
/// `hidden_size` columns: one row for sequence-level methods, one per token for ALL.
pub trait PoolingMethod: Send + Sync {
    fn pool(&self, hidden: &HiddenStates, start: usize, len: usize) -> Vec<f32>;
}

/// The first token (`[CLS]` / `<s>`).
pub struct Cls;
/// The last token (decoders; the appended EOS).
pub struct Last;
/// The rightmost token whose id is not the padding id, else the first token: what transformers'
/// `*ForSequenceClassification` decoders pool. It differs from [`Last`] only when the tokenizer
/// appends the padding id itself (Qwen's `<|endoftext|>`).
pub struct LastNonPad {
    pub pad_token_id: u32,
}
/// The average of all tokens, special tokens included, as sentence-transformers does.
pub struct Mean;
/// Every token, unchanged.
pub struct All;

impl PoolingMethod for Cls {
    fn pool(&self, hidden: &HiddenStates, start: usize, _len: usize) -> Vec<f32> {
        hidden.row(start).to_vec()
    }
}

impl PoolingMethod for Last {
    fn pool(&self, hidden: &HiddenStates, start: usize, len: usize) -> Vec<f32> {
        hidden.row(start + len.max(1) - 1).to_vec()
    }
}

impl PoolingMethod for LastNonPad {
    fn pool(&self, hidden: &HiddenStates, start: usize, len: usize) -> Vec<f32> {
        let ids = &hidden.input_ids[start..start + len];
        let index = ids.iter().rposition(|&id| id != self.pad_token_id).unwrap_or(0);
        hidden.row(start + index).to_vec()
    }
}

impl PoolingMethod for Mean {
    fn pool(&self, hidden: &HiddenStates, start: usize, len: usize) -> Vec<f32> {
        let mut sum = vec![0f32; hidden.hidden_size];
        for row in hidden.rows(start, len).chunks_exact(hidden.hidden_size) {
            sum.iter_mut().zip(row).for_each(|(s, v)| *s += v);
        }
        let scale = 1.0 / len.max(1) as f32;
        sum.iter_mut().for_each(|s| *s *= scale);
        sum
    }
}

impl PoolingMethod for All {
    fn pool(&self, hidden: &HiddenStates, start: usize, len: usize) -> Vec<f32> {
        hidden.rows(start, len).to_vec()
    }
}

/// Late chunking (vLLM's `late_chunking_params`): the mean of each run of `size` consecutive
/// token rows (`width` floats each), the last run possibly shorter; accumulated in f64 for rows
/// summed over long chunks.
pub fn chunk_means(rows: &[f32], width: usize, size: usize) -> Vec<f32> {
    let tokens = rows.len() / width.max(1);
    let size = size.clamp(1, tokens.max(1));
    let mut out = Vec::with_capacity(tokens.div_ceil(size) * width);
    for chunk in rows.chunks(size * width) {
        let count = (chunk.len() / width) as f64;
        let mut sum = vec![0f64; width];
        for row in chunk.chunks(width) {
            sum.iter_mut().zip(row).for_each(|(s, x)| *s += *x as f64);
        }
        out.extend(sum.into_iter().map(|s| (s / count) as f32));
    }
    out
}

/// The `pooling_type` names of vLLM's `--pooler-config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PoolingType {
    Cls,
    Last,
    Mean,
    All,
    Step,
    /// SPLADE: max over tokens of log(1 + ReLU(MLM logits)); needs a masked-LM head.
    Splade,
}

/// The method that feeds a classifier the token(s) its architecture reads.
pub fn for_head(input: crate::models::head_weights::HeadInput) -> Box<dyn PoolingMethod> {
    use crate::models::head_weights::HeadInput;
    match input {
        HeadInput::First => Box::new(Cls),
        HeadInput::Mean => Box::new(Mean),
        HeadInput::Last => Box::new(Last),
        HeadInput::LastNonPad { pad_token_id } => Box::new(LastNonPad { pad_token_id }),
        HeadInput::EveryToken => Box::new(All),
    }
}

impl PoolingType {
    /// The method object, or `None` for types this build cannot run yet.
    pub fn method(self) -> Option<&'static dyn PoolingMethod> {
        match self {
            PoolingType::Cls => Some(&Cls),
            PoolingType::Last => Some(&Last),
            PoolingType::Mean => Some(&Mean),
            PoolingType::All => Some(&All),
            PoolingType::Step | PoolingType::Splade => None,
        }
    }

    pub fn is_token_level(self) -> bool {
        matches!(self, PoolingType::All | PoolingType::Step | PoolingType::Splade)
    }
}

impl FromStr for PoolingType {
    type Err = super::PoolingError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_uppercase().as_str() {
            "CLS" => Ok(Self::Cls),
            "LAST" | "LASTTOKEN" => Ok(Self::Last),
            "MEAN" => Ok(Self::Mean),
            "ALL" => Ok(Self::All),
            "STEP" => Ok(Self::Step),
            "SPLADE" => Ok(Self::Splade),
            other => Err(super::PoolingError::Config(format!("unknown pooling type `{other}` (expected CLS, LAST, MEAN, ALL or STEP)"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_means_average_runs_of_rows() {
        // Three rows of width 2, chunks of 2: the mean of rows 0-1, then row 2 alone.
        let rows = [1.0, 2.0, 3.0, 4.0, 10.0, 20.0];
        assert_eq!(chunk_means(&rows, 2, 2), vec![2.0, 3.0, 10.0, 20.0]);
        assert_eq!(chunk_means(&rows, 2, usize::MAX), vec![14.0 / 3.0, 26.0 / 3.0]);
        assert_eq!(chunk_means(&rows, 2, 1), rows.to_vec());
    }

    #[test]
    fn methods_select_and_reduce_rows() {
        // Two sequences: tokens 0..2 and 2..5, hidden size 2.
        let data = [1.0, 2.0, 3.0, 4.0, 10.0, 0.0, 20.0, 0.0, 30.0, 3.0];
        let ids = [5, 0, 7, 0, 0];
        let hidden = HiddenStates { data: &data, hidden_size: 2, input_ids: &ids };
        assert_eq!(Cls.pool(&hidden, 2, 3), vec![10.0, 0.0]);
        assert_eq!(LastNonPad { pad_token_id: 0 }.pool(&hidden, 2, 3), vec![10.0, 0.0]);
        assert_eq!(LastNonPad { pad_token_id: 0 }.pool(&hidden, 0, 2), vec![1.0, 2.0]);
        assert_eq!(LastNonPad { pad_token_id: 9 }.pool(&hidden, 0, 2), vec![3.0, 4.0]);
        assert_eq!(Last.pool(&hidden, 0, 2), vec![3.0, 4.0]);
        assert_eq!(Mean.pool(&hidden, 2, 3), vec![20.0, 1.0]);
        assert_eq!(All.pool(&hidden, 0, 2), vec![1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn parses_pooling_names() {
        assert_eq!("mean".parse::<PoolingType>().unwrap(), PoolingType::Mean);
        assert_eq!("lasttoken".parse::<PoolingType>().unwrap(), PoolingType::Last);
        assert!("max".parse::<PoolingType>().is_err());
    }
}
