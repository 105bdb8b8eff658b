//! `POST /classify`: class probabilities (or raw logits with `use_activation: false`) and the
//! winning label for every input, as vLLM answers it; texts, token ids, or a chat conversation
//! (`messages`, rendered through the chat template, see [`super::chat`]).

use super::chat::{self, ChatFields};
use super::error::{ApiError, ErrorResponses};
use super::json::ApiJson;
use super::{AppState, ListResponse};
use crate::engine::params::PoolingParams;
use crate::pooling::Task;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ClassifyRequest {
    /// Texts or token ids (absent when `messages` is sent).
    #[serde(default)]
    pub input: serde_json::Value,
    /// vLLM's chat input: one conversation rendered through the chat template.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub messages: Option<serde_json::Value>,
    #[serde(default)]
    pub model: Option<String>,
    /// vLLM: names the response (`classify-{request_id}`) when no `X-Request-Id` header does.
    #[serde(default)]
    pub request_id: Option<String>,
    #[serde(flatten)]
    pub chat: ChatFields,
    #[serde(flatten)]
    pub params: PoolingParams,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ClassifyData {
    pub index: usize,
    pub label: String,
    pub probs: Vec<f32>,
    pub num_classes: usize,
}

use crate::pooling::classifier::argmax;

#[utoipa::path(post, tag = "Classification", path = "/classify", description = "Class probabilities per input.", request_body = ClassifyRequest,
    responses(
        (status = 200, body = ListResponse<ClassifyData>),
        ErrorResponses
    ))]
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<ClassifyRequest>,
) -> Result<Json<ListResponse<ClassifyData>>, ApiError> {
    AppState::require_input(&request.input, request.messages.as_ref())?;
    let (engine, _permit, ()) = state.begin(request.model.as_deref(), super::serving(Task::Classify, "Classification"))?;
    let engine = &engine;
    let params = request.params.verify(Task::Classify, engine.spec())?;
    let inputs = chat::inputs(&state, engine, &request.input, request.messages.as_ref(), &request.chat, false).await?;
    let params = inputs.params(params, request.params.add_special_tokens);
    let (outputs, tokens): (Vec<Vec<f32>>, _) = engine.encode_as(inputs.prompts, &params).await?;
    let labels = &engine.spec().labels;
    let data = outputs
        .into_iter()
        .enumerate()
        .map(|(index, probs)| {
            let label = labels.get(argmax(&probs)).cloned().unwrap_or_default();
            ClassifyData { index, label, num_classes: probs.len(), probs }
        })
        .collect();
    Ok(Json(ListResponse::new("classify", &headers, request.request_id.as_deref(), engine, data, tokens)))
}

#[cfg(test)]
mod tests {
    use crate::pooling::classifier::argmax;

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.1, 0.7, 0.2]), 1);
        assert_eq!(argmax(&[0.5, 0.5]), 0);
        assert_eq!(argmax(&[-3.0]), 0);
    }
}
