//! `POST /generative_scoring` (vLLM's): for a causal LM served with `--runner generate`, each
//! item's probability of the first label token right after `query + item`
//! ([`crate::engine::generative`]). Served for the models run that way; for any other model the
//! route is not there (404), as vLLM registers it only for generating models.

use super::error::{ApiError, ErrorResponses};
use super::json::ApiJson;
use super::AppState;
use crate::engine::generative::{GenerativeRequest, GenerativeText};
use crate::engine::Engine;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::{Deserialize, Serialize};

/// A query as sent: a text or token ids.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum QueryInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// The items as sent: all texts or all token-id lists.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ItemsInput {
    Texts(Vec<String>),
    Tokens(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct GenerativeScoringRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub query: QueryInput,
    pub items: ItemsInput,
    /// The tokens whose probabilities are read; the score is the first one's.
    pub label_token_ids: Vec<i64>,
    /// Softmax over the label tokens alone (default); `false`: the model's probability over the
    /// whole vocabulary.
    #[serde(default = "yes")]
    pub apply_softmax: bool,
    /// The item before the query.
    #[serde(default)]
    pub item_first: bool,
    /// Special tokens around the query (items never get them).
    #[serde(default = "yes")]
    pub add_special_tokens: bool,
    /// Names the response (`generative-scoring-{request_id}`) when no `X-Request-Id` header does.
    #[serde(default)]
    pub request_id: Option<String>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GenerativeScoringData {
    pub index: usize,
    pub object: &'static str,
    pub score: f32,
}

/// vLLM's usage of this route: one completion token per item (the one token vLLM samples).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GenerativeUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
    pub completion_tokens: usize,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GenerativeScoringResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub data: Vec<GenerativeScoringData>,
    pub usage: GenerativeUsage,
}

/// [`AppState::begin`]'s check: the model was loaded with its LM head.
fn generates(engine: &Engine) -> Result<(), ApiError> {
    match engine.spec().generates {
        true => Ok(()),
        false => Err(ApiError::RouteNotFound),
    }
}

#[utoipa::path(post, tag = "Scores", path = "/generative_scoring",
    description = "Each item's probability of the first label token after query + item (causal LMs served with --runner generate).",
    request_body = GenerativeScoringRequest,
    responses(
        (status = 200, body = GenerativeScoringResponse),
        ErrorResponses
    ))]
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<GenerativeScoringRequest>,
) -> Result<Json<GenerativeScoringResponse>, ApiError> {
    let (engine, _permit, ()) = state.begin(request.model.as_deref(), generates)?;
    let items: Vec<GenerativeText> = match request.items {
        ItemsInput::Texts(texts) => texts.into_iter().map(GenerativeText::Text).collect(),
        ItemsInput::Tokens(ids) => ids.into_iter().map(GenerativeText::Tokens).collect(),
    };
    state.check_batch_size(items.len())?;
    let query = match request.query {
        QueryInput::Text(text) => GenerativeText::Text(text),
        QueryInput::Tokens(ids) => GenerativeText::Tokens(ids),
    };
    let scored = engine
        .generative_scores(GenerativeRequest {
            query,
            items,
            label_token_ids: request.label_token_ids,
            apply_softmax: request.apply_softmax,
            item_first: request.item_first,
            add_special_tokens: request.add_special_tokens,
        })
        .await?;
    let prompt_tokens: usize = scored.prompt_tokens.iter().sum();
    let completion_tokens = scored.scores.len();
    let data =
        scored.scores.into_iter().enumerate().map(|(index, score)| GenerativeScoringData { index, object: "score", score }).collect();
    Ok(Json(GenerativeScoringResponse {
        id: super::response_id("generative-scoring", &headers, request.request_id.as_deref()),
        object: "list",
        created: super::unix_now(),
        model: engine.served_name().to_string(),
        data,
        usage: GenerativeUsage { prompt_tokens, total_tokens: prompt_tokens + completion_tokens, completion_tokens },
    }))
}
