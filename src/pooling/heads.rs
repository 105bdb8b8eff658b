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
    /// The classifier head of its LoRA adapter (`modules_to_save`), in place of the model's.
    pub classifier: Option<&'a ClassifierHead>,
}

/// The rows one classifier head takes from a batch (the model's head, or an adapter's own):
/// pooled sequences and token_classify's token states, each run as one product.
struct ClassifierRows<'h> {
    head: &'h ClassifierHead,
    sequences: Vec<f32>,
    tokens: Vec<f32>,
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
        // One entry per distinct head; token states of token_classify are kept apart (some
        // heads skip their pooler layer on them).
        let mut classifier_rows: Vec<ClassifierRows> = Vec::new();
        // Each request's entry in `classifier_rows` (`None` for other tasks).
        let mut head_of_request = Vec::with_capacity(requests.len());
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
                    head_of_request.push(None);
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
                Task::Classify | Task::Score | Task::TokenClassify => {
                    let head = self.classifier_for(request)?;
                    let group = match classifier_rows.iter().position(|g| std::ptr::eq(g.head, head)) {
                        Some(group) => group,
                        None => {
                            classifier_rows.push(ClassifierRows { head, sequences: Vec::new(), tokens: Vec::new() });
                            classifier_rows.len() - 1
                        }
                    };
                    let pooled = head.pool(task, states, start, len);
                    row_counts.push(pooled.len() / hidden_size);
                    head_of_request.push(Some(group));
                    let rows = &mut classifier_rows[group];
                    match task {
                        Task::TokenClassify => rows.tokens.extend(pooled),
                        _ => rows.sequences.extend(pooled),
                    }
                    continue;
                }
                Task::EmbedSparse => {
                    let head = self.sparse.as_ref().ok_or("SPLADE needs a masked-LM head, which this model lacks")?;
                    let rows = All.pool(states, start, len);
                    sparse.push(head.weights(&rows, hidden_size).map_err(|e| describe(&e))?);
                    row_counts.push(0);
                    head_of_request.push(None);
                    continue;
                }
            };
            head_of_request.push(None);
            row_counts.push(pooled.len() / hidden_size);
            rows.extend(pooled);
        }
        let (embeddings, width) = self.embedding.project(embedding_rows, hidden_size).map_err(|e| describe(&e))?;
        // Per head: (sequence logits, token logits), and how far each has been handed out.
        let mut logits = Vec::with_capacity(classifier_rows.len());
        for rows in &mut classifier_rows {
            let sequences = rows.head.logits(std::mem::take(&mut rows.sequences), hidden_size, false);
            let tokens = rows.head.logits(std::mem::take(&mut rows.tokens), hidden_size, true);
            logits.push((sequences.map_err(|e| describe(&e))?, tokens.map_err(|e| describe(&e))?));
        }
        let mut logit_offsets = vec![(0, 0); logits.len()];

        let mut outputs = Vec::with_capacity(requests.len());
        let mut embedding_offset = 0;
        let mut sparse = sparse.into_iter();
        for (((request, count), ready), group) in requests.iter().zip(row_counts).zip(m3_outputs).zip(head_of_request) {
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
                    let group = group.ok_or("a classifier task without its head")?;
                    let head = classifier_rows[group].head;
                    let labels = head.num_labels();
                    let (sequences, tokens) = &logits[group];
                    let (source, offset) = match request.task {
                        Task::TokenClassify => (tokens, &mut logit_offsets[group].1),
                        _ => (sequences, &mut logit_offsets[group].0),
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

    /// The head a classifier task runs: its adapter's own, else the model's.
    fn classifier_for<'h>(&'h self, request: &PoolRequest<'h>) -> Result<&'h ClassifierHead, String> {
        let task = request.task;
        request
            .classifier
            .or(self.classifier.as_ref())
            .ok_or_else(|| format!("task {task} needs a classifier head, which this model lacks"))
    }
}
