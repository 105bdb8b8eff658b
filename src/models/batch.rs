//! The flat, padding-free batch that backbones consume.
//!
//! All sequences' token ids are concatenated; `cu_seqlens` marks where each sequence starts
//! and ends. Dense layers run over every token at once and attention runs per sequence, so
//! no compute is spent on padding, whatever the mix of lengths.

use super::ops::lora::{LoraWeights, Segment};
use std::sync::Arc;

/// One tokenized input, as the model will see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizedInput {
    pub ids: Vec<u32>,
    /// Segment ids (0 for single texts, 0/1 for pairs on models that use them).
    pub type_ids: Vec<u32>,
}

impl TokenizedInput {
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// Several sequences laid end to end.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub input_ids: Vec<u32>,
    pub token_type_ids: Vec<u32>,
    /// Cumulative sequence lengths: sequence `i` is tokens `cu_seqlens[i]..cu_seqlens[i+1]`.
    pub cu_seqlens: Vec<usize>,
    pub max_len: usize,
    /// The LoRA adapter of every sequence (`None`: the base model); empty when none has one.
    pub adapters: Vec<Option<Arc<LoraWeights>>>,
}

impl Batch {
    pub fn from_inputs<'a>(inputs: impl IntoIterator<Item = &'a TokenizedInput>) -> Self {
        let mut batch = Batch { cu_seqlens: vec![0], ..Default::default() };
        for input in inputs {
            batch.input_ids.extend_from_slice(&input.ids);
            batch.token_type_ids.extend_from_slice(&input.type_ids);
            batch.cu_seqlens.push(batch.input_ids.len());
            batch.max_len = batch.max_len.max(input.len());
        }
        batch
    }

    pub fn num_seqs(&self) -> usize {
        self.cu_seqlens.len() - 1
    }

    pub fn num_tokens(&self) -> usize {
        self.input_ids.len()
    }

    /// `(start, len)` of every sequence.
    pub fn spans(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.cu_seqlens.windows(2).map(|w| (w[0], w[1] - w[0]))
    }

    /// Splits the batch at sequence boundaries into consecutive sub-batches of at most
    /// `max_tokens` tokens each (a longer sequence gets a sub-batch of its own).
    pub fn chunks(&self, max_tokens: usize) -> Vec<Batch> {
        let mut chunks = Vec::new();
        let mut first = 0;
        while first < self.num_seqs() {
            let start = self.cu_seqlens[first];
            let mut last = first + 1;
            while last < self.num_seqs() && self.cu_seqlens[last + 1] - start <= max_tokens {
                last += 1;
            }
            let end = self.cu_seqlens[last];
            chunks.push(Batch {
                input_ids: self.input_ids[start..end].to_vec(),
                token_type_ids: self.token_type_ids[start..end].to_vec(),
                cu_seqlens: self.cu_seqlens[first..=last].iter().map(|c| c - start).collect(),
                max_len: self.spans().skip(first).take(last - first).map(|(_, l)| l).max().unwrap_or(0),
                adapters: self.adapters.get(first..last).map(<[_]>::to_vec).unwrap_or_default(),
            });
            first = last;
        }
        chunks
    }

    /// The token rows of each run of consecutive sequences with one adapter, for
    /// [`super::ops::lora::with_segments`]; base-model sequences have none.
    pub fn lora_segments(&self) -> Vec<Segment> {
        let mut segments: Vec<Segment> = Vec::new();
        for ((start, len), adapter) in self.spans().zip(&self.adapters) {
            let Some(weights) = adapter else { continue };
            match segments.last_mut() {
                Some(last) if last.end == start && Arc::ptr_eq(&last.weights, weights) => last.end = start + len,
                _ => segments.push(Segment { start, end: start + len, weights: Arc::clone(weights) }),
            }
        }
        segments
    }

    /// Position of every token inside its own sequence, offset by `offset`
    /// (0 for BERT, `pad_token_id + 1` for RoBERTa-style models).
    pub fn positions(&self, offset: u32) -> Vec<u32> {
        let mut positions = Vec::with_capacity(self.num_tokens());
        for (_, len) in self.spans() {
            positions.extend((0..len as u32).map(|p| p + offset));
        }
        positions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concatenates_without_padding() {
        let a = TokenizedInput { ids: vec![1, 2, 3], type_ids: vec![0, 0, 0] };
        let b = TokenizedInput { ids: vec![4], type_ids: vec![0] };
        let batch = Batch::from_inputs([&a, &b]);
        assert_eq!(batch.input_ids, vec![1, 2, 3, 4]);
        assert_eq!(batch.cu_seqlens, vec![0, 3, 4]);
        assert_eq!(batch.max_len, 3);
        assert_eq!(batch.positions(2), vec![2, 3, 4, 2]);
        assert_eq!(batch.spans().collect::<Vec<_>>(), vec![(0, 3), (3, 1)]);
    }

    #[test]
    fn chunks_split_at_sequence_boundaries() {
        let inputs: Vec<TokenizedInput> =
            [3usize, 2, 4, 1].iter().map(|&n| TokenizedInput { ids: (0..n as u32).collect(), type_ids: vec![0; n] }).collect();
        let batch = Batch::from_inputs(&inputs);
        let chunks = batch.chunks(5);
        let lens: Vec<Vec<usize>> = chunks.iter().map(|c| c.spans().map(|(_, l)| l).collect()).collect();
        assert_eq!(lens, vec![vec![3, 2], vec![4, 1]]);
        assert_eq!(chunks[1].cu_seqlens, vec![0, 4, 5]);
        assert_eq!(chunks[1].input_ids, vec![0, 1, 2, 3, 0]);
        assert_eq!(batch.chunks(2).len(), 4); // a sequence longer than the limit stands alone
        let rejoined: Vec<u32> = chunks.iter().flat_map(|c| c.input_ids.clone()).collect();
        assert_eq!(rejoined, batch.input_ids);
    }
}
