//! Relevance scores for (query, document) pairs, shared by `/score` and `/rerank`.
//!
//! A cross-encoder (a classifier with one label) reads each pair as one sequence and its
//! activated logit is the score. An embedding model (bi-encoder) embeds every distinct text once
//! and scores the cosine of the two embeddings. A multi-vector model (ColBERT-style late
//! interaction) embeds every token and scores MaxSim: the sum over query tokens of the largest
//! dot product with any document token, on L2-normalized token vectors. BGE-M3 also weighs its
//! three scores into one when a request gives FlagEmbedding's weights. All pairs of a request are queued together, so
//! the scheduler batches them like any other inputs.

use super::{Engine, EngineError};
use crate::engine::params::ResolvedParams;
use crate::input::{InputError, Part, Prompt};
use crate::pooling::m3::{self, MultiOutput, MultiVectors};
use crate::pooling::Task;

/// How the served model turns a pair into a score.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreMode {
    CrossEncoder,
    BiEncoder,
    LateInteraction,
}

/// The pairs `(i, j)` of query `i` and document `j`: 1:1, 1:N (the single query repeated) or N:N.
pub fn pair_up(queries: usize, documents: usize) -> Result<Vec<(usize, usize)>, EngineError> {
    match (queries, documents) {
        (0, _) | (_, 0) => Err(InputError::EmptyPrompt.into()),
        (1, n) => Ok((0..n).map(|j| (0, j)).collect()),
        (m, n) if m == n => Ok((0..n).map(|i| (i, i)).collect()),
        _ => Err(InputError::InvalidPairing.into()),
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    (dot / (norm(a) * norm(b)).max(1e-12)) as f32
}

/// Σ over query tokens of the largest dot product with a document token.
pub fn max_sim(query: &[Vec<f32>], document: &[Vec<f32>]) -> f32 {
    query.iter().map(|q| document.iter().map(|d| q.iter().zip(d).map(|(a, b)| a * b).sum::<f32>()).fold(f32::NEG_INFINITY, f32::max)).sum()
}

/// A cross-encoder's score: the first (only) value of its one-label output.
fn single_value(scores: Vec<f32>) -> Result<f32, EngineError> {
    scores.first().copied().ok_or_else(|| EngineError::Model("the score head returned no value".into()))
}

/// Pairs of a prompt-template reranker rendered and tokenized at a time.
const RENDER_BATCH: usize = 64;

/// Every text within the input layer's byte bound (cut or refused, see
/// [`crate::input::Preprocessor::bounded`]).
fn bounded_all<'a>(engine: &Engine, texts: &'a [String], params: &ResolvedParams) -> Result<Vec<std::borrow::Cow<'a, str>>, EngineError> {
    let options = engine.input_options(params);
    Ok(texts.iter().map(|t| engine.input().bounded(t, &options)).collect::<Result<_, _>>()?)
}

impl Engine {
    /// How this model scores pairs, if it can: vLLM's score type of its pooling task (classify
    /// with one label: cross-encoder; embed: bi-encoder; token_embed: late interaction).
    pub fn score_mode(&self) -> Option<ScoreMode> {
        let spec = self.spec();
        if !spec.scores() {
            return None;
        }
        match spec.pooling_task {
            Task::Classify => Some(ScoreMode::CrossEncoder),
            Task::TokenEmbed => Some(ScoreMode::LateInteraction),
            Task::Embed => Some(ScoreMode::BiEncoder),
            _ => None,
        }
    }

    /// One score per pair of [`pair_up`], in pair order, and the tokens the model ran.
    /// `params` are the request's, validated for the `score` task; `instruction` replaces the
    /// task description of prompt-based rerankers (Qwen3-Reranker).
    pub async fn score(
        &self,
        queries: &[String],
        documents: &[String],
        params: &ResolvedParams,
        instruction: Option<&str>,
    ) -> Result<(Vec<f32>, usize), EngineError> {
        let pairs = pair_up(queries.len(), documents.len())?;
        if let Some(weights) = params.hybrid {
            return self.score_hybrid(queries, documents, pairs, params, weights).await;
        }
        match self.score_mode() {
            Some(ScoreMode::CrossEncoder) => {
                // Embedding prompts do not apply to a cross-encoder's pairs or to its template.
                let params = &ResolvedParams { prompt: None, ..params.clone() };
                let (outputs, tokens) = match &self.spec().rerank_template {
                    // The rendered prompt is the whole input: the tokenizer adds nothing to it.
                    // Each pair is rendered and tokenized whole (tokenizing the template's parts
                    // apart would change the tokens at their seams); texts are bounded first.
                    Some(template) => {
                        let params = ResolvedParams { add_special_tokens: false, ..params.clone() };
                        let (queries, documents) = (bounded_all(self, queries, &params)?, bounded_all(self, documents, &params)?);
                        // Rendered RENDER_BATCH pairs at a time: at most that many prompt
                        // copies of a long query exist at once, whatever the document count.
                        let mut inputs = Vec::with_capacity(pairs.len());
                        for group in pairs.chunks(RENDER_BATCH) {
                            let prompts = group
                                .iter()
                                .map(|&(i, j)| Prompt::Text(template.render(&queries[i], &documents[j], instruction)))
                                .collect();
                            inputs.extend(self.prepare(prompts, &params).await?);
                        }
                        let tokens = inputs.iter().map(|i| i.len()).sum();
                        (self.run_as::<Vec<f32>>(inputs, &params).await?, tokens)
                    }
                    // Each distinct query and document is tokenized once; pairs are joined
                    // from their token ids.
                    None => {
                        let inputs = self.prepare_pairs(queries, documents, pairs, params).await?;
                        let tokens = inputs.iter().map(|i| i.len()).sum();
                        (self.run_as::<Vec<f32>>(inputs, params).await?, tokens)
                    }
                };
                let scores = outputs.into_iter().map(single_value).collect::<Result<_, _>>()?;
                Ok((scores, tokens))
            }
            Some(ScoreMode::BiEncoder) => {
                let as_prompts = |texts: &[String]| texts.iter().cloned().map(Prompt::Text).collect();
                self.score_prompts(as_prompts(queries), as_prompts(documents), params, None).await
            }
            Some(ScoreMode::LateInteraction) => {
                let as_prompts = |texts: &[String]| texts.iter().cloned().map(Prompt::Text).collect();
                self.score_prompts(as_prompts(queries), as_prompts(documents), params, None).await
            }
            None => Err(EngineError::Model("this model cannot score pairs".into())),
        }
    }

    /// BGE-M3's hybrid score, as FlagEmbedding's `compute_score` weighs it:
    /// `(w_dense · dense + w_sparse · lexical + w_colbert · colbert) / Σw`, where dense is the
    /// cosine of the normalized embeddings, lexical the sum over shared token ids of the two
    /// lexical weights' product, and colbert the mean over query vectors of the best dot product
    /// with a passage vector. Every distinct text runs once, with all three outputs of its pass.
    async fn score_hybrid(
        &self,
        queries: &[String],
        documents: &[String],
        pairs: Vec<(usize, usize)>,
        params: &ResolvedParams,
        weights: [f32; 3],
    ) -> Result<(Vec<f32>, usize), EngineError> {
        let all = MultiOutput { dense: true, sparse: true, colbert: true, token_weights: false };
        let multi =
            ResolvedParams { task: Task::Embed, dimensions: None, activation: true, multi: Some(all), hybrid: None, ..params.clone() };
        let query_count = queries.len();
        let prompts = queries.iter().chain(documents).cloned().map(Prompt::Text).collect();
        let (outputs, tokens): (Vec<MultiVectors>, _) = self.encode_as(prompts, &multi).await?;
        if outputs.iter().any(|m| m.dense.is_none() || m.sparse.is_none() || m.colbert.is_none()) {
            return Err(EngineError::Model("BGE-M3 returned fewer outputs than asked for".into()));
        }
        let total: f32 = weights.iter().sum();
        // ColBERT is pairs × query tokens × passage tokens × dims multiply-adds: off the runtime.
        let scores = tokio::task::spawn_blocking(move || {
            pairs
                .iter()
                .map(|&(i, j)| {
                    let (q, d) = (&outputs[i], &outputs[query_count + j]);
                    let dense = cosine(q.dense.as_deref().unwrap_or_default(), d.dense.as_deref().unwrap_or_default());
                    let sparse = m3::lexical_score(q.sparse.as_deref().unwrap_or_default(), d.sparse.as_deref().unwrap_or_default());
                    let colbert = m3::colbert_score(q.colbert.as_deref().unwrap_or_default(), d.colbert.as_deref().unwrap_or_default());
                    (weights[0] * dense + weights[1] * sparse + weights[2] * colbert) / total
                })
                .collect()
        })
        .await
        .map_err(|_| EngineError::Model("hybrid scoring failed".into()))?;
        Ok((scores, tokens))
    }

    /// Scores of sides that may hold images, pairs as [`pair_up`] makes them: a bi-encoder's
    /// cosine of the two embeddings, a multi-vector model's MaxSim of their token vectors, or
    /// a prompt-based cross-encoder's score of the pair written into its template
    /// (Qwen3-VL-Reranker; `instruction` replaces the template's task description).
    pub async fn score_prompts(
        &self,
        queries: Vec<Prompt>,
        documents: Vec<Prompt>,
        params: &ResolvedParams,
        instruction: Option<&str>,
    ) -> Result<(Vec<f32>, usize), EngineError> {
        let mode = self.score_mode();
        let pairs = pair_up(queries.len(), documents.len())?;
        if mode == Some(ScoreMode::CrossEncoder) {
            return self.score_templated_pairs(&queries, &documents, pairs, params, instruction).await;
        }
        if mode != Some(ScoreMode::BiEncoder) && mode != Some(ScoreMode::LateInteraction) {
            return Err(InputError::ImagesUnsupported.into());
        }
        let query_count = queries.len();
        let prompts = queries.into_iter().chain(documents).collect();
        if mode == Some(ScoreMode::LateInteraction) {
            let per_token = ResolvedParams { task: Task::TokenEmbed, dimensions: None, activation: true, ..params.clone() };
            let (matrices, tokens): (Vec<Vec<Vec<f32>>>, _) = self.encode_as(prompts, &per_token).await?;
            // MaxSim is pairs × query tokens × document tokens × dims multiply-adds: on a
            // blocking thread, not a runtime worker.
            let scores = tokio::task::spawn_blocking(move || {
                pairs.iter().map(|&(i, j)| max_sim(&matrices[i], &matrices[query_count + j])).collect()
            })
            .await
            .map_err(|_| EngineError::Model("MaxSim scoring failed".into()))?;
            return Ok((scores, tokens));
        }
        // Normalized embeddings of every input, queries first; cosine is then exact.
        let embed = ResolvedParams { task: Task::Embed, dimensions: None, activation: true, ..params.clone() };
        let (vectors, tokens): (Vec<Vec<f32>>, _) = self.encode_as(prompts, &embed).await?;
        let scores = pairs.iter().map(|&(i, j)| cosine(&vectors[i], &vectors[query_count + j])).collect();
        Ok((scores, tokens))
    }

    /// A cross-encoder's scores of pairs whose sides may be images: each pair one input, its
    /// query's and its document's parts where the rerank template puts them (a pair of texts
    /// is the template rendered, as [`Self::score`] writes it). Only models that read images
    /// inside their text and score with a template (Qwen3-VL-Reranker) take them.
    async fn score_templated_pairs(
        &self,
        queries: &[Prompt],
        documents: &[Prompt],
        pairs: Vec<(usize, usize)>,
        params: &ResolvedParams,
        instruction: Option<&str>,
    ) -> Result<(Vec<f32>, usize), EngineError> {
        let template = self.spec().rerank_template.as_ref().ok_or(InputError::ImagesUnsupported)?;
        let refused = |message: &str| EngineError::Input(InputError::Media { message: message.into(), param: None });
        let [before, between, after] = template
            .around(instruction)
            .ok_or_else(|| refused("this model's rerank template puts the document before the query; it scores text pairs only"))?;
        let parts = |prompt: &Prompt| -> Result<Vec<Part>, EngineError> {
            match prompt {
                Prompt::Text(text) => Ok(vec![Part::Text(text.clone())]),
                Prompt::Image(bytes) => Ok(vec![Part::Image(bytes.clone())]),
                Prompt::Interleaved(parts) | Prompt::Chat(parts) => Ok(parts.clone()),
                Prompt::Tokens(_) | Prompt::Pair(..) => Err(refused("token ids cannot be written into the rerank template beside images")),
            }
        };
        let prompts = pairs
            .iter()
            .map(|&(i, j)| match (&queries[i], &documents[j]) {
                (Prompt::Text(query), Prompt::Text(document)) => Ok(Prompt::Text(template.render(query, document, instruction))),
                (query, document) => {
                    let mut pair = vec![Part::Text(before.clone())];
                    pair.extend(parts(query)?);
                    pair.push(Part::Text(between.clone()));
                    pair.extend(parts(document)?);
                    pair.push(Part::Text(after.clone()));
                    Ok(Prompt::Interleaved(pair))
                }
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        // The template is the whole input: no embedding prompt, nothing the tokenizer adds.
        let params = ResolvedParams { prompt: None, add_special_tokens: false, ..params.clone() };
        let (outputs, tokens): (Vec<Vec<f32>>, _) = self.encode_as(prompts, &params).await?;
        let scores = outputs.into_iter().map(single_value).collect::<Result<_, _>>()?;
        Ok((scores, tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairing_rules() {
        assert_eq!(pair_up(1, 1).unwrap(), vec![(0, 0)]);
        assert_eq!(pair_up(1, 3).unwrap(), vec![(0, 0), (0, 1), (0, 2)]);
        assert_eq!(pair_up(2, 2).unwrap(), vec![(0, 0), (1, 1)]);
        assert!(matches!(pair_up(2, 3), Err(EngineError::Input(InputError::InvalidPairing))));
        assert!(matches!(pair_up(3, 1), Err(EngineError::Input(InputError::InvalidPairing))));
        assert!(pair_up(0, 2).is_err());
    }

    #[test]
    fn max_sim_sums_best_matches() {
        let q = vec![vec![1.0, 0.0], vec![0.0, 1.0]];
        let d = vec![vec![0.6, 0.8], vec![1.0, 0.0]];
        assert!((max_sim(&q, &d) - (1.0 + 0.8)).abs() < 1e-6);
    }

    #[test]
    fn cosine_of_vectors() {
        assert!((cosine(&[1.0, 0.0], &[2.0, 0.0]) - 1.0).abs() < 1e-6);
        assert!(cosine(&[1.0, 0.0], &[0.0, 3.0]).abs() < 1e-6);
    }
}
