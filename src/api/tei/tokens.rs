//! TEI's token routes: `/decode` (ids back to text) and TEI's body of `/tokenize` (tokens with
//! their byte offsets in the prompted text).

use super::error::{handed_over, TeiError, TeiJson};
use super::inputs::{unknown_prompt, yes};
use super::{batch_size, model};
use crate::api::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `/decode`'s request.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct DecodeRequest {
    pub ids: DecodeIds,
    #[serde(default = "yes")]
    pub skip_special_tokens: bool,
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum DecodeIds {
    Single(Vec<u32>),
    Batch(Vec<Vec<u32>>),
}

#[utoipa::path(post, tag = "TEI", path = "/decode", description = "TEI: token ids back to text.", request_body = DecodeRequest, responses((status = 200, body = Vec<String>), crate::api::error::TeiErrorResponses))]
pub async fn decode(State(state): State<AppState>, TeiJson(request): TeiJson<DecodeRequest>) -> Result<Json<Vec<String>>, TeiError> {
    decode_inner(&state, request).await.map(Json)
}

pub(in crate::api) async fn decode_inner(state: &AppState, request: DecodeRequest) -> Result<Vec<String>, TeiError> {
    let engine = model(state, request.model.as_deref(), |_| true)?;
    let lists = match request.ids {
        DecodeIds::Single(ids) => vec![ids],
        DecodeIds::Batch(lists) => {
            batch_size(state, lists.len())?;
            lists
        }
    };
    if lists.iter().any(Vec::is_empty) {
        return Err(TeiError::empty("Input validation error: `input_ids` cannot be empty"));
    }
    let vocab = engine.input().tokenizer().vocab_size();
    if let Some(&id) = lists.iter().flatten().find(|&&id| id as usize >= vocab) {
        return Err(TeiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Tokenizer",
            format!("tokenizer error Token id {id} is out of vocabulary"),
        ));
    }
    Ok(engine.input().decode_all(lists, request.skip_special_tokens).await?)
}

/// TEI's `/tokenize` body.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct TokenizeRequest {
    pub inputs: TokenizeInput,
    #[serde(default = "yes")]
    pub add_special_tokens: bool,
    #[serde(default)]
    pub prompt_name: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum TokenizeInput {
    Single(String),
    Batch(Vec<String>),
}

/// One token of TEI's `/tokenize`: `start`/`stop` are byte offsets in the (prompted) text.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SimpleToken {
    pub id: u32,
    pub text: String,
    pub special: bool,
    pub start: Option<usize>,
    pub stop: Option<usize>,
}

/// Whether a `/tokenize` body is TEI's: `inputs` without vLLM's `prompt` or `messages`.
pub fn is_tei_tokenize(body: &Value) -> bool {
    body.get("inputs").is_some() && body.get("prompt").is_none() && body.get("messages").is_none()
}

pub(in crate::api) async fn tokenize_inner(state: &AppState, request: TokenizeRequest) -> Result<Vec<Vec<SimpleToken>>, TeiError> {
    let engine = model(state, request.model.as_deref(), |_| true)?;
    let texts = match request.inputs {
        TokenizeInput::Single(text) => vec![text],
        TokenizeInput::Batch(texts) if texts.is_empty() => return Err(TeiError::empty("`inputs` cannot be empty")),
        TokenizeInput::Batch(texts) => {
            batch_size(state, texts.len())?;
            texts
        }
    };
    let spec = engine.spec();
    let prompt = match &request.prompt_name {
        Some(name) => spec.prompts.resolve(Some(name)).map_err(|_| unknown_prompt(name, spec))?,
        None => spec.prompts.default.clone(),
    };
    let limit = spec.max_model_len * 250;
    let mut prompted = Vec::with_capacity(texts.len());
    for text in texts {
        if text.is_empty() {
            return Err(TeiError::empty("Input validation error: `inputs` cannot be empty"));
        }
        let chars = text.chars().count();
        if chars > limit {
            return Err(TeiError::validation(format!(
                "Input validation error: `inputs` must have less than {limit} characters. Given: {chars}"
            )));
        }
        prompted.push(format!("{}{text}", prompt.as_deref().unwrap_or("")));
    }
    let tokens = engine.input().tokens(prompted.clone(), request.add_special_tokens).await?;
    let tokenizer = engine.input().tokenizer();
    Ok(tokens
        .into_iter()
        .zip(&prompted)
        .map(|(list, text)| {
            list.into_iter()
                .map(|(id, special, range)| {
                    let text = match range {
                        Some((start, stop)) => {
                            String::from_utf8_lossy(&text.as_bytes()[start.min(text.len())..stop.min(text.len())]).into_owned()
                        }
                        None => tokenizer.token_strings(&[id]).pop().unwrap_or_default(),
                    };
                    SimpleToken { id, text, special, start: range.map(|r| r.0), stop: range.map(|r| r.1) }
                })
                .collect()
        })
        .collect())
}

/// TEI's `/tokenize`, for bodies [`is_tei_tokenize`] says are TEI's.
pub async fn tokenize(state: &AppState, body: Value) -> Response {
    let answer = async { tokenize_inner(state, handed_over(body)?).await };
    answer.await.map(Json).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tokenize_bodies_are_told_apart() {
        assert!(is_tei_tokenize(&json!({"inputs": "a"})));
        assert!(!is_tei_tokenize(&json!({"prompt": "a"})));
    }
}
