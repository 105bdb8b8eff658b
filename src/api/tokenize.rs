//! `POST /tokenize` and `POST /detokenize` (vLLM's shapes). `/tokenize` takes a `prompt`, or
//! vLLM's chat form (`messages` rendered through the chat template, `add_generation_prompt`
//! true by default there, `add_special_tokens` false).

use super::chat::{self, ChatFields};
use super::error::{ApiError, ErrorResponses};
use super::json::ApiJson;
use super::AppState;
use crate::input::tokenizer::EncodeOptions;
use crate::input::{InputError, InputOptions, Prompt};
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct TokenizeRequest {
    /// The text (absent when `messages` is sent).
    #[serde(default)]
    pub prompt: Option<String>,
    /// vLLM's chat form: one conversation, rendered through the chat template.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub messages: Option<serde_json::Value>,
    #[serde(default)]
    pub model: Option<String>,
    /// Default: true for `prompt`, false for `messages`.
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    #[serde(default)]
    pub return_token_strs: bool,
    /// A sentence-transformers prompt of the model, prepended as the embedding routes do (the
    /// model's default prompt applies when none is named).
    #[serde(default)]
    pub prompt_name: Option<String>,
    #[serde(flatten)]
    pub chat: ChatFields,
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
        super::error::AnyErrorResponses
    ))]
pub async fn tokenize(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<serde_json::Value>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    // TEI's body (`inputs`): TEI's tokens with their offsets.
    if super::tei::tokens::is_tei_tokenize(&body) {
        return Ok(super::tei::tokens::tokenize(&state, body).await);
    }
    let request: TokenizeRequest = super::json::from_value(body)?;
    let (engine, _permit, ()) = state.begin(request.model.as_deref(), super::any_model)?;
    let engine = &engine;
    // The text and the sentence-transformers prompt it gets, as the embedding routes prepend it.
    let (text, prompt) = match (request.prompt, &request.messages) {
        (Some(_), Some(_)) => {
            return Err(ApiError::BadRequest { message: "Send either `prompt` or `messages`, not both".into(), param: Some("messages") })
        }
        (None, None) => {
            return Err(ApiError::BadRequest { message: "missing field `prompt` (or vLLM's `messages`)".into(), param: Some("prompt") })
        }
        (None, Some(messages)) => {
            let inputs = chat::inputs(&state, engine, &serde_json::Value::Null, Some(messages), &request.chat, true).await?;
            match inputs.prompts.as_slice() {
                [Prompt::Text(text)] => (text.clone(), None),
                _ => return Err(ApiError::BadRequest { message: "/tokenize takes one conversation".into(), param: Some("messages") }),
            }
        }
        (Some(prompt), None) => {
            (prompt, engine.spec().prompts.resolve(request.prompt_name.as_deref()).map_err(crate::engine::params::ParamsError::from)?)
        }
    };
    let options = InputOptions {
        encode: EncodeOptions {
            add_special_tokens: request.add_special_tokens.unwrap_or(request.messages.is_none()),
            truncate_to: None,
            side: engine.spec().truncation_side,
            pair_limits: Default::default(),
        },
        prompt: prompt.map(Into::into),
        pad_to_max_length: false,
        max_len: engine.spec().max_model_len,
    };
    let tokens = engine.input().tokenize(text, &options).await?.ids;
    let token_strs = request.return_token_strs.then(|| engine.input().tokenizer().token_strings(&tokens));
    Ok(Json(TokenizeResponse { count: tokens.len(), max_model_len: engine.spec().max_model_len, tokens, token_strs }).into_response())
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
    let (engine, _permit, ()) = state.begin(request.model.as_deref(), super::any_model)?;
    let engine = &engine;
    let vocab = engine.input().tokenizer().vocab_size();
    if let Some(&id) = request.tokens.iter().find(|&&id| id as usize >= vocab) {
        return Err(InputError::InvalidTokenId { id: id as i64 }.into());
    }
    Ok(Json(DetokenizeResponse { prompt: engine.input().detokenize(request.tokens).await? }))
}
