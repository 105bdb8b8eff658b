//! The flat, padding-free batch that backbones consume.
//!
//! All sequences' token ids are concatenated; `cu_seqlens` marks where each sequence starts
//! and ends. Dense layers run over every token at once and attention runs per sequence, so
//! no compute is spent on padding, whatever the mix of lengths.

use crate::kernels::lora::{LoraWeights, Segment};
use candle_core::{Result, Tensor};
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
    /// Embeddings that stand in for placeholder tokens (an image's soft tokens), for the
    /// backbones that take them ([`super::embedding_gemma2`]).
    pub soft_tokens: Option<SoftTokens>,
}

/// Rows of the text model's embedding width that replace the embeddings of some tokens of a
/// batch: row `i` replaces token `positions[i]` (flat index, ascending).
#[derive(Debug, Clone)]
pub struct SoftTokens {
    positions: Vec<usize>,
    rows: Tensor,
    /// Where each image's soft tokens lie as a grid (Qwen2-VL's M-RoPE places them by row and
    /// column); empty for models that do not need it.
    pub grids: Vec<ImageGrid>,
}

/// One image's soft tokens in the batch: `rows × cols` consecutive tokens, row-major, the first
/// at flat position `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGrid {
    pub first: usize,
    pub rows: usize,
    pub cols: usize,
}

impl SoftTokens {
    /// One row per position, positions strictly ascending (checked here, so that slicing a
    /// batch into chunks cannot fail).
    pub fn new(positions: Vec<usize>, rows: Tensor) -> Result<Self> {
        if rows.rank() != 2 || rows.dim(0)? != positions.len() || positions.windows(2).any(|w| w[0] >= w[1]) {
            candle_core::bail!(
                "{} soft-token rows ({:?}) for {} positions, which must ascend",
                rows.dims().first().unwrap_or(&0),
                rows.shape(),
                positions.len()
            );
        }
        Ok(Self { positions, rows, grids: Vec::new() })
    }

    /// The rows whose tokens lie in `start..end`, with positions made relative to `start`.
    fn slice(&self, start: usize, end: usize) -> Result<Option<SoftTokens>> {
        let first = self.positions.partition_point(|&p| p < start);
        let last = self.positions.partition_point(|&p| p < end);
        if first == last {
            return Ok(None);
        }
        Ok(Some(SoftTokens {
            positions: self.positions[first..last].iter().map(|p| p - start).collect(),
            rows: self.rows.narrow(0, first, last - first)?,
            grids: self
                .grids
                .iter()
                .filter(|g| (start..end).contains(&g.first))
                .map(|g| ImageGrid { first: g.first - start, ..*g })
                .collect(),
        }))
    }

    /// Columns `start..start + len` of every row, at the same positions (Qwen3-VL's tower gives
    /// each soft token its input embedding and its DeepStack features side by side).
    pub fn columns(&self, start: usize, len: usize) -> Result<SoftTokens> {
        Ok(SoftTokens {
            positions: self.positions.clone(),
            rows: self.rows.narrow(1, start, len)?.contiguous()?,
            grids: self.grids.clone(),
        })
    }

    /// The width of the rows.
    pub fn width(&self) -> Result<usize> {
        self.rows.dim(1)
    }

    /// `hidden` (`[tokens, hidden]`) with these rows added at their positions (DeepStack's
    /// visual features joining the residual stream).
    pub fn add_to(&self, hidden: &Tensor) -> Result<Tensor> {
        hidden.index_add(&self.index_into(hidden)?, &self.rows.to_dtype(hidden.dtype())?, 0)
    }

    /// The positions as an index into `states` (`[tokens, width]`), checked to lie inside it.
    fn index_into(&self, states: &Tensor) -> Result<Tensor> {
        let tokens = states.dim(0)?;
        if self.positions.last().is_some_and(|&p| p >= tokens) {
            candle_core::bail!("{} soft tokens at positions up to {:?} for {tokens} tokens", self.positions.len(), self.positions.last());
        }
        Tensor::from_vec(self.positions.iter().map(|&p| p as u32).collect::<Vec<_>>(), self.positions.len(), states.device())
    }

    /// `embeddings` (`[tokens, hidden]`) with the rows at `positions` replaced by these.
    pub fn replace(&self, embeddings: &Tensor) -> Result<Tensor> {
        let index = self.index_into(embeddings)?;
        let tokens = embeddings.dim(0)?;
        let mut keep = vec![1f32; tokens];
        self.positions.iter().for_each(|&p| keep[p] = 0.0);
        let keep = Tensor::from_vec(keep, (tokens, 1), embeddings.device())?.to_dtype(embeddings.dtype())?;
        let placed = embeddings.zeros_like()?.index_add(&index, &self.rows.to_dtype(embeddings.dtype())?, 0)?;
        embeddings.broadcast_mul(&keep)? + placed
    }
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
                // [`SoftTokens::new`] checked one row per position, so the narrowing in
                // `slice` stays inside the rows.
                soft_tokens: self.soft_tokens.as_ref().and_then(|soft| soft.slice(start, end).ok().flatten()),
            });
            first = last;
        }
        chunks
    }

    /// The token rows of each run of consecutive sequences with one adapter, for
    /// [`crate::kernels::lora::with_segments`]; base-model sequences have none.
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

    #[test]
    fn soft_tokens_follow_their_sequences_into_chunks() {
        let inputs: Vec<TokenizedInput> =
            [3usize, 2, 4].iter().map(|&n| TokenizedInput { ids: vec![7; n], type_ids: vec![0; n] }).collect();
        let mut batch = Batch::from_inputs(&inputs);
        let rows = Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0], (4, 1), &candle_core::Device::Cpu).unwrap();
        // Tokens 1 and 2 of the first sequence, 0 and 3 of the third.
        batch.soft_tokens = Some(SoftTokens::new(vec![1, 2, 5, 8], rows).unwrap());
        let chunks = batch.chunks(5);
        let first = chunks[0].soft_tokens.as_ref().unwrap();
        assert_eq!((first.positions.clone(), first.rows.flatten_all().unwrap().to_vec1::<f32>().unwrap()), (vec![1, 2], vec![1.0, 2.0]));
        let second = chunks[1].soft_tokens.as_ref().unwrap();
        assert_eq!((second.positions.clone(), second.rows.flatten_all().unwrap().to_vec1::<f32>().unwrap()), (vec![0, 3], vec![3.0, 4.0]));
        let embeddings = Tensor::zeros((4, 1), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        assert_eq!(second.replace(&embeddings).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap(), vec![3.0, 0.0, 0.0, 4.0]);
        // Rows and positions must agree, positions ascend.
        let two = Tensor::zeros((2, 1), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        assert!(SoftTokens::new(vec![1], two.clone()).is_err());
        assert!(SoftTokens::new(vec![2, 1], two).is_err());
    }
}
