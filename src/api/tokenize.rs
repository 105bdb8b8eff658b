//! `POST /tokenize` and `POST /detokenize` (vLLM's shapes).

use super::error::{ApiError, ErrorResponses};
use super::json::ApiJson;
use super::AppState;
use crate::loader::tokenizer::EncodeOptions;
use crate::engine::EngineError;
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct TokenizeRequest {
    pub prompt: String,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default = "yes")]
    pub add_special_tokens: bool,
    #[serde(default)]
    pub return_token_strs: bool,
    /// A sentence-transformers prompt of the model, prepended as the embedding routes do (the
    /// model's default prompt applies when none is named).
    #[serde(default)]
    pub prompt_name: Option<String>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    pub token_strs: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct DetokenizeRequest {
    pub tokens: Vec<u32>,
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

#[utoipa::path(post, tag = "Tokens", path = "/tokenize", description = "Tokenize a prompt.", request_body = TokenizeRequest,
    responses(
        (status = 200, body = TokenizeResponse),
        ErrorResponses
    ))]
pub async fn tokenize(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let engine = state.model(request.model.as_deref())?;
    let _permit = super::admit(engine)?;
    let options = EncodeOptions {
        add_special_tokens: request.add_special_tokens,
        truncate_to: None,
        side: engine.spec().truncation_side,
        pair_limits: Default::default(),
    };
    let text = match engine.spec().prompts.resolve(request.prompt_name.as_deref()).map_err(crate::engine::params::ParamsError::from)? {
        Some(prompt) => prompt + &request.prompt,
        None => request.prompt,
    };
    let tokens = engine.tokenize(text, options).await?.ids;
    let token_strs = request.return_token_strs.then(|| engine.tokenizer().token_strings(&tokens));
    Ok(Json(TokenizeResponse { count: tokens.len(), max_model_len: engine.spec().max_model_len, tokens, token_strs }))
}

#[utoipa::path(post, tag = "Tokens", path = "/detokenize", description = "Token ids back to text.", request_body = DetokenizeRequest,
    responses(
        (status = 200, body = DetokenizeResponse),
        ErrorResponses
    ))]
pub async fn detokenize(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let engine = state.model(request.model.as_deref())?;
    let _permit = super::admit(engine)?;
    let vocab = engine.tokenizer().vocab_size();
    if let Some(&id) = request.tokens.iter().find(|&&id| id as usize >= vocab) {
        return Err(EngineError::InvalidTokenId { id, vocab }.into());
    }
    Ok(Json(DetokenizeResponse { prompt: engine.detokenize(request.tokens).await? }))
}
