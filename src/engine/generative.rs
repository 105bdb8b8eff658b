//! Generative scores (vLLM's `/generative_scoring`): how likely a causal LM finds each of its
//! label tokens right after `query + item`, one score per item.
//!
//! The prompts are built as vLLM's `generative_scoring/serving.py` builds them: the query's ids
//! (tokenized with the request's `add_special_tokens`) then the item's (tokenized without
//! special tokens, so that no second BOS lands in the middle), or the reverse with `item_first`,
//! cut to `max_model_len - 1` tokens (vLLM keeps room for the one token it generates). Each
//! prompt runs as any other input of the model, and the LM head reads its last token
//! ([`crate::pooling::next_token`]). The checks and their messages are vLLM's.

use super::params::{ParamsError, ResolvedParams};
use super::{Engine, EngineError};
use crate::input::Prompt;
use crate::pooling::next_token::LabelQuery;
use crate::pooling::{PoolingOutput, Task};
use std::sync::Arc;

/// A query or an item as sent: text, or token ids.
#[derive(Debug, Clone)]
pub enum GenerativeText {
    Text(String),
    Tokens(Vec<u32>),
}

/// One `/generative_scoring` request, as the engine takes it.
#[derive(Debug, Clone)]
pub struct GenerativeRequest {
    pub query: GenerativeText,
    pub items: Vec<GenerativeText>,
    pub label_token_ids: Vec<i64>,
    pub apply_softmax: bool,
    pub item_first: bool,
    pub add_special_tokens: bool,
}

/// The scores, one per item in order, and the prompt tokens they took.
#[derive(Debug, Clone)]
pub struct GenerativeScores {
    pub scores: Vec<f32>,
    pub prompt_tokens: Vec<usize>,
}

/// vLLM's errors carry no `param`.
fn refused(message: String) -> EngineError {
    EngineError::Params(ParamsError { message, param: None })
}

impl Engine {
    /// Scores every item of `request` (in one run, batched with other requests' inputs).
    pub async fn generative_scores(&self, request: GenerativeRequest) -> Result<GenerativeScores, EngineError> {
        let spec = self.spec();
        let vocab = self.input().vocab_size();
        // vLLM's order: the labels' range, then their count, then the items'.
        if let Some(&id) = request.label_token_ids.iter().find(|&&id| id < 0 || id >= vocab as i64) {
            return Err(refused(format!("label_token_id {id} is out of vocabulary range [0, {vocab}). Please provide valid token IDs.")));
        }
        if request.label_token_ids.is_empty() {
            return Err(refused("label_token_ids must contain at least one token ID.".into()));
        }
        if request.items.is_empty() {
            return Err(refused("items must contain at least one item.".into()));
        }
        let labels: Vec<u32> = request.label_token_ids.iter().map(|&id| id as u32).collect();
        let base = ResolvedParams {
            truncation_side: spec.truncation_side,
            add_special_tokens: request.add_special_tokens,
            labels: Some(Arc::new(LabelQuery::new(&labels, request.apply_softmax))),
            // The task is not run (`labels` takes its place); a sequence-level one keeps the
            // token-output budget and chunked embedding out of the way.
            ..ResolvedParams::plain(Task::Classify)
        };
        let query = self.ids_of(request.query, &base).await?;
        let items_params = ResolvedParams { add_special_tokens: false, ..base.clone() };
        let mut prompts = Vec::with_capacity(request.items.len());
        let keep = spec.max_model_len.saturating_sub(1).max(1);
        for item in request.items {
            let item = self.ids_of(item, &items_params).await?;
            let mut prompt = match request.item_first {
                true => [item.as_slice(), &query].concat(),
                false => [query.as_slice(), &item].concat(),
            };
            prompt.truncate(keep);
            prompts.push(prompt);
        }
        let prompt_tokens = prompts.iter().map(Vec::len).collect();
        let inputs = self.prepare(prompts.into_iter().map(Prompt::Tokens).collect(), &base).await?;
        let scores = self
            .run(inputs, &base)
            .await?
            .into_iter()
            .map(|output| match output {
                PoolingOutput::Vector(v) if v.len() == 1 => Ok(v[0]),
                _ => Err(EngineError::Model("the LM head gave no score".into())),
            })
            .collect::<Result<_, _>>()?;
        Ok(GenerativeScores { scores, prompt_tokens })
    }

    /// A text's token ids as `params` tokenizes it (no prompt, no length check), or the ids sent.
    async fn ids_of(&self, text: GenerativeText, params: &ResolvedParams) -> Result<Vec<u32>, EngineError> {
        match text {
            GenerativeText::Tokens(ids) => Ok(ids),
            GenerativeText::Text(text) => Ok(self.input().tokenize(text, &self.input_options(params)).await?.ids),
        }
    }
}
