//! Everything after the backbone for one batch: each sequence pooled as its task asks, then
//! each head run once over all the rows it takes (embedding head: Dense layers, Matryoshka
//! slice, normalization; classifier: logits and activation, per token for token_classify,
//! filtered by STEP's tag; SPLADE's masked-LM head), one [`PoolingOutput`] per sequence. The
//! scheduler forms the batch and runs the backbone; this file turns its hidden states into
//! answers.

use super::classifier::ClassifierHead;
use super::head::{finish_embedding, EmbeddingHead};
use super::m3::{M3Head, MultiOutput, MultiVectors};
use super::method::{All, HiddenStates, PoolingMethod};
use super::output::PoolingOutput;
use super::sparse::SparseHead;
use super::Task;
use crate::models::describe;

/// What one sequence of a batch asks of the heads (its request's validated parameters).
#[derive(Debug, Clone, Copy)]
pub struct PoolRequest<'a> {
    pub task: Task,
    /// Matryoshka dimensions of embeddings.
    pub dimensions: Option<usize>,
    /// Normalize embeddings / apply the classifier's activation.
    pub activation: bool,
    /// token_embed's late chunking: mean of every `n` token rows.
    pub late_chunk: Option<usize>,
    /// The sequence's token ids (STEP reward heads keep the rows of their tag token; BGE-M3's
    /// heads drop BOS/EOS rows and key lexical weights by id).
    pub ids: &'a [u32],
    /// BGE-M3: several outputs of one pass (the task is then `embed`).
    pub multi: Option<MultiOutput>,
}

/// A model's heads, as the loader built them for the tasks its spec serves.
pub struct Heads {
    /// The sentence-level pooling of `embed` (absent for models that do not embed).
    pub pooling: Option<&'static dyn PoolingMethod>,
    pub embedding: EmbeddingHead,
    pub classifier: Option<ClassifierHead>,
    pub sparse: Option<SparseHead>,
    /// BGE-M3's sparse and ColBERT heads: with them `token_embed` gives ColBERT vectors,
    /// `token_classify` per-token lexical weights and `embed_sparse` FlagEmbedding's lexical
    /// weights (instead of plain token states, a classifier and SPLADE).
    pub m3: Option<M3Head>,
}

impl Heads {
    /// The outputs of a batch's text sequences (`spans`: each one's `(start, len)` in
    /// `states`), in order.
    pub fn texts(
        &self,
        states: &HiddenStates,
        spans: impl Iterator<Item = (usize, usize)>,
        requests: &[PoolRequest],
    ) -> Result<Vec<PoolingOutput>, String> {
        let hidden_size = states.hidden_size;
        // Pool every sequence into its head's rows, then run each head once over all its rows.
        let mut embedding_rows = Vec::new();
        let mut classifier_rows = Vec::new();
        // Token states of token_classify: some heads skip their pooler layer on them.
        let mut token_classifier_rows = Vec::new();
        let mut sparse = Vec::new();
        // Outputs BGE-M3's heads finished in this first pass (a multi-output request's dense
        // part still goes through the embedding head below).
        let mut m3_outputs: Vec<Option<PoolingOutput>> = Vec::with_capacity(requests.len());
        let mut row_counts = Vec::with_capacity(requests.len());
        for (request, (start, len)) in requests.iter().zip(spans) {
            let task = request.task;
            if let Some(head) = &self.m3 {
                if let Some(output) = self.m3_output(head, request, states, start, len).map_err(|e| describe(&e))? {
                    let dense = matches!(&output, PoolingOutput::Multi(_)) && request.multi.is_some_and(|m| m.dense);
                    if dense {
                        embedding_rows.extend(self.pooling()?.pool(states, start, len));
                    }
                    m3_outputs.push(Some(output));
                    row_counts.push(usize::from(dense));
                    continue;
                }
            }
            m3_outputs.push(None);
            let (rows, pooled) = match task {
                Task::Embed => (&mut embedding_rows, self.pooling()?.pool(states, start, len)),
                Task::TokenEmbed => {
                    let rows = All.pool(states, start, len);
                    let rows = match request.late_chunk {
                        Some(size) => super::method::chunk_means(&rows, hidden_size, size),
                        None => rows,
                    };
                    (&mut embedding_rows, rows)
                }
                Task::Classify | Task::Score => (&mut classifier_rows, self.classifier(task)?.pool(task, states, start, len)),
                Task::TokenClassify => (&mut token_classifier_rows, self.classifier(task)?.pool(task, states, start, len)),
                Task::EmbedSparse => {
                    let head = self.sparse.as_ref().ok_or("SPLADE needs a masked-LM head, which this model lacks")?;
                    let rows = All.pool(states, start, len);
                    sparse.push(head.weights(&rows, hidden_size).map_err(|e| describe(&e))?);
                    row_counts.push(0);
                    continue;
                }
            };
            row_counts.push(pooled.len() / hidden_size);
            rows.extend(pooled);
        }
        let (embeddings, width) = self.embedding.project(embedding_rows, hidden_size).map_err(|e| describe(&e))?;
        let (logits, token_logits) = match &self.classifier {
            Some(head) => (
                head.logits(classifier_rows, hidden_size, false).map_err(|e| describe(&e))?,
                head.logits(token_classifier_rows, hidden_size, true).map_err(|e| describe(&e))?,
            ),
            None => (Vec::new(), Vec::new()),
        };

        let mut outputs = Vec::with_capacity(requests.len());
        let (mut embedding_offset, mut logit_offset, mut token_logit_offset) = (0, 0, 0);
        let mut sparse = sparse.into_iter();
        for ((request, count), ready) in requests.iter().zip(row_counts).zip(m3_outputs) {
            if let Some(ready) = ready {
                outputs.push(match ready {
                    PoolingOutput::Multi(mut multi) => {
                        let block = &embeddings[embedding_offset * width..(embedding_offset + count) * width];
                        embedding_offset += count;
                        if count > 0 {
                            multi.dense = Some(finish_embedding(block.to_vec(), request.dimensions, request.activation));
                        }
                        PoolingOutput::Multi(multi)
                    }
                    other => other,
                });
                continue;
            }
            outputs.push(match request.task {
                Task::Classify | Task::Score | Task::TokenClassify => {
                    let head = self.classifier(request.task)?;
                    let labels = head.num_labels();
                    let (source, offset) = match request.task {
                        Task::TokenClassify => (&token_logits, &mut token_logit_offset),
                        _ => (&logits, &mut logit_offset),
                    };
                    let block = &source[*offset * labels..(*offset + count) * labels];
                    *offset += count;
                    let activate = |row: &[f32]| {
                        let mut values = row.to_vec();
                        if request.activation {
                            head.activation(request.task).apply(&mut values);
                        }
                        values
                    };
                    match (request.task, &head.step) {
                        (Task::TokenClassify, Some(step)) => {
                            PoolingOutput::Tokens(step.apply(request.ids, block, labels).iter().map(|r| activate(r)).collect())
                        }
                        (Task::TokenClassify, None) => PoolingOutput::Tokens(block.chunks(labels).map(activate).collect()),
                        _ => PoolingOutput::Vector(activate(block)),
                    }
                }
                Task::EmbedSparse => PoolingOutput::Sparse(sparse.next().ok_or("sparse output missing")?),
                task => {
                    let block = &embeddings[embedding_offset * width..(embedding_offset + count) * width];
                    embedding_offset += count;
                    let finish = |row: &[f32]| finish_embedding(row.to_vec(), request.dimensions, request.activation);
                    match task {
                        Task::TokenEmbed => PoolingOutput::Tokens(block.chunks(width).map(finish).collect()),
                        _ => PoolingOutput::Vector(finish(block)),
                    }
                }
            });
        }
        Ok(outputs)
    }

    /// The outputs of a batch's images: each tower embedding sliced and normalized as its
    /// request asks.
    pub fn images(&self, embeddings: Vec<Vec<f32>>, requests: &[PoolRequest]) -> Vec<PoolingOutput> {
        embeddings
            .into_iter()
            .zip(requests)
            .map(|(row, request)| PoolingOutput::Vector(finish_embedding(row, request.dimensions, request.activation)))
            .collect()
    }

    /// What BGE-M3's heads answer for one sequence: the multi-output request's sparse and
    /// ColBERT parts (its dense part is left to the embedding head), or a per-token or sparse
    /// task; `None` for the tasks its embedding head serves as any model's.
    fn m3_output(
        &self,
        head: &M3Head,
        request: &PoolRequest,
        states: &HiddenStates,
        start: usize,
        len: usize,
    ) -> candle_core::Result<Option<PoolingOutput>> {
        let width = states.hidden_size;
        let rows = &states.data[start * width..(start + len) * width];
        let ids = request.ids;
        if let Some(multi) = request.multi {
            let sparse = if multi.sparse { Some(head.lexical_weights(ids, &head.token_weights(rows, width)?)) } else { None };
            let colbert = if multi.colbert { Some(head.colbert(ids, rows, width, request.activation)?) } else { None };
            return Ok(Some(PoolingOutput::Multi(MultiVectors { dense: None, sparse, colbert })));
        }
        Ok(match request.task {
            Task::TokenEmbed => Some(PoolingOutput::Tokens(head.colbert(ids, rows, width, request.activation)?)),
            Task::TokenClassify => Some(PoolingOutput::Tokens(head.token_rows(ids, rows, width)?)),
            Task::EmbedSparse => Some(PoolingOutput::Sparse(head.lexical_weights(ids, &head.token_weights(rows, width)?))),
            _ => None,
        })
    }

    fn pooling(&self) -> Result<&'static dyn PoolingMethod, String> {
        self.pooling.ok_or_else(|| "this model has no sentence-level pooling".to_string())
    }

    fn classifier(&self, task: Task) -> Result<&ClassifierHead, String> {
        self.classifier.as_ref().ok_or_else(|| format!("task {task} needs a classifier head, which this model lacks"))
    }
}
