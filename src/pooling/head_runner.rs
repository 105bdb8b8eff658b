//! Everything after the backbone for one batch: each sequence pooled as its task asks, then
//! each head run once over all the rows it takes (embedding head: Dense layers, Matryoshka
//! slice, normalization; classifier: logits and activation, per token for token_classify,
//! filtered by STEP's tag; SPLADE's masked-LM head; a causal LM's head on the last token for
//! generative scores), one [`PoolingOutput`] per sequence. The
//! scheduler forms the batch and runs the backbone; this file turns its hidden states into
//! answers.

use super::classifier::ClassifierHead;
use super::embedding_head::{finish_embedding, EmbeddingHead};
use super::instruction::InstructionSpan;
use super::m3::{M3Head, MultiOutput, MultiVectors};
use super::method::{All, HiddenStates, PoolingMethod};
use super::next_token::{LabelQuery, NextTokenHead};
use super::output::PoolingOutput;
use super::sparse::SparseHead;
use super::{PoolingError, Task};

/// What one sequence of a batch asks of the heads (its request's validated parameters).
#[derive(Debug, Clone, Copy)]
pub struct SequenceRequest<'a> {
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
    /// A generative score: the LM head's probability of these labels after the sequence's
    /// last token, in place of the task's output (a one-value vector).
    pub labels: Option<&'a LabelQuery>,
}

/// The rows one classifier head takes from a batch (the model's head, or an adapter's own):
/// pooled sequences and token_classify's token states, each run as one product.
struct ClassifierRows<'h> {
    head: &'h ClassifierHead,
    sequences: Vec<f32>,
    tokens: Vec<f32>,
}

/// A model's heads, as the loader built them for the tasks its spec serves.
pub struct HeadRunner {
    /// The sentence-level pooling of `embed` (absent for models that do not embed).
    pub pooling: Option<&'static dyn PoolingMethod>,
    pub embedding: EmbeddingHead,
    pub classifier: Option<ClassifierHead>,
    pub sparse: Option<SparseHead>,
    /// BGE-M3's sparse and ColBERT heads: with them `token_embed` gives ColBERT vectors,
    /// `token_classify` per-token lexical weights and `embed_sparse` FlagEmbedding's lexical
    /// weights (instead of plain token states, a classifier and SPLADE).
    pub m3: Option<M3Head>,
    /// A causal LM's head (`--runner generate`).
    pub next_token: Option<NextTokenHead>,
    /// GritLM: `embed` pools the tokens after the instruction that opens the prompt (at least
    /// the last token, where a prompt is all instruction).
    pub instruction: Option<InstructionSpan>,
}

/// Where one sequence's answer stands between gathering its rows and handing them back.
enum Pending {
    /// Finished while gathering (BGE-M3's per-token and sparse outputs, SPLADE).
    Done(PoolingOutput),
    /// BGE-M3's several outputs; with `dense`, the next row of the embedding head's output is
    /// their dense part.
    Multi { outputs: MultiVectors, dense: bool },
    /// `rows` rows of the embedding head's output: one pooled vector, or one per token.
    Embedding { rows: usize, per_token: bool },
    /// `rows` rows of classifier group `group`'s logits: of its sequences, or of its tokens.
    Logits { group: usize, rows: usize, per_token: bool },
    /// The next generative score.
    NextToken,
}

/// Hands out consecutive blocks of rows of one head's output.
struct Rows<'a> {
    data: &'a [f32],
    width: usize,
    next: usize,
}

impl<'a> Rows<'a> {
    fn new(data: &'a [f32], width: usize) -> Self {
        Rows { data, width, next: 0 }
    }

    fn take(&mut self, rows: usize) -> &'a [f32] {
        let block = &self.data[self.next * self.width..(self.next + rows) * self.width];
        self.next += rows;
        block
    }
}

impl HeadRunner {
    /// The outputs of a batch's text sequences (`spans`: each one's `(start, len)` in
    /// `states`), in order: every sequence's rows gathered into its head's input, each head run
    /// once over all of them, and each sequence's rows handed back.
    pub fn texts(
        &self,
        states: &HiddenStates,
        spans: impl Iterator<Item = (usize, usize)>,
        requests: &[SequenceRequest],
    ) -> Result<Vec<PoolingOutput>, PoolingError> {
        let hidden_size = states.hidden_size;
        let mut embedding_rows = Vec::new();
        // One entry per distinct classifier head (the model's, adapters' own).
        let mut groups: Vec<ClassifierRows> = Vec::new();
        let mut last_states = Vec::new();
        let pending = requests
            .iter()
            .zip(spans)
            .map(|(request, (start, len))| self.gather(request, states, (start, len), &mut embedding_rows, &mut groups, &mut last_states))
            .collect::<Result<Vec<_>, _>>()?;
        let queries: Vec<&LabelQuery> = requests.iter().filter_map(|r| r.labels).collect();
        let mut next_scores = match (&self.next_token, queries.is_empty()) {
            (_, true) => Vec::new(),
            (Some(head), false) => head.scores(&last_states, hidden_size, &queries)?,
            (None, false) => return Err(no_lm_head()),
        }
        .into_iter();

        let (embeddings, width) = self.embedding.project(embedding_rows, hidden_size)?;
        let logits = groups
            .iter_mut()
            .map(|rows| {
                let sequences = rows.head.logits(std::mem::take(&mut rows.sequences), hidden_size, false)?;
                let tokens = rows.head.logits(std::mem::take(&mut rows.tokens), hidden_size, true)?;
                Ok((sequences, tokens))
            })
            .collect::<Result<Vec<_>, PoolingError>>()?;

        let mut embeddings = Rows::new(&embeddings, width);
        let mut logits: Vec<(Rows, Rows)> = groups
            .iter()
            .zip(&logits)
            .map(|(rows, (sequences, tokens))| (Rows::new(sequences, rows.head.num_labels()), Rows::new(tokens, rows.head.num_labels())))
            .collect();
        Ok(requests
            .iter()
            .zip(pending)
            .map(|(request, pending)| match pending {
                Pending::Done(output) => output,
                Pending::Multi { mut outputs, dense } => {
                    if dense {
                        outputs.dense = Some(finish_embedding(embeddings.take(1).to_vec(), request.dimensions, request.activation));
                    }
                    PoolingOutput::Multi(outputs)
                }
                Pending::Embedding { rows, per_token } => {
                    let block = embeddings.take(rows);
                    let finish = |row: &[f32]| finish_embedding(row.to_vec(), request.dimensions, request.activation);
                    match per_token {
                        true => PoolingOutput::Tokens(block.chunks(width).map(finish).collect()),
                        false => PoolingOutput::Vector(finish(block)),
                    }
                }
                Pending::Logits { group, rows, per_token } => {
                    let (sequences, tokens) = &mut logits[group];
                    let block = if per_token { tokens.take(rows) } else { sequences.take(rows) };
                    classifier_output(groups[group].head, request, block)
                }
                Pending::NextToken => PoolingOutput::Vector(next_scores.next().into_iter().collect()),
            })
            .collect())
    }

    /// Adds one sequence's rows to the input of the head its task runs (or computes its
    /// output now, for the heads that run per sequence), and says where its answer will be.
    fn gather<'h>(
        &'h self,
        request: &SequenceRequest<'h>,
        states: &HiddenStates,
        (start, len): (usize, usize),
        embedding_rows: &mut Vec<f32>,
        groups: &mut Vec<ClassifierRows<'h>>,
        last_states: &mut Vec<f32>,
    ) -> Result<Pending, PoolingError> {
        let width = states.hidden_size;
        if request.labels.is_some() {
            if self.next_token.is_none() {
                return Err(no_lm_head());
            }
            last_states.extend(super::method::Last.pool(states, start, len));
            return Ok(Pending::NextToken);
        }
        if let Some(head) = &self.m3 {
            match self.m3_output(head, request, states, start, len)? {
                Some(PoolingOutput::Multi(outputs)) => {
                    let dense = request.multi.is_some_and(|m| m.dense);
                    if dense {
                        embedding_rows.extend(self.pooling()?.pool(states, start, len));
                    }
                    return Ok(Pending::Multi { outputs, dense });
                }
                Some(output) => return Ok(Pending::Done(output)),
                None => {}
            }
        }
        match request.task {
            Task::Embed => {
                let skip = self.instruction.as_ref().map_or(0, |span| span.len_in(request.ids).min(len.saturating_sub(1)));
                let pooled = self.pooling()?.pool(states, start + skip, len - skip);
                let rows = pooled.len() / width;
                embedding_rows.extend(pooled);
                Ok(Pending::Embedding { rows, per_token: false })
            }
            Task::TokenEmbed => {
                let mut pooled = All.pool(states, start, len);
                if let Some(size) = request.late_chunk {
                    pooled = super::method::chunk_means(&pooled, width, size);
                }
                let rows = pooled.len() / width;
                embedding_rows.extend(pooled);
                Ok(Pending::Embedding { rows, per_token: true })
            }
            task @ (Task::Classify | Task::Score | Task::TokenClassify) => {
                let head = self.classifier_for(request)?;
                let group = match groups.iter().position(|g| std::ptr::eq(g.head, head)) {
                    Some(group) => group,
                    None => {
                        groups.push(ClassifierRows { head, sequences: Vec::new(), tokens: Vec::new() });
                        groups.len() - 1
                    }
                };
                let pooled = head.pool(task, states, start, len);
                let rows = pooled.len() / width;
                // Token states are kept apart: some heads skip their pooler layer on them.
                let per_token = task == Task::TokenClassify;
                match per_token {
                    true => groups[group].tokens.extend(pooled),
                    false => groups[group].sequences.extend(pooled),
                }
                Ok(Pending::Logits { group, rows, per_token })
            }
            Task::EmbedSparse => {
                let head = self
                    .sparse
                    .as_ref()
                    .ok_or_else(|| PoolingError::MissingHead("SPLADE needs a masked-LM head, which this model lacks".into()))?;
                Ok(Pending::Done(PoolingOutput::Sparse(head.weights(&All.pool(states, start, len), width)?)))
            }
        }
    }

    /// The outputs of a batch's images: each tower embedding sliced and normalized as its
    /// request asks.
    pub fn images(&self, embeddings: Vec<Vec<f32>>, requests: &[SequenceRequest]) -> Vec<PoolingOutput> {
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
        request: &SequenceRequest,
        states: &HiddenStates,
        start: usize,
        len: usize,
    ) -> Result<Option<PoolingOutput>, PoolingError> {
        let width = states.hidden_size;
        let rows = &states.data[start * width..(start + len) * width];
        let ids = request.ids;
        if let Some(multi) = request.multi {
            let sparse = if multi.sparse { Some(head.lexical_weights(ids, &head.token_weights(rows, width)?)) } else { None };
            let colbert = if multi.colbert { Some(head.colbert(ids, rows, width, request.activation)?) } else { None };
            let token_weights = if multi.token_weights { Some(head.token_rows(ids, rows, width)?.concat()) } else { None };
            return Ok(Some(PoolingOutput::Multi(MultiVectors { dense: None, sparse, colbert, token_weights })));
        }
        Ok(match request.task {
            Task::TokenEmbed => Some(PoolingOutput::Tokens(head.colbert(ids, rows, width, request.activation)?)),
            Task::TokenClassify => Some(PoolingOutput::Tokens(head.token_rows(ids, rows, width)?)),
            Task::EmbedSparse => Some(PoolingOutput::Sparse(head.lexical_weights(ids, &head.token_weights(rows, width)?))),
            _ => None,
        })
    }

    fn pooling(&self) -> Result<&'static dyn PoolingMethod, PoolingError> {
        self.pooling.ok_or_else(|| PoolingError::MissingHead("this model has no sentence-level pooling".into()))
    }

    /// The head a classifier task runs: its adapter's own, else the model's.
    fn classifier_for<'h>(&'h self, request: &SequenceRequest<'h>) -> Result<&'h ClassifierHead, PoolingError> {
        let task = request.task;
        request
            .classifier
            .or(self.classifier.as_ref())
            .ok_or_else(|| PoolingError::MissingHead(format!("task {task} needs a classifier head, which this model lacks")))
    }
}

fn no_lm_head() -> PoolingError {
    PoolingError::MissingHead("generative scores need a causal LM loaded with `--runner generate`".into())
}

/// A classifier task's answer from its block of logits: activated as the request asks, per
/// token for token_classify (STEP keeps the rows of its tag), one vector otherwise.
fn classifier_output(head: &ClassifierHead, request: &SequenceRequest, block: &[f32]) -> PoolingOutput {
    let labels = head.num_labels();
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
